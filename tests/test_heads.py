"""Per-head scores: known answers on hand-built attention, a loop-by-loop reference, the runner and CLI.

Attention tensors are `[layer, head, query, key]` throughout.
"""

import gc
import json
import math
import pickle
import weakref
from typing import get_args

import numpy as np
import pandas as pd
import pytest
import torch

from headscope.analyses.heads import (
    METRICS,
    HeadScoreAccumulator,
    HeadScores,
    is_punctuation,
    score_corpus,
)
from headscope.analyses.induction import PATTERNS, detection_pattern, pattern_score, repeated_random_tokens
from headscope.analyses.metrics import (
    ROLE_LABELS, THRESHOLDS, Diagonal, KeyShare, Metric, MetricName, Pairwise, Pattern, RowStatistic, row_entropy, row_max,
)
from headscope.probe.families import family_for
from headscope.probe.blocks import Block
from headscope.probe.types import AttentionMap, Units

# The corpus metrics the loop reference below defines; test_reference_covers_the_registry keeps it honest.
# The metrics of images (patch positions): their loop reference is in tests/test_vision.py.
IMAGE_METRICS = ("registers", "attention_distance", "previous_patch", "neighbour_patches")
VISION_LANGUAGE_METRICS = ("image_share", "image_to_text")  # their hand-worked cases: tests/test_vision_language.py
CORPUS_METRICS = ("previous_token", "next_token", "self", "first_token", "cls", "sep", "punctuation",
                  "entropy", "normalized_entropy", "max_weight")


def amap(rows, *, labels=None, special=None, causal=False, level="token", token_ids=(), word_index=(), **kw):
    """A map from a `[query, key]` matrix (one head) or a `[layer, head, query, key]` tensor."""
    a = torch.as_tensor(rows, dtype=torch.float32)
    if a.dim() == 2:
        a = a[None, None]
    n = a.shape[-1]
    labels = labels or tuple(f"w{i}" for i in range(n))
    special = special or (False,) * n
    spans = tuple((0, 0) if sp else (i, i + 1) for i, sp in enumerate(special))
    return AttentionMap(text="x" * (n + 1), level=level, labels=tuple(labels), spans=spans, special=tuple(special),
                        attention=a, causal=causal, token_ids=tuple(token_ids), word_index=tuple(word_index),
                        meta={"model": "toy"}, **kw)


def value(scores: HeadScores, metric: str, layer: int = 0, head: int = 0) -> tuple[float, int]:
    row = scores.table[(scores.table.metric == metric) & (scores.table.layer == layer) & (scores.table["head"] == head)]
    assert len(row) == 1
    return float(row["value"].iloc[0]), int(row["n"].iloc[0])


def shifted(n: int, offset: int, *, fallback: str = "self") -> torch.Tensor:
    """All weight on key q + offset (or on `fallback` where that key does not exist)."""
    a = torch.zeros(n, n)
    for q in range(n):
        k = q + offset
        a[q, k if 0 <= k < n else (q if fallback == "self" else 0)] = 1
    return a


# --- known answers -------------------------------------------------------------------------------


def test_perfect_previous_token_encoder():
    s = score_corpus([amap(shifted(5, -1))], level="token")
    assert value(s, "previous_token") == (1.0, 4)
    assert value(s, "next_token") == (0.0, 4)
    assert value(s, "self") == (pytest.approx(1 / 5), 5)
    assert value(s, "entropy") == (0.0, 5)
    assert value(s, "max_weight") == (1.0, 5)
    assert list(s.roles["role"])[:1] == ["previous-token head"]


def test_perfect_next_token_encoder():
    s = score_corpus([amap(shifted(4, +1))], level="token")
    assert value(s, "next_token") == (1.0, 3)
    assert value(s, "previous_token") == (0.0, 3)
    assert "next-token head" in set(s.roles["role"])


def test_previous_token_decoder_next_token_not_applicable():
    s = score_corpus([amap(shifted(5, -1), causal=True)], level="token")
    assert value(s, "previous_token") == (1.0, 4)
    v, n = value(s, "next_token")
    assert math.isnan(v) and n == 0
    assert "next_token" not in set(s.roles["metric"])
    assert s.top("next_token").empty


def test_perfect_self():
    s = score_corpus([amap(torch.eye(4))], level="token")
    assert value(s, "self") == (1.0, 4)
    assert value(s, "previous_token")[0] == 0.0
    assert value(s, "first_token") == (0.0, 3)  # query 0 is the target itself and is left out


def test_all_to_first_token_and_cls():
    a = torch.zeros(5, 5)
    a[:, 0] = 1
    plain = score_corpus([amap(a)], level="token")
    assert value(plain, "first_token") == (1.0, 4)
    assert math.isnan(value(plain, "cls")[0]) and value(plain, "cls")[1] == 0  # no special token: n/a, not 0
    assert math.isnan(value(plain, "sep")[0])
    cls = score_corpus([amap(a, labels=("[CLS]", "a", "b", "c", "[SEP]"), special=(True, False, False, False, True))],
                       level="token")
    assert value(cls, "cls") == (1.0, 4)
    assert value(cls, "sep") == (0.0, 4)
    assert {"first-token sink", "[CLS]/BOS sink"} <= set(cls.roles["role"])


