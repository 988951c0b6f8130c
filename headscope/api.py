"""The public headscope API: the workflows that compose extraction (`probe`) and analysis (`analyses`).

    >>> import headscope as hs                                                   # doctest: +SKIP
    >>> lm = hs.load("minilm")                                                   # doctest: +SKIP
    >>> hs.verify(lm).passed                                                     # doctest: +SKIP
    True
    >>> scores = hs.heads(lm, hs.builtin_corpus()[:20])                          # doctest: +SKIP
    >>> result = hs.coref(lm, hs.builtin_set("agreement"))                       # doctest: +SKIP

Every function takes a loaded model (`hs.load`) and plain data, and returns a result object that
renders itself in Jupyter. The CLI commands are thin wrappers over these functions. torch and
transformers are imported when a function runs, not when `headscope` is imported, so
`import headscope` and `headscope --help` stay instant.
"""

from __future__ import annotations

import platform
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

__all__ = [
    "load", "extract", "verify", "explain", "fit_context", "heads", "induction_inputs", "extract_scores", "coref",
    "relation_probe", "probe_sets", "causal", "corpus_stats", "versions", "builtin_corpus", "builtin_set",
    "read_corpus", "read_probe_file", "analyse_model", "ModelAnalysis", "RunSettings", "REPORT_SENTENCES",
    "TOO_LONG", "DEFAULT_LEVEL", "DEFAULT_INCLUDE_SPECIAL", "Attention", "DEFAULT_ATTENTION", "memory_budget",
    "DEFAULT_TARGETS",
]

Level = Literal["token", "word"]
Weight = Literal["attention", "norm"]  # probe.types.Weight, spelled out so that `import headscope` does not import torch
# How attention is obtained (`probe.recompute`): the model's eager weights, recomputed from scratch in
# blocks of query rows, or recompute only where eager would exceed the memory budget.
Attention = Literal["eager", "recompute", "auto"]
# Eager by default: recomputed numbers agree with eager ones to about 1e-7, not bit for bit, and the
# default run must keep giving the numbers it gave.
DEFAULT_ATTENTION: Attention = "eager"

# analyses.heads.DEFAULT_LEVEL / DEFAULT_INCLUDE_SPECIAL (Clark et al. 2019), spelled out so that
# `import headscope` does not import torch; tests/test_heads.py checks they agree.
DEFAULT_LEVEL: Level = "word"
DEFAULT_INCLUDE_SPECIAL = True

TOO_LONG = "longer than the model's context"

# The sentences of the explorer and the attention figures: the it -> animal sentence, its "too
# wide" twin (where "it" is the street), and the textbook 我爱北京天安门.
REPORT_SENTENCES = (
    "The animal didn't cross the street because it was too tired.",
    "The animal didn't cross the street because it was too wide.",
    "我爱北京天安门",
)


# ---------------------------------------------------------------- models, attention, verification


def load(name: str = "minilm", *, device: str = "cpu", dtype: str = "float32", use_cache: bool = True):
    """Load a packaged model name, a local folder, a .gguf file or a hub id -> `LoadedModel`.

    >>> lm = load("minilm")                                                       # doctest: +SKIP
    >>> lm.name, lm.is_causal                                                     # doctest: +SKIP
    ('minilm', False)
    """
    from headscope.probe import load_model

    return load_model(name, device=device, dtype=dtype, use_cache=use_cache)


def extract(lm, texts: str | Iterable[str], *, level: Level = "token", weight: Weight = "attention",
            **options) -> list:
    """One `AttentionMap` per text, attention `[layer, head, query, key]` (see `probe.extract`).

    `weight="norm"`: Kobayashi et al.'s norm-based weights ‖α_ij f(x_j)‖ instead of the probabilities α,
    each query row divided by its sum; `map.weight` says which the values are.
    `options`: batch_size, layers, heads, store_dtype, truncate, segmenter, and for an encoder–decoder
    model `target` (one decoder text per source text), which gives one `Seq2SeqAttention` per pair.

    >>> from headscope.probe.tiny import tiny_model
    >>> [m] = extract(tiny_model("bert"), "The cat sat.", level="word")
    >>> m.labels[1:4], tuple(m.attention.shape[:2])
    (('The', 'cat', 'sat'), (2, 4))
    """
    from headscope.probe import extract as _extract

    return _extract(lm, texts, level=level, weight=weight, **options)


def verify(lm, texts: str | Sequence[str] | None = None, *, truncate: bool = False, **options):
    """Recompute every layer's attention from scratch and compare with the model -> `Verification`.

    >>> from headscope.probe.tiny import tiny_model
    >>> verify(tiny_model("llama")).passed
    True
    """
    from headscope.probe.verify import verify as _verify

    return _verify(lm, texts, truncate=truncate, **options)


def explain(lm, text: str, *, token: str | int, layer: int, head: int, occurrence: int = 0,
            attention: Attention = DEFAULT_ATTENTION, budget: int | None = None):
    """softmax(q·kᵀ/√d)·v for `token` as the query of one head, with the real numbers -> `Explanation`.

    `attention`/`budget` as in `heads`: recomputed, only the one layer is computed from scratch.

    >>> from headscope.probe.tiny import tiny_model
    >>> e = explain(tiny_model("bert"), "The cat sat.", token="cat", layer=1, head=2)
    >>> e.query, round(float(e.table["weight"].sum()), 6)
    ('cat', 1.0)
    """
    from headscope.probe.explain import explain as _explain

    if isinstance(occurrence, bool) or not isinstance(occurrence, int) or occurrence < 0:
        raise ValueError(f"occurrence must be 0 (the first), 1 (the second), ...; got {occurrence!r}")
    _check_attention(attention)
    return _explain(lm, text, token=token, layer=layer, head=head, occurrence=occurrence, attention=attention,
                    budget=memory_budget(budget))


