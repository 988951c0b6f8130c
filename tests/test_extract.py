"""Extraction, words, from-scratch attention and verification on tiny random models: seconds, no weights."""

import dataclasses

import pytest
import torch

from headscope.probe import AttentionMap, extract_ids, to_word_level, word_spans

from headscope.probe.extract import extract
from headscope.probe.families import UnsupportedArchitecture, UnsupportedFeature, family_for
from headscope.probe.explain import explain, permutation_check, scale_effect
from headscope.probe.forward import attention_layers, base_model
from headscope.probe.scratch import build_mask, stable_softmax
from headscope.probe.tiny import tiny_model
from headscope.probe.verify import verify

TEXTS = [
    "The animal didn't cross the street because it was too tired.",
    "我爱北京天安门",
    "Is it 42?",
]


def _sink(m: AttentionMap):
    """What a row leaves to learned sinks: nothing (rows sum to 1) unless the model has them (gpt-oss)."""
    if m.sinks:
        assert m.sink_share.min() > 1e-4  # the tiny gpt-oss gives its sinks a visible share
        return m.sink_share
    assert m.sink_share is None
    return 0.0


def test_shapes_rows_and_specials(tiny):
    maps = extract(tiny, TEXTS, batch_size=2)
    assert [m.text for m in maps] == TEXTS  # input order survives length sorting
    for m in maps:
        L, H = len(attention_layers(tiny)), tiny.config.num_attention_heads  # a hybrid stack: attention layers only
        assert m.attention.shape == (L, H, len(m), len(m))
        torch.testing.assert_close(m.attention.sum(-1) + _sink(m), torch.ones(L, H, len(m)), atol=1e-5, rtol=0)
        assert len(m.word_index) == len(m)
        for (a, b), sp in zip(m.spans, m.special):
            assert (a, b) == (0, 0) if sp else 0 <= a < b <= len(m.text)


def test_decoders_are_causal(tiny):
    [m] = extract(tiny, TEXTS[0])
    upper = torch.triu(torch.ones(len(m), len(m), dtype=torch.bool), diagonal=1)
    if tiny.is_causal:
        assert m.attention[..., upper].abs().max() == 0
    else:  # every query sees the key after it; all later keys, except in a local band (ModernBERT)
        assert m.attention.diagonal(offset=1, dim1=-2, dim2=-1).min() > 0
        assert m.attention[0][..., upper].min() > 0  # layer 0 is global in every encoder family


def test_batch_equals_single(tiny):
    batched = extract(tiny, TEXTS, batch_size=3)
    for text, b in zip(TEXTS, batched):
        [single] = extract(tiny, text, batch_size=1)
        torch.testing.assert_close(b.attention, single.attention, atol=1e-5, rtol=0)


def test_layer_head_selection_and_store_dtype(tiny):
    [full] = extract(tiny, TEXTS[0])
    [part] = extract(tiny, TEXTS[0], layers=[1], heads=[0, 2], store_dtype=torch.float16)
    assert part.attention.dtype == torch.float16 and part.layer_ids == (1,) and part.head_ids == (0, 2)
    row = full.layer_ids.index(1)  # the row of the model's layer 1 (in a hybrid stack, not row 1)
    torch.testing.assert_close(part.attention.float(), full.attention[row : row + 1][:, [0, 2]], atol=1e-3, rtol=0)
    with pytest.raises(ValueError, match="out of range"):
        extract(tiny, TEXTS[0], layers=[99])


def test_word_level_rows_sum_to_one(tiny):
    [w] = extract(tiny, TEXTS[0], level="word")
    assert w.level == "word"
    words = [lab for lab, sp in zip(w.labels, w.special) if not sp]
    # Words come from the text; a token spanning two words (a tiny SentencePiece's "tired.") merges them.
    assert "".join(words) == TEXTS[0].replace(" ", "")
    assert {"animal", "didn't", "street", "it"} <= set(words)
    torch.testing.assert_close(w.attention.sum(-1) + _sink(w), torch.ones(w.attention.shape[:-1]), atol=1e-5, rtol=0)
    assert w.labels[w.find("it")] == "it"


