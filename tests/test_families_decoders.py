"""Decoders with rotary variants: every rope type of the registry, partial and interleaved rotary, fused QKV
layouts, QK norms, layers without rotary. Each is verified from scratch on a tiny random model with padding
in the batch, and a deliberately broken variant of each feature must fail verification."""

import dataclasses
import math
import re

import pytest
import torch

from headscope.probe.families import FAMILIES, SUPPORTED_TYPES, UnsupportedFeature, family_for
from headscope.probe.rotary import ROPE_INV_FREQ, default_inv_freq, rope
from headscope.probe.tiny import TINY_CORPUS, tiny_model
from headscope.probe.verify import verify

TEXTS = list(TINY_CORPUS[:4])  # different lengths: the batch is padded
LONG = " ".join(TINY_CORPUS[:3])  # longer than the 16 positions the scaled ropes below were "trained" on
ORIGINAL = 16

# One tiny-llama rope configuration per registry entry; `original_max_position_embeddings` 16 with
# `max_position_embeddings` 128 (dynamic: 16 as well, its threshold is max_position_embeddings).
ROPES = {
    "default": {},
    "linear": {"factor": 2.0},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": ORIGINAL},
    "dynamic": {"factor": 2.0},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": ORIGINAL},
    "longrope": {"short_factor": [1.0, 1.1, 1.5, 2.0], "long_factor": [1.0, 2.0, 4.0, 8.0],
                 "original_max_position_embeddings": ORIGINAL},
    "proportional": {"partial_rotary_factor": 0.5},  # Gemma 4's: half the angle pairs turn, whole-head exponents
}


def _tiny_llama(rope_type: str, **extra):
    params = {"rope_type": rope_type, "rope_theta": 10000.0, **ROPES[rope_type], **extra}
    overrides = {"max_position_embeddings": ORIGINAL} if rope_type == "dynamic" else {}
    return tiny_model("llama", rope_parameters=params, **overrides)


@pytest.fixture
def past_the_context_limit(monkeypatch):
    """headscope refuses texts longer than `max_position_embeddings`, but that is where dynamic NTK starts
    changing its frequencies: lift the limit to the 128 positions the other tiny models have."""
    from headscope.probe.model import LoadedModel

    monkeypatch.setattr(LoadedModel, "max_length", property(lambda self: 128))


def _break(lm, change):
    """The model's family with `change(spec, base, i, cfg) -> spec` applied to every layer's spec."""
    good = family_for(lm.config)

    def layer_spec(base, i, cfg):
        return change(good.layer_spec(base, i, cfg), base, i, cfg)

    return dataclasses.replace(good, layer_spec=layer_spec)


def _n_tokens(lm, text: str) -> int:
    return len(lm.tokenizer(text)["input_ids"])


def test_every_rope_type_of_the_registry_has_a_tiny_llama_case():
    assert set(ROPES) == set(ROPE_INV_FREQ)


@pytest.mark.parametrize("rope_type", sorted(ROPES))
def test_each_rope_type_verifies_on_a_tiny_llama_with_padding_and_beyond_the_original_length(
        rope_type, past_the_context_limit):
    lm = _tiny_llama(rope_type)
    assert _n_tokens(lm, LONG) > ORIGINAL and len({_n_tokens(lm, t) for t in TEXTS}) > 1
    v = verify(lm, [*TEXTS, LONG])
    assert v.passed and v.max_abs_err <= 1e-5, v.to_frame()


# --- the frequencies against transformers' own rope functions, used here only as a reference ---


def _reference(rope_type: str, head_dim: int = 8, seq_len=None, **params):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = LlamaConfig(hidden_size=32, num_attention_heads=4, head_dim=head_dim, max_position_embeddings=128,
                      rope_parameters={"rope_type": rope_type, "rope_theta": 10000.0, **params})
    freq, factor = ROPE_INIT_FUNCTIONS[rope_type](cfg, None, seq_len=seq_len)
    return cfg, freq, factor