def fit_context(lm, text: str) -> str:
    """`text` cut after the last token that fits `lm`'s context (special tokens included); unchanged if it fits.

    >>> from headscope.probe.tiny import tiny_model
    >>> lm = tiny_model("bert")
    >>> fit_context(lm, "The cat sat.") == "The cat sat."
    True
    >>> long = fit_context(lm, "cat " * 5000)
    >>> len(lm.tokenizer(long)["input_ids"]) <= lm.max_length < len(lm.tokenizer("cat " * 5000)["input_ids"])
    True
    """
    import warnings

    from headscope.probe.encoding import encode

    if len(lm.tokenizer(text)["input_ids"]) <= lm.max_length:
        return text
    with warnings.catch_warnings():  # the caller asked for the cut; encode's "truncating" warning says it again
        warnings.simplefilter("ignore")
        enc = encode(lm, text, truncate=True)
    return text[: max(b for (a, b), special in zip(enc.spans, enc.special) if not special)]


# ---------------------------------------------------------------- head scores


def memory_budget(value: int | None = None) -> int:
    """Bytes that eager attention may take before `attention="auto"` recomputes: `value`, or a quarter of RAM.

    >>> memory_budget(2**30)
    1073741824
    """
    if value is None:
        import psutil

        return psutil.virtual_memory().total // 4
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"memory_budget must be a positive number of bytes, got {value!r}")
    return value


def _check_attention(attention: object) -> None:
    if attention not in ("eager", "recompute", "auto"):
        raise ValueError(f"attention must be 'eager', 'recompute' or 'auto', got {attention!r}")


def heads(
    lm,
    texts: Iterable[str],
    *,
    level: Level = DEFAULT_LEVEL,
    include_special: bool = DEFAULT_INCLUDE_SPECIAL,
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
    attention: Attention = DEFAULT_ATTENTION,
    budget: int | None = None,
    weight: Weight = "attention",
    world=None,
):
    """Score every head of `lm` over `texts`, plus induction for decoders -> `HeadScores`.

    `weight="norm"` scores the heads on norm-based weights (`extract(..., weight="norm")`) instead of
    attention; the repeated random sequences are then skipped (their duplicate-token and induction
    scores read attention) and `meta["weight"]` says "norm".

    Texts stream through `probe.iter_extract` into `analyses.heads.HeadScoreAccumulator`; only
    `window` batches of attention are alive at once (sorted by length together: less padding).
    For decoders, repeated random token sequences (`induction_inputs`) give the duplicate-token
    and induction scores; `induction_sequences=0` skips them. `total` sizes the progress bar
    (stderr); `source` names the corpus in `meta`. An encoder–decoder model's texts are sources:
    its encoder's self-attention is scored (`meta["stack"] == "encoder"`), with no induction.

    `attention="recompute"` folds each text's attention in blocks of query rows recomputed from
    scratch (`probe.recompute`), so no `[layer, head, T, T]` of all layers exists; `"auto"` does so
    for the texts whose eager attention would exceed `budget` bytes (`memory_budget`). Either way
    the recomputation is first checked against the model's eager attention on the first
    recomputed text's prefix (`meta["check"]`); a mismatch raises.
    `world` (a `headscope.distributed.World`, in a torchrun run): this process scores its shard of
    the texts and of the induction sequences, and the sums are added over the processes, so every
    process returns the scores of the whole corpus.

    >>> from headscope.probe.tiny import tiny_model
    >>> s = heads(tiny_model("llama"), ["The cat sat.", "A dog ran!"], induction_sequences=2, induction_length=5)
    >>> s.n_texts, s.n_sequences, s.level
    (2, 2, 'word')
    """
    from headscope.analyses.heads import HeadScoreAccumulator
    from headscope.distributed import World, merge_head_scores, shard, shard_length, together
    from headscope.probe.forward import is_seq2seq

    _check_attention(attention)
    if weight != "attention" and attention != "eager":
        raise ValueError(f"weight={weight!r} comes from the eager forward pass; use attention='eager' with it")
    budget = memory_budget(budget)
    world = world or World()
    texts = [texts] if isinstance(texts, str) else texts  # one text, as iter_extract takes it
    acc = HeadScoreAccumulator(model=lm.name, level=level, include_special=include_special)
    texts = shard(texts, world)
    if progress:
        from tqdm.auto import tqdm

        total = None if total is None else shard_length(total, world)
        texts = tqdm(texts, total=total, desc=f"{lm.name} heads", unit="text")
    fold = _Fold(lm, acc, attention, budget, batch_size)
    with together(world):
        fold.texts(texts, level=level, truncate=truncate, window=window, weight=weight)
    meta: dict = {"corpus": source, "batch_size": batch_size, "causal": lm.is_causal}
    if is_seq2seq(lm):  # without targets, the texts are sources: the encoder's self-attention is scored
        meta["stack"] = "encoder"
    if weight != "attention":
        meta["weight"] = weight
    if lm.is_causal and induction_sequences > 0 and weight == "attention":
        sequences, prefix = induction_inputs(lm, n_sequences=induction_sequences, length=induction_length, seed=seed)
        sequences = shard(sequences, world)
        with together(world):
            fold.repeated(sequences)
        meta["induction"] = {
            "sequences": induction_sequences, "length": induction_length, "seed": seed, "prefix": list(prefix),
            "prefix_tokens": lm.tokenizer.convert_ids_to_tokens(list(prefix)),
        }
    else:
        meta["induction"] = None
    if attention != "eager":  # an eager run's output stays as it was
        meta.update(fold.record())
    return merge_head_scores(acc).result(thresholds=thresholds, meta=meta)


