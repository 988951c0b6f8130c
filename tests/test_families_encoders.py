"""DistilBERT, ModernBERT, DeBERTa v2, OPT, BLOOM, Falcon and Gemma 2: each feature verified on a tiny
random model, and each deliberately broken the way a port might break it, which verification must catch."""

import dataclasses
import re

import pytest
import torch

from headscope.probe.extract import extract
from headscope.probe.families import FAMILIES, UnsupportedFeature, family_for
from headscope.probe.families.bloom import key_position_bias
from headscope.probe.families.deberta_v2 import log_bucket
from headscope.probe.scratch import alibi_slopes
from headscope.probe.tiny import tiny_model
from headscope.probe.verify import verify

TEXTS = [
    "The animal didn't cross the street because it was too tired.",
    "我爱北京天安门",  # shorter: the batch is padded
    "Is it 42 or 43? Nobody knows... yet.",
]


def _verify_broken(model: str, change, **overrides):
    """verify() of the tiny `model` against its family with every layer's spec passed through `change`."""
    lm = tiny_model(model, **overrides)
    good = family_for(lm.config)
    broken = dataclasses.replace(good, layer_spec=lambda base, i, cfg: change(good.layer_spec(base, i, cfg)))
    return verify(lm, TEXTS, family=broken)


def _with_bias(spec, change):
    bias = spec.score_bias
    return dataclasses.replace(spec, score_bias=lambda tq, tk: change(bias(tq, tk)))


# --- every variant of every new family verifies, padding in the batch ---

@pytest.mark.parametrize("model, overrides", [
    ("distilbert", {}),
    ("distilbert", {"sinusoidal_pos_embds": True}),
    ("opt", {}),
    ("opt", {"enable_bias": False}),
    ("bloom", {}),
    ("falcon", {}),  # multi-query, rotary
    ("falcon", {"alibi": True}),
    ("falcon", {"multi_query": False}),  # per-head fused QKV
    ("falcon", {"multi_query": False, "alibi": True}),
    ("falcon", {"new_decoder_architecture": True, "num_kv_heads": 2}),  # grouped
    ("falcon", {"new_decoder_architecture": True, "num_kv_heads": 3, "alibi": True, "bias": True}),
    ("gemma2", {}),
    ("modernbert", {}),
    ("modernbert", {"attention_bias": True}),
    ("deberta-v2", {}),  # v3 style: shared key projections, 8 log buckets
    ("deberta-v2", {"share_att_key": False}),  # separate position projections
    ("deberta-v2", {"position_buckets": -1, "max_relative_positions": 6}),  # no buckets, clipped at ±6
    ("deberta-v2", {"norm_rel_ebd": "none", "pos_att_type": ["c2p"]}),  # one position term: scale_factor 2
])
def test_variant_verifies_with_padding(model, overrides):
    v = verify(tiny_model(model, **overrides), TEXTS)
    assert v.passed and v.max_abs_err <= 1e-5, v.to_frame()


# --- broken on purpose: verification must catch each ---

def _shift_heads(bias):  # head h gets head h-1's ALiBi slope
    return bias.roll(1, dims=0)


@pytest.mark.parametrize("model, overrides, change", [
    ("bloom", {}, lambda s: _with_bias(s, _shift_heads)),
    ("falcon", {"alibi": True}, lambda s: _with_bias(s, _shift_heads)),
    ("falcon", {"alibi": True}, lambda s: _with_bias(s, lambda b: b / 2)),  # Falcon's bias counted once, not twice
    ("falcon", {"alibi": True}, lambda s: dataclasses.replace(s, score_bias=None)),
    ("gemma2", {}, lambda s: dataclasses.replace(s, softcap=None)),
    ("gemma2", {}, lambda s: dataclasses.replace(s, sliding_window=s.sliding_window and s.sliding_window + 1)),
    ("gemma2", {}, lambda s: dataclasses.replace(s, scale=s.scale / 2)),  # query_pre_attn_scalar taken 4× too large
    ("modernbert", {}, lambda s: dataclasses.replace(s, local_window=s.local_window and s.local_window + 1)),
    ("modernbert", {}, lambda s: dataclasses.replace(s, local_window=s.local_window and s.local_window - 1)),
    ("deberta-v2", {}, lambda s: dataclasses.replace(s, scale=s.head_dim**-0.5)),  # scale_factor dropped
    ("deberta-v2", {}, lambda s: dataclasses.replace(s, position_scores=None)),
])
def test_broken_variant_is_caught(model, overrides, change):
    v = _verify_broken(model, change, **overrides)
    assert not v.passed and v.max_abs_err > 1e-3