@pytest.mark.parametrize("rope_type, params", [
    ("yarn", {"factor": 4.0, "original_max_position_embeddings": 16}),
    ("yarn", {"factor": 4.0, "original_max_position_embeddings": 32, "mscale": 0.7, "mscale_all_dim": 0.5,
              "beta_fast": 16, "beta_slow": 2}),
    ("yarn", {"factor": 4.0, "original_max_position_embeddings": 16, "truncate": False, "attention_factor": 1.3}),
    ("yarn", {"factor": 2.0, "original_max_position_embeddings": 64, "partial_rotary_factor": 0.5}),
    ("linear", {"factor": 2.0, "partial_rotary_factor": 0.5}),
    ("llama3", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16}),
])
def test_fixed_frequencies_and_attention_factor_match_transformers(rope_type, params):
    cfg, freq, factor = _reference(rope_type, head_dim=16, **params)
    ours = rope(cfg, 16)
    torch.testing.assert_close(ours.inv_freq, freq, rtol=0, atol=0)
    assert ours.attention_factor == pytest.approx(factor, rel=1e-12)
    assert ours.rotary_dim == (None if params.get("partial_rotary_factor", 1.0) == 1.0 else 8)


@pytest.mark.parametrize("T", [5, 16, 17, 100])
def test_length_dependent_frequencies_match_transformers_at_each_length(T):
    long, short = [1.0, 2.0, 4.0, 8.0, 8.0, 8.0], [1.0, 1.1, 1.2, 1.3, 1.4, 1.5]
    cfg, _, factor = _reference("longrope", head_dim=12, long_factor=long, short_factor=short,
                                original_max_position_embeddings=16)
    _, ref, _ = _reference("longrope", head_dim=12, seq_len=T, long_factor=long, short_factor=short,
                           original_max_position_embeddings=16)
    ours = rope(cfg, 12)
    torch.testing.assert_close(ours.inv_freq(T), ref, rtol=0, atol=0)
    assert ours.attention_factor == pytest.approx(factor) == pytest.approx(math.sqrt(1 + math.log(8) / math.log(16)))
    # dynamic NTK: transformers hands the length over as the tensor it reads off the position ids
    cfg, _, _ = _reference("dynamic", head_dim=12, factor=3.0)
    _, ref, _ = _reference("dynamic", head_dim=12, seq_len=torch.tensor(T + 120), factor=3.0)
    torch.testing.assert_close(rope(cfg, 12).inv_freq(T + 120), ref, rtol=0, atol=0)


def test_yarn_keeps_fast_dims_and_slows_slow_dims_by_the_factor():
    # Property of the formula, independent of transformers: a dim turning more than beta_fast = 32 times
    # over the original 4096 positions keeps its frequency; one turning less than once is slowed by `factor`.
    from transformers import LlamaConfig

    cfg = LlamaConfig(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                       "original_max_position_embeddings": 4096})
    got, base = rope(cfg, 64).inv_freq, default_inv_freq(10000.0, 64)
    turns = 4096 * base / (2 * math.pi)
    assert torch.equal(got[turns > 33], base[turns > 33]) and (turns > 33).any()
    torch.testing.assert_close(got[turns < 0.9], base[turns < 0.9] / 4) and (turns < 0.9).any()
    assert rope(cfg, 64).attention_factor == pytest.approx(0.1 * math.log(4) + 1)


# --- dynamic NTK: the frequencies follow the sequence length, and the model's cache of the longest one ---


def test_dynamic_frequencies_grow_beyond_the_trained_length():
    lm = _tiny_llama("dynamic")
    freq = family_for(lm.config).layer_spec(lm.model.model, 0, lm.config).inv_freq
    T = _n_tokens(lm, LONG)
    torch.testing.assert_close(freq(ORIGINAL), default_inv_freq(10000.0, 8))
    assert (freq(T)[1:] < default_inv_freq(10000.0, 8)[1:]).all()  # a larger base: slower turns


