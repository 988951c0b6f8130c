"""`headscope models`: the known models and whether they work offline right now; with `--families`,
every model type whose attention is verified."""

from __future__ import annotations

import click

from ..common import internals as hs_
from ..common.options import options
from ..common.outputs import emit


@click.command()
@click.option("--families", is_flag=True, help="List the model types whose attention is verified, by family.")
@options("out", "json", "quiet")
def cli(families: bool, out_path, as_json: bool, quiet) -> None:
    """List the known models, their family, where the weights come from and if they are installed."""
    rows = hs_.family_table() if families else hs_.model_table()
    table = None
    if out_path:
        import pandas as pd

        table = pd.DataFrame(rows)
    if not emit(rows, out_path, as_json=as_json, payload=rows, table=table, summary=None):
        return
    if families:
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
    # Each column as wide as its widest cell and two spaces ("encoder-decoder" ran into the file name).
    columns = {"model type": "model_type", "family": "family", "kind": "kind", "file": "file"}
    width = {k: max([len(k), *(len(str(r[f])) for r in rows)]) + 2 for k, f in columns.items()}
    click.echo("".join(f"{k:<{width[k]}}" for k in columns) + "reproduces")
    for r in rows:
        click.echo("".join(f"{str(r[f]):<{width[k]}}" for k, f in columns.items()) + "; ".join(r["features"]))