def test_chinese_one_word_per_character(tiny):
    [w] = extract(tiny, "我爱北京天安门", level="word")
    words = [lab for lab, sp in zip(w.labels, w.special) if not sp]
    assert "".join(words) == "我爱北京天安门"
    if tiny.model_type == "bert":  # WordPiece splits CJK per character; the tiny BPEs learned "我爱北京" whole
        assert words == list("我爱北京天安门")


def test_word_aggregation_known_answer():
    a = torch.tensor([[[[0.5, 0.25, 0.25], [0.2, 0.4, 0.4], [0.1, 0.6, 0.3]]]])  # [layer, head, query, key]
    m = AttentionMap(text="ab c", level="token", labels=("a", "##b", "c"), spans=((0, 1), (1, 2), (3, 4)),
                     special=(False,) * 3, attention=a, causal=False, word_index=(0, 0, 1), word_spans=((0, 2), (3, 4)))
    w = to_word_level(m)
    # keys summed within a word, queries averaged: row "ab" = mean([.5+.25, .25], [.2+.4, .4]) = [.675, .325]
    torch.testing.assert_close(w.attention[0, 0], torch.tensor([[0.675, 0.325], [0.70, 0.30]]))
    assert w.labels == ("ab", "c")
    assert torch.equal(m.attention, a)  # the caller's tensor is untouched


def test_multiword_token_merges_words():
    from headscope.probe.words import assign_words

    units, spans, _ = assign_words("我爱北京", [(0, 1), (1, 2), (2, 4)], [False] * 3)
    assert units == [0, 1, 2] and spans[2] == (2, 4)


def test_custom_segmenter():
    text = "我爱北京天安门"
    assert word_spans(text, lambda t: [(0, 1), (1, 2), (2, 4), (4, 7)]) == [(0, 1), (1, 2), (2, 4), (4, 7)]
    with pytest.raises(ValueError, match="overlapping"):
        word_spans(text, lambda t: [(0, 3), (2, 4)])


@pytest.mark.parametrize("bad, err, match", [
    ("", ValueError, "text 0 is empty"),
    ("   ", ValueError, "empty"),
    (b"bytes", TypeError, "not a str"),
    (["ok", 3], TypeError, "text 1 is a int"),
])
def test_bad_input(tiny, bad, err, match):
    with pytest.raises(err, match=match):
        extract(tiny, bad)


def test_context_limit_errors_or_truncates(tiny):
    long = "word " * 300  # the tiny configs take 128 positions
    with pytest.raises(ValueError, match="takes at most 128"):
        extract(tiny, long)
    with pytest.warns(UserWarning, match="truncating"):
        [m] = extract(tiny, long, truncate=True)
    assert len(m) == 128


def test_extract_ids(tiny):
    [m] = extract_ids(tiny, [[5, 6, 7, 5, 6, 7]])
    assert m.attention.shape[-1] == 6 and m.token_ids == (5, 6, 7, 5, 6, 7)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        extract_ids(tiny, [[10**7]])


# --- from-scratch attention -----------------------------------------------------------------


def test_stable_softmax_does_not_overflow():
    p = stable_softmax(torch.tensor([[1e4, 1e4 - 1.0, -float("inf")]]))
    assert torch.isfinite(p).all() and p[0, 2] == 0
    torch.testing.assert_close(p.sum(-1), torch.ones(1))


def test_mask_causal_sliding_padding():
    m = build_mask(torch.tensor([[1, 1, 1, 1, 0]]), causal=True, sliding_window=2, dtype=torch.float32)[0, 0]
    allowed = torch.isfinite(m)
    assert allowed[3].tolist() == [False, False, True, True, False]  # window 2: keys 2, 3 only
    assert not allowed[:, 4].any()  # the padded key is never visible