def test_dynamic_uses_the_longest_length_the_model_has_cached(past_the_context_limit):
    # transformers keeps the frequencies of the longest sequence seen while later ones stay beyond the
    # trained length; a second, shorter (but still long) text is verified against those.
    lm = _tiny_llama("dynamic")
    middle = " ".join(TINY_CORPUS[:2])
    assert ORIGINAL < _n_tokens(lm, middle) < _n_tokens(lm, LONG)
    assert verify(lm, [LONG]).passed
    assert verify(lm, [middle]).passed

    def at_the_current_length_only(spec, base, i, cfg):
        return dataclasses.replace(spec, inv_freq=rope(cfg, spec.head_dim).inv_freq)

    assert not verify(lm, [middle], family=_break(lm, at_the_current_length_only)).passed


@pytest.mark.parametrize("rope_type, broken, why", [
    ("dynamic", lambda s: dataclasses.replace(s, inv_freq=default_inv_freq(10000.0, 8)), "frequencies fixed"),
    ("yarn", lambda s: dataclasses.replace(s, rope_scaling=1.0), "attention factor dropped"),
    ("longrope", lambda s: dataclasses.replace(s, rope_scaling=1.0), "attention factor dropped"),
    ("longrope", lambda s: dataclasses.replace(s, inv_freq=s.inv_freq(1)), "short factors beyond the original length"),
    ("llama3", lambda s: dataclasses.replace(s, inv_freq=default_inv_freq(10000.0, 8)), "no scaling"),
])
def test_each_broken_rope_fails_verification(rope_type, broken, why, past_the_context_limit):
    lm = _tiny_llama(rope_type)
    v = verify(lm, [*TEXTS, LONG], family=_break(lm, lambda spec, *_: broken(spec)))
    assert not v.passed and v.max_abs_err > 1e-4, why


# --- partial rotary ---


def test_llama_ignores_partial_rotary_with_the_default_rope_and_refuses_it_with_others():
    lm = tiny_model("llama", rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5})
    assert family_for(lm.config).layer_spec(lm.model.model, 0, lm.config).rotary_dim is None
    assert verify(lm, TEXTS).passed
    from transformers import LlamaConfig

    cfg = LlamaConfig(rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0,
                                       "partial_rotary_factor": 0.5})
    with pytest.raises(UnsupportedFeature, match=re.escape("partial_rotary_factor=0.5 with rope_type='linear': this "
                                                           "model applies the rotary angles to the whole head")):
        family_for(cfg)


@pytest.mark.parametrize("model_type, rotated", [("gpt_neox", 2), ("gptj", 4)])
def test_partial_rotary_turns_only_the_first_dims_and_all_dims_fails(model_type, rotated):
    lm = tiny_model(model_type)
    family = family_for(lm.config)
    spec = family.layer_spec(lm.model.base_model, 0, lm.config)
    assert spec.rotary_dim == rotated < spec.head_dim and len(spec.inv_freq) == rotated // 2

    def all_dims(spec, *_):
        return dataclasses.replace(spec, inv_freq=default_inv_freq(10000.0, spec.head_dim), rotary_dim=None)

    assert verify(lm, TEXTS).passed
    v = verify(lm, TEXTS, family=_break(lm, all_dims))
    assert not v.passed and v.max_abs_err > 1e-4


