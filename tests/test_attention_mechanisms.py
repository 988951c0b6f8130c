"""The attention mechanisms of issue 22 still missing from the first pass: multi-head latent attention
(DeepSeek); chunked local attention, NoPE layers, temperature tuning and the L2 q/k norm (Llama 4);
shared-KV layers, k = v, the value norm and proportional rope (Gemma 4). Each has a known answer from a reference loop written apart from `scratch.py`, is needed
(broken, verification fails), verifies on a random config no other test builds, and the tools that
slice head outputs read the value head size from the spec."""

import copy
import dataclasses
import importlib
import math

import pytest
import torch
from conftest import _tiny

from headscope.probe.attribution import qk_attribution, residual_parts, trace
from headscope.probe.composition import head_factors
from headscope.probe.errors import UnsupportedFeature
from headscope.probe.families import SUPPORTED_TYPES, family_for
from headscope.probe.forward import base_model
from headscope.probe.interventions import ablate, head_means
from headscope.probe.rotary import ROPE_INV_FREQ, default_inv_freq
from headscope.probe.scratch import (LayerSpec, MultiHeadLatent, attention_from_scratch, project_qk, project_v,
                                     temperature_scales, visible_keys)
from headscope.probe.tiny import TINY_CORPUS, tiny_model
from headscope.probe.verify import verify

TEXTS = list(TINY_CORPUS[:3])  # different lengths: the batch is padded


def _break(lm, change):
    good = family_for(lm.config)
    return dataclasses.replace(good, layer_spec=lambda b, i, c: change(good.layer_spec(b, i, c), b, i, c))


def _fails(lm, change):
    v = verify(lm, TEXTS, family=_break(lm, change))
    return not v.passed and v.max_abs_err > 1e-4


# --- multi-head latent attention (DeepSeek-V2/V3) ---


def _rms(x, w, eps=1e-6):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _turn_pairs(x, pos, inv_freq):
    """Interleaved rotary by a loop over pairs (x_2i, x_2i+1): each turns by the angle pos × inv_freq[i]."""
    out = x.clone()
    for i, f in enumerate(inv_freq.tolist()):
        c, s = math.cos(pos * f), math.sin(pos * f)
        out[2 * i], out[2 * i + 1] = x[2 * i] * c - x[2 * i + 1] * s, x[2 * i] * s + x[2 * i + 1] * c
    return out


def test_latent_attention_matches_a_loop_over_heads_queries_and_keys():
    torch.manual_seed(0)
    D, nh, rq, r, nope, rope, vd, T = 10, 3, 5, 4, 2, 4, 3, 5
    w = {k: torch.randn(*s, dtype=torch.float32) for k, s in dict(
        q_a=(rq, D), q_a_norm=(rq,), wq=(nh * (nope + rope), rq), kv_a=(r + rope, D), kv_a_norm=(r,),
        wk=(nh * nope, r), wv=(nh * vd, r), wo=(D, nh * vd)).items()}
    inv_freq = default_inv_freq(10000.0, rope)
    spec = LayerSpec(w["wq"], w["wk"], w["wv"], w["wo"], None, None, None, None, n_heads=nh, n_kv_heads=nh,
                     head_dim=nope + rope, v_head_dim=vd, scale=0.37, causal=True, inv_freq=inv_freq,
                     rotary_interleaved=True,
                     latent=MultiHeadLatent(q_a=w["q_a"], q_a_bias=None, q_a_norm=w["q_a_norm"], kv_a=w["kv_a"],
                                            kv_a_bias=None, kv_a_norm=w["kv_a_norm"], nope_dim=nope))
    x = torch.randn(1, T, D, dtype=torch.float32)
    got = attention_from_scratch(x, spec, torch.ones(1, T))
    assert got.heads_out.shape == (1, nh, T, vd)  # the value head size, not nope + rope

    out = torch.zeros(T, D, dtype=torch.float32)
    for t in range(T):
        q_lat = _rms(w["q_a"] @ x[0, t], w["q_a_norm"])
        for h in range(nh):
            q = (w["wq"] @ q_lat)[h * (nope + rope) : (h + 1) * (nope + rope)]
            q = torch.cat([q[:nope], _turn_pairs(q[nope:], t, inv_freq)])
            scores = []
            for s in range(t + 1):  # causal
                ckr = w["kv_a"] @ x[0, s]
                c, k_rope = _rms(ckr[:r], w["kv_a_norm"]), ckr[r:]  # one rotary key for every head
                k = torch.cat([(w["wk"] @ c)[h * nope : (h + 1) * nope], _turn_pairs(k_rope, s, inv_freq)])
                scores.append(0.37 * float(q @ k))
            p = torch.softmax(torch.tensor(scores, dtype=torch.float32), 0)
            torch.testing.assert_close(got.probs[0, h, t, : t + 1], p)
            v = torch.stack([(w["wv"] @ _rms((w["kv_a"] @ x[0, s])[:r], w["kv_a_norm"]))[h * vd : (h + 1) * vd]
                             for s in range(t + 1)])  # (t+1, vd)
            out[t] += w["wo"][:, h * vd : (h + 1) * vd] @ (p @ v)
    torch.testing.assert_close(got.output[0], out)