class _Fold:
    """Folds texts and repeated sequences into a `HeadScoreAccumulator`: eager maps in batches, or
    recomputed blocks of rows one text at a time, chosen per text by `probe.recompute.choose_attention`."""

    def __init__(self, lm, acc, attention: Attention, budget: int, batch_size: int) -> None:
        self.lm, self.acc, self.attention, self.budget, self.batch_size = lm, acc, attention, budget, batch_size
        self.counts = Counter()
        self.check = None  # probe.recompute.PrefixCheck of the first recomputed text
        n = lm.config
        self.all = dict(layers=tuple(range(n.num_hidden_layers)), heads=tuple(range(n.num_attention_heads)))

    def mode(self, n_tokens: int, batch: int) -> str:
        from headscope.probe.forward import is_seq2seq
        from headscope.probe.recompute import choose_attention, eager_bytes

        if is_seq2seq(self.lm):  # recompute mode hooks one stack of self-attention
            if self.attention == "recompute":
                raise ValueError(f"{self.lm.name} is an encoder-decoder model; recomputed attention covers "
                                 "encoders and decoders only, use attention='eager'")
            return "eager"
        return choose_attention(self.attention, eager_bytes(self.lm, n_tokens, batch=batch), self.budget)

    def texts(self, texts: Iterable[str], *, level: Level, truncate: bool, window: int,
              weight: Weight = "attention") -> None:
        from itertools import islice

        from headscope.probe import iter_extract
        from headscope.probe.encoding import check_texts, encode_many, text_units

        if self.attention == "eager":
            for amap in iter_extract(self.lm, texts, batch_size=self.batch_size, level=level, truncate=truncate,
                                     window=window, weight=weight):
                self.acc.update(amap)
            return
        stream, done = iter(texts), 0
        while chunk := list(islice(stream, self.batch_size * window)):
            try:
                chunk = check_texts(chunk)
            except (TypeError, ValueError) as exc:  # name the text by its place in the whole stream
                raise type(exc)(f"{exc} (text {done} is the first of this chunk of {len(chunk)})") from None
            encoded = encode_many(self.lm, chunk, truncate=truncate, first_index=done)
            batch = min(self.batch_size, len(chunk))
            eager = [t for t, e in zip(chunk, encoded) if self.mode(len(e.ids), batch) == "eager"]
            for amap in iter_extract(self.lm, eager, batch_size=self.batch_size, level=level, truncate=truncate,
                                     window=window):
                self.acc.update(amap)
            for enc in (e for e in encoded if self.mode(len(e.ids), batch) == "recompute"):
                self.acc.update_blocks(text_units(self.lm, enc), self.blocks(enc), causal=self.lm.is_causal,
                                       **self.all)
            self.counts["eager"] += len(eager)
            self.counts["recompute"] += len(chunk) - len(eager)
            done += len(chunk)

    def eager_texts(self, texts: Sequence[str]) -> list[str]:
        """The texts whose eager attention fits the budget (batched `batch_size` at a time)."""
        from headscope.probe.encoding import encode_many

        batch = min(self.batch_size, len(texts))
        return [t for t, e in zip(texts, encode_many(self.lm, texts)) if self.mode(len(e.ids), batch) == "eager"]

    def query_rows(self, text: str, examples: Sequence, *, level: Level, head_word: bool):
        """The query rows of one text that its probe examples' sources need, from recomputed blocks."""
        from headscope.analyses.coref import Excluded, candidate_units, query_rows
        from headscope.probe import to_word_level
        from headscope.probe.encoding import encode, text_units

        enc = encode(self.lm, text)
        units = text_units(self.lm, enc)
        scored = to_word_level(units) if level == "word" else units
        wanted: set[int] = set()
        for ex in examples:
            try:
                wanted.update(candidate_units(scored, ex, causal=self.lm.is_causal, head_word=head_word)[0])
            except Excluded:  # counted when the example is scored
                pass
        self.counts["recompute"] += 1
        return query_rows(units, self.blocks(enc) if wanted else (), wanted, level=level, causal=self.lm.is_causal,
                          meta={"model": self.lm.name}, **self.all)

    def repeated(self, sequences: Sequence[Sequence[int]]) -> None:
        from headscope.probe import extract_ids

        bs = self.batch_size
        for start in range(0, len(sequences), bs):  # one batch of maps alive at a time
            chunk = sequences[start : start + bs]
            if self.mode(max(map(len, chunk)), len(chunk)) == "eager":
                for amap in extract_ids(self.lm, chunk, batch_size=bs):
                    self.acc.update_repeated(amap)
                continue
            for seq in chunk:
                self.acc.update_repeated_blocks(seq, self.blocks(_id_item(self.lm, seq)), causal=self.lm.is_causal,
                                                **self.all)

    def blocks(self, enc):
        """The blocks of one text; the first recomputed text is checked against eager attention first."""
        from headscope.probe.recompute import DEFAULT_BUDGET, check_prefix, iter_blocks_encoded

        if self.check is None:
            self.check = check_prefix(self.lm, enc)
            if not self.check.passed:
                raise RuntimeError(f"{self.lm.name}: {self.check.summary()}; the recomputed attention cannot be "
                                   "trusted, run with attention='eager'")
        return (block for _, block in iter_blocks_encoded(self.lm, [enc], budget=min(DEFAULT_BUDGET, self.budget)))

    def record(self) -> dict:
        """What `meta` says about how attention was obtained."""
        return {"attention": {"asked": self.attention, "budget": self.budget, **{k: self.counts[k] for k in
                                                                               ("eager", "recompute")}},
                "check": None if self.check is None else self.check.to_dict()}