def test_verify_passes_on_every_family(tiny):
    v = verify(tiny, TEXTS)  # batched: padding is exercised
    assert v.passed, v.to_frame()
    assert v.max_abs_err < 1e-6 and len(v.layers) == len(attention_layers(tiny))
    assert [c.layer for c in v.layers] == list(attention_layers(tiny))  # the model's own layer numbers
    assert "attention verified" in v.summary()


def test_gemma3_sliding_window_beyond_window():
    lm = tiny_model("gemma3")  # sliding_window=4 on layers 0 and 1
    text = "The cat sat on the mat, and the dog sat on the log!"
    [m] = extract(lm, text)
    assert len(m) > 8
    assert m.attention[0, :, 8, :5].abs().max() == 0  # query 8 cannot see keys more than 3 back
    assert m.attention[2, :, 8, :5].abs().max() > 0  # the global layer can
    assert verify(lm, [text]).passed


def test_wrong_family_fails_verification(tiny):
    good = family_for(tiny.config)

    def no_scale(base, i, cfg):
        spec = good.layer_spec(base, i, cfg)
        return dataclasses.replace(spec, scale=2.0 * spec.scale)  # (a scale of 1 is Gemma 4's own)

    broken = dataclasses.replace(good, layer_spec=no_scale)
    v = verify(tiny, TEXTS[:1], family=broken)
    assert not v.passed and v.max_abs_err > 1e-3
    assert "NOT verified" in v.summary()


def test_wrong_rotary_base_fails_verification():
    lm = tiny_model("llama")
    good = family_for(lm.config)

    def wrong_rope(base, i, cfg):
        spec = good.layer_spec(base, i, cfg)
        return dataclasses.replace(spec, inv_freq=spec.inv_freq * 0.5)

    assert not verify(lm, TEXTS[:1], family=dataclasses.replace(good, layer_spec=wrong_rope)).passed


def test_unsupported_architecture_and_features():
    from transformers import Gemma3TextConfig, LlamaConfig, XLNetConfig

    with pytest.raises(UnsupportedArchitecture, match=r"supported families: (.*, )?bert \(bert/roberta"):
        family_for(XLNetConfig())
    with pytest.raises(UnsupportedFeature, match="softcapping"):
        family_for(Gemma3TextConfig(attn_logit_softcapping=50.0))
    with pytest.raises(UnsupportedFeature, match="rope_type='mrope'"):  # (proportional is Gemma 4's, reproduced)
        family_for(LlamaConfig(rope_parameters={"rope_type": "mrope", "rope_theta": 1e4}))


def test_llama3_rope_scaling_verifies():
    lm = tiny_model("llama", rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 16})
    assert verify(lm, TEXTS).passed


# --- explain's experiments: one head's scores, the 1/√d scale, permutation without positions ---


def test_explain_matches_model(tiny):
    e = explain(tiny, TEXTS[0], token="it", layer=1, head=2)
    assert e.query == "it" and e.model_weight_max_abs_err < 1e-6
    assert abs(e.table["weight"].sum() + e.sink_share - 1) < 1e-5  # learned sinks (gpt-oss) take the rest
    # The logit is the sum of its terms (q·k × scale, then whatever position terms the model adds),
    # capped where the model caps it (Gemma 2).
    t = e.table.dropna()
    logit = torch.tensor((t["raw_score"] * e.scale + t.get("position_bias", 0) + t.get("position_scores", 0)).values)
    cap = family_for(tiny.config).layer_spec(base_model(tiny), 1, tiny.config).softcap
    if cap is not None:
        logit = cap * torch.tanh(logit / cap)
    torch.testing.assert_close(torch.tensor(t["scaled_score"].values), logit, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="occurs 0 time"):
        explain(tiny, TEXTS[0], token="zebra", layer=1, head=0)


