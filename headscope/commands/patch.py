"""`headscope patch`: activation patching of every head (or MLP, or residual stream) on clean/corrupt pairs."""

from __future__ import annotations

import click

from headscope.probe.names import PatchDirection, PatchPositions, PatchWhat, choices

from ..common import (device_options, echo_json, fail, json_option, load_or_fail, model_option, new_figure_or_fail,
                      out_option, quiet_option, refusals, utf8_text, write_table)

__all__ = ["cli"]


@click.command()
@model_option
@click.option("--pairs", "pairs_spec", default="ioi", show_default=True,
              help="A built-in pair set (ioi, agreement) or a JSONL file of {\"clean\", \"corrupt\", \"right\", \"wrong\"}.")
@click.option("--what", type=click.Choice(choices(PatchWhat)), default="head_out", show_default=True,
              help="What is patched: each head's output, pattern, q, k or v, each MLP's output, the residual stream "
                   "entering each layer, or path (--sender to every later head's --receivers input).")
@click.option("--sender", default=None, callback=utf8_text("--sender"),
              help="With --what path: the sender head, e.g. L9H6.")
@click.option("--receivers", type=click.Choice(["q", "k", "v"]), default="q", show_default=True,
              help="With --what path: which input of each later head receives the sender's path.")
@click.option("--freeze-mlps", is_flag=True, default=False,
              help="With --what path: freeze the MLPs too (by default they are recomputed, as in Wang et al. 2022).")
@click.option("--attribution", is_flag=True, default=False,
              help="Attribution patching (the gradient approximation, with --what head_out or resid), beside real "
                   "patching on the same pairs and their Spearman rank correlation.")
@click.option("--direction", type=click.Choice(choices(PatchDirection)), default="denoise", show_default=True,
              help="denoise: run the corrupt prompt, patch in clean activations; noise: the reverse.")
@click.option("--positions", type=click.Choice(choices(PatchPositions)), default="all", show_default=True,
              help="Patch at every position at once, or (with --what resid) at each position alone.")
@click.option("--top", "k", type=click.IntRange(min=1), default=3, show_default=True,
              help="Heads chosen on half of the pairs and confirmed on the other half.")
@click.option("--random", "n_random", type=click.IntRange(min=0), default=19, show_default=True,
              help="Random head sets of the same size to compare the chosen heads with.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--figure", "figure_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the layer × head grid of the normalised metric (.png, .svg or .pdf).")
@out_option
@json_option
@quiet_option
@device_options
def cli(model_name, pairs_spec, what, sender, receivers, freeze_mlps, attribution, direction, positions, k, n_random, seed, figure_path, out_path, as_json,
        device, dtype, quiet) -> None:
    """Patch every head's output (or pattern, q, k, v, MLP, residual stream, or path) from one run of each pair into the other.

    The metric is logit(right) − logit(wrong) at the last token; normalised, 0 is the corrupt run and
    1 the clean one. For head outputs the k strongest heads on half of the pairs are patched together
    on the other half and compared with random head sets; the verdict says whether they beat them.
    """
    from pathlib import Path

    from headscope import patch

    if pairs_spec not in ("ioi", "agreement") and not Path(pairs_spec).is_file():
        fail(f"--pairs {pairs_spec}: no such file; give a JSONL file or a built-in set (ioi, agreement)")
    new_figure_or_fail(figure_path)
    if figure_path is not None and what in ("mlp", "resid"):
        fail("--figure draws the layer × head grid: use it with a head's output, pattern, q, k, v or a path")
    if (what == "path") != (sender is not None):
        fail("--what path needs --sender (e.g. L9H6), and --sender is only for --what path")
    if sender is not None:
        from headscope.probe.types import parse_head

        try:
            parse_head(sender)
        except ValueError as exc:
            fail(f"--sender: {exc}")
    if attribution and (what not in ("head_out", "resid") or positions != "all"):
        fail("--attribution approximates head_out or resid patching at every position; use --what head_out or resid")
    if attribution and figure_path is not None:
        fail("--figure draws real patching; leave out --attribution")
    lm = load_or_fail(model_name, device, dtype)
    if attribution:
        from headscope import attribution_patch

        with refusals(model_name):
            approx = attribution_patch(lm, pairs_spec, what=what, direction=direction)
        if out_path:
            write_table(approx.to_frame(), out_path)
        if as_json:
            echo_json(approx.to_dict())
        else:
            click.echo(approx.summary())
        return
    with refusals(model_name):
        result = patch(lm, pairs_spec, what=what, direction=direction, positions=positions, k=k, n_random=n_random,
                       seed=seed, sender=sender, receivers=receivers, freeze_mlps=freeze_mlps)
    if out_path:
        write_table(result.to_frame(), out_path)
    if figure_path is not None:
        from headscope.reports.figures import patch_grid, save

        save(patch_grid(result), figure_path)
    if as_json:
        echo_json(result.to_dict())
        return
    click.echo(result.summary())
    click.echo(f"{result.forwards} batched forward passes in {result.seconds:.1f} s")
