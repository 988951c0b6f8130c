"""Attention from scratch, top to bottom, in plain torch ops.

Given one layer's input `x` and that layer's own weights (a `LayerSpec`, filled in by the
architecture adapters), recompute what the model's attention block does:

    q, k, v = x Wqᵀ + bq, x Wkᵀ + bk, x Wvᵀ + bv           project
    split into heads (grouped-query: a KV head serves several query heads)
    optional per-head RMS norm of q and k (Gemma 3), rotary positions (Llama, Gemma 3)
    scores = q kᵀ · scale                                   (√d or the model's own scalar)
    scores += mask                                          padding, causal, sliding window
    P = softmax(scores), written out: subtract the row max, exp, normalise
    y = P v, heads concatenated, out = y Woᵀ + bo

No `scaled_dot_product_attention`, no transformers attention code: this is the independent
implementation the real model is checked against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "LayerSpec", "ScratchResult", "attention_from_scratch", "project_qk", "row_probs", "stable_softmax",
    "rotary_cos_sin", "build_mask",
]


@dataclass(frozen=True, eq=False)
class LayerSpec:
    """Everything one attention layer needs, in nn.Linear layout (weight is (out, in))."""

    wq: torch.Tensor  # (nh*hs, D)
    wk: torch.Tensor  # (nkv*hs, D)
    wv: torch.Tensor  # (nkv*hs, D)
    wo: torch.Tensor  # (D, nh*hs)
    bq: torch.Tensor | None
    bk: torch.Tensor | None
    bv: torch.Tensor | None
    bo: torch.Tensor | None
    n_heads: int
    n_kv_heads: int
    head_dim: int
    scale: float
    causal: bool
    sliding_window: int | None = None  # key j visible from query i only if i - j < window
    inv_freq: torch.Tensor | None = None  # (hs/2,) rotary frequencies; None = no rotary
    rope_scaling: float = 1.0  # multiplies cos and sin (1.0 for default, linear and llama3 rope)
    q_norm: torch.Tensor | None = None  # (hs,) Gemma-style RMS norm weight, applied as (1 + w)
    k_norm: torch.Tensor | None = None
    norm_eps: float = 1e-6


@dataclass(frozen=True, eq=False)
class ScratchResult:
    scores: torch.Tensor  # (B, nh, T, T) scaled, before masking
    probs: torch.Tensor  # (B, nh, T, T) attention probabilities
    values: torch.Tensor  # (B, nh, T, hs) V per query head (grouped KV heads repeated)
    heads_out: torch.Tensor  # (B, nh, T, hs) P·V per head
    output: torch.Tensor  # (B, T, D) after the head concat and W_O


def stable_softmax(scores: torch.Tensor) -> torch.Tensor:
    """softmax over the last dim, shifted by the row max so exp never overflows.

    >>> stable_softmax(torch.tensor([[1000.0, 1000.0, -float("inf")]]))
    tensor([[0.5000, 0.5000, 0.0000]])
    """
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))  # fully masked rows
    e = torch.exp(scores - row_max)
    return e / e.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)


def rotary_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, scaling: float = 1.0):
    """cos and sin tables, (T, hs), in the half-split layout transformers uses (not interleaved)."""
    angles = positions[:, None].to(inv_freq.dtype) * inv_freq[None, :]  # (T, hs/2)
    emb = torch.cat([angles, angles], dim=-1)  # (T, hs)
    return emb.cos() * scaling, emb.sin() * scaling


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (B, n, T, hs); each pair (x_i, x_{i+hs/2}) turns by its angle.
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * (1.0 + weight.float())).to(x.dtype)


def build_mask(
    key_valid: torch.Tensor,
    *,
    causal: bool,
    sliding_window: int | None,
    dtype: torch.dtype,
    rows: tuple[int, int] | None = None,
    key_start: int = 0,
) -> torch.Tensor:
    """Additive mask (B, 1, R, T): 0 where query i may see key j, -inf elsewhere.

    `rows=(start, stop)` gives the mask of queries start .. stop-1 only (all T queries by default);
    `key_start` is the position of the first key of `key_valid` (keys key_start .. key_start+T-1).

    >>> build_mask(torch.tensor([[1, 1, 0]]), causal=True, sliding_window=None, dtype=torch.float32)[0, 0]
    tensor([[0., -inf, -inf],
            [0., 0., -inf],
            [0., 0., -inf]])
    """
    T = key_valid.shape[-1]
    start, stop = rows if rows is not None else (0, T)
    i = torch.arange(start, stop, device=key_valid.device)[:, None]
    j = torch.arange(key_start, key_start + T, device=key_valid.device)[None, :]
    allowed = key_valid.bool()[:, None, None, :].expand(-1, 1, stop - start, T)  # (B, 1, R, T)
    if causal:
        allowed = allowed & (j <= i)
    if sliding_window is not None:
        allowed = allowed & (i - j < sliding_window)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=key_valid.device)
    return mask.masked_fill(~allowed, float("-inf"))


def attention_from_scratch(
    x: torch.Tensor,
    spec: LayerSpec,
    key_valid: torch.Tensor,
    *,
    use_scale: bool = True,
    use_positions: bool = True,
) -> ScratchResult:
    """One attention layer on input `x` (B, T, D); `key_valid` (B, T) is 1 for real tokens.

    `use_scale=False` drops the 1/√d factor and `use_positions=False` drops rotary positions —
    the two experiments the lessons describe (softmax saturation, permutation equivariance).
    """
    B, T, D = x.shape
    nh, nkv, hs = spec.n_heads, spec.n_kv_heads, spec.head_dim
    dt = x.dtype

    q, k = project_qk(x, spec, use_positions=use_positions)  # (B, nh, T, hs), (B, nkv, T, hs)
    v = _project(x, spec.wv, spec.bv, nkv, hs)  # (B, nkv, T, hs)

    group = nh // nkv  # grouped-query attention: KV head g serves query heads g*group .. g*group+group-1
    k = k.repeat_interleave(group, dim=1)  # (B, nh, T, hs)
    v = v.repeat_interleave(group, dim=1)  # (B, nh, T, hs)

    scores, probs = row_probs(q, k, spec, key_valid, query_start=0, use_scale=use_scale)  # (B, nh, T, T)

    heads_out = probs @ v  # (B, nh, T, hs)
    y = heads_out.transpose(1, 2).reshape(B, T, nh * hs)  # concat heads: (B, T, nh*hs)
    out = _add_bias(y @ spec.wo.T.to(dt), spec.bo)  # (B, T, D)
    return ScratchResult(scores=scores, probs=probs, values=v, heads_out=heads_out, output=out)


def _project(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, n: int, hs: int) -> torch.Tensor:
    B, T, _ = x.shape
    return _add_bias(x @ w.T.to(x.dtype), b).view(B, T, n, hs).transpose(1, 2)  # (B, n, T, hs)


def project_qk(x: torch.Tensor, spec: LayerSpec, *, use_positions: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries (B, nh, T, hs) and keys (B, nkv, T, hs) of input `x` (B, T, D): projected, normed, rotated.

    Positions are 0 .. T-1, so `x` must start at the text's first token (right padding is fine).
    """
    T, dt = x.shape[1], x.dtype
    q = _project(x, spec.wq, spec.bq, spec.n_heads, spec.head_dim)  # (B, nh, T, hs)
    k = _project(x, spec.wk, spec.bk, spec.n_kv_heads, spec.head_dim)  # (B, nkv, T, hs)
    if spec.q_norm is not None:
        q, k = _rms_norm(q, spec.q_norm, spec.norm_eps), _rms_norm(k, spec.k_norm, spec.norm_eps)
    if spec.inv_freq is not None and use_positions:
        positions = torch.arange(T, device=x.device)
        cos, sin = rotary_cos_sin(spec.inv_freq.float().to(x.device), positions, spec.rope_scaling)
        q, k = _rotate(q, cos.to(dt), sin.to(dt)), _rotate(k, cos.to(dt), sin.to(dt))
    return q, k