def test_scale_effect_saturates_softmax():
    df = scale_effect(tiny_model("gemma3", std=0.5), TEXTS[0])
    assert (df["max_weight_unscaled"] >= df["max_weight_scaled"] - 1e-6).mean() > 0.9


def test_permutation_equivariance_without_positions(tiny):
    if attention_layers(tiny)[0] != 0:  # a hybrid stack: a recurrent layer before the first attention carries order
        with pytest.raises(UnsupportedFeature, match="carry the tokens' order"):
            permutation_check(tiny, TEXTS[0])
        return
    r = permutation_check(tiny, TEXTS[0])
    assert r.max_dev_without_positions < 1e-5
    assert r.max_dev_with_positions > 10 * r.max_dev_without_positions
    assert r.exact and "permuted exactly" in r.summary()


def test_permutation_equivariance_without_positions_seq2seq(tiny_seq2seq):
    # BART's learned and Marian's sinusoidal positions sit in the encoder (`encoder.embed_positions`), not
    # in the attention: the family must name them, or "without positions" still carries the order.
    r = permutation_check(tiny_seq2seq, TEXTS[0])
    assert r.max_dev_without_positions < 1e-5, r.summary()
    assert r.max_dev_with_positions > 10 * r.max_dev_without_positions


def test_permutation_verdict_follows_the_number():
    from headscope.probe.results import PermutationCheck

    kw = dict(layer=0, n_tokens=5, permutation=(1, 0, 2, 4, 3), max_dev_with_positions=0.3, tolerance=1e-5)
    bad, good = PermutationCheck(max_dev_without_positions=1.5e-2, **kw), PermutationCheck(max_dev_without_positions=2e-8, **kw)
    assert not bad.exact and "is NOT permuted exactly" in bad.summary() and "is permuted exactly" not in bad.summary()
    assert good.exact and "is permuted exactly" in good.summary() and "NOT" not in good.summary()
    assert bad.to_dict()["exact"] is False and good.to_dict()["exact"] is True


def test_chosen_layers_are_caught_by_hooks_and_match(tiny):
    from headscope.probe.encoding import encode, model_batch
    from headscope.probe.forward import _catch

    enc = [encode(tiny, TEXTS[0]), encode(tiny, TEXTS[2])]
    batch = model_batch(enc, tiny.device)
    caught = {}
    with torch.inference_mode():
        handed = _catch(tiny, batch, [1], {}, caught.__setitem__, output_attentions=False)
    if tiny.model_type in ("deberta-v2", "mpnet"):  # their attention returns weights only when asked: extract asks for all
        assert handed == [] and caught == {}
    else:
        assert handed == [1] and list(caught) == [1]  # only layer 1 was kept: the model was asked for no attention at all
    full = extract(tiny, [TEXTS[0], TEXTS[2]], batch_size=2)
    part = extract(tiny, [TEXTS[0], TEXTS[2]], batch_size=2, layers=[1])
    for f, p in zip(full, part):
        row = f.layer_ids.index(1)
        torch.testing.assert_close(p.attention, f.attention[row : row + 1], atol=1e-6, rtol=0)


def _finished(module):
    """A list that gets an entry each time `module`'s forward pass runs to its end, and the hook's handle."""
    ends = []
    return ends, module.register_forward_hook(lambda *args: ends.append(1))