def test_sep_sink_encoder_and_decoder():
    labels, special = ("[CLS]", "a", "b", "[SEP]"), (True, False, False, True)
    a = torch.zeros(4, 4)
    a[:, 3] = 1
    s = score_corpus([amap(a, labels=labels, special=special)], level="token")
    assert value(s, "sep") == (1.0, 3)
    causal = torch.tril(torch.ones(4, 4))
    causal = causal / causal.sum(-1, keepdim=True)
    d = score_corpus([amap(causal, labels=labels, special=special, causal=True)], level="token")
    v, n = value(d, "sep")  # no query before the end can see a trailing </s>
    assert math.isnan(v) and n == 0


def test_uniform_rows_entropy():
    n = 6
    s = score_corpus([amap(torch.full((n, n), 1 / n))], level="token")
    assert value(s, "entropy") == (pytest.approx(math.log(n)), n)
    assert value(s, "normalized_entropy")[0] == pytest.approx(1.0)
    assert value(s, "max_weight")[0] == pytest.approx(1 / n)
    assert "broad head" in set(s.roles["role"])


def test_causal_uniform_rows_are_normalised_by_visible_keys():
    n = 5
    a = torch.tril(torch.ones(n, n))
    a = a / a.sum(-1, keepdim=True)
    s = score_corpus([amap(a, causal=True)], level="token")
    # row 0 sees a single key and is skipped; row q sees q + 1 keys uniformly
    assert value(s, "entropy") == (pytest.approx(np.mean([math.log(q + 1) for q in range(1, n)])), n - 1)
    assert value(s, "normalized_entropy")[0] == pytest.approx(1.0)
    assert value(s, "max_weight")[0] == pytest.approx(np.mean([1 / (q + 1) for q in range(1, n)]))


def test_punctuation():
    labels = ("Hi", ",", "you", "$", "!")
    a = torch.zeros(5, 5)
    a[:, 1] = 0.25  # ","
    a[:, 4] = 0.25  # "!"
    a[:, 3] = 0.5  # "$" is a symbol, not punctuation
    s = score_corpus([amap(a, labels=labels)], level="token")
    assert value(s, "punctuation") == (0.5, 3)  # queries "Hi", "you", "$"
    assert [is_punctuation(x) for x in ("...", "。", "«", "-", "+", "")] == [True, True, True, True, False, False]
    d = score_corpus([amap(torch.tril(torch.ones(5, 5)) / torch.arange(1, 6)[:, None], labels=labels, causal=True)],
                     level="token")
    assert value(d, "punctuation")[1] == 2  # causal: only "you" and "$" come after a punctuation mark


def test_exclude_special_drops_and_renormalises():
    labels, special = ("[CLS]", "a", "b", "c", "[SEP]"), (True, False, False, False, True)
    a = torch.zeros(5, 5)
    a[:, 4] = 0.5  # half of every row on [SEP]
    a[0, 0] = a[4, 4] = 0.5
    a[1, 1] = 0.5  # "a" has no previous word among the text's own units
    a[2, 1] = a[3, 2] = 0.5  # the rest on the previous word
    m = amap(a, labels=labels, special=special)
    kept = score_corpus([m], level="token")
    assert value(kept, "previous_token") == (pytest.approx((0 + 0 + 0.5 + 0.5 + 0) / 4), 4)
    assert value(kept, "sep") == (pytest.approx(0.5), 4)
    dropped = score_corpus([m], level="token", include_special=False)
    assert dropped.include_special is False
    assert value(dropped, "previous_token") == (1.0, 2)
    assert value(dropped, "self") == (pytest.approx(1 / 3), 3)
    assert value(dropped, "first_token") == (0.5, 2)  # "a" is now the first unit
    for sink in ("cls", "sep"):
        v, n = value(dropped, sink)
        assert math.isnan(v) and n == 0
    assert torch.equal(m.attention[0, 0], a)  # the caller's tensor is untouched


def test_word_level_aggregates_pieces():
    # tokens a ##b c; token-level previous-token pattern (row 0 on itself)
    m = amap(shifted(3, -1), labels=("a", "##b", "c"), word_index=(0, 0, 1), word_spans=((0, 2), (2, 3)))
    tok = score_corpus([m], level="token")
    word = score_corpus([m], level="word")
    assert word.level == "word" and tok.level == "token"
    # word rows: "ab" = mean of token rows 0 and 1 -> all on word 0; "c" -> token 1 -> word 0
    assert value(word, "previous_token") == (1.0, 1)
    assert value(word, "self") == (0.5, 2)
    assert value(tok, "previous_token") == (1.0, 2)
    with pytest.raises(ValueError, match="already word level"):
        HeadScoreAccumulator(level="token").update(amap(torch.eye(2), level="word"))


def test_default_follows_clark_and_is_stated():
    # [CLS] + two pieces of one word + [SEP]: Clark et al. score words and keep the special units.
    a = torch.tensor([[1.0, 0, 0, 0], [0, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 1]])
    m = amap(a, labels=("[CLS]", "ab", "##c", "[SEP]"), special=(True, False, False, True), word_index=(0, 1, 1, 2))
    s = score_corpus([m])
    explicit = score_corpus([m], level="word", include_special=True)
    pd.testing.assert_frame_equal(s.table, explicit.table)
    assert s.level == "word" and s.include_special is True
    assert value(s, "self") == (1.0, 3)  # three word units, each piece's row summed over the word's keys
    assert value(score_corpus([m], level="token"), "self") == (0.5, 4)
    assert "Clark et al. 2019" in s.setting and "default" in s.setting
    assert "default" not in score_corpus([m], level="token").setting
    assert "default" not in score_corpus([m], include_special=False).setting


# --- induction (TransformerLens head_detector) ---------------------------------------------------


