"""`headscope explain`: the textbook walk-through of softmax(q·kᵀ/√d)·v with a real head's numbers."""

from __future__ import annotations

import click

from ..common import echo_json, fail, load_or_fail, model_options


@click.command()
@click.argument("text")
@click.option("--model", "model_name", default="minilm", show_default=True, help="Packaged name, folder or hub id.")
@click.option("--token", required=True, help="The query token (a word of TEXT; a split word starts at its first piece).")
@click.option("--occurrence", default=0, show_default=True, help="Which occurrence of --token (0-based).")
@click.option("--layer", type=int, required=True)
@click.option("--head", type=int, required=True)
@click.option("--scale-effect", is_flag=True, help="Also show every head of --layer with and without the 1/√d scale.")
@click.option("--permutation", is_flag=True, help="Also show that attention without positions is permutation-equivariant.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@model_options
def cli(text, model_name, token, occurrence, layer, head, scale_effect, permutation, as_json, device, dtype) -> None:
    """Explain how head LAYER.HEAD builds TOKEN's output in TEXT: scores, scaling, softmax, values."""
    import pandas as pd

    from headscope.probe.families import UnsupportedArchitecture, UnsupportedFeature
    from headscope.probe.explain import explain, permutation_check
    from headscope.probe.explain import scale_effect as scale_table

    lm = load_or_fail(model_name, device, dtype)
    try:
        e = explain(lm, text, token=token, layer=layer, head=head, occurrence=occurrence)
        scales = scale_table(lm, text, layers=[layer]) if scale_effect else None
        perm = permutation_check(lm, text, layer=0) if permutation else None
    except (UnsupportedArchitecture, UnsupportedFeature) as exc:
        fail(f"{model_name}: {exc}", code=3)
    except (TypeError, ValueError) as exc:
        fail(str(exc))
    if as_json:
        out = {"model": lm.name, "text": text, "query": e.query, "layer": layer, "head": head, "scale": e.scale,
               "output_norm": e.output_norm, "model_weight_max_abs_err": e.model_weight_max_abs_err,
               "keys": e.table.to_dict(orient="records")}
        if scales is not None:
            out["scale_effect"] = scales.to_dict(orient="records")
        if perm is not None:
            out["permutation"] = {"max_dev_without_positions": perm.max_dev_without_positions,
                                  "max_dev_with_positions": perm.max_dev_with_positions, "layer": perm.layer}
        echo_json(out)
        return
    with pd.option_context("display.max_rows", 500, "display.width", 120):
        click.echo(f"{lm.name} L{layer}H{head}, query {e.query!r} (token {e.query_index}); scale = {e.scale:.6g}")
        click.echo(e.table.to_string(index=False, float_format=lambda x: f"{x:9.4f}"))
        click.echo(e.summary())
        if scales is not None:
            click.echo("\nWith and without the 1/√d scale (mean over query rows):")
            click.echo(scales.drop(columns=["scale"]).to_string(index=False, float_format=lambda x: f"{x:8.3f}"))
        if perm is not None:
            click.echo("\n" + perm.summary())
