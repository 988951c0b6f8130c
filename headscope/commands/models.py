"""`headscope models`: the known models and whether they work offline right now."""

from __future__ import annotations

import click

from ..common import echo_json, json_option, out_option, write_table


@click.command()
@out_option
@json_option
def cli(out_path, as_json: bool) -> None:
    """List the known models, their family, where the weights come from and if they are installed."""
    from headscope.probe.registry import model_table

    rows = model_table()
    if out_path:
        import pandas as pd

        write_table(pd.DataFrame(rows), out_path)
    if as_json:
        echo_json(rows)
        return
    click.echo(f"{'name':<22}{'family':<8}{'offline':<9}source / install")
    for r in rows:
        state = "yes" if r["available"] else "no"
        where = r["source"] if r["available"] else f"{r['source']} — {r['install']}"
        click.echo(f"{r['name']:<22}{r['family']:<8}{state:<9}{where}")
    click.echo("Any local model folder, .gguf file or Hugging Face hub id also works where you have it.")