def _id_item(lm, seq: Sequence[int]):
    """A token-id sequence as an `Encoded` text (no text, the ids as they are)."""
    from headscope.probe.encoding import Encoded

    special = set(getattr(lm.tokenizer, "all_special_ids", []))
    ids = tuple(int(t) for t in seq)
    return Encoded(text="", ids=ids, spans=((0, 0),) * len(ids), special=tuple(t in special for t in ids))


def induction_inputs(lm, *, n_sequences: int = 20, length: int = 50, seed: int = 0):
    """Repeated random token sequences for `lm` and the prefix they start with: `(sequences, prefix)`.

    The prefix is whatever special tokens the tokenizer itself puts at the start of a text (Gemma's
    <bos>; nothing for SmolLM2, which adds none), so the sequences begin the way texts do, as
    TransformerLens's `to_tokens` prepends BOS. Random tokens are drawn from the vocabulary without
    special or added tokens.

    >>> from headscope.probe.tiny import tiny_model
    >>> seqs, prefix = induction_inputs(tiny_model("llama"), n_sequences=2, length=3)
    >>> len(seqs), all(s[len(prefix):][:3] == s[len(prefix):][3:] for s in seqs)
    (2, True)
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


# ---------------------------------------------------------------- relation and coreference probes


def extract_scores(lm, examples: Sequence, *, level: Level = "word", head_word: bool = False, batch_size: int = 8,
                   crop: bool = True, progress: bool = False, attention: Attention = DEFAULT_ATTENTION,
                   budget: int | None = None, world=None):
    """Attention from each example's source to each candidate on `lm` -> `analyses.coref.ProbeScores`.

    Texts are deduplicated and run shortest first (little padding); an example that cannot be
    scored is counted in `excluded` by reason: longer than the context, a candidate after the
    source for a decoder, a word cut from the map. The result keeps the input order.

    `crop` (decoders only): run each text only up to the end of the source's word. A causal
    model's attention from the source does not depend on anything after it, so this changes no
    number (as long as the tokenizer does not merge a token across that word boundary, which
    byte-level BPE never does) and saves the cost of the rest of a long paragraph.

    `attention` and `budget` as in `heads`: a recomputed text keeps only its sources' query rows,
    taken from the blocks as they pass (`analyses.coref.query_rows`); `data.check` records the check.
    `world` (a `headscope.distributed.World`, in a torchrun run): each process scores its shard of
    the examples and every process returns all of them, gathered.

    >>> from headscope.probe.tiny import tiny_model
    >>> data = extract_scores(tiny_model("bert"), builtin_set("agreement")[:3])
    >>> len(data), tuple(data.scores.shape[1:3])
    (3, (2, 4))
    """
    from headscope.analyses.coref import CAUSAL_REASON, collect_scores
    from headscope.probe import iter_extract

    if world is not None and world.size > 1:
        from headscope.distributed import sharded_probe_scores

        return sharded_probe_scores(lambda part: extract_scores(lm, part, level=level, head_word=head_word,
                                                                batch_size=batch_size, crop=crop, progress=progress,
                                                                attention=attention, budget=budget),
                                    examples, world)
    _check_attention(attention)
    fold = None if attention == "eager" else _Fold(lm, None, attention, memory_budget(budget), batch_size)
    excluded: Counter = Counter()
    keep = []
    for ex in examples:
        if lm.is_causal and not all(ex.preceding()):
            excluded[CAUSAL_REASON] += 1
        else:
            keep.append(ex)
    model_text = {id(ex): _cropped(ex) if crop and lm.is_causal else ex.text for ex in keep}
    texts = list(dict.fromkeys(model_text[id(ex)] for ex in keep))
    length = {t: len(lm.tokenizer(t)["input_ids"]) for t in texts}
    too_long = {t for t in texts if length[t] > lm.max_length}
    if too_long:
        excluded[f"{TOO_LONG} ({lm.max_length} tokens)"] = sum(model_text[id(ex)] in too_long for ex in keep)
        keep = [ex for ex in keep if model_text[id(ex)] not in too_long]
        texts = [t for t in texts if t not in too_long]
    texts.sort(key=lambda t: length[t])
    by_text: dict[str, list] = {}
    for ex in keep:
        by_text.setdefault(model_text[id(ex)], []).append(ex)

    eager = texts if fold is None else fold.eager_texts(texts)

    def pairs():
        maps = iter_extract(lm, eager, level=level, batch_size=batch_size, window=2)
        if progress:
            from tqdm import tqdm

            maps = tqdm(maps, total=len(eager), desc=f"{lm.name} attention", unit="text", file=sys.stderr)
        for text, amap in zip(eager, maps):
            for ex in by_text[text]:
                yield ex, amap
        for text in (t for t in texts if t not in set(eager)):
            rows = fold.query_rows(text, by_text[text], level=level, head_word=head_word)
            for ex in by_text[text]:
                yield ex, rows

    data = collect_scores(pairs(), head_word=head_word, excluded=dict(excluded))
    if fold is not None and fold.check is not None:
        data = replace(data, check=fold.check.to_dict())
    if not len(data):
        return _no_scores(lm, data, level)
    position = {id(ex): i for i, ex in enumerate(examples)}
    order = sorted(range(len(data)), key=lambda i: position[id(data.examples[i])])
    return replace(data, examples=tuple(data.examples[i] for i in order), scores=data.scores[order],
                   model=data.model or lm.name, level=level)


def _no_scores(lm, data, level: str):
    """Nothing scored: keep the model's real layers and heads so that tables still name them."""
    import torch

    n_layers, n_heads = lm.config.num_hidden_layers, lm.config.num_attention_heads
    return replace(data, scores=torch.zeros(0, n_layers, n_heads, 2), layer_ids=tuple(range(n_layers)),
                   head_ids=tuple(range(n_heads)), model=lm.name, level=level, causal=lm.is_causal)