def _tl_duplicate_pattern(tokens):
    """TransformerLens get_duplicate_token_head_detection_pattern, restated with numpy."""
    t = np.asarray(tokens)[None, :]
    token_pattern = np.repeat(t, t.shape[-1], axis=0)
    eq = np.equal(token_pattern, token_pattern.T).astype(int)
    np.fill_diagonal(eq, 0)
    return torch.tril(torch.as_tensor(eq).float())


def _tl_induction_pattern(tokens):
    dup = _tl_duplicate_pattern(tokens)
    shifted_ = torch.roll(dup, shifts=1, dims=1)
    return torch.tril(torch.cat((torch.zeros(dup.shape[0], 1), shifted_[:, 1:]), dim=1))


def test_detection_patterns_match_transformer_lens():
    for ids in ([1, 5, 6, 7, 5, 6, 7], [3, 3, 3, 4, 3], list(range(9)) * 2):
        assert torch.equal(detection_pattern(ids, "duplicate_token"), _tl_duplicate_pattern(ids))
        assert torch.equal(detection_pattern(ids, "induction"), _tl_induction_pattern(ids))
    assert torch.equal(detection_pattern([1, 2, 3], "previous_token"), torch.tensor([[0., 0, 0], [1, 0, 0], [0, 1, 0]]))
    with pytest.raises(ValueError, match="kind must be"):
        detection_pattern([1, 2], "copying")


def _perfect(ids, kind):
    """A causal head that puts all weight on its pattern where it has one, else on position 0."""
    p = detection_pattern(ids, kind)
    a = torch.zeros_like(p)
    for q in range(len(ids)):
        hits = p[q].nonzero()
        a[q, int(hits[0]) if len(hits) else 0] = 1
    return a


def test_perfect_induction_and_duplicate_heads():
    k = 6
    [seq] = repeated_random_tokens(range(10, 1000), n_sequences=1, length=k, seed=3, prefix=[1])
    assert len(set(seq[1 : k + 1])) == k  # no accidental repeats inside a half for this seed
    a = torch.stack([torch.stack([_perfect(seq, "induction"), _perfect(seq, "duplicate_token")])])  # [1, 2, T, T]
    m = amap(a, causal=True, token_ids=seq)
    acc = HeadScoreAccumulator(level="token")
    acc.update_repeated(m)
    s = acc.result()
    expected = k / (2 * k + 1)  # TransformerLens "mul": the first copy has nothing to match
    assert value(s, "induction", 0, 0) == (pytest.approx(expected), 2 * k + 1)
    assert value(s, "duplicate_token", 0, 1) == (pytest.approx(expected), 2 * k + 1)
    assert value(s, "duplicate_token", 0, 0)[0] == pytest.approx(0.0)
    assert s.n_sequences == 1 and s.n_texts == 0
    assert {"induction head", "duplicate-token head"} <= set(s.roles["role"])
    v, n = value(s, "previous_token")
    assert math.isnan(v) and n == 0  # no corpus text was given


def test_induction_is_mean_of_per_sequence_scores():
    seqs = repeated_random_tokens(range(50), n_sequences=3, length=4, seed=1)
    gen = torch.Generator().manual_seed(0)
    maps, per_seq = [], []
    for seq in seqs:
        a = torch.tril(torch.rand(2, 3, 8, 8, generator=gen))
        a = a / a.sum(-1, keepdim=True)
        maps.append(amap(a, causal=True, token_ids=seq))
        per_seq.append(pattern_score(a, detection_pattern(seq, "induction")))
    grid = score_corpus([], repeated=maps, level="token").grid("induction").to_numpy()
    assert np.allclose(grid, torch.stack(per_seq).mean(0).numpy(), atol=1e-12)


def test_induction_refuses_encoders_and_encoders_report_nan():
    seq = [5, 6, 5, 6]
    with pytest.raises(ValueError, match="decoders"):
        HeadScoreAccumulator(level="token").update_repeated(amap(torch.full((4, 4), 0.25), token_ids=seq))
    s = score_corpus([amap(torch.eye(3))], level="token")
    for m in ("induction", "duplicate_token"):
        v, n = value(s, m)
        assert math.isnan(v) and n == 0


def test_repeated_random_tokens_are_seeded():
    a = repeated_random_tokens([7, 8, 9], n_sequences=2, length=5, seed=4, prefix=[0])
    assert a == repeated_random_tokens([7, 8, 9], n_sequences=2, length=5, seed=4, prefix=[0])
    assert a != repeated_random_tokens([7, 8, 9], n_sequences=2, length=5, seed=5, prefix=[0])
    for s in a:
        assert s[0] == 0 and s[1:6] == s[6:] and set(s[1:]) <= {7, 8, 9}


# --- a loop-by-loop reference over random maps -----------------------------------------------------


