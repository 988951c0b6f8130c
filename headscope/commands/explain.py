"""`headscope explain`: the textbook walk-through of softmax(q·kᵀ/√d)·v with a real head's numbers."""

from __future__ import annotations

import click

from ..common import internals as hs_
from ..common.exits import fail, refusals
from ..common.loading import inputs_or_fail, load_or_fail
from ..common.options import head, options, utf8_text
from ..common.outputs import emit


def _layer_head(layer: int | None, given: tuple[int, int] | int) -> tuple[int, int]:
    """(layer, head) from `--head L2H3` (or `2,3`), or from `--layer 2 --head 3` (`given` is then the int 3)."""
    if isinstance(given, int):
        if layer is None:
            fail(f"--head {given}: give the layer too, as --head LAYERH{given} (e.g. L2H{given}) or with --layer")
        return layer, given
    if layer is not None and layer != given[0]:
        fail(f"--layer {layer} and --head L{given[0]}H{given[1]} name different layers; give one of them")
    return given


@click.command()
@click.argument("text", required=False, callback=utf8_text("TEXT"))
@options("model")
@click.option("--token", required=True, help="The query token (a word of TEXT; a split word starts at its first piece).")
@options("occurrence", head(name="head_spec", required=True, bare=True))
@click.option("--layer", type=int, default=None, help="The layer, when --head is a bare head number.")
@click.option("--scale-effect", is_flag=True, help="Also show every head of the layer with and without the 1/√d scale.")
@click.option("--permutation", is_flag=True, help="Also show that attention without positions is permutation-equivariant.")
@options("truncate", "image", "out", "json", "quiet", "attention", "device")
def cli(text, model_name, token, occurrence, head_spec, layer, scale_effect, permutation, truncate, images, out_path,
        as_json, placement, attention, memory_budget, quiet) -> None:
    """Explain how one head builds TOKEN's output in TEXT: scores, scaling, softmax, values.

    A vision transformer explains one --image instead of TEXT (--token a unit such as [CLS] or r1c2); a
    vision–language decoder reads TEXT with its --image files, one per image slot (or the default prompt),
    and --token is a word or an image token such as img0:r1c2. --head takes a bare head number with --layer.
    --out writes the per-key table.
    """
    import pandas as pd

    from headscope import explain, fit_context

    layer, head = _layer_head(layer, head_spec)
    image = list(images) if images else None
    if text is None and image is None:
        fail("give TEXT or --image FILE (a vision–language decoder: TEXT with --image)")
    if image is not None and (scale_effect or permutation):
        fail("--scale-effect and --permutation take a TEXT, not --image")
    if images:
        inputs_or_fail([model_name], images=True)
    lm = load_or_fail(model_name, placement)
    with refusals(model_name, RuntimeError):
        lm = hs_.for_input(lm, images=image is not None)  # a two-tower model (CLIP, SigLIP): the tower that reads it
        if image is not None and text is not None and not getattr(lm, "reads_images", False):
            fail(f"give TEXT or --image FILE, not both: {lm.name} is not a vision–language decoder")
        if image is not None:
            e = explain(lm, text, images=image, token=token, layer=layer, head=head, occurrence=occurrence)
            text, scales, perm = e.text, None, None
        elif truncate:
            text = fit_context(lm, text)
        if image is None:
            e = explain(lm, text, token=token, layer=layer, head=head, occurrence=occurrence, attention=attention,
                        budget=memory_budget)
            scales = hs_.scale_effect(lm, text, layers=[layer]) if scale_effect else None
            perm = hs_.permutation_check(lm, text) if permutation else None
    out = None
    if as_json:
        out = {"model": lm.name, "text": text, "query": e.query, "layer": layer, "head": head, "scale": e.scale,
               "output_norm": e.output_norm, "model_weight_max_abs_err": e.model_weight_max_abs_err,
               "keys": e.table.to_dict(orient="records")}
        if e.check is not None:
            out["check"] = e.check
        if scales is not None:
            out["scale_effect"] = scales.to_dict(orient="records")
        if perm is not None:
            out["permutation"] = perm.to_dict()
    if not emit(e, out_path, as_json=as_json, payload=out, table=e.table, summary=None):
        return
    with pd.option_context("display.max_rows", 500, "display.width", 120):
        click.echo(f"{lm.name} {hs_.head_name(layer, head)}, query {e.query!r} (token {e.query_index}); scale = {e.scale:.6g}")
        click.echo(e.table.to_string(index=False, float_format=lambda x: f"{x:9.4f}"))
        click.echo(e.summary())
        if e.check is not None:
            click.echo(e.check["summary"])
        if scales is not None:
            click.echo("\nWith and without the 1/√d scale (mean over query rows):")
            click.echo(scales.drop(columns=["scale"]).to_string(index=False, float_format=lambda x: f"{x:8.3f}"))
        if perm is not None:
            click.echo("\n" + perm.summary())
