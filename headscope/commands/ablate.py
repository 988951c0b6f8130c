"""`headscope ablate`: does a set of heads matter? Its ablation effect against random head sets."""

from __future__ import annotations

import click

from headscope.probe.names import AblationMethod, choices

from ..common.corpus import corpus_or_fail
from ..common.exits import fail
from ..common.loading import load_or_fail
from ..common.options import options, renamed
from ..common.outputs import echo_json
from headscope.probe.wording import counted

__all__ = ["cli", "parse_top"]

TOP_TEXTS = 32  # built-in corpus texts scored for --heads-by when the effect is measured on a task


def parse_top(spec: str) -> tuple[str, int]:
    """`METRIC:K` -> (metric, k); the metric is one of `headscope heads`' metrics."""
    from headscope.analyses.metrics import METRICS

    metric, sep, k = spec.partition(":")
    if not sep or not k.strip().isdigit() or int(k) < 1:
        raise ValueError(f"--heads-by {spec!r}: write METRIC:K, e.g. induction:5")
    if metric not in METRICS:
        raise ValueError(f"--heads-by {spec!r}: unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    return metric, int(k)


def _top_heads(lm, metric: str, k: int, texts: list[str], *, quiet: bool) -> list[tuple[int, int]]:
    from headscope import heads

    top = heads(lm, texts, progress=not quiet, total=len(texts)).top(metric, k)
    if top.empty:
        fail(f"--heads-by {metric}:{k}: {lm.name} has no {metric} score (not applicable to this model)")
    return [(int(r.layer), int(r.head)) for r in top.itertuples()]


@click.command()
@options("model", "heads")
@click.option("--heads-by", "heads_by", default=None, metavar="METRIC:K",
              help="Ablate the K heads scoring highest on METRIC, scored as `headscope heads` does (e.g. induction:5).")
@renamed("--top", "--heads-by", "heads_by", value="METRIC:K")
@options("method", "corpus")
@click.option("--task", type=click.Choice(["induction"]), default=None,
              help="Measure on a built-in task: induction = loss on the second copy of repeated random tokens.")
@click.option("--word", default=None, help="Encoders: the word whose final representation is compared.")
@options("random", "seed", "batching", "json", "quiet", "device")
def cli(model_name, heads, heads_by, method, corpus_path, limit, task, word, n_random, seed, batch_size, as_json,
        placement, quiet) -> None:
    """Ablate heads and compare the effect with ablating random heads (mean, sd, empirical p)."""
    from headscope import ablate, builtin_corpus
    from headscope.probe.interventions import refuse_seq2seq

    if (heads is None) == (heads_by is None):
        fail("give exactly one of --heads L16H0,L18H6 or --heads-by METRIC:K")
    if (corpus_path is None) == (task is None):
        fail("give exactly one of --corpus FILE or --task induction")
    try:
        top = parse_top(heads_by) if heads_by is not None else None
    except ValueError as exc:
        fail(str(exc))
    texts = corpus_or_fail(corpus_path, limit).texts if corpus_path else None
    lm = load_or_fail(model_name, placement)
    try:
        refuse_seq2seq(lm, "head ablation")  # before --top scores every head
        if top is not None:
            heads = _top_heads(lm, *top, texts or builtin_corpus()[:TOP_TEXTS], quiet=quiet)
        result = ablate(lm, heads, method=method, corpus=texts, task=task, word=word, n_random=n_random,
                        seed=seed, batch_size=batch_size, progress=not quiet)
    except (TypeError, ValueError) as exc:
        fail(str(exc))
    if as_json:
        echo_json(result.to_dict())
        return
    d = result.to_dict()
    click.echo(f"{lm.name}: {d['effect_metric']} over {counted(d['n'], 'example')} (clean mean {d['baseline']:.4g})")
    click.echo(result.verdict)