def _reference(maps, include_special):
    """The documented definitions, written as plain loops over numbers."""
    sums = {m: {} for m in CORPUS_METRICS}
    counts = dict.fromkeys(CORPUS_METRICS, 0)
    for mp in maps:
        a = mp.attention.double().numpy()
        special = list(mp.special)
        labels = list(mp.labels)
        if not include_special:
            keep = [i for i, sp in enumerate(special) if not sp]
            a = a[:, :, keep][:, :, :, keep]
            a = a / a.sum(-1, keepdims=True)
            labels = [labels[i] for i in keep]
            special = [False] * len(keep)
        t = len(labels)
        lead = 0
        while lead < t and special[lead]:
            lead += 1
        trail = 0
        while trail < t - lead and special[t - 1 - trail]:
            trail += 1
        sets = {"first_token": [0], "cls": list(range(lead)), "sep": list(range(t - trail, t)),
                "punctuation": [i for i in range(t) if is_punctuation(labels[i]) and not special[i]]}
        for l in range(a.shape[0]):
            for h in range(a.shape[1]):
                A = a[l, h]
                acc = dict.fromkeys(CORPUS_METRICS, 0.0)
                n = dict.fromkeys(CORPUS_METRICS, 0)
                for q in range(t):
                    if q >= 1:
                        acc["previous_token"] += A[q, q - 1]
                        n["previous_token"] += 1
                    if q + 1 < t and not mp.causal:
                        acc["next_token"] += A[q, q + 1]
                        n["next_token"] += 1
                    acc["self"] += A[q, q]
                    n["self"] += 1
                    for name, keys in sets.items():
                        if keys and q not in keys and (not mp.causal or q >= min(keys)):
                            acc[name] += sum(A[q, k] for k in keys)
                            n[name] += 1
                    visible = q + 1 if mp.causal else t
                    if visible >= 2:
                        h_q = -sum(p * math.log(p) for p in A[q] if p > 0)
                        acc["entropy"] += h_q
                        acc["normalized_entropy"] += h_q / math.log(visible)
                        acc["max_weight"] += max(A[q])
                        for name in ("entropy", "normalized_entropy", "max_weight"):
                            n[name] += 1
                for name in CORPUS_METRICS:
                    sums[name][(l, h)] = sums[name].get((l, h), 0.0) + acc[name]
                    if (l, h) == (0, 0):
                        counts[name] += n[name]
    return {name: {lh: (s / counts[name] if counts[name] else float("nan")) for lh, s in d.items()}
            for name, d in sums.items()}, counts


