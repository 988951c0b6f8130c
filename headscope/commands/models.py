"""`headscope models`: the known models and whether they work offline right now; with `--families`,
every model type whose attention is verified."""

from __future__ import annotations

import click

from ..common import echo_json, json_option, out_option, write_table


@click.command()
@click.option("--families", is_flag=True, help="List the model types whose attention is verified, by family.")
@out_option
@json_option
def cli(families: bool, out_path, as_json: bool) -> None:
    """List the known models, their family, where the weights come from and if they are installed."""
    from headscope.probe.families import family_table
    from headscope.probe.registry import model_table

    rows = family_table() if families else model_table()
    if out_path:
        import pandas as pd

        write_table(pd.DataFrame(rows), out_path)
    if as_json:
        echo_json(rows)
    elif families:
        _print_families(rows)
    else:
        _print_models(rows)


def _print_models(rows: list[dict]) -> None:
    click.echo(f"{'name':<22}{'family':<8}{'offline':<9}source / install")
    for r in rows:
        state = "yes" if r["available"] else "no"
        where = r["source"] if r["available"] else f"{r['source']} — {r['install']}"
        click.echo(f"{r['name']:<22}{r['family']:<8}{state:<9}{where}")
    click.echo("Any local model folder, .gguf file or Hugging Face hub id also works where you have it.")


def _print_families(rows: list[dict]) -> None:
    click.echo(f"{'model type':<14}{'family':<8}{'kind':<9}{'file':<27}reproduces")
    for r in rows:
        click.echo(f"{r['model_type']:<14}{r['family']:<8}{r['kind']:<9}{r['file']:<27}{'; '.join(r['features'])}")
