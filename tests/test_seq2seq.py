"""Encoder–decoder models (T5, BART, Marian): three kinds of attention extracted and verified, and the
broken variants verification must catch."""

import dataclasses
import inspect

import pytest
import torch

from headscope.probe.encoding import encode_many, encode_targets
from headscope.probe.extract import extract
from headscope.probe.families import FAMILIES, family_for
from headscope.probe.families.t5 import relative_bias
from headscope.probe.tiny import tiny_model
from headscope.probe.types import CrossAttentionMap, Seq2SeqAttention, Units
from headscope.probe.verify import DEFAULT_TEXTS, verify
from headscope.probe.words import to_word_level

SOURCES = ["The cat sat on the mat, and the dog sat on the log!", "Is it 42?", "Mary told John that she would call."]
TARGETS = ["Numbers: 1, 2, 3.", "The animal didn't cross the street because it was too tired.", "He said no."]


def _replace_stack(family, kind, **changes):
    """`family` with its `kind` stack changed — how each broken variant below is built."""
    stacks = tuple(dataclasses.replace(s, **changes) if s.kind == kind else s for s in family.stacks)
    return dataclasses.replace(family, stacks=stacks)


def _failed_kinds(v) -> set[str]:
    return {c.kind for c in v.layers if not c.passed}


# --- verification ------------------------------------------------------------------------------


def test_every_kind_verifies_with_padding_on_both_sides(tiny_seq2seq):
    lm = tiny_seq2seq
    sources, targets = list(DEFAULT_TEXTS), list(DEFAULT_TEXTS[1:] + DEFAULT_TEXTS[:1])  # verify's default pairs
    assert len({len(e.ids) for e in encode_many(lm, sources)}) > 1  # the source side is padded
    assert len({len(e.ids) for e in encode_targets(lm, targets)}) > 1  # and the target side
    v = verify(lm)
    assert v.passed, v.to_frame()
    assert v.max_abs_err <= 1e-5 and v.max_rel_err_output <= 1e-5
    assert [c.kind for c in v.layers] == ["encoder"] * 2 + ["decoder"] * 2 + ["cross"] * 2
    assert [c.layer for c in v.layers] == [0, 1] * 3
    assert "2 encoder + 2 decoder + 2 cross layers" in v.summary()
    assert [r["kind"] for r in v.to_dict()["layers"]] == [c.kind for c in v.layers]


def test_one_stack_rows_carry_no_kind():
    row = verify(tiny_model("llama"), SOURCES[:1]).to_dict()["layers"][0]
    assert "kind" not in row  # the JSON of encoders and decoders is unchanged


def test_decoder_mask_not_causal_is_caught(tiny_seq2seq):
    good = family_for(tiny_seq2seq.config)
    decoder = good.stack("decoder")

    def bidirectional(base, i, cfg):
        return dataclasses.replace(decoder.layer_spec(base, i, cfg), causal=False)

    v = verify(tiny_seq2seq, SOURCES, target=TARGETS, family=_replace_stack(good, "decoder", layer_spec=bidirectional))
    assert _failed_kinds(v) == {"decoder"} and v.max_abs_err > 1e-2
    assert "NOT verified" in v.summary()


def test_cross_attention_keys_from_the_wrong_stack_are_caught(tiny_seq2seq):
    lm = tiny_seq2seq
    broken = _replace_stack(family_for(lm.config), "cross", keys="self")  # keys from the decoder's own input
    v = verify(lm, SOURCES, target=TARGETS, family=broken)
    assert _failed_kinds(v) == {"cross"} and not v.passed
    # A pair whose two sides have the same length, so the wrong keys give a number, not a shape mismatch.
    source, target = "The cat sat on the mat.", "The cat sat on the mat"
    assert len(encode_many(lm, [source])[0].ids) == len(encode_targets(lm, [target])[0].ids)
    v = verify(lm, [source], target=[target], family=broken)
    assert _failed_kinds(v) == {"cross"} and 1e-3 < v.max_abs_err < float("inf")


def test_t5_bias_buckets_shifted_are_caught():
    lm = tiny_model("t5")
    good = family_for(lm.config)
    cfg = lm.config

    def shifted(kind, bidirectional):
        stack = good.stack(kind)

        def spec(base, i, c):
            table = getattr(base, kind).block[0].layer[0].SelfAttention.relative_attention_bias.weight
            bias = relative_bias(table.roll(-1, dims=0), bidirectional=bidirectional,  # bucket b reads b + 1
                                 n_buckets=cfg.relative_attention_num_buckets,
                                 max_distance=cfg.relative_attention_max_distance)
            return dataclasses.replace(stack.layer_spec(base, i, c), score_bias=bias)

        return spec

    broken = _replace_stack(_replace_stack(good, "encoder", layer_spec=shifted("encoder", True)),
                            "decoder", layer_spec=shifted("decoder", False))
    v = verify(lm, SOURCES, target=TARGETS, family=broken)
    assert _failed_kinds(v) == {"encoder", "decoder"} and v.max_abs_err > 1e-2


