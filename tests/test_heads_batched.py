"""A padded batch scored at once (`HeadScoreAccumulator.update_batch`, `analyses.batches`) gives each text's
scores: checked against an independent per-text loop (plain numbers, the documented definitions), on
hand-built batches with padding edge cases and on tiny models end to end."""

from __future__ import annotations

import math

import pytest
import torch

import headscope as hs
from headscope.analyses.heads import HeadScoreAccumulator, score_corpus
from headscope.analyses.metrics import METRICS, Metric, RowStatistic, is_punctuation
from headscope.probe.extract import batches_encoded, extract, extract_ids
from headscope.probe.encoding import encode_many
from headscope.probe.tiny import tiny_model
from conftest import in_turn
from headscope.probe.types import AttentionBatch, AttentionMap, Units
from headscope.probe.words import to_word_level

CORPUS = [m for m, spec in METRICS.items() if spec.kind == "corpus" and spec.applies_to != "images"]


def _loop_scores(texts, level, include_special, causal):
    """Per text, the documented definitions as plain loops: words pooled (mean over query pieces, sum over
    key pieces), special units removed and rows renormalised, then each metric summed row by row."""
    sums, counts = {}, dict.fromkeys(CORPUS, 0)
    for units, a in texts:  # a: [layer, head, token, token] of the text alone, float64
        a = a.double()
        if level == "word":
            n_words = max(units.word_index) + 1
            pieces = [[t for t, w in enumerate(units.word_index) if w == v] for v in range(n_words)]
            words = torch.zeros(*a.shape[:2], n_words, n_words, dtype=torch.float64)
            for v, qs in enumerate(pieces):
                for w, ks in enumerate(pieces):
                    words[:, :, v, w] = a[:, :, qs][:, :, :, ks].sum(-1).mean(-1)
            a = words
            words = to_word_level(units)
            labels, special = list(words.labels), list(words.special)
        else:
            labels, special = list(units.labels), list(units.special)
        if not include_special:
            keep = [i for i, sp in enumerate(special) if not sp]
            a = a[..., keep, :][..., keep]
            a = a / a.sum(-1, keepdim=True)
            labels, special = [labels[i] for i in keep], [False] * len(keep)
        t = len(labels)
        lead = next((i for i, sp in enumerate(special) if not sp), t)
        trail = next((i for i, sp in enumerate(reversed(special[lead:])) if not sp), t - lead)
        sets = {"first_token": [0] if t else [], "cls": list(range(lead)), "sep": list(range(t - trail, t)),
                "punctuation": [i for i in range(t) if is_punctuation(labels[i]) and not special[i]],
                "registers": []}
        for l in range(a.shape[0]):
            for h in range(a.shape[1]):
                A, acc, n = a[l, h].tolist(), dict.fromkeys(CORPUS, 0.0), dict.fromkeys(CORPUS, 0)
                for q in range(t):
                    for name, d in (("previous_token", -1), ("self", 0), ("next_token", 1)):
                        if 0 <= q + d < t and not (causal and name == "next_token"):
                            acc[name] += A[q][q + d]
                            n[name] += 1
                    for name, keys in sets.items():
                        if keys and q not in keys and (not causal or q >= min(keys)):
                            acc[name] += sum(A[q][k] for k in keys)
                            n[name] += 1
                    visible = q + 1 if causal else t
                    if visible >= 2:
                        h_q = -sum(p * math.log(p) for p in A[q] if p > 0)
                        for name, v in (("entropy", h_q), ("normalized_entropy", h_q / math.log(visible)),
                                        ("max_weight", max(A[q]))):
                            acc[name] += v
                            n[name] += 1
                for name in CORPUS:
                    sums[name, l, h] = sums.get((name, l, h), 0.0) + acc[name]
                    if (l, h) == (0, 0):
                        counts[name] += n[name]
    return sums, counts


def _units(gen, t, *, causal, with_special):
    """Token units of a random text of `t` tokens: words of one to three pieces, punctuation, specials."""
    words = ["the", ",", "cat", ".", "sat", "!", "on", "?", "42"]
    special = [False] * t
    if with_special and t >= 1:
        special[0] = True
        if not causal and t >= 3:
            special[-1] = True
    labels, word_index, w = [], [], -1
    for i in range(t):
        if special[i]:
            labels.append("[CLS]" if i == 0 else "[SEP]")
            w += 1
        else:
            label = words[int(torch.randint(len(words), (1,), generator=gen))]
            continuing = word_index and not special[i - 1] and torch.rand(1, generator=gen).item() < 0.4
            labels.append("##" + label if continuing else label)
            w += not continuing
        word_index.append(w)
    text = " ".join(labels)
    spans, at = [], 0
    for lab, sp in zip(labels, special):
        spans.append((0, 0) if sp else (at, at + len(lab)))
        at += len(lab) + 1
    word_spans = [None] * (w + 1)
    for (a, b), v, sp in zip(spans, word_index, special):
        if not sp:
            word_spans[v] = (a, b) if word_spans[v] is None else (word_spans[v][0], b)
    word_spans = [s or (0, 0) for s in word_spans]
    return Units(text, "token", tuple(labels), tuple(spans), tuple(special), word_index=tuple(word_index),
                 word_spans=tuple(word_spans))