def _cropped(ex) -> str:
    """The text up to the end of the word that holds the end of the source."""
    from headscope.probe import word_spans

    end = ex.source_span[1]
    return ex.text[: max([end] + [b for a, b in word_spans(ex.text) if a < end <= b])]


def relation_probe(lm, examples: Sequence, *, task: str, level: Level = "word", head_word: bool = False,
                   heldout: Sequence | None = None, folds: int = 5, n_perm: int = 10_000, seed: int = 0,
                   batch_size: int = 8, noun: str = "examples", progress: bool = False,
                   attention: Attention = DEFAULT_ATTENTION, budget: int | None = None, world=None):
    """Which head lets a source word attend to its target: extraction, then `analyses.coref.score_probe`.

    The head is chosen by group k-fold on `examples`; with `heldout` (a second list of examples)
    it is chosen on all of `examples` and scored on `heldout`. Returns a `ProbeResult`.
    `world`: extraction sharded over the processes of a torchrun run (`extract_scores`); every
    process then scores the gathered examples, all with the same numbers.
    (Named `relation_probe`, not `probe`, because `headscope.probe` is the extraction subpackage.)

    >>> from headscope.probe.tiny import tiny_model
    >>> r = relation_probe(tiny_model("bert"), builtin_set("verb-subject")[:20], task="verb-subject", n_perm=200)
    >>> r.n, len(r.heads)
    (20, 8)
    """
    from headscope.analyses.coref import score_probe

    kw = dict(level=level, head_word=head_word, batch_size=batch_size, progress=progress, attention=attention,
              budget=budget, world=world)
    data = extract_scores(lm, examples, **kw)
    test = None if heldout is None else extract_scores(lm, heldout, **kw)
    return score_probe(data, task=task, heldout=test, folds=folds, n_perm=n_perm, seed=seed, noun=noun)


def coref(lm, examples: Sequence, *, task: str = "coref", noun: str = "pronouns", **options):
    """Which head lets a pronoun attend to the word it refers to -> `ProbeResult` (see `relation_probe`).

    >>> import headscope as hs                                                    # doctest: +SKIP
    >>> hs.coref(hs.load("minilm"), hs.builtin_set("agreement"), task="coref-agreement").verdict  # doctest: +SKIP
    """
    return relation_probe(lm, examples, task=task, noun=noun, **options)


def probe_sets(lm, sets: Sequence[tuple[str, Sequence]], *, heldout: tuple[str, Sequence] | None = None,
               combined_task: str = "combined", level: Level = "word", head_word: bool = False, folds: int = 5,
               n_perm: int = 10_000, seed: int = 0, batch_size: int = 8, noun: str = "examples",
               progress: bool = False, attention: Attention = DEFAULT_ATTENTION, budget: int | None = None,
               world=None):
    """Score named probe sets `[(task, examples), ...]` on one model -> `(main, parts)`.

    With several sets each is scored on its own (`parts`) and `main` scores them together as
    `combined_task`; with one set `main` is that set and `parts` is empty. With `heldout` (one set
    only) `main` is the head chosen on all of the set and scored on `heldout`, and `parts` keeps
    the k-fold result inside the set: one extraction, two honest answers. `world`: as in `relation_probe`.

    >>> from headscope.probe.tiny import tiny_model
    >>> main, parts = probe_sets(tiny_model("bert"), [("a", builtin_set("agreement")[:16]),
    ...                                                ("w", builtin_set("winograd")[:16])], n_perm=200)
    >>> main.task, main.n, [p.n for p in parts]
    ('combined', 32, [16, 16])
    """
    from headscope.analyses.coref import concat_scores, score_probe

    if heldout is not None and len(sets) != 1:
        raise ValueError("a held-out set needs a single set to choose the head on")
    ex_kw = dict(level=level, head_word=head_word, batch_size=batch_size, progress=progress, attention=attention,
                 budget=budget, world=world)
    kw = dict(folds=folds, n_perm=n_perm, seed=seed, noun=noun)
    if heldout is not None:
        (task, examples), (h_task, h_examples) = sets[0], heldout
        data, test = (extract_scores(lm, exs, **ex_kw) for exs in (examples, h_examples))
        return score_probe(data, task=f"{task}->{h_task}", heldout=test, **kw), [score_probe(data, task=task, **kw)]
    data = [extract_scores(lm, exs, **ex_kw) for _, exs in sets]
    parts = [score_probe(d, task=task, **kw) for d, (task, _) in zip(data, sets, strict=True)] if len(sets) > 1 else []
    main = score_probe(concat_scores(data), task=combined_task if len(sets) > 1 else sets[0][0], **kw)
    return main, parts