def test_deberta_buckets_shifted_by_one_are_caught(monkeypatch):
    import headscope.probe.families.deberta_v2 as deberta

    shifted = deberta._relative_index
    monkeypatch.setattr(deberta, "_relative_index", lambda tq, tk, attn: (shifted(tq, tk, attn) + 1).clamp_max(
        2 * attn.pos_ebd_size - 1))
    v = verify(tiny_model("deberta-v2"), TEXTS)
    assert not v.passed and v.max_abs_err > 1e-3


# --- positions by hand and against transformers' own as an independent reference ---

def test_bloom_alibi_is_the_canonical_one_up_to_a_row_constant():
    slopes = alibi_slopes(6)
    ours = key_position_bias(slopes)(5, 5)  # (nh, Tq, Tk): slope × j
    i, j = torch.arange(5)[:, None], torch.arange(5)[None, :]
    canonical = -slopes[:, None, None] * (i - j)  # ALiBi: −slope × distance to the query
    row_shift = ours - canonical
    assert torch.allclose(row_shift, row_shift[..., :1].expand_as(row_shift))  # the same for every key of a row
    assert torch.allclose(torch.softmax(ours.masked_fill(j > i, -torch.inf), -1),
                          torch.softmax(canonical.masked_fill(j > i, -torch.inf), -1))


def test_alibi_slopes_match_transformers_bloom():
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    for n in (1, 4, 6, 12, 16, 20):
        ref = build_alibi_tensor(torch.ones(1, 7, dtype=torch.long), n, torch.float32)  # (n, 1, 7)
        torch.testing.assert_close(key_position_bias(alibi_slopes(n))(1, 7), ref)


def test_deberta_buckets_match_transformers():
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    relative = torch.arange(-300, 301)
    for n_buckets, max_position in [(8, 64), (32, 128), (256, 512)]:
        assert torch.equal(log_bucket(relative, n_buckets, max_position),
                           make_log_bucket_position(relative, n_buckets, max_position).long())


def test_modernbert_local_layers_see_a_band_of_half_the_window():
    lm = tiny_model("modernbert")  # local_attention=4: |i - j| <= 2 on the local layers 1 and 2
    [m] = extract(lm, TEXTS[0])
    n = len(m)
    far = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs() > lm.config.local_attention // 2
    assert lm.config.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    assert m.attention[1:, :, far].abs().max() == 0
    assert m.attention[1:, :, ~far].min() > 0  # the band itself is seen, both ways
    assert m.attention[0].min() > 0  # the global layer sees every token


def test_gemma2_softcap_bounds_the_scores_it_bends():
    from headscope.probe.encoding import encode
    from headscope.probe.forward import base_model
    from headscope.probe.scratch import attention_from_scratch
    from headscope.probe.verify import capture

    lm = tiny_model("gemma2")
    family = family_for(lm.config)
    cap = capture(lm, [encode(lm, TEXTS[0])], family)
    for i in range(lm.config.num_hidden_layers):
        spec = family.layer_spec(base_model(lm), i, lm.config)
        capped = attention_from_scratch(cap.inputs[i], spec, cap.key_valid).scores
        raw = attention_from_scratch(cap.inputs[i], dataclasses.replace(spec, softcap=None), cap.key_valid).scores
        torch.testing.assert_close(capped, spec.softcap * torch.tanh(raw / spec.softcap))
        assert capped.abs().max() < spec.softcap
    assert raw.abs().max() > spec.softcap / 2  # the tiny model's scores reach where the cap bends them


# --- refused by name ---

def _config(cls: str, **kwargs):
    import transformers

    return getattr(transformers, cls)(**kwargs)


@pytest.mark.parametrize("cls, kwargs, message", [
    ("DebertaV2Config", {"relative_attention": True, "pos_att_type": ["c2p", "p2p"]},
     "pos_att_type ['p2p']: only the c2p and p2c terms are reproduced"),
    ("Gemma2Config", {"use_bidirectional_attention": True}, "use_bidirectional_attention=True is not reproduced"),
    ("FalconConfig", {"rope_parameters": {"rope_type": "mrope", "rope_theta": 1e4, "factor": 4.0}},
     "rope_type='mrope' is not reproduced"),
    ("ModernBertConfig", {"rope_parameters": {"full_attention": {"rope_type": "mrope", "rope_theta": 1e4, "factor": 4.0},
                                              "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
     "rope_type='mrope' is not reproduced"),
])
def test_each_refused_feature_is_named(cls, kwargs, message):
    with pytest.raises(UnsupportedFeature, match=re.escape(message)):
        family_for(_config(cls, **kwargs))


def test_falcon_with_alibi_does_not_ask_for_a_rope():
    family_for(_config("FalconConfig", alibi=True, rope_parameters={"rope_type": "mrope", "rope_theta": 1e4,
                                                                    "factor": 4.0}))


def test_every_new_family_is_registered():
    assert {"distilbert", "modernbert", "deberta_v2", "opt", "bloom", "falcon", "gemma2"} <= set(FAMILIES)