def _random_map(gen, t, causal, with_special):
    logits = torch.randn(3, 2, t, t, generator=gen) * 2
    if causal:
        logits = logits.masked_fill(torch.ones(t, t).triu(1).bool(), float("-inf"))
    a = logits.softmax(-1)
    words = ["the", ",", "cat", ".", "sat", "!", "on", "?", "42"]
    labels = [words[int(i)] for i in torch.randint(len(words), (t,), generator=gen)]
    special = [False] * t
    if with_special:
        labels[0], special[0] = "[CLS]", True
        if not causal:
            labels[-1], special[-1] = "[SEP]", True
    return amap(a, labels=labels, special=special, causal=causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("include_special", [True, False])
def test_accumulator_matches_loop_reference(causal, include_special):
    gen = torch.Generator().manual_seed(7)
    maps = [_random_map(gen, t, causal, with_special=i % 3 != 2) for i, t in enumerate([2, 5, 9, 7, 3, 12])]
    s = score_corpus(maps, level="token", include_special=include_special)
    ref, counts = _reference(maps, include_special)
    for metric in CORPUS_METRICS:
        rows = s.table[s.table.metric == metric]
        assert (rows["n"] == counts[metric]).all(), metric
        for r in rows.itertuples():
            expected = ref[metric][(r.layer, r.head)]
            if math.isnan(expected):
                assert math.isnan(r.value), metric
            else:
                assert r.value == pytest.approx(expected, abs=1e-6), (metric, r.layer, r.head)


def test_streaming_equals_one_pass_and_keeps_no_maps():
    gen = torch.Generator().manual_seed(1)
    maps = [_random_map(gen, t, False, True) for t in (4, 6, 8, 5)]
    whole = score_corpus(maps, level="token").table
    acc = HeadScoreAccumulator(level="token")
    acc.update(maps[0])
    acc.update(maps[1])
    first = acc.result()
    acc.update(maps[2])
    acc.update(maps[3])
    pd.testing.assert_frame_equal(acc.result().table, whole)
    assert first.n_texts == 2 and not first.table.equals(whole)

    def stream():
        for t in (4, 6, 8):
            yield _random_map(gen, t, False, True)

    probe_ref = []
    acc = HeadScoreAccumulator(level="token")
    for m in stream():
        acc.update(m)
        probe_ref.append(weakref.ref(m.attention))
        del m
    gc.collect()
    assert all(r() is None for r in probe_ref), "the accumulator kept a map's attention alive"


def test_subset_of_layers_and_heads_and_mismatch():
    a = torch.rand(2, 2, 3, 3).softmax(-1)
    s = score_corpus([amap(a, layers=(1, 4), heads=(0, 7))], level="token")
    assert sorted(s.table.layer.unique()) == [1, 4] and sorted(s.table["head"].unique()) == [0, 7]
    assert s.n_layers == 2 and s.n_heads == 2
    acc = HeadScoreAccumulator(level="token")
    acc.update(amap(a, layers=(1, 4), heads=(0, 7)))
    with pytest.raises(ValueError, match="same layers/heads"):
        acc.update(amap(a))
    with pytest.raises(ValueError, match="no attention maps"):
        HeadScoreAccumulator().result()
    with pytest.raises(ValueError, match="level must be"):
        HeadScoreAccumulator(level="char")


# --- HeadScores ----------------------------------------------------------------------------------


def _scores():
    gen = torch.Generator().manual_seed(2)
    return score_corpus([_random_map(gen, t, False, True) for t in (5, 7)], level="token")


def test_every_registry_metric_appears_once_per_head_in_registry_order():
    s = _scores()
    per_head = s.table.groupby(["layer", "head"], sort=False)["metric"].apply(list)
    assert len(per_head) == 3 * 2
    for metrics in per_head:
        assert sorted(metrics) == sorted(METRICS) and len(set(metrics)) == len(metrics)
    first_seen = list(dict.fromkeys(s.table["metric"]))
    assert first_seen == list(METRICS) and s.metrics == list(METRICS)


def test_reference_covers_the_registry():
    corpus = {m for m, spec in METRICS.items() if spec.kind == "corpus"}
    pattern = {m for m, spec in METRICS.items() if spec.kind == "pattern"}
    assert corpus == set(CORPUS_METRICS) | set(IMAGE_METRICS) | set(VISION_LANGUAGE_METRICS)
    assert corpus | pattern == set(METRICS)
    assert pattern <= set(PATTERNS)  # every pattern metric has a detection pattern of its name
    for name in pattern:  # ... and is scored with it: TransformerLens's pattern, held by the entry
        assert METRICS[name].computation.pattern is PATTERNS[name]
    for name, spec in METRICS.items():
        assert spec.name == name
        assert (spec.role is None) == (spec.threshold is None), name
        lo, hi = spec.value_range
        assert hi is None or lo < hi
    assert dict(THRESHOLDS) == {m: spec.threshold for m, spec in METRICS.items() if spec.role}
    assert dict(ROLE_LABELS) == {m: spec.role for m, spec in METRICS.items() if spec.role}


def test_roles_are_the_scores_over_their_thresholds():
    s = _scores()
    expected = set()
    for r in s.table.itertuples():  # a plain loop over the table and the registry
        spec = METRICS[r.metric]
        if spec.threshold is not None and not math.isnan(r.value) and r.value >= spec.threshold:
            expected.add((r.layer, r.head, spec.role, r.metric, r.value, spec.threshold))
    got = {(r.layer, r.head, r.role, r.metric, r.value, r.threshold) for r in s.roles.itertuples()}
    assert got == expected and len(s.roles) == len(expected)
    order = [list(METRICS).index(m) for m in s.roles["metric"]]
    assert order == sorted(order)  # grouped by metric, in table order


def test_head_scores_table_grid_top_roles():
    s = _scores()
    assert list(s.table.columns) == ["model", "layer", "head", "metric", "value", "n"]
    assert list(s.roles.columns) == ["model", "layer", "head", "role", "metric", "value", "threshold"]
    assert s.model == "toy"
    assert s.to_frame() is s.table
    g = s.grid("self")
    assert g.shape == (3, 2) and list(g.index) == [0, 1, 2]
    top = s.top("self", k=4)
    assert len(top) == 4 and top["value"].is_monotonic_decreasing
    assert float(top["value"].iloc[0]) == float(g.to_numpy().max())
    assert (s.roles["value"] >= s.roles["threshold"]).all()
    with pytest.raises(KeyError, match="unknown metric"):
        s.grid("copying")
    strict = score_corpus([amap(torch.eye(3))], level="token", thresholds={"self": 1.01})
    assert strict.roles.empty
    lax = score_corpus([amap(torch.eye(3))], level="token", thresholds={"self": 0.9})
    assert list(lax.roles["role"]) == ["self (current-token) head"] and lax.roles["threshold"].iloc[0] == 0.9
    with pytest.raises(ValueError, match="no role is defined"):
        score_corpus([amap(torch.eye(3))], level="token", thresholds={"entropy": 1.0})


def test_head_scores_serialise(tmp_path):
    s = _scores()
    d = s.to_dict()
    text = json.dumps(d, allow_nan=False)  # NaN became null
    assert json.loads(text)["top"]["self"][0].keys() == {"layer", "head", "value", "n"}
    assert len(d["table"]) == len(s.table) and "table" not in s.to_dict(table=False)
    assert d["level"] == "token" and d["include_special"] is True
    back = pd.read_csv(s.save(tmp_path / "t.csv"))
    pd.testing.assert_frame_equal(back, s.table, check_dtype=False)
    pq = pd.read_parquet(s.save(tmp_path / "t.parquet"))
    pd.testing.assert_frame_equal(pq, s.table)
    with pytest.raises(ValueError, match=".csv or .parquet"):
        s.save(tmp_path / "t.xlsx")
    html = s._repr_html_()
    assert "HeadScores" in html and "previous_token" in html


# --- a registry of one's own: a new metric is one entry ------------------------------------------


def test_metric_name_literal_is_the_registry():
    # the Literal stays the one static list of the built-in names, in table order
    assert get_args(MetricName) == tuple(METRICS)
    assert all(isinstance(spec.computation, (Diagonal, KeyShare, RowStatistic, Pattern, Pairwise)) for spec in METRICS.values())


def _last_unit(labels, special):
    return [i == len(labels) - 1 for i in range(len(labels))]


THROWAWAY = {
    **METRICS,
    "two_back": Metric("two_back", "attention two units back, A[q, q-2]", Diagonal(-2),
                       role="two-back head", threshold=0.5),
    "last_unit": Metric("last_unit", "attention to the last unit", KeyShare(_last_unit),
                        role="last-unit sink", threshold=0.1),
}


def _two_heads():
    """Head 0: rows written out by hand; head 1: every row two units back (rows 0 and 1 on themselves)."""
    h0 = torch.tensor([[0.4, 0.3, 0.1, 0.1, 0.1],
                       [0.2, 0.4, 0.2, 0.0, 0.2],
                       [0.5, 0.1, 0.2, 0.1, 0.1],
                       [0.1, 0.3, 0.2, 0.2, 0.2],
                       [0.1, 0.2, 0.4, 0.3, 0.0]])
    return torch.stack([h0, shifted(5, -2)])[None]  # [layer, head, query, key]


def _blocks_of(m, rows):
    for li, layer in enumerate(m.layer_ids):
        for start in range(0, len(m), rows):
            yield Block(layer, m.head_ids, start, m.attention[li, :, start : start + rows])


def test_a_new_metric_is_one_registry_entry():
    a = _two_heads()
    m = amap(a)
    before = a.clone()
    # by hand. two_back: queries 2, 3, 4 have a key two back; head 0 puts 0.5, 0.3, 0.4 there.
    # last_unit: queries 0..3 (the last unit itself is left out), head 0: 0.1, 0.2, 0.1, 0.2; head 1: 0.
    hand = {"two_back": ([(0.5 + 0.3 + 0.4) / 3, 1.0], 3), "last_unit": ([(0.1 + 0.2 + 0.1 + 0.2) / 4, 0.0], 4)}
    whole = score_corpus([m], level="token", metrics=THROWAWAY)
    acc = HeadScoreAccumulator(level="token", metrics=THROWAWAY)
    for rows in (1, 2):  # the block path, blocks of one and of two query rows
        acc.update_blocks(Units.of(m), _blocks_of(m, rows), causal=False, layers=m.layer_ids, heads=m.head_ids)
    blocks = acc.result()
    assert blocks.n_texts == 2  # the same text twice: the same means
    for s in (whole, blocks):
        assert list(dict.fromkeys(s.table["metric"])) == list(THROWAWAY) == s.metrics  # table order = registry order
        for name, (values, n) in hand.items():
            for head, v in enumerate(values):
                got, got_n = value(s, name, head=head)
                assert got == pytest.approx(v, abs=1e-6) and got_n == n * s.n_texts, (name, head)
        assert s.grid("two_back").to_numpy().ravel().tolist() == pytest.approx([0.4, 1.0], abs=1e-6)
        assert s.top("last_unit", k=1)["head"].tolist() == [0]
        d = s.to_dict()
        assert d["thresholds"]["two_back"] == 0.5 and d["top"]["two_back"][0]["head"] == 1
        # roles: head 1 is a two-back head (1.0 >= 0.5), head 0 a last-unit sink (0.15 >= 0.1)
        roles = s.roles[s.roles["metric"].isin(["two_back", "last_unit"])]
        assert [(r.head, r.role, r.threshold) for r in roles.itertuples()] == [
            (1, "two-back head", 0.5), (0, "last-unit sink", 0.1)]
    shared = whole.table["metric"].isin(list(METRICS))  # the built-ins are as without the extra entries
    pd.testing.assert_frame_equal(whole.table[shared].reset_index(drop=True), score_corpus([m], level="token").table)
    np.testing.assert_allclose(blocks.table["value"], whole.table["value"], atol=1e-6, rtol=0)
    assert (blocks.table["n"] == 2 * whole.table["n"]).all()
    assert torch.equal(m.attention, before)  # the caller's tensor is untouched
    lax = score_corpus([m], level="token", metrics=THROWAWAY, thresholds={"two_back": 0.3})
    assert sorted(lax.roles["head"]) == [0, 1] and set(lax.roles["role"]) == {"two-back head"}
    with pytest.raises(ValueError, match="no role is defined"):
        score_corpus([m], level="token", thresholds={"two_back": 0.3})  # the default registry has no such role
    with pytest.raises(KeyError, match="unknown metric"):
        score_corpus([m], level="token").grid("two_back")


def test_row_statistics_of_a_registry_share_their_statistic():
    # entropy in bits and half the max weight: new row weights (not adjacent to the built-ins' in the
    # weight table) for statistics the built-ins compute too
    registry = {**METRICS,
                "half_max": Metric("half_max", "half the largest weight", RowStatistic(row_max, _half)),
                "entropy_bits": Metric("entropy_bits", "entropy in bits", RowStatistic(row_entropy, _per_ln2),
                                       value_range=(0.0, None), unit="bits")}
    gen = torch.Generator().manual_seed(3)
    maps = [_random_map(gen, t, causal, with_special=True) for t, causal in ((6, False), (5, True), (7, True))]
    for m in maps:
        whole = HeadScoreAccumulator(level="token", metrics=registry)
        blocks = HeadScoreAccumulator(level="token", metrics=registry)
        whole.update(m)
        blocks.update_blocks(Units.of(m), _blocks_of(m, 2), causal=m.causal, layers=m.layer_ids, heads=m.head_ids)
        for s in (whole.result(), blocks.result()):
            for mine, builtin, factor in (("half_max", "max_weight", 0.5), ("entropy_bits", "entropy", 1 / math.log(2))):
                for layer in range(3):
                    for head in range(2):
                        v, n = value(s, mine, layer, head)
                        ref, ref_n = value(s, builtin, layer, head)
                        assert v == pytest.approx(ref * factor, rel=1e-6) and n == ref_n


def _half(visible):
    return 0.5


def _per_ln2(visible):
    return 1 / math.log(2)


def test_a_registry_is_checked_kept_and_carried():
    with pytest.raises(ValueError, match="must be a Metric named 'x'"):
        HeadScoreAccumulator(metrics={**METRICS, "x": METRICS["self"]})
    with pytest.raises(ValueError, match="computation must be one of"):
        HeadScoreAccumulator(metrics={"x": Metric("x", "?", "corpus")})
    registry = dict(THROWAWAY)
    acc = HeadScoreAccumulator(level="token", metrics=registry)
    registry.pop("two_back")  # the caller's dict changing later does not reach the accumulator
    acc.update(amap(_two_heads()))
    s = acc.result()
    assert "two_back" in s.metrics and list(s.registry) == list(THROWAWAY)
    merged = acc.merged(lambda *totals: totals).result()  # what a data-parallel run does, one process
    pd.testing.assert_frame_equal(merged.table, s.table)
    assert list(merged.registry) == list(THROWAWAY)
    back = pickle.loads(pickle.dumps(score_corpus([amap(_two_heads())], level="token")))  # HeadScores still pickle
    pd.testing.assert_frame_equal(back.table, score_corpus([amap(_two_heads())], level="token").table)


# --- the runner on tiny random models ------------------------------------------------------------


def test_run_heads_tiny(tiny):
    from headscope import heads as run_heads
    from headscope.probe.forward import attention_layers
    from headscope.probe.tiny import TINY_CORPUS

    s = run_heads(tiny, TINY_CORPUS[:5], induction_sequences=3, induction_length=6, batch_size=2)
    assert s.n_texts == 5 and s.model == tiny.name
    assert s.n_layers == len(attention_layers(tiny)) and s.n_heads == tiny.config.num_attention_heads
    t = s.table
    for m in ("previous_token", "self", "first_token", "entropy", "max_weight"):
        assert t[t.metric == m]["value"].between(0, 10).all() and (t[t.metric == m]["n"] > 0).all()
    next_token = t[t.metric == "next_token"]
    induction = t[t.metric == "induction"]
    if tiny.is_causal:
        assert next_token["value"].isna().all() and (next_token["n"] == 0).all()
        assert induction["value"].between(0, 1).all() and s.n_sequences == 3
        prefix = s.meta["induction"]["prefix"]
        adds_bos = family_for(tiny.config).tokenizer == "sentencepiece"  # tiny.py's template: "<bos> $A"
        assert prefix == ([tiny.tokenizer.bos_token_id] if adds_bos else [])
    else:
        assert next_token["value"].notna().all()
        assert induction["value"].isna().all() and s.meta["induction"] is None
        cls = t[t.metric == "cls"]["value"]
        if tiny.tokenizer.cls_token_id is not None:  # [CLS] exists
            assert cls.notna().all()
        else:  # a bidirectional tower without one (SigLIP's text tower): nothing to measure, never a made-up 0
            assert cls.isna().all()


def test_run_heads_equals_notebook_path():
    from headscope import heads as run_heads, induction_inputs
    from headscope.probe import extract_ids
    from headscope.probe.extract import extract
    from headscope.probe.tiny import TINY_CORPUS, tiny_model

    lm = tiny_model("llama")
    texts = list(TINY_CORPUS)
    got = run_heads(lm, texts, level="token", include_special=False, induction_sequences=4, induction_length=5,
                    seed=9, batch_size=3)
    seqs, _ = induction_inputs(lm, n_sequences=4, length=5, seed=9)
    by_hand = score_corpus(extract(lm, texts, level="token"), repeated=extract_ids(lm, seqs),
                           model=lm.name, level="token", include_special=False)
    pd.testing.assert_frame_equal(got.table, by_hand.table, check_exact=False, rtol=1e-5, atol=1e-6)


def test_cli_matches_runner(tmp_path, monkeypatch):
    from click.testing import CliRunner

    import headscope as hs
    import headscope.commands.heads as cmd
    from headscope.probe.tiny import tiny_model

    lm = tiny_model("bert")
    monkeypatch.setattr(cmd, "load_or_fail", lambda name, *placement: lm)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": t}) if t else "" for t in ["The cat sat.", "", "Is it 42?", "No, no!"]))
    out = tmp_path / "t.csv"
    res = CliRunner().invoke(cmd.cli, ["--model", "x", "--corpus", str(corpus), "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "3 texts" in res.output and "Clark et al. 2019" in res.output and "previous_token" in res.output
    expected = hs.heads(lm, ["The cat sat.", "Is it 42?", "No, no!"]).table
    pd.testing.assert_frame_equal(pd.read_csv(out), expected, check_dtype=False)

    res = CliRunner().invoke(cmd.cli, ["--corpus", str(corpus), "--json", "--no-progress", "--level", "token",
                                       "--no-special", "--top", "2"])
    d = json.loads(res.stdout)
    assert d["level"] == "token" and d["include_special"] is False and len(d["top"]["self"]) == 2

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"txt": "oops"}\n')
    res = CliRunner().invoke(cmd.cli, ["--corpus", str(bad), "--no-progress"])
    assert res.exit_code == 2 and "line 2" in res.output
    res = CliRunner().invoke(cmd.cli, ["--out", str(tmp_path / "t.xlsx")])
    assert res.exit_code == 2 and ".csv, .parquet, .json" in res.output


def test_cli_defaults_are_the_analysis_defaults():
    import headscope as hs
    from headscope.probe.extract import extract
    from headscope.probe.tiny import TINY_CORPUS, tiny_model

    lm = tiny_model("bert")
    texts = list(TINY_CORPUS[:4])
    by_default = hs.heads(lm, texts)
    analysis = score_corpus(extract(lm, texts, level="token"), model=lm.name)
    assert (by_default.level, by_default.include_special) == (analysis.level, analysis.include_special)
    pd.testing.assert_frame_equal(by_default.table, analysis.table, check_exact=False, rtol=1e-5, atol=1e-6)



def test_heads_command_options_default_to_the_api_defaults():
    """`headscope heads` with no option runs `hs.heads` with its own defaults (benchmark item 1 reads them there)."""
    import inspect

    import headscope as hs
    from headscope.commands.heads import cli

    options = {p.name: p.default for p in cli.params}
    api = inspect.signature(hs.heads).parameters
    pairs = {"batch_size": "batch_size", "induction_seqs": "induction_sequences", "induction_length": "induction_length",
             "seed": "seed", "level": "level", "include_special": "include_special", "attention": "attention",
             "memory_budget": "budget"}
    assert {o: options[o] for o in pairs} == {o: api[a].default for o, a in pairs.items()}

# --- real models ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_previous_token_and_induction_against_raw_loops(smollm2):
    """Batched, padded, streamed analysis == plain loops over one unpadded forward pass per input."""
    from headscope.analyses.corpus import builtin_corpus
    from headscope import heads as run_heads, induction_inputs

    texts = builtin_corpus()[::53][:6]
    s = run_heads(smollm2, texts, level="token", induction_sequences=3, induction_length=15, seed=5, batch_size=4)
    seqs, prefix = induction_inputs(smollm2, n_sequences=3, length=15, seed=5)
    assert prefix == []  # SmolLM2's tokenizer adds no BOS

    def raw(ids):  # [layer][head][query][key] as nested lists, from the model itself
        with torch.inference_mode():
            out = smollm2.model.model(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False)
        return [layer[0].tolist() for layer in out.attentions]

    n_l, n_h = s.n_layers, s.n_heads
    prev = [[0.0] * n_h for _ in range(n_l)]
    n_prev = 0
    for text in texts:
        ids = smollm2.tokenizer(text)["input_ids"]
        att = raw(ids)
        n_prev += len(ids) - 1
        for l in range(n_l):
            for h in range(n_h):
                prev[l][h] += sum(att[l][h][q][q - 1] for q in range(1, len(ids)))
    ind = [[0.0] * n_h for _ in range(n_l)]
    for seq in seqs:
        att = raw(list(seq))
        targets = [(q, k) for q in range(len(seq)) for k in range(1, q + 1) if seq[k - 1] == seq[q] and k - 1 != q]
        for l in range(n_l):
            for h in range(n_h):
                rows = att[l][h]
                ind[l][h] += sum(rows[q][k] for q, k in targets) / sum(sum(r) for r in rows) / len(seqs)
    assert np.allclose(s.grid("previous_token").to_numpy(), np.array(prev) / n_prev, atol=1e-5)
    assert np.allclose(s.grid("induction").to_numpy(), np.array(ind), atol=1e-5)
    assert s.top("induction", 1)["value"].iloc[0] > 0.25  # SmolLM2 has induction heads


@pytest.mark.slow
def test_minilm_heads_are_stable_over_corpus_halves(minilm):
    from headscope.analyses.corpus import builtin_corpus
    from headscope import heads as run_heads

    texts = builtin_corpus()[:120]
    halves = [run_heads(minilm, texts[i::2], batch_size=16) for i in (0, 1)]
    for metric in ("previous_token", "next_token", "cls", "punctuation"):
        tops = [tuple(h.top(metric, 1)[["layer", "head"]].iloc[0]) for h in halves]
        assert tops[0] == tops[1], (metric, tops)
    for metric in ("previous_token", "next_token", "self", "cls", "sep", "punctuation", "normalized_entropy"):
        a, b = (h.grid(metric).to_numpy().ravel() for h in halves)
        assert np.corrcoef(a, b)[0, 1] > 0.95, metric
    prev_heads = [set(map(tuple, h.roles[h.roles.metric == "previous_token"][["layer", "head"]].to_numpy()))
                  for h in halves]
    assert prev_heads[0] == prev_heads[1] and prev_heads[0]


def test_a_new_metric_flows_through_hs_heads_and_the_report():
    """The throwaway entries, and nothing else, reach the workflow (eager and recomputed alike), the
    report's layer × head grid figures and the explorer's score grids."""
    import headscope as hs
    from headscope.probe.tiny import tiny_model
    from headscope.reports.analysis import ModelAnalysis
    from headscope.reports.panels import FIGURES
    from headscope.reports.html import explorer_data

    lm = tiny_model("gpt2")
    texts = ["The cat sat on the mat.", "A dog ran home quickly, then slept."]
    eager = hs.heads(lm, texts, metrics=THROWAWAY, induction_sequences=2, induction_length=5)
    recomputed = hs.heads(lm, texts, metrics=THROWAWAY, induction_sequences=2, induction_length=5,
                          attention="recompute", budget=2_000)
    assert eager.metrics == recomputed.metrics == list(THROWAWAY)
    np.testing.assert_allclose(recomputed.table["value"], eager.table["value"], atol=1e-5, rtol=0)
    # two_back by a plain loop over the word-level maps: A[q, q-2] averaged over the rows that have it
    maps = hs.extract(lm, texts, level="word")
    by_hand = torch.stack([m.attention[:, :, q, q - 2] for m in maps for q in range(2, len(m))]).mean(0)
    np.testing.assert_allclose(eager.grid("two_back").to_numpy(), by_hand.numpy(), atol=1e-6, rtol=0)
    analysis = ModelAnalysis(model=lm.name, scores=eager, maps=tuple(hs.extract(lm, texts[:1])))
    panels = [p.words["metric"] for p in FIGURES["head_scores"].panels(analysis)]
    # a decoder's queries never see the last unit (it comes after them): last_unit has no row, so no figure
    assert "two_back" in panels and "last_unit" not in panels and eager.grid("last_unit").isna().all().all()
    grids = explorer_data([analysis])["models"][0]["grids"]
    assert grids["two_back"]["title"] == "two back"
