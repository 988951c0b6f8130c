"""`headscope verify`: recompute every layer from scratch and compare with the model (`headscope.verify`)."""

from __future__ import annotations

import math
import sys

import click

from ..common import internals as hs_
from ..common.exits import refusals
from ..common.loading import inputs_or_fail, load_or_fail
from ..common.options import options
from ..common.outputs import emit


@click.command()
@options("model")
@options("texts", "truncate", "image", "out", "json", "quiet", "device")
def cli(model_name: str, texts: tuple[str, ...], targets: tuple[str, ...], truncate: bool, images: tuple[str, ...], out_path, as_json: bool, placement, quiet) -> None:
    """Exit 0 only when every head of every layer matches the from-scratch attention.

    --out writes the per-layer table.
    """
    from headscope import verify

    if images:
        inputs_or_fail([model_name], images=True)
    lm = load_or_fail(model_name, placement)
    with refusals(model_name):
        result = verify(lm, list(texts) or None, truncate=truncate, progress=not quiet,
                        **({"target": list(targets)} if targets else {}),
                        **({"images": list(images)} if images else {}))
    if emit(result, out_path, as_json=as_json, summary=None):
        for name, v in result.towers or (("", result),):  # a two-tower model: each tower's line, named
            image = lm.is_image or name == hs_.TOWER_NAMES["image"]
            click.echo(f"{v.model} ({v.family}, {v.dtype}), {v.n_texts} {'images' if image else 'texts'}, "
                       f"{v.n_tokens} {'units' if image else 'tokens'}")
        width = max(len(_layer(c)) for c in result.layers) if result.layers else 5
        click.echo(f"{'layer':>{max(width, 5)}} {'max|Δ| probs':>13} {'rel':>9} {'max|Δ| out':>11} {'rel':>9}  ok")
        for c in result.layers:
            probs = (f"{'—':>13} {'—':>9}" if math.isnan(c.max_abs_err)  # outputs only: no weights to compare
                     else f"{c.max_abs_err:>13.2e} {c.max_rel_err:>9.1e}")
            click.echo(f"{_layer(c):>{max(width, 5)}} {probs} {c.max_abs_err_output:>11.2e} "
                       f"{c.max_rel_err_output:>9.1e}  {'yes' if c.passed else 'NO'}")
        click.echo(result.summary())
        click.echo(f"tolerances: probabilities |Δ| <= {result.tolerance:g}, output max|Δ|/max|ref| <= "
                   f"{result.tolerance_output:g}; recomputation took {result.overhead:.2f}x the forward pass")
    sys.exit(0 if result.passed else 1)


def _layer(check) -> str:
    """The layer column: `3`, or `cross 3` for one of an encoder-decoder model's three kinds of attention."""
    return str(check.layer) if check.kind is None else f"{check.kind} {check.layer}"