def test_t5_scaled_by_root_d_is_caught():
    lm = tiny_model("t5")
    good = family_for(lm.config)
    encoder = good.stack("encoder")

    def scaled(base, i, cfg):
        return dataclasses.replace(encoder.layer_spec(base, i, cfg), scale=cfg.d_kv**-0.5)

    v = verify(lm, SOURCES, target=TARGETS, family=_replace_stack(good, "encoder", layer_spec=scaled))
    assert _failed_kinds(v) == {"encoder"}


@pytest.mark.parametrize("kind, bidirectional", [("encoder", True), ("decoder", False)])
def test_t5_relative_bias_matches_transformers(kind, bidirectional):
    lm = tiny_model("t5")
    attn = getattr(lm.model, kind).block[0].layer[0].SelfAttention
    cfg = lm.config
    ours = relative_bias(attn.relative_attention_bias.weight, bidirectional=bidirectional,
                         n_buckets=cfg.relative_attention_num_buckets, max_distance=cfg.relative_attention_max_distance)
    with torch.no_grad():
        for tq, tk in [(5, 5), (40, 40), (7, 30)]:  # 40 > max_distance 16: the last bucket is reached
            torch.testing.assert_close(ours(tq, tk), attn.compute_bias(tq, tk)[0], rtol=0, atol=0)


def test_encoder_decoder_checkpoint_loads_whole(tmp_path):
    from headscope.probe import load_model

    tiny = tiny_model("t5")
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    lm = load_model(str(tmp_path))
    assert type(lm.model).__name__ == "T5ForConditionalGeneration"
    assert verify(lm, SOURCES[:2], target=TARGETS[:2]).passed


# --- extraction --------------------------------------------------------------------------------


def test_extract_gives_three_maps_with_their_own_units(tiny_seq2seq):
    lm = tiny_seq2seq
    pairs = extract(lm, SOURCES, target=TARGETS)
    assert len(pairs) == 3 and all(isinstance(p, Seq2SeqAttention) for p in pairs)
    for p, src, tgt in zip(pairs, encode_many(lm, SOURCES), encode_targets(lm, TARGETS)):
        S, T = len(src.ids), len(tgt.ids)
        assert p.encoder.text == src.text and p.encoder.token_ids == src.ids and not p.encoder.causal
        assert p.decoder.text == tgt.text and p.decoder.token_ids == tgt.ids and p.decoder.causal
        assert p.decoder.token_ids[0] == lm.config.decoder_start_token_id and p.decoder.special[0]
        assert tuple(p.encoder.attention.shape) == (2, 4, S, S)
        assert tuple(p.decoder.attention.shape) == (2, 4, T, T)
        assert tuple(p.cross.attention.shape) == (2, 4, T, S)
        assert p.cross.queries.labels == p.decoder.labels and p.cross.keys.labels == p.encoder.labels
        for a in (p.encoder.attention, p.decoder.attention, p.cross.attention):
            torch.testing.assert_close(a.sum(-1), torch.ones(a.shape[:-1]))  # padding cut: rows still sum to 1
        assert torch.triu(p.decoder.attention, diagonal=1).abs().max() == 0  # causal
        assert (p.cross.attention[..., -1] > 0).all()  # every target position sees the last source token


def test_batch_equals_single(tiny_seq2seq):
    batch = extract(tiny_seq2seq, SOURCES, target=TARGETS, batch_size=3)
    for p, s, t in zip(batch, SOURCES, TARGETS):
        [q] = extract(tiny_seq2seq, s, target=t)
        for kind in ("encoder", "decoder", "cross"):
            torch.testing.assert_close(getattr(p, kind).attention, getattr(q, kind).attention, atol=1e-6, rtol=0)


def test_word_level_of_all_three(tiny_seq2seq):
    [tok] = extract(tiny_seq2seq, SOURCES[0], target=TARGETS[0])
    [word] = extract(tiny_seq2seq, SOURCES[0], target=TARGETS[0], level="word")
    assert word.level == "word" and word.cross.level == "word"
    assert word.cross.queries.labels == word.decoder.labels and word.cross.keys.labels == word.encoder.labels
    assert "cat" in word.encoder.labels and any(lab.startswith("Numbers") for lab in word.decoder.labels)
    torch.testing.assert_close(word.cross.attention, to_word_level(tok.cross).attention)
    torch.testing.assert_close(word.cross.attention.sum(-1), torch.ones(word.cross.attention.shape[:-1]))