def test_all_layers_stop_after_the_last_attention_and_match(tiny):
    """`forward_batch` of every layer catches the weights from the attention modules and stops the forward pass
    after the last one: the same tensors, bit for bit, as the whole forward pass asked for its attention."""
    from headscope.probe.encoding import encode, model_batch
    from headscope.probe.forward import _catch, attention_layers, base_model, forward_batch

    enc = [encode(tiny, TEXTS[0]), encode(tiny, TEXTS[2])]
    batch = model_batch(enc, tiny.device)
    wanted = list(attention_layers(tiny))
    caught = {}
    ends, handle = _finished(base_model(tiny))
    try:
        with torch.inference_mode():
            handed = _catch(tiny, batch, wanted, {}, caught.__setitem__, output_attentions=True)
    finally:
        handle.remove()
    with torch.inference_mode():
        whole = base_model(tiny)(input_ids=batch.ids, attention_mask=batch.mask, output_attentions=True, use_cache=False).attentions
        got = forward_batch(tiny, enc)
    assert handed in ([], wanted)
    if handed:  # stopped: the model's pass never reached its end, the hooks caught every layer
        assert ends == [] and list(caught) == wanted
    assert len(got) == len(whole) == len(wanted)
    for g, w in zip(got, whole):
        assert torch.equal(g, w)


def test_an_encoder_decoders_encoder_stops_after_its_last_attention_and_matches(tiny_seq2seq):
    """Without a target the encoder runs alone: its weights, caught and stopped early, are its own output's."""
    from headscope.probe.encoding import encode, model_batch
    from headscope.probe.forward import _catch, attention_layers, base_model, forward_batch

    lm = tiny_seq2seq
    enc = [encode(lm, TEXTS[0]), encode(lm, TEXTS[2])]
    batch = model_batch(enc, lm.device)
    wanted = list(attention_layers(lm))
    ends, handle = _finished(base_model(lm).get_encoder())
    try:
        with torch.inference_mode():
            handed = _catch(lm, batch, wanted, {}, {}.__setitem__, output_attentions=True)
    finally:
        handle.remove()
    with torch.inference_mode():
        whole = base_model(lm).get_encoder()(input_ids=batch.ids, attention_mask=batch.mask, output_attentions=True).attentions
        got = forward_batch(lm, enc)
    assert handed == wanted and ends == [] and len(got) == len(whole)
    assert all(torch.equal(g, w) for g, w in zip(got, whole))


def test_each_layer_is_handed_over_alone_in_layer_order(tiny):
    _each_layer_alone(tiny)


def test_an_encoders_layers_are_handed_over_alone_in_layer_order(tiny_seq2seq):
    _each_layer_alone(tiny_seq2seq)


def _each_layer_alone(tiny):
    """`forward_each_layer` hands every layer's weights over as the pass gives them, in layer order, the same
    tensors as `forward_batch`'s; the model keeps none of them, so a layer handed over and let go is gone
    once the next but one comes (where the modules give weights unasked; a model's loop may still hold the
    layer just before, as Bloom's `outputs` does, never the batch's every layer); no hook is left behind."""
    import weakref

    from headscope.probe.encoding import encode
    from headscope.probe.forward import base_model, forward_batch, forward_each_layer

    enc = [encode(tiny, TEXTS[0]), encode(tiny, TEXTS[2])]
    want = forward_batch(tiny, enc)
    hooks = [dict(m._forward_hooks) for m in base_model(tiny).modules()]  # the model's own (transformers' recorders)
    order, alive, gone = [], [], []

    def each(layer, a):
        gone.append(all(ref() is None for ref in alive[:-1]))
        alive.append(weakref.ref(a))
        order.append(layer)
        assert torch.equal(a, want[len(order) - 1])

    forward_each_layer(tiny, enc, each)
    assert order == list(attention_layers(tiny))
    if tiny.model_type not in ("deberta-v2", "mpnet"):  # these give weights only when asked, and the model keeps them
        assert all(gone)
    assert [dict(m._forward_hooks) for m in base_model(tiny).modules()] == hooks


