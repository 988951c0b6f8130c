"""The model types of 2024–26 (issue 22): each new type verifies on a random config the other tests never
build, each new mechanism of the from-scratch attention has a known answer, and each is needed (broken,
verification fails)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from headscope.probe.families import SUPPORTED_TYPES, family_for
from headscope.probe.rotary import default_inv_freq
from headscope.probe.scratch import (LayerSpec, attention_from_scratch, block_probs, project_qk, row_probs,
                                     sink_share, softmax_with_sink)
from headscope.probe.tiny import TINY_CORPUS, tiny_model
from headscope.probe.verify import verify

TEXTS = list(TINY_CORPUS[:3])  # different lengths: the batch is padded

# Another seed, and where the type has one another layer pattern, window, head count or rotary share than
# the tiny config the other tests use.
SECOND_CONFIGS = {
    "mixtral": {"sliding_window": 3}, "qwen2_moe": {}, "phimoe": {"sliding_window": None},
    "granite": {"attention_multiplier": 0.05}, "granitemoe": {"attention_multiplier": 2.0},
    "starcoder2": {"sliding_window": 2}, "seed_oss": {}, "gemma": {},
    "qwen3_moe": {"sliding_window": 3}, "apertus": {},
    "exaone4": {"layer_types": ["full_attention", "sliding_attention"]},
    "hunyuan_v1_dense": {}, "hunyuan_v1_moe": {},
    "olmoe": {}, "olmo3": {"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 2},
    "vaultgemma": {"layer_types": ["full_attention"] * 3}, "mt5": {}, "umt5": {}, "mbart": {}, "pegasus": {},
    "glm": {}, "glm4": {}, "glm4_moe": {"use_qk_norm": False}, "ernie4_5": {}, "ernie4_5_moe": {},
    "cohere": {"use_qk_norm": False}, "cohere2": {"layer_types": ["full_attention", "sliding_attention"]},
    "phi": {}, "stablelm": {}, "gpt_bigcode": {"multi_query": False},
    "gpt_oss": {"layer_types": ["full_attention", "sliding_attention"]},
    "ministral": {"layer_types": ["full_attention", "sliding_attention"]}, "arcee": {}, "olmo": {}, "solar_open": {},
    "dots1": {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 3}, "flex_olmo": {},
}


def test_every_new_type_is_registered():
    assert set(SECOND_CONFIGS) <= set(SUPPORTED_TYPES)
    assert len(SUPPORTED_TYPES) >= 63


@pytest.mark.parametrize("model_type", sorted(SECOND_CONFIGS))
def test_each_new_type_verifies_on_a_random_config_no_other_test_builds(model_type):
    lm = tiny_model(model_type, seed=7, **SECOND_CONFIGS[model_type])
    assert lm.config.model_type == model_type
    v = verify(lm, TEXTS)
    assert v.passed, (model_type, v.max_abs_err, v.max_rel_err_output)


# --- learned attention sinks (gpt-oss) ---


def test_a_sink_is_one_more_key_whose_column_is_dropped():
    # Three visible keys with score 0 and a sink logit of 0: four equal shares, the sink's is dropped.
    p = softmax_with_sink(torch.zeros(1, 1, 2, 3), torch.tensor([0.0]))
    torch.testing.assert_close(p, torch.full((1, 1, 2, 3), 0.25))
    torch.testing.assert_close(sink_share(p), torch.full((1, 1, 2), 0.25))
    # A sink logit of log 3 against two keys of score 0: the sink takes 3 / (3 + 1 + 1).
    p = softmax_with_sink(torch.tensor([[[[0.0, 0.0, -float("inf")]]]]), torch.tensor([3.0]).log())
    torch.testing.assert_close(p, torch.tensor([[[[0.2, 0.2, 0.0]]]]))
    torch.testing.assert_close(sink_share(p), torch.tensor([[[0.6]]]))


def _spec(**extra) -> LayerSpec:
    g = torch.Generator().manual_seed(0)
    D, nh, hs = 8, 2, 4
    w = [torch.randn(nh * hs, D, generator=g) for _ in range(3)] + [torch.randn(D, nh * hs, generator=g)]
    return LayerSpec(*w, None, None, None, None, n_heads=nh, n_kv_heads=nh, head_dim=hs, scale=hs**-0.5,
                     causal=True, **extra)


def test_sinks_in_the_scratch_attention_match_a_reference_loop_and_blocks_agree():
    sinks = torch.tensor([1.5, -0.5])
    spec = _spec(sinks=sinks)
    x = 0.2 * torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(1))  # scores of order 1: no row saturates
    valid = torch.ones(1, 5)
    out = attention_from_scratch(x, spec, valid)
    q, k = project_qk(x, spec)
    for h in range(2):
        for i in range(5):
            logits = torch.cat([(q[0, h, i] @ k[0, h, : i + 1].T) * spec.scale, sinks[h : h + 1]])
            e = (logits - logits.max()).exp()
            torch.testing.assert_close(out.probs[0, h, i, : i + 1], e[:-1] / e.sum())
            assert (out.probs[0, h, i, i + 1 :] == 0).all()  # causal
            torch.testing.assert_close(sink_share(out.probs)[0, h, i], e[-1] / e.sum())
    assert (out.probs.sum(-1) < 1).all()  # never renormalised
    _, rows = row_probs(q[:, :, 2:4], k, spec, valid, query_start=2)
    torch.testing.assert_close(rows, out.probs[:, :, 2:4])
    one_head = block_probs(q[:, 1:, 2:4], k[:, 1:], spec, valid, query_start=2, heads=[1])
    torch.testing.assert_close(one_head, out.probs[:, 1:, 2:4])


def test_gpt_oss_maps_keep_the_sink_share_and_verification_needs_the_sinks():
    lm = tiny_model("gpt_oss")
    family = family_for(lm.config)
    good = verify(lm, TEXTS)
    assert good.passed
    without = dataclasses.replace(family, layer_spec=lambda b, i, c: dataclasses.replace(
        family.layer_spec(b, i, c), sinks=None))
    assert not verify(lm, TEXTS, family=without).passed
    ids = lm.tokenizer(TEXTS[0], return_tensors="pt").input_ids
    with torch.no_grad():
        att = lm.model(ids, output_attentions=True).attentions  # the model's own maps: rows sum to < 1
    shares = torch.stack([sink_share(a) for a in att])
    assert shares.min() > 1e-3 and shares.max() < 1


# --- the other mechanisms, each by a known answer and by breaking it ---


def test_mean_centred_qk_norm_with_a_weight_row_per_head_is_layer_norm():
    w = torch.randn(2, 4, generator=torch.Generator().manual_seed(2))
    spec = _spec(q_norm=w, k_norm=w, norm_offset=0.0, norm_kind="layer", norm_eps=1e-5)
    x = torch.randn(1, 3, 8, generator=torch.Generator().manual_seed(3))
    q, _ = project_qk(x, spec)
    raw = (x @ spec.wq.T).view(1, 3, 2, 4)  # (B, T, nh, hs)
    expected = torch.stack([F.layer_norm(raw[:, :, h], (4,), w[h], None, 1e-5) for h in range(2)], dim=1)
    torch.testing.assert_close(q, expected)


def test_norm_after_rotary_differs_from_before_and_equals_norming_the_rotated_heads():
    w = torch.rand(4) + 0.5
    before = _spec(q_norm=w, k_norm=w, norm_offset=0.0, inv_freq=torch.tensor([1.0, 0.1]))
    after = dataclasses.replace(before, norm_after_rotary=True)
    x = torch.randn(1, 4, 8, generator=torch.Generator().manual_seed(4))
    q_after, _ = project_qk(x, after)
    q_rot, _ = project_qk(x, dataclasses.replace(before, q_norm=None, k_norm=None))
    rms = q_rot.pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt()
    torch.testing.assert_close(q_after, q_rot * rms * w)
    assert not torch.allclose(q_after, project_qk(x, before)[0])


def _break(lm, change):
    good = family_for(lm.config)
    return dataclasses.replace(good, layer_spec=lambda b, i, c: change(good.layer_spec(b, i, c), b, i, c))


@pytest.mark.parametrize("model_type, change", [
    ("granite", lambda s, *_: dataclasses.replace(s, scale=s.head_dim**-0.5)),  # 1/√d, not attention_multiplier
    ("mixtral", lambda s, *_: dataclasses.replace(s, sliding_window=None)),  # slides on every layer
    ("hunyuan_v1_dense", lambda s, *_: dataclasses.replace(s, norm_after_rotary=False)),
    ("exaone4", lambda s, b, i, c: dataclasses.replace(family_for(c).layer_spec(b, 0, c), wq=s.wq, wk=s.wk, wv=s.wv,
                                                       wo=s.wo, q_norm=s.q_norm, k_norm=s.k_norm,
                                                       sliding_window=s.sliding_window)),  # rotary on NoPE layers
    ("glm", lambda s, *_: dataclasses.replace(s, rotary_interleaved=False)),
    ("glm", lambda s, *_: dataclasses.replace(s, rotary_dim=None, inv_freq=default_inv_freq(10000.0, s.head_dim))),
    ("glm4_moe", lambda s, *_: dataclasses.replace(s, rotary_interleaved=True)),
    ("cohere", lambda s, *_: dataclasses.replace(s, norm_kind="rms")),
    ("phi", lambda s, *_: dataclasses.replace(s, rotary_dim=None, inv_freq=default_inv_freq(10000.0, s.head_dim))),
    ("gpt_bigcode", lambda s, *_: dataclasses.replace(s, wk=s.wv, wv=s.wk, bk=s.bv, bv=s.bk)),
])
def test_each_new_mechanism_is_needed(model_type, change):
    lm = tiny_model(model_type)
    v = verify(lm, TEXTS, family=_break(lm, change))
    assert not v.passed and v.max_abs_err > 1e-4, model_type


def test_umt5_needs_each_layers_own_bias_table():
    lm = tiny_model("umt5")
    family = family_for(lm.config)
    enc = family.stack("encoder")
    first_table = dataclasses.replace(enc, layer_spec=lambda b, i, c: dataclasses.replace(
        enc.layer_spec(b, i, c), score_bias=enc.layer_spec(b, 0, c).score_bias))
    broken = dataclasses.replace(family, stacks=tuple(first_table if s.kind == "encoder" else s for s in family.stacks))
    v = verify(lm, TEXTS, family=broken)
    assert [c.passed for c in v.layers if c.kind == "encoder"] == [True, False]


# --- a hybrid stack (only some layers have softmax attention): its attention layers by their own numbers ---


@pytest.fixture(scope="module")
def hybrid():
    """A tiny random Qwen3.5 text model: three gated delta-net layers, then one full-attention layer."""
    import transformers
    from transformers import AutoConfig

    from headscope.probe.model import LoadedModel
    from headscope.probe.tiny import tiny_tokenizer

    tok = tiny_tokenizer("bytebpe")
    cfg = AutoConfig.for_model("qwen3_5_text", vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                               num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                               linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
                               linear_value_head_dim=8, max_position_embeddings=128, pad_token_id=0,
                               layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    return LoadedModel(name="tiny-qwen3.5", model=model, tokenizer=tok, source="random init", dtype=torch.float32,
                       device=torch.device("cpu"))


def test_a_hybrid_model_is_extracted_by_its_own_layer_numbers(hybrid):
    from headscope.probe.extract import extract
    from headscope.probe.forward import attention_layers, hybrid_note

    assert attention_layers(hybrid) == (1, 3)
    maps = extract(hybrid, TEXTS[:2], batch_size=2)
    for m in maps:
        assert m.layer_ids == (1, 3) and m.attention.shape[:2] == (2, 4)  # L1 and L3, never renumbered 0 and 1
        torch.testing.assert_close(m.attention.sum(-1), torch.ones(m.attention.shape[:-1]))
    with torch.no_grad():  # the model's own maps of its layer 3, in the order it returns them
        own = hybrid.model(hybrid.tokenizer(TEXTS[0], return_tensors="pt").input_ids, output_attentions=True).attentions
    torch.testing.assert_close(maps[0].attention[1], own[1][0])
    [one] = extract(hybrid, TEXTS[0], layers=[3])
    assert one.layer_ids == (3,) and torch.equal(one.attention[0], maps[0].attention[1])
    with pytest.raises(ValueError, match=r"layer 2 of tiny-qwen3.5 has no softmax self-attention \(a 'linear_attention' "
                                         r"layer of a hybrid stack\); its attention layers are 1, 3"):
        extract(hybrid, TEXTS[0], layers=[2])
    assert hybrid_note(hybrid).startswith("hybrid stack: layers 1, 3 of 4 have softmax attention; layers 0, 2 "
                                          "(linear_attention) have none")
    v = verify(hybrid, TEXTS)  # another layer pattern than the family's tiny model: verified on layers 1 and 3
    assert v.passed and [c.layer for c in v.layers] == [1, 3] and v.no_attention == (0, 2)


def test_head_scores_of_a_hybrid_model_name_its_attention_layers(hybrid):
    from headscope.workflows.heads import heads

    scores = heads(hybrid, TEXTS, induction_sequences=0)
    assert set(scores.table["layer"]) == {1, 3}


def test_olmo_clipping_of_q_k_v_is_refused_by_name():
    from transformers import AutoConfig

    from headscope.probe.families import UnsupportedFeature

    with pytest.raises(UnsupportedFeature, match=r"clip_qkv=8.0: clamping q, k and v is not reproduced"):
        family_for(AutoConfig.for_model("olmo", clip_qkv=8.0))
