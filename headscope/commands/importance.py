"""`headscope importance`: gradient head importance (Michel et al. 2019) over a corpus, as tidy rows."""

from __future__ import annotations

import click

from ..common.corpus import corpus_or_fail
from ..common.exits import fail
from ..common.loading import load_or_fail
from ..common.options import options, top
from ..common.outputs import echo_json, write_table
from headscope.probe.wording import counted

__all__ = ["cli"]


@click.command()
@options("model", "corpus", "out", "batching", top(10), "truncate", "json", "quiet", "device")
def cli(model_name, corpus_path, limit, out_path, batch_size, k, truncate, as_json, placement, quiet) -> None:
    """Rank every head by E|∂L/∂ξ_h| through a head mask, normalised per layer."""
    from headscope import importance
    from headscope.probe.importance import IMPORTANCE_LOSSES
    from headscope.probe.types import head_name

    texts = corpus_or_fail(corpus_path, limit).texts
    lm = load_or_fail(model_name, placement)
    try:
        result = importance(lm, texts, batch_size=batch_size, truncate=truncate, progress=not quiet)
    except (TypeError, ValueError) as exc:
        fail(str(exc))
    frame = result.to_frame()
    if out_path:
        write_table(frame, out_path)
    top = [{"head": head_name(r.layer, r.head), "importance": r.importance} for r in frame.head(k).itertuples()]
    if as_json:
        echo_json({"model": lm.name, "loss": result.loss, "loss_description": IMPORTANCE_LOSSES[result.loss],
                   "n": result.n, "top": top, "out": None if out_path is None else str(out_path)})
        return
    click.echo(f"{lm.name}: head importance E|dL/dxi| over {counted(result.n, 'text')}, normalised per layer (L2); "
               f"L = {IMPORTANCE_LOSSES[result.loss]}")
    click.echo("   ".join(f"{t['head']} {t['importance']:.3f}" for t in top))
    if out_path:
        click.echo(f"wrote {counted(len(frame), 'row')} to {out_path}")