def row_probs(
    q_rows: torch.Tensor,
    k: torch.Tensor,
    spec: LayerSpec,
    key_valid: torch.Tensor,
    *,
    query_start: int,
    key_start: int = 0,
    use_scale: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled scores and probabilities of a block of query rows against a run of keys.

    `q_rows` (B, h, R, hs) are the queries of positions query_start .. query_start+R-1; `k`
    (B, h, K, hs) and `key_valid` (B, K) the keys key_start .. key_start+K-1 of the same heads.
    Returns scores (before the mask) and probabilities, both (B, h, R, K). With every query and
    every key (query_start = key_start = 0) this is the full attention. Keys left out must be ones
    the mask hides from these rows, or the rows no longer sum over what the model sees.
    """
    R = q_rows.shape[-2]
    scale = spec.scale if use_scale else 1.0
    scores = (q_rows @ k.transpose(-2, -1)) * scale  # (B, h, R, K)
    mask = build_mask(key_valid, causal=spec.causal, sliding_window=spec.sliding_window, dtype=q_rows.dtype,
                      rows=(query_start, query_start + R), key_start=key_start)
    return scores, stable_softmax(scores + mask)  # (B, h, R, K)


def _add_bias(t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return t if bias is None else t + bias.to(t.dtype)


def default_inv_freq(theta: float, dim: int) -> torch.Tensor:
    """Rotary frequencies θ^(-2i/d), i = 0 .. d/2-1, in float32 as transformers computes them."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def llama3_inv_freq(base: torch.Tensor, factor: float, low: float, high: float, original_max: int) -> torch.Tensor:
    """Llama 3.1 rope scaling: long wavelengths slowed by `factor`, a smooth ramp in between."""
    low_wavelen, high_wavelen = original_max / low, original_max / high
    wavelen = 2 * math.pi / base
    scaled = torch.where(wavelen > low_wavelen, base / factor, base)
    smooth = (original_max / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)