def causal(lm, result, *, template: str | None = None, method: str = "zero", n_random: int = 19, seed: int = 0,
           batch_size: int = 8, max_examples: int | None = None) -> dict:
    """Ablate `result`'s best head and compare the model's preference between the candidates
    with random head sets (decoders), on the examples the head was chosen on -> a dict.

    `template` is the continuation prompt (default: `analyses.relations.COREF_TEMPLATE`); `method`
    one of `probe.interventions.ABLATION_METHODS`; `max_examples` keeps the first examples only.
    The dict is `analyses.ablation.ChoiceCheck.to_dict()` (delta of the preference, flips) with the
    template and task, or `{"skipped": why}`.
    """
    from headscope.ablation import Choice, choice_check
    from headscope.analyses.relations import COREF_TEMPLATE, continuation

    template = template or COREF_TEMPLATE
    if result.best_head is None:
        return {"skipped": "no head was selected, so there is nothing to ablate"}
    if not lm.is_causal:
        return {"skipped": f"{lm.name} is an encoder: it does not predict a continuation to compare"}
    examples = result.data.examples[:max_examples]
    prompts, options = zip(*(continuation(ex, template=template) for ex in examples))
    choice = Choice(tuple(prompts), tuple(tuple(o) for o in options), tuple(ex.answer for ex in examples))
    check = choice_check(lm, [result.best_head], choice, method=method, n_random=n_random, seed=seed,
                         batch_size=batch_size)
    return {**check.to_dict(), "prompt_template": template, "task": result.task}


# ---------------------------------------------------------------- data


def builtin_corpus() -> list[str]:
    """The packaged corpus for head scores, one text per entry."""
    from headscope.analyses.corpus import builtin_corpus as _builtin

    return _builtin()


def read_corpus(path) -> list[str]:
    """Texts from a file: one per line, or JSONL with a 'text' field (`CorpusError` names a bad line)."""
    from headscope.analyses.corpus import read_corpus as _read

    return _read(path)


def builtin_set(name: str) -> list:
    """A packaged probe set by name: agreement, winograd, verb-subject -> list of `RelationExample`.

    >>> len(builtin_set("agreement"))
    70
    """
    from headscope.analyses.relations import builtin_set as _builtin

    return _builtin(name)


def read_probe_file(path) -> list:
    """Probe examples from a JSONL file or a GAP .tsv (told apart by content)."""
    from headscope.analyses.relations import read_probe_file as _read

    return _read(path)


def corpus_stats(tokenizer, corpora: Sequence[tuple[str, str, Sequence[str]]]):
    """One row per `(name, source, texts)`: texts, words, tokens (with special tokens), tokens per
    word, longest text -> DataFrame. `tokenizer` is any Hugging Face tokenizer.

    >>> from headscope.probe.tiny import tiny_model
    >>> corpus_stats(tiny_model("bert").tokenizer, [("c", "here", ["The cat sat.", "Hi"])])[["texts", "words"]].values.tolist()
    [[2, 5]]
    """
    import pandas as pd

    from headscope.probe.words import word_spans

    rows = []
    for name, source, texts in corpora:
        texts = list(texts)
        tokens = [len(ids) for ids in tokenizer(texts)["input_ids"]] if texts else []
        words = [len(word_spans(t)) for t in texts]
        rows.append({
            "corpus": name, "source": source, "texts": len(texts), "words": sum(words), "tokens": sum(tokens),
            "tokens_per_word": sum(tokens) / max(sum(words), 1),
            "mean_tokens": sum(tokens) / max(len(texts), 1), "max_tokens": max(tokens, default=0),
        })
    return pd.DataFrame(rows)


_VERSIONED = ("torch", "transformers", "numpy", "pandas", "matplotlib", "seaborn", "jinja2", "gguf")


def versions() -> dict:
    """Versions of everything that shapes the numbers (None for a package that is not installed)."""
    from importlib import metadata

    from . import __version__

    out: dict[str, Any] = {"headscope": __version__, "python": platform.python_version(),
                           "platform": platform.platform()}
    for dist in _VERSIONED:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


# ---------------------------------------------------------------- one model, everything (`headscope run`)


@dataclass(frozen=True)
class RunSettings:
    """What a run did, as recorded in run.json and the report."""

    corpus: str  # "built-in" or a path
    coref: str  # "built-in (agreement, winograd)" or a path
    texts: tuple[str, ...]
    level: str = "word"
    include_special: bool = True
    limit: int | None = None
    induction_sequences: int = 20
    permutations: int = 10_000
    folds: int = 5
    seed: int = 0
    batch_size: int = 8
    device: str = "cpu"
    dtype: str = "float32"
    truncate: bool = False
    attention: Attention = DEFAULT_ATTENTION
    memory_budget: int | None = None  # bytes; None: a quarter of RAM (`memory_budget`)
    # An encoder–decoder model's decoder texts, one per report sentence; none: each sentence is its own
    # target (`DEFAULT_TARGETS`). One-stack models ignore them.
    targets: tuple[str, ...] = ()
    # Decoders: greedily generate this many tokens after each report sentence and record each new token's
    # attention (`headscope.generate`), which the report's explorer steps through; 0: none.
    generate: int = 0
    conllu: str | None = None  # a CoNLL-U treebank: the report gains a Syntax section (scored on it)
    select_on: str | None = None  # a second treebank to choose the syntax heads on (else a seeded half of conllu)
    # Causal evidence (`headscope.causal_evidence`): None = where it is cheap, i.e. for encoders (one
    # forward pass per head over `causal_texts` texts: seconds for minilm); a decoder adds an LM head
    # per pass, the induction ablation and three cloze checks (minutes on a CPU), so only with True.
    causal: bool | None = None
    causal_texts: int = 32
    causal_random: int = 19
    causal_examples: int = 40
    induction_k: int = 5


# What an encoder–decoder model's decoder reads when no targets are given: each report sentence itself
# (teacher-forced, as if it were the model's own output), so cross-attention has something to show.
DEFAULT_TARGETS = "each report sentence itself (no --target given)"


