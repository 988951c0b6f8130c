"""`headscope composition`: Q-, K- and V-composition between heads and OV copying scores, from the weights alone."""

from __future__ import annotations

import click

from ..common.exits import refusals
from ..common.loading import load_or_fail
from ..common.options import figure, options, top
from ..common.outputs import echo_json, write_outputs

__all__ = ["cli"]


@click.command()
@options("model")
@click.option("--kind", type=click.Choice(["q", "k", "v"]), default=None,
              help="Only this kind of composition (default: all three).")
@top(10, "Strongest edges listed per kind (by the ratio to random matrices).")
@click.option("--copying/--no-copying", default=True, show_default=True,
              help="Also the OV copying score of every head (decoders: it needs the unembedding).")
@options(figure(help="Also write the composition graph of --kind (default k) (.png, .svg or .pdf)."), "out", "json",
         "quiet", "device")
def cli(model_name, kind, k, copying, figure_path, out_path, as_json, device, dtype,
        max_memory, offload_folder, quiet) -> None:
    """Q-, K- and V-composition scores between every earlier and later head (Elhage et al. 2021),
    against random matrices of the same shapes, and each head's OV copying score.

    Weights only, no text: the pre-attention norm's weight is folded into W_Q, W_K and W_V and the
    final norm's into W_U; no centring. --out writes every (kind, sender, receiver) score.
    """
    from headscope import composition

    lm = load_or_fail(model_name, device, dtype, max_memory, offload_folder)
    with refusals(model_name):
        result = composition(lm, progress=not quiet)
        copy = None
        if copying and lm.is_causal:
            from headscope.probe.composition import copying_scores

            copy = copying_scores(lm)
    kinds = [kind] if kind else ["q", "k", "v"]
    frame = result.to_frame()
    write_outputs(result, out_path, figure_path, table=frame[frame["kind"].isin(kinds)], kind=kind or "k")
    edges = {kd: result.top(k, kind=kd) for kd in kinds}
    if as_json:
        echo_json({"model": result.model, "baseline": {kd: result.baseline[kd] for kd in kinds},
                   "edges": [{"kind": kd, "sender": r.sender, "receiver": r.receiver, "score": r.score,
                              "baseline": r.baseline, "ratio": r.ratio} for kd in kinds for r in edges[kd].itertuples()],
                   "copying": None if copy is None else [{"head": r.head, "layer": r.layer, "copying": r.copying}
                                                         for r in copy.to_frame().itertuples()],
                   "summary": result.summary()})
        return
    click.echo(result.summary())
    for kd in kinds:
        click.echo(f"{kd.upper()}-composition (random matrices: {result.baseline[kd]:.3f}):")
        for r in edges[kd].itertuples():
            click.echo(f"  {r.sender:>7} → {r.receiver:<7} {r.score:.3f}  ({r.ratio:.1f}×)")
    if copy is not None:
        click.echo(copy.summary())
    elif copying:
        click.echo(f"{result.model}: no OV copying scores (an encoder has no unembedding to copy onto)")