def test_cross_word_level_by_hand():
    # Queries: target pieces "a", "##b" (word 0) and "c" (word 1); keys: source "x" (word 0), "y", "##z" (word 1).
    a = torch.tensor([[[[0.5, 0.25, 0.25], [0.2, 0.4, 0.4], [0.1, 0.6, 0.3]]]])
    target = Units("ab c", "token", ("a", "##b", "c"), ((0, 1), (1, 2), (3, 4)), (False,) * 3, word_index=(0, 0, 1))
    source = Units("x yz", "token", ("x", "y", "##z"), ((0, 1), (2, 3), (3, 4)), (False,) * 3, word_index=(0, 1, 1))
    w = to_word_level(CrossAttentionMap(queries=target, keys=source, attention=a))
    # query word "ab" = mean of rows 0 and 1 = (0.35, 0.325, 0.325); key word "yz" sums its two columns
    torch.testing.assert_close(w.attention[0, 0], torch.tensor([[0.35, 0.65], [0.1, 0.9]]))
    assert w.queries.labels == ("ab", "c") and w.keys.labels == ("x", "yz")


def test_cross_map_checks_its_shape():
    u = Units("a", "token", ("a",), ((0, 1),), (False,))
    with pytest.raises(ValueError, match="1 query and 1 key units"):
        CrossAttentionMap(queries=u, keys=u, attention=torch.ones(1, 1, 2, 1))


def test_without_a_target_the_encoder_runs_alone(tiny_seq2seq):
    pairs = extract(tiny_seq2seq, SOURCES, target=TARGETS)
    alone = extract(tiny_seq2seq, SOURCES, batch_size=2)
    assert not tiny_seq2seq.is_causal
    for p, m in zip(pairs, alone):
        assert m.labels == p.encoder.labels and not m.causal
        torch.testing.assert_close(m.attention, p.encoder.attention, atol=1e-6, rtol=0)
    [one] = extract(tiny_seq2seq, SOURCES[0], layers=[1], heads=[2])  # the hooked path: one layer's modules
    torch.testing.assert_close(one.attention[0, 0], pairs[0].encoder.attention[1, 2], atol=1e-6, rtol=0)


def test_extract_target_errors():
    with pytest.raises(ValueError, match="give one target per source"):
        extract(tiny_model("bart"), SOURCES, target=TARGETS[:2])
    with pytest.raises(ValueError, match="target= is for encoder-decoder models"):
        extract(tiny_model("bert"), SOURCES, target=TARGETS)
    with pytest.raises(ValueError, match="layers= and heads= select in one stack only"):
        extract(tiny_model("bart"), SOURCES, target=TARGETS, heads=[0])


def test_seq2seq_families_declare_three_stacks():
    for family in FAMILIES.values():
        kinds = [s.kind for s in family.stacks]
        if family.kind == "encoder-decoder":
            assert kinds == ["encoder", "decoder", "cross"]
            assert [s.keys for s in family.stacks] == ["self", "self", "encoder"]
            # the same function (each wrapped once by probe.placement.onloading)
            assert inspect.unwrap(family.layer_spec) is inspect.unwrap(family.stack("encoder").layer_spec)
        else:
            assert kinds == []


# --- explain ------------------------------------------------------------------------------------


def test_explain_on_t5_takes_the_relative_bias_apart():
    from headscope.probe.explain import explain

    lm = tiny_model("t5")
    e = explain(lm, SOURCES[0], token="dog", layer=1, head=2)
    t = e.table
    n = len(t)
    with torch.no_grad():  # transformers' own bias, from block 0's table, which T5 shares with every layer
        bias = lm.model.encoder.block[0].layer[0].SelfAttention.compute_bias(n, n)[0, 2, e.query_index]
    torch.testing.assert_close(torch.tensor(t["position_bias"].values), bias.double(), rtol=0, atol=1e-6)
    assert bias.std() > 1e-3  # keys at different distances get different biases: the term matters
    logit = t["raw_score"] * e.scale + t["position_bias"]  # T5 has no 1/√d: scale is 1
    assert e.scale == 1.0
    assert (logit - t["scaled_score"]).abs().max() < 1e-5
    torch.testing.assert_close(torch.softmax(torch.tensor(logit.values), -1), torch.tensor(t["weight"].values),
                               rtol=0, atol=1e-6)
    assert e.model_weight_max_abs_err < 1e-6
