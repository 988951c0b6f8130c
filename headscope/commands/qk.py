"""`headscope qk`: why a head attends from one token to another — its score split over pairs of upstream parts."""

from __future__ import annotations

import click

from ..common.exits import refusals
from ..common.loading import load_or_fail
from ..common.options import head, options, top, utf8_text
from ..common.outputs import emit

__all__ = ["cli"]


def _position(value: str) -> int | str:
    return int(value) if value.strip().lstrip("-").isdigit() else value


@click.command()
@click.argument("text", callback=utf8_text("TEXT"))
@options("model", head(required=True))
@click.option("--query", required=True, help="The query token: a token of TEXT, or its index.")
@click.option("--key", required=True, help="The key token: a token of TEXT, or its index.")
@options("occurrence", top(10), "out", "json", "quiet", "device")
def cli(text, model_name, head, query, key, occurrence, k, out_path, as_json, placement, quiet) -> None:
    """Split one head's score from --query to --key over (query-side part, key-side part) pairs.

    The parts are the embeddings, every earlier head, every earlier MLP and the biases; the norms'
    scales are frozen at this run's values. The terms sum to the from-scratch score, and the error of
    that sum is printed. --out writes every pair.
    """
    from headscope import qk

    layer, head = head
    lm = load_or_fail(model_name, placement)
    with refusals(model_name):
        result = qk(lm, text, layer=layer, head=head, query=_position(query), key=_position(key),
                    occurrence=occurrence, progress=not quiet)
    if not emit(result, out_path, as_json=as_json):
        return
    for r in result.top(k).itertuples():
        click.echo(f"  query {r.query_component:>14} × key {r.key_component:<14} {r.value:+.4f}")
    removed = result.weight_without.reindex(result.weight_without["change"].abs().sort_values(ascending=False).index)
    click.echo("the key's weight with one part removed: " + ", ".join(
        f"{r.side} {r.component} {r.weight:.3f}" for r in removed.head(5).itertuples()))