@pytest.mark.parametrize("rope_type", ["default", "longrope"])
def test_phi3_partial_rotary_and_longrope_verify(rope_type):
    params = {"rope_type": rope_type, "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    if rope_type == "longrope":
        params |= {"short_factor": [1.0, 1.5], "long_factor": [2.0, 8.0], "original_max_position_embeddings": ORIGINAL}
    lm = tiny_model("phi3", rope_parameters=params)
    spec = family_for(lm.config).layer_spec(lm.model.model, 0, lm.config)
    assert spec.rotary_dim == 4
    assert verify(lm, [*TEXTS, LONG]).passed
    v = verify(lm, [*TEXTS, LONG], family=_break(lm, lambda s, *_: dataclasses.replace(s, rotary_dim=None,
                                                                                   inv_freq=default_inv_freq(1e4, 8))))
    assert not v.passed


def test_phi3_sliding_window_verifies():
    lm = tiny_model("phi3", sliding_window=4)
    assert family_for(lm.config).layer_spec(lm.model.model, 1, lm.config).sliding_window == 4
    assert verify(lm, TEXTS).passed
    assert not verify(lm, TEXTS, family=_break(lm, lambda s, *_: dataclasses.replace(s, sliding_window=None))).passed


# --- layouts and norms: each broken variant must be caught ---


def _blockwise_qkv(spec, base, i, cfg):
    # GPT-NeoX's fused rows are per head [q_h k_h v_h]; reading them as [all Q | all K | all V] is wrong.
    w = base.layers[i].attention.query_key_value.weight.detach()
    wq, wk, wv = w.chunk(3)
    return dataclasses.replace(spec, wq=wq, wk=wk, wv=wv, bq=None, bk=None, bv=None)


def _half_split(spec, *_):
    return dataclasses.replace(spec, rotary_interleaved=False)


def _no_qk_norm(spec, *_):
    return dataclasses.replace(spec, q_norm=None, k_norm=None)


def _gemma_offset(spec, *_):
    return dataclasses.replace(spec, norm_offset=1.0)


def _norm_per_head(spec, *_):
    # OLMo 2 normalises the whole projection; normalising each head with its slice of the weight is wrong.
    hs = spec.head_dim
    return dataclasses.replace(spec, norm_scope="head", q_norm=spec.q_norm.view(-1, 1, hs),
                               k_norm=spec.k_norm.view(-1, 1, hs))


def _rotary_everywhere(spec, base, i, cfg):
    from headscope.probe.families.llama import llama_spec

    return llama_spec(base, i, cfg)


def _phi3_swapped_k_v(spec, *_):
    return dataclasses.replace(spec, wk=spec.wv, wv=spec.wk)


@pytest.mark.parametrize("model_type, broken", [
    ("gpt_neox", _blockwise_qkv),
    ("gptj", _half_split),
    ("qwen3", _no_qk_norm),
    ("qwen3", _gemma_offset),
    ("olmo2", _no_qk_norm),
    ("olmo2", _norm_per_head),
    ("smollm3", _rotary_everywhere),
    ("phi3", _phi3_swapped_k_v),
])
def test_each_broken_decoder_feature_fails_verification(model_type, broken):
    lm = tiny_model(model_type)
    assert verify(lm, TEXTS).passed
    v = verify(lm, TEXTS, family=_break(lm, broken))
    assert not v.passed and v.max_abs_err > 1e-4, broken.__name__


def test_smollm3_tiny_model_has_layers_with_and_without_rotary_and_only_the_nope_layer_breaks():
    lm = tiny_model("smollm3")
    assert list(lm.config.no_rope_layers) == [1, 0]
    family = family_for(lm.config)
    specs = [family.layer_spec(lm.model.model, i, lm.config) for i in range(2)]
    assert specs[0].inv_freq is not None and specs[1].inv_freq is None
    v = verify(lm, TEXTS, family=_break(lm, _rotary_everywhere))
    assert [c.passed for c in v.layers] == [True, False]


def test_olmo2_and_qwen3_norm_weights_have_their_scope():
    olmo, qwen = tiny_model("olmo2"), tiny_model("qwen3")
    o = family_for(olmo.config).layer_spec(olmo.model.model, 0, olmo.config)
    q = family_for(qwen.config).layer_spec(qwen.model.model, 0, qwen.config)
    assert o.norm_scope == "projection" and o.q_norm.shape == (4 * 8,) and o.k_norm.shape == (2 * 8,)
    assert q.norm_scope == "head" and q.q_norm.shape == (8,) and o.norm_offset == q.norm_offset == 0.0


def test_gptj_rotary_wider_than_a_head_is_refused():
    from transformers import GPTJConfig

    with pytest.raises(UnsupportedFeature, match=re.escape("rotary_dim=16 rotates 16 dims, more than a head's 8")):
        family_for(GPTJConfig(n_embd=32, n_head=4, rotary_dim=16))


def test_pretraining_tp_is_ignored_by_transformers_and_verifies():
    lm = tiny_model("llama", pretraining_tp=2)
    assert verify(lm, TEXTS).passed


def test_new_decoder_families_are_registered():
    assert {"gpt_neox", "gptj", "phi3", "qwen3", "olmo2", "smollm3"} <= set(FAMILIES)