def _padded_batch(gen, lengths, *, causal, with_special, n_layers=2, n_heads=3):
    """An `AttentionBatch` of random texts (padding zero, as `probe.batches_encoded` leaves it) and each text's
    own attention, cut out independently."""
    t_max = max(lengths)
    units, own = [], []
    batch = torch.zeros(n_layers, len(lengths), n_heads, t_max, t_max)
    for b, t in enumerate(lengths):
        logits = torch.randn(n_layers, n_heads, t, t, generator=gen) * 2
        if causal:
            logits = logits.masked_fill(torch.ones(t, t).triu(1).bool(), float("-inf"))
        a = logits.softmax(-1)
        batch[:, b, :, :t, :t] = a
        own.append(a)
        units.append(_units(gen, t, causal=causal, with_special=with_special and b % 3 != 2))
    att = AttentionBatch(units=tuple(units), attention=tuple(batch), causal=causal, layers=tuple(range(n_layers)),
                         heads=tuple(range(n_heads)), meta={"model": "toy"})
    return att, list(zip(units, own))


@pytest.mark.parametrize("level", ["word", "token"])
@pytest.mark.parametrize("include_special", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_a_padded_batch_scores_as_the_per_text_loop(level, include_special, causal):
    gen = torch.Generator().manual_seed(11)
    acc = HeadScoreAccumulator(model="toy", level=level, include_special=include_special)
    texts = []
    for lengths in ([1, 5, 9, 2], [3], [7, 7, 1], [12, 4, 6, 2, 1]):  # one-token texts, a lone text, equal lengths
        batch, own = _padded_batch(gen, lengths, causal=causal, with_special=True)
        acc.update_batch(batch)
        texts += own
    sums, counts = _loop_scores(texts, level, include_special, causal)
    s = acc.result()
    assert s.n_texts == len(texts)
    for r in s.table[s.table.metric.isin(CORPUS)].itertuples():
        assert r.n == counts[r.metric], r.metric
        if counts[r.metric] == 0:
            assert math.isnan(r.value), r.metric
        else:
            assert r.value == pytest.approx(sums[r.metric, r.layer, r.head] / counts[r.metric], abs=1e-6), r


def test_batched_and_per_map_scores_agree_on_any_registry():
    """A registry's own statistic that reads every key (not zero-free) gets each text's own keys only."""
    width = Metric("width", "keys per row", RowStatistic(lambda a: a.new_full(a.shape[:-1], float(a.shape[-1]))),
                   value_range=(0.0, None))
    registry = {**METRICS, "width": width}
    gen = torch.Generator().manual_seed(3)
    batch, own = _padded_batch(gen, [2, 6, 4], causal=False, with_special=True)
    acc = HeadScoreAccumulator(model="toy", level="token", metrics=registry)
    acc.update_batch(batch)
    per_map = HeadScoreAccumulator(model="toy", level="token", metrics=registry)
    for units, a in own:
        per_map.update(AttentionMap(text=units.text, level="token", labels=units.labels, spans=units.spans,
                                       special=units.special, attention=a, causal=False, word_index=units.word_index,
                                       word_spans=units.word_spans))
    a, b = acc.result().table, per_map.result().table
    assert (a.n == b.n).all()
    assert ((a.value - b.value).abs().fillna(0) <= 1e-6).all()
    assert a[a.metric == "width"].value.iloc[0] == pytest.approx((2 * 2 + 6 * 6 + 4 * 4) / (2 + 6 + 4))  # each row: its own keys


@pytest.mark.parametrize("tiny, setting", in_turn(("word", True), ("token", False), ("word", False), ("token", True)),
                         indirect=["tiny"])
def test_a_tiny_model_batch_is_its_texts_maps(tiny, setting):
    """Every one-stack family (hybrids, sinks, windows, ALiBi ...), each with one setting in turn:
    `probe.batches_encoded` gives each text's own map in its block of the padded batch, the padding exact
    zeros; and `hs.heads` (batched) scores as the per-map path on the same texts."""
    level, include_special = setting
    texts = ["The cat sat.", "A", "Dogs, cats and birds!", "It didn't rain today, sadly.", "x y"]
    maps = {m.text: m for m in extract(tiny, texts)}
    for streamed in batches_encoded(tiny, encode_many(tiny, texts), batch_size=3):
        batch = streamed.collect()
        assert batch.n_tokens == streamed.n_tokens and batch.units == streamed.units
        for i, u in enumerate(batch.units):
            n = len(u)
            for layer, a in enumerate(batch.attention):
                torch.testing.assert_close(a[i, :, :n, :n], maps[u.text].attention[layer], atol=1e-6, rtol=0)
                assert not a[i, :, n:].any() and not a[i, :, :, n:].any()
    new = hs.heads(tiny, texts, level=level, include_special=include_special, induction_sequences=0, batch_size=2,
                   window=2).table
    old = score_corpus(list(maps.values()), level=level, include_special=include_special).table
    assert (new.n == old.n).all() and (new.value.isna() == old.value.isna()).all()
    assert float((new.value - old.value).abs().max()) <= 1e-6


def test_batches_leave_no_map_and_say_what_they_cover():
    lm = tiny_model("llama")
    [streamed] = batches_encoded(lm, encode_many(lm, ["one two", "three"]), batch_size=8)
    batch = streamed.collect()
    assert len(batch) == 2 and batch.causal and batch.layers == tuple(range(lm.config.num_hidden_layers))
    assert [u.text for u in batch.units] == ["three", "one two"]  # sorted by length
    assert all(a.shape[:2] == (2, lm.config.num_attention_heads) for a in batch.attention)


def test_repeated_sequences_batched_score_as_each_sequence():
    """Duplicate-token and induction of a padded batch of token-id sequences (uneven lengths): per sequence
    `Σ A⊙P / Σ A` by plain loops over its own map, averaged over the sequences."""
    from headscope.probe.sources import source_for

    lm = tiny_model("llama")
    seqs, _ = hs.induction_inputs(lm, n_sequences=5, length=6, seed=2)
    seqs[1], seqs[3] = seqs[1][:8], seqs[3][:1]  # shorter ones: padding inside the batch, a one-token sequence
    acc = HeadScoreAccumulator(model=lm.name)
    for batch in source_for(lm, "eager", batch_size=4).sequences(seqs, batched=True):
        acc.update_repeated_batch(batch.collect())
    s = acc.result()
    maps = {tuple(m.token_ids): m.attention.double() for m in extract_ids(lm, seqs)}
    for r in s.table[s.table.metric.isin(["duplicate_token", "induction"])].itertuples():
        scores = []
        for seq in seqs:
            a, t = maps[tuple(seq)][r.layer, r.head].tolist(), len(seq)
            if r.metric == "duplicate_token":  # an earlier copy of the query's token
                hits = [(q, k) for q in range(t) for k in range(q) if seq[k] == seq[q]]
            else:  # the token after an earlier copy
                hits = [(q, k) for q in range(t) for k in range(1, q + 1) if seq[k - 1] == seq[q]]
            scores.append(sum(a[q][k] for q, k in hits) / sum(map(sum, a)))
        assert r.n == sum(map(len, seqs)) and r.value == pytest.approx(sum(scores) / len(seqs), abs=1e-9), r


@pytest.mark.parametrize("include_special", [True, False])
def test_scored_rows_are_each_texts_own_pooled_map(include_special):
    """`BatchRows.scored` (query pieces summed by `index_add_`, keys and key sets by one matmul) against a
    per-text loop: text i's block is its own word map (mean over query pieces, sum over key pieces, special
    words removed and rows renormalised), its extra columns each key set's share, zeros past its words."""
    from headscope.analyses.batches import BatchRows

    gen = torch.Generator().manual_seed(5)
    plan = HeadScoreAccumulator(model="toy")._plan
    batch, own = _padded_batch(gen, [6, 1, 9, 4], causal=False, with_special=True)
    rows = BatchRows.of(batch.units, plan, causal=False, level="word", include_special=include_special,
                        n_tokens=batch.attention[0].shape[-1])
    u = rows.scored(batch.attention)  # [text, query, layer, head, column]
    n, s = rows.n_units, len(plan.key_shares)
    assert u.shape[-1] == n + rows.extra and rows.extra == s + (not include_special)
    for i, (units, a) in enumerate(own):
        a = a.double()
        words = to_word_level(units)
        keep = [w for w, sp in enumerate(words.special) if include_special or not sp]
        pieces = [[t for t, w in enumerate(units.word_index) if w == v] for v in keep]
        m = torch.zeros(*a.shape[:2], len(keep), len(keep), dtype=torch.float64)
        for x, qs in enumerate(pieces):
            for y, ks in enumerate(pieces):
                m[:, :, x, y] = a[:, :, qs][:, :, :, ks].sum(-1).mean(-1)
        if not include_special:
            m = m / m.sum(-1, keepdim=True)
        k = len(keep)
        got = u[i, :k, :, :, :k].permute(1, 2, 0, 3).double()  # [layer, head, query, key]
        torch.testing.assert_close(got, m, atol=1e-6, rtol=0)
        assert not u[i, k:].any() and not u[i, :, :, :, k:n].any()
        members = rows.targets[i, :k].double()  # [word, set]
        torch.testing.assert_close(u[i, :k, :, :, n : n + s].permute(1, 2, 0, 3).double(), m @ members, atol=1e-6, rtol=0)


def test_layer_by_layer_folds_score_as_the_whole_batch():
    """`hs.heads` scores each batch's layers as its forward pass gives them (a "layers" `Reading`'s `run` into
    `HeadScoreAccumulator.batch_fold`): the scores of the whole-batch path (`update_batch`,
    `update_repeated_batch` of the batch with every layer at once), bit for bit, with the caller's batch
    tensors and the model untouched, and within 1e-6 of each text's and sequence's own map scored alone; a
    fold that is not committed adds nothing."""
    from headscope.probe.sources import source_for

    lm = tiny_model("llama")
    texts = ["The cat sat.", "A", "Dogs, cats and birds!", "It didn't rain today, sadly.", "x y"]
    seqs, _ = hs.induction_inputs(lm, n_sequences=5, length=6, seed=2)
    weights = {k: v.clone() for k, v in lm.model.state_dict().items()}
    source = source_for(lm, "eager", batch_size=2)
    whole, layerwise = HeadScoreAccumulator(model=lm.name), HeadScoreAccumulator(model=lm.name)
    for repeated, batches in ((False, source.texts(texts, batched=True)), (True, source.sequences(seqs, batched=True))):
        for batch in batches:
            collected = batch.collect()
            kept = [a.clone() for a in collected.attention]
            (whole.update_repeated_batch if repeated else whole.update_batch)(collected)
            assert all(torch.equal(a, k) for a, k in zip(collected.attention, kept))
            before = layerwise.result().table if layerwise.units else None
            batch.run(layerwise.batch_fold(batch, repeated=repeated))  # run, never committed: nothing added
            if before is not None:
                assert layerwise.result().table.equals(before)
            fold = layerwise.batch_fold(batch, repeated=repeated)
            batch.run(fold)
            fold.commit()
    a, b = whole.result().table, layerwise.result().table
    assert a.equals(b) and a.metric.isin(["duplicate_token", "induction"]).any() and a.value.notna().any()
    per_map = HeadScoreAccumulator(model=lm.name)  # each text's and sequence's own map, no batch at all
    for m in extract(lm, texts):
        per_map.update(m)
    for m in extract_ids(lm, seqs):
        per_map.update_repeated(m)
    c = per_map.result().table
    assert (c.n == b.n).all() and (c.value.isna() == b.value.isna()).all()
    assert float((c.value - b.value).abs().max()) <= 1e-6
    workflow = hs.heads(lm, texts, induction_sequences=5, induction_length=6, seed=2, batch_size=2).table
    assert workflow.value.equals(b.value)  # the workflow is this layer-by-layer path
    assert all(torch.equal(v, weights[k]) for k, v in lm.model.state_dict().items())


def test_small_layers_held_and_scored_together_score_as_each_layer_alone(monkeypatch):
    """A fold holds a batch's small layers up to `_FOLD_BYTES` and scores them stacked; one byte makes it
    score every layer alone as it comes: the same scores up to the order of float32 additions (the stacked
    matmuls sum in another order)."""
    from headscope.analyses import heads as heads_module

    lm = tiny_model("bert")
    texts = ["The cat sat.", "A", "Dogs, cats and birds!", "It didn't rain today, sadly.", "x y"]
    stacked = hs.heads(lm, texts, batch_size=2).table
    monkeypatch.setattr(heads_module, "_FOLD_BYTES", 1)
    alone = hs.heads(lm, texts, batch_size=2).table
    assert stacked.value.notna().any() and (stacked.value.isna() == alone.value.isna()).all()
    assert float((stacked.value - alone.value).abs().max()) <= 1e-6
