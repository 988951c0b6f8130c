"""`headscope models`: the known models and whether they work offline right now."""

from __future__ import annotations

import click

from ..common import echo_json


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON list instead of a table.")
@click.option("--families", is_flag=True, help="List the model types whose attention is verified, by family.")
def cli(as_json: bool, families: bool) -> None:
    """List the known models, their family, where the weights come from and if they are installed."""
    from headscope.probe.registry import model_table

    if families:
        _families(as_json)
        return
    rows = model_table()
    if as_json:
        echo_json(rows)
        return
    click.echo(f"{'name':<22}{'family':<8}{'offline':<9}source / install")
    for r in rows:
        state = "yes" if r["available"] else "no"
        where = r["source"] if r["available"] else f"{r['source']} — {r['install']}"
        click.echo(f"{r['name']:<22}{r['family']:<8}{state:<9}{where}")
    click.echo("Any local model folder, .gguf file or Hugging Face hub id also works where you have it.")


def _families(as_json: bool) -> None:
    from headscope.probe.families import family_table

    rows = family_table()
    if as_json:
        echo_json(rows)
        return
    click.echo(f"{'model type':<14}{'family':<8}{'kind':<9}{'file':<27}reproduces")
    for r in rows:
        click.echo(f"{r['model_type']:<14}{r['family']:<8}{r['kind']:<9}{r['file']:<27}{'; '.join(r['features'])}")