@dataclass(frozen=True)
class ModelAnalysis:
    """Everything `analyse_model` found for one model: the inputs of its report section and run.json entry."""

    model: str
    verification: Any  # probe.verify.Verification, or None where it could not run
    scores: Any  # analyses.heads.HeadScores
    probes: tuple  # ProbeResult, the combined one first when there are several sets
    maps: tuple  # AttentionMap of the report sentences, token level
    corpus: Any  # corpus_stats DataFrame
    info: dict
    notes: tuple[str, ...] = ()
    seconds: dict = field(default_factory=dict)
    pairs: tuple = ()  # Seq2SeqAttention of the report sentences and their targets (encoder–decoder models)
    norm_maps: tuple = ()  # the report sentences' norm-based weights, token level (none where they cannot be computed)
    generations: tuple = ()  # GenerationAttention after each report sentence (decoders, `RunSettings.generate`)
    syntax: Any = None  # analyses.syntax.SyntaxResult when settings.conllu was given
    syntax_clusters: Any = None  # its heads embedded by attention distance (analyses.syntax.head_clusters)
    causal: Any = None  # analyses.causal.CausalEvidence, or None where it was not run

    def to_dict(self) -> dict:
        """The run.json entry of this model (with "syntax" only when the syntax analysis ran)."""
        v = self.verification
        record = {
            "model": self.model, "info": self.info,
            "verification": None if v is None else v.to_dict(),
            "verified": v is not None and v.passed,
            "heads": self.scores.to_dict(table=False),
            "probes": [{k: val for k, val in p.to_dict().items() if k != "heads"} for p in self.probes],
            "notes": list(self.notes), "seconds": dict(self.seconds),
            **({"generated": [{"prompt": g.prompt.text, "text": g.text, "stopped": g.stopped} for g in self.generations]}
               if self.generations else {}),
            "causal": None if self.causal is None else self.causal.to_dict(self.scores),
        }
        if self.syntax is not None:
            record["syntax"] = self.syntax.to_dict()
        return record


