"""The position and score features of the from-scratch attention, each against an independent reference."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from headscope.probe.scratch import (LayerSpec, alibi_slopes, attention_from_scratch, relative_position_buckets,
                                     rotary_cos_sin)


def _spec(*, nh=2, nkv=2, hs=8, D=16, causal=False, seed=0, **kw) -> LayerSpec:
    g = torch.Generator().manual_seed(seed)
    w = lambda o, i: torch.randn(o, i, generator=g) * 0.5  # noqa: E731
    return LayerSpec(w(nh * hs, D), w(nkv * hs, D), w(nkv * hs, D), w(D, nh * hs), None, None, None, None,
                     n_heads=nh, n_kv_heads=nkv, head_dim=hs, scale=hs**-0.5, causal=causal, **kw)


def _x(B=2, T=5, D=16, seed=1):
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed))


def _valid(B=2, T=5):
    return torch.ones(B, T, dtype=torch.long)


def _rotate_pairs_reference(x: torch.Tensor, inv_freq: torch.Tensor, pairs: list[tuple[int, int]]) -> torch.Tensor:
    """A loop over positions and dimension pairs: pair p = (a, b) turns by angle pos × inv_freq[p]."""
    out = x.clone()
    for t in range(x.shape[-2]):
        for p, (a, b) in enumerate(pairs):
            c, s = math.cos(t * inv_freq[p].item()), math.sin(t * inv_freq[p].item())
            xa, xb = x[..., t, a], x[..., t, b]
            out[..., t, a], out[..., t, b] = xa * c - xb * s, xb * c + xa * s
    return out


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [None, 4])
def test_rotary_matches_a_loop_over_dimension_pairs(interleaved, rotary_dim):
    hs = 8
    d = rotary_dim or hs
    inv_freq = 1.0 / (10_000 ** (torch.arange(0, d, 2).float() / d))
    spec = _spec(hs=hs, inv_freq=inv_freq, rotary_dim=rotary_dim, rotary_interleaved=interleaved)
    pairs = [(2 * i, 2 * i + 1) for i in range(d // 2)] if interleaved else [(i, i + d // 2) for i in range(d // 2)]
    x = _x()
    got = attention_from_scratch(x, spec, _valid())
    plain = attention_from_scratch(x, dataclasses.replace(spec, inv_freq=None), _valid())
    # Recompute scores from the unrotated q, k of the plain run, rotated by the reference loop.
    q = (x @ spec.wq.T).view(2, 5, 2, hs).transpose(1, 2)
    k = (x @ spec.wk.T).view(2, 5, 2, hs).transpose(1, 2)
    q, k = _rotate_pairs_reference(q, inv_freq, pairs), _rotate_pairs_reference(k, inv_freq, pairs)
    assert torch.allclose(got.scores, q @ k.transpose(-2, -1) * spec.scale, atol=1e-5)
    assert not torch.allclose(got.scores, plain.scores, atol=1e-3)  # positions did something


def test_interleaved_and_half_split_tables_hold_the_same_angles():
    inv_freq = torch.tensor([1.0, 0.1])
    c_half, _ = rotary_cos_sin(inv_freq, torch.arange(3))
    c_int, _ = rotary_cos_sin(inv_freq, torch.arange(3), interleaved=True)
    assert torch.equal(c_half[:, [0, 2, 1, 3]], c_int)


def test_rotary_frequencies_may_depend_on_the_sequence_length():
    seen = []

    def inv_freq(T):
        seen.append(T)
        return torch.ones(4)

    attention_from_scratch(_x(T=5), _spec(inv_freq=inv_freq), _valid(T=5))
    assert seen and set(seen) == {5}  # asked for the length of the sequence being rotated


def test_softcap_bounds_the_scores_and_vanishes_when_large():
    spec = _spec(seed=3)
    x = _x()
    capped = attention_from_scratch(x, dataclasses.replace(spec, softcap=2.0), _valid())
    assert capped.scores.abs().max() <= 2.0
    huge = attention_from_scratch(x, dataclasses.replace(spec, softcap=1e6), _valid())
    plain = attention_from_scratch(x, spec, _valid())
    assert torch.allclose(huge.probs, plain.probs, atol=1e-5)
    assert torch.allclose(capped.scores, 2.0 * torch.tanh(plain.scores / 2.0), atol=1e-6)


def test_score_bias_is_added_per_head_and_dropped_without_positions():
    bias = torch.zeros(2, 5, 5)
    bias[1, :, 0] = 50.0  # head 1 is pushed onto key 0
    spec = _spec(score_bias=lambda tq, tk: bias[:, :tq, :tk])
    out = attention_from_scratch(_x(), spec, _valid())
    assert torch.allclose(out.probs[:, 1, :, 0], torch.ones(2, 5), atol=1e-6)
    plain = attention_from_scratch(_x(), dataclasses.replace(spec, score_bias=None), _valid())
    assert torch.allclose(out.probs[:, 0], plain.probs[:, 0])
    no_pos = attention_from_scratch(_x(), spec, _valid(), use_positions=False)
    assert torch.equal(no_pos.probs, plain.probs)


def test_qk_norm_over_the_projection_equals_per_head_with_one_head():
    w = torch.linspace(0.5, 1.5, 8)
    one = dict(nh=1, nkv=1, q_norm=w, k_norm=w, norm_offset=0.0)
    per_head = attention_from_scratch(_x(), _spec(**one, norm_scope="head"), _valid())
    whole = attention_from_scratch(_x(), _spec(**one, norm_scope="projection"), _valid())
    assert torch.allclose(per_head.probs, whole.probs, atol=1e-6)
    two = dict(nh=2, nkv=2, q_norm=torch.ones(16), k_norm=torch.ones(16), norm_offset=0.0)
    assert not torch.allclose(attention_from_scratch(_x(), _spec(**two, norm_scope="projection"), _valid()).probs,
                              per_head.probs, atol=1e-3)


def test_plain_norm_weight_vs_gemma_offset():
    w = torch.full((8,), 0.5)
    plain = attention_from_scratch(_x(), _spec(q_norm=w, k_norm=w, norm_offset=0.0), _valid())
    gemma = attention_from_scratch(_x(), _spec(q_norm=w - 1.0, k_norm=w - 1.0, norm_offset=1.0), _valid())
    assert torch.allclose(plain.probs, gemma.probs, atol=1e-6)


def test_cross_attention_on_the_same_sequence_is_self_attention():
    spec, x = _spec(), _x()
    assert torch.allclose(attention_from_scratch(x, spec, _valid(), kv=x.clone()).probs,
                          attention_from_scratch(x, spec, _valid()).probs)


def test_cross_attention_shapes_and_padding_of_the_source():
    spec, x, src = _spec(), _x(T=3), _x(T=6, seed=5)
    valid = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    out = attention_from_scratch(x, spec, valid, kv=src)
    assert out.probs.shape == (2, 2, 3, 6) and out.output.shape == (2, 3, 16)
    assert torch.equal(out.probs[1, :, :, 4:], torch.zeros(2, 3, 2))
    assert torch.allclose(out.probs.sum(-1), torch.ones(2, 2, 3), atol=1e-6)


def test_local_window_band():
    spec = _spec(local_window=1)
    probs = attention_from_scratch(_x(), spec, _valid()).probs
    i, j = torch.meshgrid(torch.arange(5), torch.arange(5), indexing="ij")
    assert torch.equal(probs[..., (i - j).abs() > 1], torch.zeros_like(probs[..., (i - j).abs() > 1]))


def test_alibi_slopes_against_transformers_bloom():
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    for n in (1, 3, 4, 6, 8, 12, 20, 71):
        ref = build_alibi_tensor(torch.ones(1, 2), n, torch.float32).reshape(n, 2)[:, 1]  # slope × position 1
        assert torch.allclose(alibi_slopes(n), ref), n


@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_buckets_against_transformers_t5(bidirectional):
    from transformers.models.t5.modeling_t5 import T5Attention

    r = torch.arange(-300, 301)
    ref = T5Attention._relative_position_bucket(r, bidirectional=bidirectional, num_buckets=32, max_distance=128)
    assert torch.equal(relative_position_buckets(r, bidirectional=bidirectional, n_buckets=32, max_distance=128), ref)
