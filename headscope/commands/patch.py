"""`headscope patch`: activation patching of every head (or MLP, or residual stream) on clean/corrupt pairs."""

from __future__ import annotations

import click

from ..common import internals as hs_
from ..common.exits import fail, refusals
from ..common.loading import load_or_fail
from ..common.options import head, options, renamed
from ..common.outputs import emit

__all__ = ["cli"]


@click.command()
@options("model")
@click.option("--pairs", "pairs_spec", default="ioi", show_default=True,
              help="A built-in pair set (ioi, agreement) or a JSONL file of {\"clean\", \"corrupt\", \"right\", \"wrong\"}.")
@click.option("--what", type=click.Choice(hs_.choices(hs_.PatchWhat)), default="head_out", show_default=True,
              help="What is patched: each head's output, pattern, q, k or v, each MLP's output, the residual stream "
                   "entering each layer, or path (--sender to every later head's --receivers input).")
@head(option="--sender", name="sender")
@click.option("--receivers", type=click.Choice(["q", "k", "v"]), default="q", show_default=True,
              help="With --what path: which input of each later head receives the sender's path.")
@click.option("--freeze-mlps", is_flag=True, default=False,
              help="With --what path: freeze the MLPs too (by default they are recomputed, as in Wang et al. 2022).")
@click.option("--attribution", is_flag=True, default=False,
              help="Attribution patching (the gradient approximation, with --what head_out or resid), beside real "
                   "patching on the same pairs and their Spearman rank correlation.")
@click.option("--direction", type=click.Choice(hs_.choices(hs_.PatchDirection)), default="denoise", show_default=True,
              help="denoise: run the corrupt prompt, patch in clean activations; noise: the reverse.")
@click.option("--positions", type=click.Choice(hs_.choices(hs_.PatchPositions)), default="all", show_default=True,
              help="Patch at every position at once, or (with --what resid) at each position alone.")
@click.option("--confirm", "k", type=click.IntRange(min=1), default=3, show_default=True,
              help="Heads chosen on half of the pairs (the strongest) and confirmed, patched together, on the other "
                   "half.")
@renamed("--top", "--confirm", "k", value="K", type=click.IntRange(min=1))
@options("random", "seed", "figure", "out", "json", "quiet", "device")
def cli(model_name, pairs_spec, what, sender, receivers, freeze_mlps, attribution, direction, positions, k, n_random, seed, figure_path, out_path, as_json,
        placement, quiet) -> None:
    """Patch every head's output (or pattern, q, k, v, MLP, residual stream, or path) from one run of each pair into the other.

    The metric is logit(right) − logit(wrong) at the last token; normalised, 0 is the corrupt run and
    1 the clean one. For head outputs the k strongest heads on half of the pairs are patched together
    on the other half (--confirm K) and compared with random head sets; the verdict says whether they beat them.
    --figure draws the layer × head grid of the normalised metric.
    """
    from pathlib import Path

    from headscope import patch

    if pairs_spec not in ("ioi", "agreement") and not Path(pairs_spec).is_file():
        fail(f"--pairs {pairs_spec}: no such file; give a JSONL file or a built-in set (ioi, agreement)")
    if figure_path is not None and what in ("mlp", "resid"):
        fail("--figure draws the layer × head grid: use it with a head's output, pattern, q, k, v or a path")
    if attribution and (positions != "all" or sender is not None):  # flags the attribution workflow does not take
        fail("--attribution approximates head_out or resid patching at every position at once; leave out "
             "--positions and --sender")
    if attribution and figure_path is not None:
        fail("--figure draws real patching; leave out --attribution")
    lm = load_or_fail(model_name, placement)
    if attribution:
        from headscope import attribution_patch

        with refusals(model_name):
            approx = attribution_patch(lm, pairs_spec, what=what, direction=direction, progress=not quiet)
        emit(approx, out_path, as_json=as_json)
        return
    with refusals(model_name):
        result = patch(lm, pairs_spec, what=what, direction=direction, positions=positions, k=k, n_random=n_random,
                       seed=seed, sender=sender, receivers=receivers, freeze_mlps=freeze_mlps, progress=not quiet)
    if emit(result, out_path, figure_path, as_json=as_json):
        click.echo(f"{result.forwards} batched forward passes in {result.seconds:.1f} s")