@pytest.mark.parametrize("model_type, change", [
    ("deepseek_v3", lambda s, *_: dataclasses.replace(s, rotary_interleaved=False)),  # rope_interleave=True
    ("deepseek_v2", lambda s, *_: dataclasses.replace(s, rotary_interleaved=False)),  # complex rotary: pairs
    ("deepseek_v3", lambda s, *_: dataclasses.replace(s, scale=s.head_dim**-0.5)),  # yarn's mscale² left out
    ("deepseek_v3", lambda s, *_: dataclasses.replace(  # the kv latent's RMS norm left out
        s, latent=dataclasses.replace(s.latent, kv_a_norm=torch.ones_like(s.latent.kv_a_norm) * 1e3))),
    ("deepseek_v3", lambda s, *_: dataclasses.replace(  # the query latent's RMS norm left out
        s, latent=dataclasses.replace(s.latent, q_a_norm=torch.ones_like(s.latent.q_a_norm) * 1e3))),
])
def test_each_latent_attention_mechanism_is_needed(model_type, change):
    assert _fails(_tiny(model_type), change)


def test_a_rotary_key_per_head_instead_of_the_shared_one_fails():
    lm = _tiny("deepseek_v3")
    # the shared key's rows moved: the rotated dims read the wrong part of kv_a
    assert _fails(lm, lambda s, *_: dataclasses.replace(
        s, latent=dataclasses.replace(s.latent, kv_a=s.latent.kv_a.roll(1, dims=0))))


