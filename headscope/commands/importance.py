"""`headscope importance`: gradient head importance (Michel et al. 2019) over a corpus, as tidy rows."""

from __future__ import annotations

import click

from ..common import internals as hs_
from ..common.corpus import corpus_or_fail
from ..common.exits import fail
from ..common.loading import load_or_fail
from ..common.options import options, top
from ..common.outputs import emit

__all__ = ["cli"]


@click.command()
@options("model", "corpus", "out", "batching", top(10), "truncate", "json", "quiet", "device")
def cli(model_name, corpus_path, limit, out_path, batch_size, k, truncate, as_json, placement, quiet) -> None:
    """Rank every head by E|∂L/∂ξ_h| through a head mask, normalised per layer."""
    from headscope import importance

    texts = corpus_or_fail(corpus_path, limit).texts
    lm = load_or_fail(model_name, placement)
    try:
        result = importance(lm, texts, batch_size=batch_size, truncate=truncate, progress=not quiet)
    except (TypeError, ValueError) as exc:
        fail(str(exc))
    frame = result.to_frame()
    top = [{"head": hs_.head_name(r.layer, r.head), "importance": r.importance} for r in frame.head(k).itertuples()]
    loss = hs_.IMPORTANCE_LOSSES[result.loss]
    if not emit(result, out_path, as_json=as_json, table=frame,
                payload={"model": lm.name, "loss": result.loss, "loss_description": loss, "n": result.n, "top": top,
                         "out": None if out_path is None else str(out_path)},
                summary=f"{lm.name}: head importance E|dL/dxi| over {hs_.counted(result.n, 'text')}, normalised per "
                        f"layer (L2); L = {loss}"):
        return
    click.echo("   ".join(f"{t['head']} {t['importance']:.3f}" for t in top))
    if out_path:
        click.echo(f"wrote {hs_.counted(len(frame), 'row')} to {out_path}")
