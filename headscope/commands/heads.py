"""`headscope heads`: what every head does over a corpus, as one tidy table.

`run_heads(lm, texts)` is the model-running part (the notebook API and the CLI share it): texts
stream through `probe.iter_extract` into `analyses.heads.HeadScoreAccumulator`, then — for decoders —
repeated random token sequences go through `probe.extract_ids` for the duplicate-token and induction
scores. Only one window of batches' attention is alive at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Literal, Mapping

import click

from ..common import echo_json, fail, finish, load_or_fail, model_options, verify_option, verify_step

__all__ = ["cli", "run_heads", "induction_inputs"]

# analyses.heads.DEFAULT_LEVEL / DEFAULT_INCLUDE_SPECIAL (Clark et al. 2019), spelled out so that
# `headscope --help` does not import torch; tests/test_heads.py checks they agree.
CLI_LEVEL = "word"
CLI_INCLUDE_SPECIAL = True


def run_heads(
    lm,
    texts: Iterable[str],
    *,
    level: Literal["token", "word"] = CLI_LEVEL,
    include_special: bool = CLI_INCLUDE_SPECIAL,
    batch_size: int = 8,
    window: int = 4,
    induction_sequences: int = 20,
    induction_length: int = 50,
    seed: int = 0,
    truncate: bool = False,
    thresholds: Mapping[str, float] | None = None,
    progress: bool = False,
    total: int | None = None,
    source: str | None = None,
):
    """Score every head of `lm` (a `probe.LoadedModel`) over `texts`, plus induction for decoders.

    `window` batches are sorted by length together (less padding) and alive at once; `total` sizes
    the progress bar; `source` names the corpus in `meta`. `induction_sequences=0` skips the
    repeated-token scores. Returns `analyses.heads.HeadScores`.

    >>> from headscope.probe.tiny import tiny_model
    >>> s = run_heads(tiny_model("llama"), ["The cat sat.", "A dog ran!"], induction_sequences=2, induction_length=5)
    >>> s.n_texts, s.n_sequences, s.level
    (2, 2, 'word')
    """
    from headscope.analyses.heads import HeadScoreAccumulator
    from headscope.probe import extract_ids, iter_extract

    acc = HeadScoreAccumulator(model=lm.name, level=level, include_special=include_special)
    maps = iter_extract(lm, texts, batch_size=batch_size, level=level, truncate=truncate, window=window)
    if progress:
        from tqdm.auto import tqdm

        maps = tqdm(maps, total=total, desc=f"{lm.name} heads", unit="text")
    for amap in maps:
        acc.update(amap)
    meta: dict = {"corpus": source, "batch_size": batch_size, "causal": lm.is_causal}
    if lm.is_causal and induction_sequences > 0:
        sequences, prefix = induction_inputs(lm, n_sequences=induction_sequences, length=induction_length, seed=seed)
        for start in range(0, len(sequences), batch_size):  # one batch of maps alive at a time
            for amap in extract_ids(lm, sequences[start : start + batch_size], batch_size=batch_size):
                acc.update_repeated(amap)
        meta["induction"] = {
            "sequences": induction_sequences, "length": induction_length, "seed": seed, "prefix": list(prefix),
            "prefix_tokens": lm.tokenizer.convert_ids_to_tokens(list(prefix)),
        }
    else:
        meta["induction"] = None
    return acc.result(thresholds=thresholds, meta=meta)


def induction_inputs(lm, *, n_sequences: int = 20, length: int = 50, seed: int = 0):
    """Repeated random token sequences for `lm` and the prefix they start with.

    The prefix is whatever special tokens the tokenizer itself puts at the start of a text (Gemma's
    <bos>; nothing for SmolLM2, which adds none), so the sequences begin the way texts do, as
    TransformerLens's `to_tokens` prepends BOS. Random tokens are drawn from the vocabulary without
    special or added tokens.
    """
    from headscope.analyses.induction import repeated_random_tokens

    tok = lm.tokenizer
    enc = tok("a", add_special_tokens=True, return_special_tokens_mask=True)
    prefix = []
    for i, sp in zip(enc["input_ids"], enc["special_tokens_mask"]):
        if not sp:
            break
        prefix.append(int(i))
    excluded = set(getattr(tok, "all_special_ids", [])) | set(getattr(tok, "added_tokens_decoder", {}) or {})
    size = min(len(tok), lm.config.vocab_size)
    candidates = [i for i in range(size) if i not in excluded]
    return repeated_random_tokens(candidates, n_sequences=n_sequences, length=length, seed=seed, prefix=prefix), prefix


@click.command()
@click.option("--model", "model_name", default="minilm", show_default=True, help="Packaged name, folder or hub id.")
@click.option("--corpus", "corpus_path", type=click.Path(dir_okay=False), default=None,
              help="Text file (one text per line) or JSONL with a 'text' field; default: the built-in corpus.")
@click.option("--level", type=click.Choice(["token", "word"]), default=CLI_LEVEL, show_default=True,
              help="Score sub-word tokens or words (Clark et al. 2019 aggregation).")
@click.option("--special/--no-special", "include_special", default=CLI_INCLUDE_SPECIAL, show_default=True,
              help="Keep [CLS]/[SEP]/<bos> as units, or drop them and renormalise each row.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Use only the first N texts.")
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--top", "k", type=click.IntRange(min=1), default=3, show_default=True, help="Heads listed per metric.")
@click.option("--induction-seqs", type=click.IntRange(min=0), default=20, show_default=True,
              help="Repeated random sequences for the induction/duplicate scores (decoders; 0 skips).")
@click.option("--induction-length", type=click.IntRange(min=2), default=50, show_default=True,
              help="Random tokens per half of each repeated sequence.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random sequences.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Write the full tidy table here (.csv or .parquet).")
@click.option("--truncate", is_flag=True, help="Cut texts longer than the model's context instead of failing.")
@click.option("--no-progress", is_flag=True, help="No progress bar on stderr.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object (settings, top heads, roles); the full table goes to --out.")
@verify_option
@model_options
def cli(model_name, corpus_path, level, include_special, limit, batch_size, k, induction_seqs, induction_length,
        seed, out_path, truncate, no_progress, as_json, device, dtype, no_verify) -> None:
    """Score every head over a corpus: previous/next token, self, sinks, punctuation, entropy, induction."""
    from itertools import islice

    from headscope.analyses.corpus import CorpusError, builtin_corpus, iter_corpus

    if out_path and Path(out_path).suffix not in (".csv", ".parquet"):
        fail(f"--out {out_path}: use a .csv or .parquet file name")
    try:
        if corpus_path is None:
            texts, source = builtin_corpus(), "built-in corpus"
            total = len(texts)
        else:
            # One checking pass first, so a bad line fails before the model loads; then the texts stream.
            total = sum(1 for _ in iter_corpus(corpus_path))
            if not total:
                fail(f"{corpus_path} holds no texts (only empty lines); give one text per line")
            texts, source = iter_corpus(corpus_path), str(corpus_path)
    except (CorpusError, OSError, ValueError) as exc:
        fail(str(exc))
    if limit:
        texts, total = islice(texts, limit), min(total, limit)
    lm = load_or_fail(model_name, device, dtype)
    verification = verify_step(lm, enabled=not no_verify)
    try:
        scores = run_heads(lm, texts, level=level, include_special=include_special, batch_size=batch_size,
                           induction_sequences=induction_seqs, induction_length=induction_length, seed=seed,
                           truncate=truncate, progress=not no_progress, total=total, source=source)
    except (TypeError, ValueError) as exc:
        fail(str(exc))
    if out_path:
        try:
            scores.save(out_path)
        except (OSError, ImportError) as exc:
            fail(f"could not write {out_path}: {exc}")
    if as_json:
        echo_json(scores.to_dict(k=k, table=False) | {"out": out_path, "verification": verification})
    else:
        click.echo(verification["summary"])
        _print(scores, k, source, out_path)
    finish(verification)


def _print(scores, k: int, source: str, out_path: str | None) -> None:
    from headscope.analyses.heads import METRICS

    click.echo(f"{scores.model}: {scores.n_layers} layers × {scores.n_heads} heads, {scores.n_texts} texts from {source}")
    click.echo(f"setting: {scores.setting}")
    ind = scores.meta.get("induction")
    if ind:
        prefix = " ".join(ind["prefix_tokens"]) or "no BOS (the tokenizer adds none)"
        click.echo(f"induction: {ind['sequences']} sequences of prefix [{prefix}] + {ind['length']} random tokens "
                   f"× 2, seed {ind['seed']}; score Σ A⊙P / Σ A (TransformerLens head_detector, 'mul'), token level")
    elif scores.meta.get("causal"):
        click.echo("induction / duplicate-token: skipped (--induction-seqs 0)")
    else:
        click.echo("induction / duplicate-token: not applicable to an encoder (bidirectional attention)")
    click.echo(f"{'metric':<19} {'n':>7}  top {k} heads (layer.head value)")
    for m in METRICS:
        top = scores.top(m, k)
        n = int(scores.table.loc[scores.table["metric"] == m, "n"].iloc[0])
        cells = "   ".join(f"L{r.layer}.H{r.head} {r.value:.3f}" for r in top.itertuples()) or "n/a"
        click.echo(f"{m:<19} {n:>7}  {cells}")
    click.echo(f"roles (a head's score >= the threshold; {len(scores.roles)} in all):" if len(scores.roles)
               else "roles: no head reaches a threshold")
    for (role, metric), rows in scores.roles.groupby(["role", "metric"], sort=False):
        shown = ", ".join(f"L{r.layer}.H{r.head} {r.value:.3f}" for r in rows.head(5).itertuples())
        more = f" (+{len(rows) - 5} more)" if len(rows) > 5 else ""
        click.echo(f"  {role} ({metric} >= {rows['threshold'].iloc[0]:g}): {len(rows)} — {shown}{more}")
    if out_path:
        click.echo(f"wrote {len(scores.table)} rows to {out_path}")