@pytest.mark.parametrize("model_type, overrides", [
    # no query latent, half-split rotary, a wider value head, the default rope, three layers
    ("deepseek_v3", dict(q_lora_rank=None, rope_interleave=False, v_head_dim=10, num_hidden_layers=3,
                         mlp_layer_types=["dense", "sparse", "sparse"],
                         rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    ("deepseek_v2", dict(q_lora_rank=8, kv_lora_rank=6, qk_nope_head_dim=6, v_head_dim=2)),
    ("glm4_moe_lite", dict(v_head_dim=3, kv_lora_rank=5)),
    ("youtu", dict(q_lora_rank=None, rope_interleave=False)),
    ("minicpm3", dict(num_attention_heads=2, num_key_value_heads=2, qk_rope_head_dim=2, head_dim=2)),
])
def test_latent_attention_verifies_on_random_configs_no_other_test_builds(model_type, overrides):
    lm = tiny_model(model_type, seed=11, **overrides)
    v = verify(lm, TEXTS)
    assert v.passed, (v.max_abs_err, v.max_rel_err_output)


def test_zero_ablation_of_a_latent_attention_head_is_its_w_o_columns_zeroed():
    """The head's slice of W_O's input is v_head_dim wide (6 here), not the q/k head size (8)."""
    lm = _tiny("deepseek_v3")
    spec = family_for(lm.config).layer_spec(base_model(lm), 1, lm.config)
    assert spec.value_head_dim == 6 != spec.head_dim
    ids = lm.tokenizer(TEXTS[0], return_tensors="pt")["input_ids"]
    with torch.no_grad(), ablate(lm, [(1, 2)], method="zero"):
        got = lm.model(input_ids=ids).logits
    manual = copy.deepcopy(lm.model)
    with torch.no_grad():
        manual.model.layers[1].self_attn.o_proj.weight[:, 2 * 6 : 3 * 6] = 0  # head 2's columns
        want = manual(input_ids=ids).logits
        clean = lm.model(input_ids=ids).logits
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got, clean)


def test_dla_splits_latent_attention_heads_and_qk_tools_refuse_in_one_line():
    lm = _tiny("deepseek_v3")
    tr = trace(lm, TEXTS[0])
    _, _, attn_err = residual_parts(tr, 3)  # the heads' writes through their v_head_dim slices of W_O
    assert attn_err < 1e-6  # float32 rounding of the model's own output
    for call in (lambda: qk_attribution(lm, TEXTS[0], layer=1, head=0, query=3, key=1), lambda: head_factors(lm)):
        with pytest.raises(UnsupportedFeature, match="multi-head latent attention") as err:
            call()
        assert "\n" not in str(err.value)


# --- Llama 4: chunked local attention, NoPE layers, temperature tuning, L2 q/k norm ---


def test_chunked_attention_sees_only_its_own_chunk_causally():
    got = visible_keys(torch.ones(1, 7), causal=True, sliding_window=None, chunk_size=3)[0, 0].int()
    want = torch.tensor([[1, 0, 0, 0, 0, 0, 0],  # chunk 0: positions 0 1 2
                         [1, 1, 0, 0, 0, 0, 0],
                         [1, 1, 1, 0, 0, 0, 0],
                         [0, 0, 0, 1, 0, 0, 0],  # chunk 1: positions 3 4 5, none of chunk 0
                         [0, 0, 0, 1, 1, 0, 0],
                         [0, 0, 0, 1, 1, 1, 0],
                         [0, 0, 0, 0, 0, 0, 1]], dtype=torch.int32)  # chunk 2 starts afresh
    assert torch.equal(got, want)
    rows = visible_keys(torch.ones(1, 7), causal=True, sliding_window=None, chunk_size=3, rows=(4, 6))[0, 0].int()
    assert torch.equal(rows, want[4:6])  # a block of rows is the same rows of the whole


def test_temperature_is_one_then_grows_with_the_log_of_the_floored_position():
    got = temperature_scales(7, 3, 0.2)
    want = [1 + 0.2 * math.log(1 + (t + 1) // 3) for t in range(7)]  # ⌊(t+1)/3⌋ = 0 0 1 1 1 2 2
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float32))
    spec = LayerSpec(*(torch.eye(4),) * 4, None, None, None, None, n_heads=1, n_kv_heads=1, head_dim=4, scale=1.0,
                     causal=True, temperature=(3, 0.2))
    x = torch.randn(1, 7, 4)
    q, k = project_qk(x, spec)
    torch.testing.assert_close(q[0, 0], x[0] * got[:, None])  # each query row by its own position's factor
    torch.testing.assert_close(k[0, 0], x[0])  # keys untouched


def test_l2_qk_norm_after_rotary_gives_unit_rms_heads():
    lm = _tiny("llama4_text")
    spec = family_for(lm.config).layer_spec(base_model(lm), 0, lm.config)
    q, k = project_qk(10 * torch.randn(1, 5, 32), spec)  # large enough for eps not to matter
    torch.testing.assert_close(q.pow(2).mean(-1), torch.ones(1, 4, 5), atol=1e-5, rtol=0)
    torch.testing.assert_close(k.pow(2).mean(-1), torch.ones(1, 2, 5), atol=1e-5, rtol=0)


def _layer0_positions(s, b, i, c):  # rotary (layer 0's) on a NoPE layer
    first = family_for(c).layer_spec(b, 0, c)
    return dataclasses.replace(s, inv_freq=first.inv_freq) if s.inv_freq is None else s


@pytest.mark.parametrize("change", [
    lambda s, *_: dataclasses.replace(s, chunk_size=None),  # chunked layers see the whole context
    lambda s, *_: dataclasses.replace(s, temperature=None),  # no temperature on the NoPE layer
    lambda s, *_: dataclasses.replace(s, q_norm=None, k_norm=None),  # no L2 norm
    lambda s, *_: dataclasses.replace(s, rotary_interleaved=False),  # complex rotary: consecutive pairs
    _layer0_positions,
], ids=["chunks", "temperature", "l2-norm", "interleaved", "nope"])
def test_each_llama4_mechanism_is_needed(change):
    assert _fails(_tiny("llama4_text"), change)


def test_llama4_verifies_on_a_random_config_no_other_test_builds_and_qk_attribution_adds_up():
    # NoPE layers first and last, chunks of 2, another temperature, no q/k norm, one KV head
    lm = tiny_model("llama4_text", seed=5, num_hidden_layers=4, no_rope_layers=[0, 1, 1, 0],
                    layer_types=["full_attention", "chunked_attention", "chunked_attention", "full_attention"],
                    attention_chunk_size=2, floor_scale=3, attn_scale=0.2, use_qk_norm=False, num_attention_heads=2,
                    num_key_value_heads=1)
    v = verify(lm, TEXTS)
    assert v.passed, (v.max_abs_err, v.max_rel_err_output)
    lm = _tiny("llama4_text")
    for layer in (1, 2):  # a chunked layer with L2 norm, a NoPE layer with its temperature
        r = qk_attribution(lm, TEXTS[0], layer=layer, head=1, query=7, key=6)
        assert r.identity_abs_err < 1e-5 and r.input_abs_err < 1e-5


# --- Gemma 4: shared-KV layers, k = v, the value norm, proportional rope, per-layer head sizes ---


def test_shared_kv_layers_read_the_producers_keys_and_values():
    lm = _tiny("gemma4_text")  # layers: sliding, sliding, global, then shared sliding and shared global
    fam, base = family_for(lm.config), base_model(lm)
    specs = [fam.layer_spec(base, i, lm.config) for i in range(5)]
    assert [s.kv_layer for s in specs] == [None, None, None, 1, 2]  # the last earlier layer of the same type
    assert torch.equal(specs[3].wk, specs[1].wk) and torch.equal(specs[4].k_norm, specs[2].k_norm)
    # keys from the layer's own input instead of the producer's: not what the model does
    assert _fails(lm, lambda s, *_: dataclasses.replace(s, kv_layer=None))
    with pytest.raises(UnsupportedFeature, match="reuses layer 1's keys and values") as err:
        attention_from_scratch(torch.randn(1, 3, 32), specs[3], torch.ones(1, 3))  # no kv= given: refused
    assert "\n" not in str(err.value)


def test_k_eq_v_values_are_the_normed_key_projection_before_rotary():
    lm = _tiny("gemma4_text")
    spec = family_for(lm.config).layer_spec(base_model(lm), 2, lm.config)  # a global layer, k = v
    assert base_model(lm).layers[2].self_attn.v_proj is None and torch.equal(spec.wv, spec.wk)
    x = torch.randn(2, 5, 32)
    raw = (x @ spec.wk.T).view(2, 5, 1, 8).transpose(1, 2)  # (B, 1 KV head, T, 8) the keys before norm and rotary
    want = raw / raw.pow(2).mean(-1, keepdim=True).add(spec.norm_eps).sqrt()  # unit-weight RMS norm
    torch.testing.assert_close(project_v(x, spec), want)
    v = verify(lm, TEXTS, family=_break(lm, lambda s, *_: dataclasses.replace(s, v_norm=None)))
    assert not v.passed and v.max_rel_err_output > 1e-3  # the value norm is needed (the weights do not see it)


def test_proportional_rope_turns_the_first_share_of_pairs_at_whole_head_exponents():
    p = {"rope_type": "proportional", "rope_theta": 100.0, "partial_rotary_factor": 0.5}
    inv_freq, factor = ROPE_INV_FREQ["proportional"](p, 8, None)
    torch.testing.assert_close(inv_freq, torch.tensor([1.0, 100.0 ** (-2 / 8), 0.0, 0.0]))  # 2 of 4 pairs turn
    assert factor == 1.0
    lm = _tiny("gemma4_text")  # default frequencies over the whole head on the global layers: fails
    assert _fails(lm, lambda s, b, i, c: dataclasses.replace(s, inv_freq=default_inv_freq(100.0, s.head_dim))
                  if c.layer_types[i] == "full_attention" else s)


def _gemma4_config(vocab, model_type):
    from transformers import AutoConfig

    # Six layers, the last three sharing KV (producers 1 and 2), global heads of 12 dims with their own v_proj
    # (no k = v) and 2 KV heads, a window of 3, a quarter of the global pairs turning.
    return AutoConfig.for_model(
        model_type, vocab_size=vocab, vocab_size_per_layer_input=vocab, hidden_size=32, intermediate_size=64,
        num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1, head_dim=8, global_head_dim=12,
        num_global_key_value_heads=2, attention_k_eq_v=False, num_kv_shared_layers=3, sliding_window=3,
        max_position_embeddings=128, hidden_size_per_layer_input=4,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                     "sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                            "rope_theta": 1e6}})


def test_gemma4_with_other_head_sizes_per_layer_verifies_and_ablates(monkeypatch):
    family = SUPPORTED_TYPES["gemma4_text"]
    monkeypatch.setattr(importlib.import_module("headscope.probe.families.gemma4"), "FAMILY",  # the family's file
                        dataclasses.replace(family, tiny_config=_gemma4_config))
    lm = tiny_model("gemma4_text", seed=3)
    assert lm.config.kv_sharing_modes == [None, "store", "store", "reuse", "reuse", "reuse"]
    v = verify(lm, TEXTS)
    assert v.passed, (v.max_abs_err, v.max_rel_err_output)
    ids = lm.tokenizer(TEXTS[0], return_tensors="pt")["input_ids"]
    with torch.no_grad(), ablate(lm, [(2, 1), (5, 3)], method="zero"):  # global layers: 12-dim head slices
        got = lm.model(input_ids=ids).logits
    manual = copy.deepcopy(lm.model)
    with torch.no_grad():
        manual.model.layers[2].self_attn.o_proj.weight[:, 12:24] = 0
        manual.model.layers[5].self_attn.o_proj.weight[:, 36:48] = 0
        torch.testing.assert_close(got, manual(input_ids=ids).logits)
    with pytest.raises(UnsupportedFeature, match=r"different sizes in different layers \(\[8, 12\]\)"):
        head_means(lm, TEXTS)


def test_gemma3n_shares_kv_like_gemma4_and_verifies_on_another_seed_and_window():
    lm = tiny_model("gemma3n_text", seed=9, sliding_window=2)
    assert lm.config.kv_sharing_modes == ["store", "store", "reuse", "reuse"]
    v = verify(lm, TEXTS)
    assert v.passed, (v.max_abs_err, v.max_rel_err_output)
    assert _fails(lm, lambda s, *_: dataclasses.replace(s, kv_layer=None))  # its own input instead of the producer's


def test_qk_attribution_of_a_shared_kv_layer_splits_the_producers_keys():
    lm = _tiny("gemma4_text")
    for layer in (3, 4):  # the keys are layers 1's and 2's, from their residual streams
        r = qk_attribution(lm, TEXTS[0], layer=layer, head=1, query=7, key=5)
        assert r.identity_abs_err < 1e-5 and r.input_abs_err < 1e-5
    with pytest.raises(UnsupportedFeature, match="reuses layer 1's keys and values") as err:
        head_factors(lm)  # composition: K and V of another layer's stream, not covered: refused in one line
    assert "\n" not in str(err.value)