def test_heads_reads_the_model_once_and_tokenises_each_text_once(monkeypatch):
    """The corpus path's per-text costs that are not per text: `learned_sinks` (a walk over every parameter
    name) is read once per stream of texts, not once per map or window, and under attention='auto' (the default) a chunk's
    texts are tokenised once, to choose their mode, not again to extract them."""
    import headscope as hs
    from conftest import _tiny
    from headscope.probe import encoding, extract as extract_mod, maps, sources

    lm = _tiny("bert")  # the session's cached tiny model
    texts = [f"{t} {i}" for i, t in enumerate(TEXTS * 4)]  # 12 texts: two windows of 2 batches of 3
    sinks, encoded = [], []
    real_sinks, real_encode = maps.learned_sinks, encoding.encode_many
    monkeypatch.setattr(maps, "learned_sinks", lambda m: sinks.append(1) or real_sinks(m))
    counted = lambda m, chunk, **kw: encoded.extend(chunk) or real_encode(m, chunk, **kw)  # noqa: E731
    monkeypatch.setattr(sources, "encode_many", counted)
    monkeypatch.setattr(extract_mod, "encode_many", counted)
    scores = hs.heads(lm, texts, batch_size=3, window=2)
    assert scores.n_texts == len(texts) and scores.meta["attention"]["eager"] == len(texts)
    assert len(sinks) == 1
    assert sorted(encoded) == sorted(texts)  # every text tokenised exactly once


@pytest.mark.parametrize("heads_at", [slice(None), torch.tensor([2, 0])])
def test_split_batch_gives_each_text_its_maps_and_lets_the_batch_go(heads_at):
    """One batch's per-layer attention split into per-text `[layer, head, query, key]` copies, padding cut, as
    the reference stack of slices gives them; each layer's batch tensor leaves the list as it is copied."""
    from headscope.probe.extract import split_batch

    g = torch.Generator().manual_seed(0)
    att = [torch.rand(2, 3, 5, 5, generator=g) for _ in range(4)]  # 4 layers × (B=2, nh=3, T=5, T=5)
    want = [torch.stack([x[b, heads_at, :n, :n] for x in att]).to(torch.float16) for b, n in enumerate((5, 3))]
    before = [x.clone() for x in att]
    kept = list(att)
    got = split_batch(att, [5, 3], heads_at, torch.float16)
    assert att == []  # the batch's tensors were let go
    assert [tuple(t.shape) for t in got] == [(4, len(want[0][0]), 5, 5), (4, len(want[1][0]), 3, 3)]
    for g_, w in zip(got, want):
        assert g_.dtype == torch.float16 and torch.equal(g_, w)
    assert all(torch.equal(a, b) for a, b in zip(kept, before))  # the tensors themselves untouched


@pytest.mark.parametrize("family", ["llama", "albert"])
@pytest.mark.parametrize("layers", [None, [0]])
def test_another_threads_pass_through_the_same_model_is_not_caught(layers, family):
    """A server runs requests for two names of one model in two threads: a pass that starts while another
    thread's hooked pass is inside the model must neither feed that pass's weights nor be stopped by it.
    ALBERT runs one shared layer module for every layer, its hooks told apart by call order: the other
    thread's calls (a pass stopped after layer 0) must not shift this one's count."""
    import threading

    lm = tiny_model(family)
    a_text, b_text = "The cat sat on the mat.", "A dog ran far away from home, then came back."
    want = {t: extract(lm, t, layers=layers)[0].attention for t in (a_text, b_text)}
    got = {}
    base = base_model(lm)
    first = base.layers[0] if family == "llama" else base.encoder.albert_layer_groups[0].albert_layers[0]
    done = []

    def other_thread(module, args):
        if done:
            return
        done.append(1)  # once: B's whole pass runs while A's pass waits inside layer 0
        t = threading.Thread(target=lambda: got.__setitem__(b_text, extract(lm, b_text, layers=layers)[0].attention))
        t.start()
        t.join()

    h = first.register_forward_pre_hook(other_thread)
    try:
        got[a_text] = extract(lm, a_text, layers=layers)[0].attention
    finally:
        h.remove()
    assert done and set(got) == {a_text, b_text}
    for t in got:
        assert torch.equal(got[t], want[t])
