"""`headscope composition`: Q-, K- and V-composition between heads and OV copying scores, from the weights alone."""

from __future__ import annotations

import click

from ..common import internals as hs_
from ..common.exits import refusals
from ..common.loading import load_or_fail
from ..common.options import options, top
from ..common.outputs import emit

__all__ = ["cli"]


@click.command()
@options("model")
@click.option("--kind", type=click.Choice(["q", "k", "v"]), default=None,
              help="Only this kind of composition (default: all three).")
@top(10)
@click.option("--copying/--no-copying", default=True, show_default=True,
              help="Also the OV copying score of every head (decoders: it needs the unembedding).")
@options("figure", "out", "json", "quiet", "device")
def cli(model_name, kind, k, copying, figure_path, out_path, as_json, placement, quiet) -> None:
    """Q-, K- and V-composition scores between every earlier and later head (Elhage et al. 2021),
    against random matrices of the same shapes, and each head's OV copying score.

    Weights only, no text: the pre-attention norm's weight is folded into W_Q, W_K and W_V and the
    final norm's into W_U; no centring. --top lists the strongest edges of each kind (by the ratio to random
    matrices); --out writes every (kind, sender, receiver) score; --figure draws the composition graph of --kind
    (default k).
    """
    from headscope import composition

    lm = load_or_fail(model_name, placement)
    with refusals(model_name):
        result = composition(lm, progress=not quiet)
        copy = None
        if copying and lm.is_causal:
            copy = hs_.copying_scores(lm)
    kinds = [kind] if kind else ["q", "k", "v"]
    frame = result.to_frame()
    edges = {kd: result.top(k, kind=kd) for kd in kinds}
    payload = {"model": result.model, "baseline": {kd: result.baseline[kd] for kd in kinds},
               "edges": [{"kind": kd, "sender": r.sender, "receiver": r.receiver, "score": r.score,
                          "baseline": r.baseline, "ratio": r.ratio} for kd in kinds for r in edges[kd].itertuples()],
               "copying": None if copy is None else [{"head": r.head, "layer": r.layer, "copying": r.copying}
                                                     for r in copy.to_frame().itertuples()],
               "summary": result.summary()}
    if not emit(result, out_path, figure_path, as_json=as_json, payload=payload,
                table=frame[frame["kind"].isin(kinds)], kind=kind or "k"):
        return
    for kd in kinds:
        click.echo(f"{kd.upper()}-composition (random matrices: {result.baseline[kd]:.3f}):")
        for r in edges[kd].itertuples():
            click.echo(f"  {r.sender:>7} → {r.receiver:<7} {r.score:.3f}  ({r.ratio:.1f}×)")
    if copy is not None:
        click.echo(copy.summary())
    elif copying:
        click.echo(f"{result.model}: no OV copying scores (an encoder has no unembedding to copy onto)")
