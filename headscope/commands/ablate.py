"""`headscope ablate`: does a set of heads matter? Its ablation effect against random head sets."""

from __future__ import annotations

import click

from ..common import internals as hs_
from ..common.corpus import corpus_or_fail
from ..common.exits import fail, refusals
from ..common.loading import load_or_fail
from ..common.options import options, parsed, renamed
from ..common.outputs import emit

__all__ = ["cli"]


def _spec(text: str) -> str:
    """--heads-by METRIC:K, checked before any model loads (`hs.heads_by_metric` reads it)."""
    hs_.parse_heads_by(text)
    return text


@click.command()
@options("model", "heads")
@click.option("--heads-by", "heads_by", default=None, metavar="METRIC:K", callback=parsed(_spec, "--heads-by"),
              help="Ablate the K heads scoring highest on METRIC, scored as `headscope heads` does (e.g. induction:5).")
@renamed("--top", "--heads-by", "heads_by", value="METRIC:K", callback=parsed(_spec, "--top"))
@options("method", "corpus")
@click.option("--task", type=click.Choice(["induction"]), default=None,
              help="Measure on a built-in task: induction = loss on the second copy of repeated random tokens.")
@click.option("--word", default=None, help="Encoders: the word whose final representation is compared.")
@options("random", "seed", "batching", "json", "quiet", "device")
def cli(model_name, heads, heads_by, method, corpus_path, limit, task, word, n_random, seed, batch_size, as_json,
        placement, quiet) -> None:
    """Ablate heads and compare the effect with ablating random heads (mean, sd, empirical p).

    The heads are named (--heads) or the K top heads of a `headscope heads` metric over the corpus, or the first
    32 built-in texts with --task (--heads-by METRIC:K)."""
    from headscope import ablate

    if (heads is None) == (heads_by is None):
        fail("give exactly one of --heads L16H0,L18H6 or --heads-by METRIC:K")
    if (corpus_path is None) == (task is None):
        fail("give exactly one of --corpus FILE or --task induction")
    texts = corpus_or_fail(corpus_path, limit).texts if corpus_path else None
    lm = load_or_fail(model_name, placement)
    with refusals(model_name):
        result = ablate(lm, heads, heads_by=heads_by, method=method, corpus=texts, task=task, word=word,
                        n_random=n_random, seed=seed, batch_size=batch_size, progress=not quiet)
    if emit(result, as_json=as_json, summary=f"{lm.name}: {result.effect_metric} over "
                                             f"{hs_.counted(result.n, 'example')} (clean mean {result.baseline:.4g})"):
        click.echo(result.verdict)
