"""`headscope sinks`: attention sinks taken apart (sink rate, value norms, dormant heads, massive activations),
or with --streaming the StreamingLLM test of a decoder."""

from __future__ import annotations

from pathlib import Path

import click

from ..common import internals as hs_
from ..common.corpus import corpus_or_fail
from ..common.exits import fail
from ..common.loading import load_or_fail
from ..common.options import options, renamed
from ..common.outputs import emit, say

__all__ = ["cli"]


def _read_text(path: str | None) -> str | None:
    if path is None:
        return None
    p = Path(path)
    if not p.is_file():
        fail(f"--text-file {path}: no such file; give a plain UTF-8 text file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeError) as exc:
        fail(f"--text-file {path}: {exc}")
    if not text.strip():
        fail(f"--text-file {path} is empty; give a long text")
    return text


@click.command()
@options("model", "corpus")
@click.option("--k", "k", type=click.IntRange(1, 4), default=1, show_default=True,
              help="Sink rate: attention on the first k positions (Gu et al. 2025).")
@click.option("--epsilon", type=click.FloatRange(0, 1, max_open=True), default=0.3, show_default=True,
              help="Sink rate: a head is a sink when its mean attention on the first k positions exceeds this.")
@click.option("--sequence-length", "length", type=click.IntRange(min=4), default=64, show_default=True,
              help="Sink rate: tokens per sequence.")
@renamed("--length", "--sequence-length", "length", value="N", type=click.IntRange(min=4))
@click.option("--sequences", type=click.IntRange(min=1), default=32, show_default=True,
              help="Sink rate: sequences cut from the texts (at most).")
@click.option("--random-sequences", type=click.IntRange(min=0), default=32, show_default=True,
              help="Sink rate: sequences of random tokens (0 skips).")
@click.option("--dormant/--no-dormant", "ablation", default=True, show_default=True,
              help="Ablate every head alone to call sink heads dormant (no call without it).")
@renamed("--ablation/--no-ablation", "--dormant/--no-dormant", "ablation")
@options("ablation_texts", "method", "random")
@click.option("--streaming", is_flag=True,
              help="Run the StreamingLLM test instead: perplexity under dense attention, a window, and the window "
                   "plus the first tokens (decoders).")
@click.option("--window", type=click.IntRange(min=1), default=256, show_default=True,
              help="--streaming: keys each query sees (itself included).")
@click.option("--keep", type=click.IntRange(min=1), default=4, show_default=True,
              help="--streaming: the first tokens kept beside the window (every s = 1..keep is measured).")
@click.option("--text-file", "text_file", type=click.Path(dir_okay=False), default=None,
              help="--streaming: the long text. Default: the UD English EWT test treebank's text in the shared data.")
@click.option("--max-tokens", type=click.IntRange(min=2), default=2048, show_default=True,
              help="--streaming: the first N tokens of the text.")
@options("seed", "batching", "out", "quiet", "json", "device")
def cli(model_name, corpus_path, limit, k, epsilon, length, sequences, random_sequences, ablation, ablation_texts,
        method, n_random, streaming, window, keep, text_file, max_tokens, seed, batch_size, out_path, quiet, as_json,
        placement) -> None:
    """Attention sinks: per-head first-position shares, value norms, dormant calls from ablation, the sink rate
    (texts, random tokens, first token replaced) and massive activations; --streaming: the StreamingLLM test.

    The corpus gives the per-head shares, the sink rate and the ablations; each head's ablation is compared with
    --random other heads ablated alone. --out writes the per-head table (or, with --streaming, the loss per
    position)."""
    from headscope import sinks, streaming as streaming_test

    if streaming:
        text = _read_text(text_file)
        lm = load_or_fail(model_name, placement)
        try:
            result = streaming_test(lm, text, window=window, keep=keep, max_tokens=max_tokens,
                                    source=text_file)
        except ValueError as exc:
            fail(str(exc))
        d = result.to_dict()
        if not emit(result, out_path, as_json=as_json, payload=d, summary=None):
            return
        click.echo(f"{lm.name}: {d['n_tokens']} tokens of {d['source']}, window {window}, positions as the model's own")
        click.echo(f"  dense perplexity           {d['dense_ppl']:.3f}")
        click.echo(f"  window of {window} keys        {d['window_ppl']:.3f}")
        for s, v in d["sink_window_ppls"].items():
            click.echo(f"  window + first {s} token(s)  {v:.3f}")
        return
    if text_file is not None:
        fail("--text-file is the long text of --streaming; give --corpus for the sink analysis")
    texts = corpus_or_fail(corpus_path, limit).texts
    lm = load_or_fail(model_name, placement)
    say(f"{lm.name}: sinks over {hs_.counted(len(texts), 'text')}", quiet=quiet)
    try:
        result = sinks(lm, texts, k=k, epsilon=epsilon, length=length, n_sequences=sequences,
                       n_random_sequences=random_sequences, ablation=ablation, ablation_texts=ablation_texts,
                       method=method, n_random=n_random, seed=seed, batch_size=batch_size, progress=not quiet)
    except ValueError as exc:
        fail(str(exc))
    if not emit(result, out_path, as_json=as_json, summary=None):
        return
    for r in result.rates:
        click.echo(f"{lm.name}: Sink_{r.k}^{r.epsilon:g} on {r.source} ({r.n_sequences} × {r.length} tokens): "
                   f"{r.value:.1%} (95% CI {r.ci95[0]:.1%}–{r.ci95[1]:.1%})")
    heads = result.heads
    sinks_ = heads[heads["sink"]]
    click.echo(f"{len(sinks_)} of {len(heads)} heads put more than {epsilon:g} of their attention on position 0; "
               f"median value-norm ratio there {sinks_['value_norm_ratio'].median():.3g}" if len(sinks_) else
               f"no head puts more than {epsilon:g} of its attention on position 0")
    if ablation and len(sinks_):
        dormant = int(sinks_["dormant"].fillna(False).astype(bool).sum())
        click.echo(f"dormant by ablation ({method}, vs {n_random} random heads): {dormant} of {len(sinks_)} sink heads")
    layer = result.first_massive_layer
    top = result.massive.sort_values("ratio_to_median", ascending=False).head(1)
    if len(top):
        t = top.iloc[0]
        click.echo(f"largest activation: layer {t.layer}, position {t.position} ({t.token!r}), dim {t.dim}: "
                   f"{t.value:.4g}, {t.ratio_to_median:.3g}× the layer median; "
                   + (f"massive (Sun et al.) from layer {layer}" if layer is not None else "none massive (Sun et al.)"))