class _Stages:
    """Wall time of each named stage, in seconds."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def run(self, name: str, fn, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.seconds[name] = round(time.perf_counter() - t0, 3)


def analyse_model(lm, texts: Sequence[str], sets: Sequence[tuple[str, list]], settings: RunSettings,
                  *, load_seconds: float = 0.0, progress: bool = False,
                  log: Callable[[str], None] | None = None, conllu=None, select_on=None,
                  world=None) -> ModelAnalysis:
    """Verification, head scores over `texts`, the probe sets `[(task, examples), ...]` and the maps
    of the report sentences, for one loaded model; with `settings.conllu`, the syntax analysis
    (`headscope.syntax`) and its head clusters, labelled by the head scores' roles.

    An architecture that cannot be verified is noted, not fatal. `log` receives one line per
    finished stage; `progress` shows bars on stderr. `conllu` / `select_on`: the treebanks of
    `settings.conllu` / `settings.select_on` already read (`analyses.treebank.Treebank`), so that
    several models need not read them again; by default they are read from those paths.
    finished stage; `progress` shows bars on stderr. `world` (a torchrun run): the corpus of the head
    scores and the probe examples are sharded over the processes (`heads`, `probe_sets`);
    verification and the report sentences run whole on every process.

    >>> from headscope.probe.tiny import tiny_model
    >>> s = RunSettings(corpus="c", coref="p", texts=("The cat sat.",), permutations=100, induction_sequences=0)
    >>> a = analyse_model(tiny_model("bert"), ["A dog ran."] * 4, [("t", builtin_set("agreement")[:16])], s)
    >>> a.verification.passed, [p.task for p in a.probes], len(a.maps)
    (True, ['t'], 1)
    """
    from headscope.probe.families import UnsupportedArchitecture, UnsupportedFeature

    say = log or (lambda message: None)
    stage = _Stages()
    stage.seconds["load"] = round(load_seconds, 3)
    notes: list[str] = []
    try:
        verification = stage.run("verify", verify, lm, truncate=settings.truncate)
        say(f"{lm.name}: {verification.summary()} ({stage.seconds['verify']:.1f} s)")
    except (UnsupportedArchitecture, UnsupportedFeature) as exc:
        verification = None
        notes.append(f"verification could not run: {exc}")
        say(f"{lm.name}: verification could not run: {exc}")

    scores = stage.run("heads", heads, lm, texts, level=settings.level, include_special=settings.include_special,
                       batch_size=settings.batch_size, induction_sequences=settings.induction_sequences,
                       seed=settings.seed, truncate=settings.truncate, progress=progress, total=len(texts),
                       attention=settings.attention, budget=settings.memory_budget, world=world)
    scores.meta["corpus"] = settings.corpus
    say(f"{lm.name}: head scores over {scores.n_texts} texts, {len(scores.roles)} roles "
        f"({stage.seconds['heads']:.1f} s)")
    if scores.meta.get("check"):
        say(f"{lm.name}: {scores.meta['check']['summary']}")

    main, parts = stage.run("coref", probe_sets, lm, sets,
                            combined_task="coref-builtin", level=settings.level, folds=settings.folds,
                            n_perm=settings.permutations, seed=settings.seed, batch_size=settings.batch_size,
                            noun="pronouns", attention=settings.attention, budget=settings.memory_budget,
                            world=world)
    probes = [main, *parts]  # the combined result first when there are several sets
    say(f"{lm.name}: coreference probe ({stage.seconds['coref']:.1f} s)")
    for p in probes:
        say(f"  {p.task}: {p.verdict}")

    evidence = None
    from headscope.probe.forward import is_seq2seq

    if settings.causal and is_seq2seq(lm):  # the ablation effects read one stack's output (an LM loss or an embedding)
        notes.append("causal evidence was not run: head ablation covers encoders and decoders, not encoder-decoder "
                     "models")
    elif settings.causal or (settings.causal is None and not lm.is_causal and not is_seq2seq(lm)):
        from headscope.ablation import causal_evidence

        causal_texts = [fit_context(lm, t) if settings.truncate else t for t in texts[: settings.causal_texts]]
        evidence = stage.run("causal", causal_evidence, lm, causal_texts, scores, probes,
                             n_random=settings.causal_random, induction_k=settings.induction_k,
                             cloze_examples=settings.causal_examples, seed=settings.seed,
                             batch_size=settings.batch_size, progress=progress)
        say(f"{lm.name}: causal evidence, every head ablated alone on {evidence.n_texts} texts "
            f"({stage.seconds['causal']:.1f} s)")

    maps, pairs, norm_maps = stage.run("sentences", _report_attention, lm, settings)
    generations = ()
    if settings.generate and lm.is_causal:
        generations = stage.run("generate", _generations, lm, settings)
        say(f"{lm.name}: {settings.generate} tokens generated after each report sentence "
            f"({stage.seconds['generate']:.1f} s)")
    sentences = "--text" if settings.texts != REPORT_SENTENCES else "built-in"
    corpus = corpus_stats(lm.tokenizer, [("heads corpus", settings.corpus, texts),
                                          *[(f"probe: {task}", settings.coref, [e.text for e in exs])
                                            for task, exs in sets],
                                          ("report sentences", sentences, list(settings.texts))])
    found, clusters = None, None
    if settings.conllu is not None:
        found, clusters = _syntax_stages(lm, stage, settings, scores.roles, settings.conllu if conllu is None else conllu,
                                         settings.select_on if select_on is None else select_on, progress=progress)
        say(f"{lm.name}: syntax on {found.n_sentences} test sentences ({stage.seconds['syntax']:.1f} s), "
            f"{len(clusters)} heads clustered ({stage.seconds['syntax_clusters']:.1f} s)")
    info = _model_info(lm, verification, stage.seconds)
    if pairs:
        info["targets"] = "given" if settings.targets else DEFAULT_TARGETS
    return ModelAnalysis(model=lm.name, verification=verification, scores=scores, probes=tuple(probes),
                         maps=tuple(maps), corpus=corpus, info=info, notes=tuple(notes), seconds=dict(stage.seconds),
                         pairs=tuple(pairs), norm_maps=tuple(norm_maps), generations=tuple(generations),
                         syntax=found, syntax_clusters=clusters, causal=evidence)


def _generations(lm, settings: RunSettings) -> tuple:
    from headscope.generate import generate_attention

    return tuple(generate_attention(lm, text, max_new_tokens=settings.generate) for text in settings.texts)


def _report_attention(lm, settings: RunSettings) -> tuple[list, list, list]:
    """The report sentences' maps (token level), their norm-based weights (none for an architecture
    whose attention cannot be recomputed) and, for an encoder–decoder model, each sentence with its
    target (`settings.targets`, else itself): `(maps, pairs, norm_maps)`."""
    from headscope.probe.forward import is_seq2seq
    from headscope.probe.families import UnsupportedArchitecture, UnsupportedFeature

    texts = list(settings.texts)
    maps = _sentence_maps(lm, texts, settings)
    try:
        norm_maps = extract(lm, texts, level="token", weight="norm", truncate=settings.truncate)
    except (UnsupportedArchitecture, UnsupportedFeature):
        norm_maps = []
    if not is_seq2seq(lm):
        return maps, [], norm_maps
    targets = list(settings.targets) or texts
    if len(targets) != len(texts):
        raise ValueError(f"{len(targets)} targets for {len(texts)} report sentences; give one target per sentence")
    return maps, extract(lm, texts, target=targets, level="token", truncate=settings.truncate), norm_maps


def _sentence_maps(lm, texts: list[str], settings: RunSettings) -> list:
    """Token-level maps of the report sentences; whole maps (the figures draw every head), assembled from
    recomputed blocks unless attention is eager."""
    if settings.attention == "eager":
        return extract(lm, texts, level="token", truncate=settings.truncate)
    from headscope.probe.recompute import extract as extract_blocks

    return extract_blocks(lm, texts, attention=settings.attention, budget=memory_budget(settings.memory_budget),
                          level="token", truncate=settings.truncate)


def _syntax_stages(lm, stage: _Stages, settings: RunSettings, roles, conllu, select_on, *, progress: bool):
    """The syntax analysis of `conllu` (heads chosen on `select_on`) and the clusters of its heads."""
    from headscope.syntax import syntax, syntax_clusters

    found = stage.run("syntax", syntax, lm, conllu, select_on=select_on, n_perm=settings.permutations,
                      seed=settings.seed, batch_size=settings.batch_size, progress=progress,
                      attention=settings.attention, budget=settings.memory_budget)
    clusters = stage.run("syntax_clusters", syntax_clusters, [lm], conllu, roles=roles, seed=settings.seed,
                         batch_size=settings.batch_size)
    return found, clusters


def _model_info(lm, verification, seconds: dict) -> dict:
    cfg = lm.config
    return {
        "source": lm.source, "architecture": getattr(cfg, "model_type", "unknown"),
        "family": getattr(verification, "family", None), "causal": lm.is_causal,
        "layers": getattr(cfg, "num_hidden_layers", None), "heads": getattr(cfg, "num_attention_heads", None),
        "kv_heads": getattr(cfg, "num_key_value_heads", None) or getattr(cfg, "num_attention_heads", None),
        "parameters": sum(p.numel() for p in lm.model.parameters()), "context": lm.max_length,
        "dtype": str(lm.dtype).replace("torch.", ""), "device": str(lm.device), "seconds": dict(seconds),
    }
