"""Attention from scratch, top to bottom, in plain torch ops.

Given one layer's input `x` and that layer's own weights (a `LayerSpec`, filled in by the
architecture families in `probe/families/`), recompute what the model's attention block does:

    q, k, v = x Wqᵀ + bq, x Wkᵀ + bk, x Wvᵀ + bv           project
        (shared-KV layers, Gemma 4: k and v from an earlier layer's input, with that layer's weights)
    split into heads (grouped-query: a KV head serves several query heads)
    optional RMS (or mean-centred layer) norm of q and k (per head, or over the whole projection), and of v (Gemma 4)
    multi-head latent attention (DeepSeek): q, k, v through low-rank latents with their own RMS norms,
        a rotary key shared by all heads, a value head size of its own (`MultiHeadLatent`)
    rotary positions on all or the first `rotary_dim` dims of each head (half-split or interleaved)
        (DINOv3: 2-D angles from each patch's (row, column), none on [CLS] and registers: `rotary_angles`)
    (HunYuan, Llama 4: the q/k norm after rotary instead of before; Llama 4's is an L2 norm, unit weight)
    q *= 1 + attn_scale · log(1 + ⌊(t + 1) / floor_scale⌋)   attention temperature tuning (Llama 4's NoPE layers)
    scores = q kᵀ · scale                                   (√d or the model's own scalar)
    scores += position bias                                 ALiBi slopes, T5 relative buckets
    scores += content↔position scores                       DeBERTa's c2p and p2c
    scores = c · tanh(scores / c)                           logit softcapping (Gemma 2)
    scores += mask                                          padding, causal, sliding window, chunks (Llama 4)
    P = softmax(scores), written out: subtract the row max, exp, normalise
        (learned sinks, gpt-oss: a per-head sink logit joins each row and is dropped, rows sum to < 1)
    y = P v, heads concatenated
    y = y ⊙ sigmoid(x Wgᵀ + bg)                           output gate (Qwen3.5, Qwen3-Next), per head dim
    out = y Woᵀ + bo

No `scaled_dot_product_attention`, no transformers attention code: this is the independent
implementation the real model is checked against. Cross-attention is the same computation with
keys and values projected from another sequence (`kv=`, the encoder's output).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal

import torch

from .errors import UnsupportedFeature

__all__ = ["LayerSpec", "MultiHeadLatent", "ScratchResult", "project_v", "attention_from_scratch", "project_qk", "row_scores", "row_probs",
           "block_probs", "output_gate", "stable_softmax", "softmax_with_sink", "sink_share", "rotary_cos_sin", "rotate", "angles_cos_sin", "build_mask",
           "visible_keys", "temperature_scales", "alibi_slopes", "relative_position_buckets"]


@dataclass(frozen=True, eq=False)
class MultiHeadLatent:
    """Multi-head latent attention (DeepSeek-V2/V3, MLA): the input side of q, k and v is low-rank.

        q          = wq · rms(q_a x)              or wq x without a query latent       (B, T, nh*(nope+rope))
        c | k_rope = kv_a x                       latent (r,) and ONE rotary key (rope,) for all heads
        k | v      = [wk; wv] · rms(c)            per head k_nope (nope,), v (v_head_dim,)
        query      = [q_nope | rotary(q_rope)] ,  key = [k_nope | rotary(k_rope)]  (nope+rope = head_dim)

    The `LayerSpec`'s `wq` reads the query latent (or x), its `wk` and `wv` read the normed kv latent
    `rms(c)`, not x: tools that read `wk`/`wv` as maps of the residual stream refuse such a spec.
    """

    q_a: torch.Tensor | None  # (rq, D) query down-projection; None: wq reads x itself
    q_a_bias: torch.Tensor | None  # (rq,)
    q_a_norm: torch.Tensor | None  # (rq,) RMS norm weight of the query latent
    kv_a: torch.Tensor  # (r + rope, D) kv down-projection and the shared rotary key
    kv_a_bias: torch.Tensor | None  # (r + rope,)
    kv_a_norm: torch.Tensor  # (r,) RMS norm weight of the kv latent
    nope_dim: int  # dims of each q/k head without positions; the last head_dim - nope_dim dims are rotated
    norm_eps: float = 1e-6


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
    local_window: int | None = None  # bidirectional band: key j visible from query i only if |i - j| <= window
    chunk_size: int | None = None  # chunked local attention (Llama 4): key j visible from query i only if j // c == i // c
    # Rotary frequencies (rotary_dim/2,), or a function of the sequence length T for rope types whose
    # frequencies depend on it (dynamic NTK, longrope); None = no rotary.
    inv_freq: torch.Tensor | Callable[[int], torch.Tensor] | None = None
    # Rotary angles given per position instead of positions 0 .. T-1 times inv_freq: a function of T giving
    # (T, rotary_dim/2) angles (DINOv3: each patch's centre (y, x) in [-1, 1] times 2π·inv_freq, y's then x's;
    # angle 0, no rotation, for [CLS] and registers), or (B, T, rotary_dim/2), each batch row its own (Qwen-VL's
    # 3-D positions, `probe.mrope.at_positions`). Overrides inv_freq for the rotation.
    rotary_angles: Callable[[int], torch.Tensor] | None = None
    rope_scaling: float = 1.0  # multiplies cos and sin (the attention factor of yarn and longrope)
    rotary_dim: int | None = None  # rotate only the first rotary_dim dims of a head (partial rotary); None = all
    rotary_interleaved: bool = False  # pairs (x0, x1), (x2, x3), ... (GPT-J) instead of (x_i, x_{i+d/2})
    q_norm: torch.Tensor | None = None  # RMS norm weight of q: (hs,) per head, or (nh*hs,) over the projection
    k_norm: torch.Tensor | None = None
    norm_eps: float = 1e-6
    norm_offset: float = 1.0  # the norm multiplies by (offset + w): 1 for Gemma's (1 + w), 0 for a plain w
    norm_scope: Literal["head", "projection"] = "head"  # OLMo 2 normalises the whole projection before the split
    # "rms": x / rms(x); "layer": (x - mean) / std, no bias (Cohere's QK LayerNorm, weights (nh, hs) per head)
    norm_kind: Literal["rms", "layer"] = "rms"
    norm_after_rotary: bool = False  # HunYuan normalises q and k after rotary, not before
    # Additive per-head score bias from positions, a function (T_query, T_key) -> (nh, T_query, T_key):
    # ALiBi slopes, T5's bucketed relative bias. A block of rows calls it as
    # (stop_query, stop_key, query_start=, key_start=) and gets only its own rows and keys,
    # (nh, stop_query - query_start, stop_key - key_start), never the whole T × T.
    score_bias: Callable[..., torch.Tensor] | None = None
    softcap: float | None = None  # scores -> softcap * tanh(scores / softcap) before masking (Gemma 2)
    # Additive scores that depend on the content as well as the positions, a function of the projected
    # q (B, nh, T, hs) and k (B, nh, S, hs) -> (B, nh, T, S): DeBERTa's content→position and
    # position→content terms.
    position_scores: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    # Learned attention sinks (gpt-oss), (nh,): one extra logit per head joins every row's softmax and is
    # then dropped, so a row sums to 1 - sink share (`sink_share`); never renormalised.
    sinks: torch.Tensor | None = None
    # Output gate (Qwen3.5, Qwen3-Next's gated attention): (nh*hs, D) weight and (nh*hs,) bias of a projection of
    # the layer input x; the heads' concat y is multiplied elementwise by sigmoid(x Wgᵀ + bg) before W_O. The gate
    # depends on the query token only, so the probabilities are untouched; it is part of the block output.
    output_gate: torch.Tensor | None = None
    output_gate_bias: torch.Tensor | None = None
    # The size of a value head where it differs from the query/key head size (MLA): W_O reads
    # n_heads × v_head_dim; None = head_dim.
    v_head_dim: int | None = None
    latent: MultiHeadLatent | None = None  # multi-head latent attention (DeepSeek): q, k, v from low-rank latents
    # Attention temperature tuning (Llama 4's NoPE layers), (floor_scale, attn_scale): the query at position t is
    # multiplied by `temperature_scales` — attention sharpens slowly with the distance into a long text.
    temperature: tuple[float, float] | None = None
    v_norm: torch.Tensor | None = None  # (hs,) RMS norm weight of each value head (Gemma 4's has unit weight)
    # Shared-KV layers (Gemma 4's last `num_kv_shared_layers`): keys and values are layer `kv_layer`'s, made from
    # THAT layer's attention input with its weights (wk, wv, bk, bv, k_norm, v_norm here are its own); the
    # caller passes that input as `kv=`. None: keys and values of the layer's own input.
    kv_layer: int | None = None
    # Bidirectional blocks of a causal mask, (B, T) ids for the texts at hand (not a weight: set per input with
    # dataclasses.replace): a query and a key of one block id >= 0 see each other both ways, whatever their order
    # (Gemma 3's image tokens within one image, PaliGemma's image + prompt prefix); -1: causal only.
    blocks: torch.Tensor | None = None
    # Whether a block's keys are visible past the sliding window: PaliGemma's mask is (causal and window) or
    # block, so a prefix longer than the window still sees itself whole; False: the window also bounds a block,
    # window and (causal or block) (Gemma 3's images).
    block_past_window: bool = False
    # Which keys each query may see where that depends on the input (not a weight: set per input with
    # dataclasses.replace), (B, T, S) bool ANDed into the mask: Mllama's cross-attention (a text token sees the
    # tiles of the images its `cross_attention_mask` allows) and its vision mask (only padding sees no padding).
    visible: torch.Tensor | None = None

    def kv_input(self, inputs) -> torch.Tensor | None:
        """The input the keys and values come from, out of the layers' attention inputs `inputs` (indexed by
        layer): the producer layer's for a shared-KV layer, else None (the layer's own input)."""
        return None if self.kv_layer is None else inputs[self.kv_layer]

    @property
    def value_head_dim(self) -> int:
        """Width of one head's value, and of its slice of W_O's input."""
        return self.v_head_dim or self.head_dim


@dataclass(frozen=True, eq=False)
class ScratchResult:
    scores: torch.Tensor  # (B, nh, T, S) scaled, position-biased and softcapped, before masking
    probs: torch.Tensor  # (B, nh, T, S) attention probabilities (S = T for self-attention)
    values: torch.Tensor  # (B, nh, S, vs) V per query head (grouped KV heads repeated); vs = value_head_dim
    heads_out: torch.Tensor  # (B, nh, T, vs) P·V per head
    output: torch.Tensor  # (B, T, D) after the head concat and W_O
    gate: torch.Tensor | None = None  # (B, nh, T, vs) the output gate of each query and head; None without one


def stable_softmax(scores: torch.Tensor) -> torch.Tensor:
    """softmax over the last dim, shifted by the row max so exp never overflows.

    >>> stable_softmax(torch.tensor([[1000.0, 1000.0, -float("inf")]]))
    tensor([[0.5000, 0.5000, 0.0000]])
    """
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))  # fully masked rows
    e = torch.exp(scores - row_max)
    return e / e.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)


def rotary_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, scaling: float = 1.0, *, interleaved: bool = False):
    """cos and sin tables, (T, d), d = 2 × len(inv_freq): half-split layout (angle i at i and i + d/2),
    or interleaved (angle i at 2i and 2i + 1, GPT-J)."""
    angles = positions[:, None].to(inv_freq.dtype) * inv_freq[None, :]  # (T, d/2)
    return angles_cos_sin(angles, scaling, interleaved=interleaved)


def angles_cos_sin(angles: torch.Tensor, scaling: float = 1.0, *, interleaved: bool = False):
    """cos and sin tables (T, d) of rotary angles (T, d/2), in the half-split or the interleaved layout.

    >>> angles_cos_sin(torch.tensor([[0.0]]))
    (tensor([[1., 1.]]), tensor([[0., 0.]]))
    """
    if interleaved:
        emb = angles.repeat_interleave(2, dim=-1)  # (T, d)
    else:
        emb = torch.cat([angles, angles], dim=-1)  # (T, d)
    return emb.cos() * scaling, emb.sin() * scaling


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool = False) -> torch.Tensor:
    """Rotary position embedding applied to `x` (..., T, d) at `rotary_cos_sin`'s angles: each pair (x_i, x_{i+d/2}),
    or (x_{2i}, x_{2i+1}) interleaved, turns by its angle."""
    if interleaved:
        pairs = x.unflatten(-1, (-1, 2))  # (B, n, T, d/2, 2)
        rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
        return x * cos + rotated * sin
    # x·cos + (-x₂, x₁)·sin, each half written in place: the same products and sums bit for bit (-(a·b) is
    # (-a)·b exactly), with two half-size temporaries where the rotated copy, its negated half and the two
    # products were four fresh tensors (their pages cost a pass each)
    half = x.shape[-1] // 2
    out = x * cos
    out[..., :half] -= x[..., half:] * sin[..., :half]
    out[..., half:] += x[..., :half] * sin[..., half:]
    return out


def _apply_rotary(t: torch.Tensor, spec: LayerSpec, angles: tuple[torch.Tensor, torch.Tensor] | None = None
                  ) -> torch.Tensor:
    """`t` (B, n, T, hs) at positions 0 .. T-1 with rotary on its first `rotary_dim` dims; the rest pass unchanged.
    `angles`: `_rotary_angles(spec, T, ...)`, where the caller has them already (q and k of one text)."""
    cos, sin = angles if angles is not None else _rotary_angles(spec, t.shape[-2], t.device, t.dtype)
    d = spec.rotary_dim or t.shape[-1]
    if d == t.shape[-1]:
        if cos.dim() == 2 and t.dim() == 4 and t.transpose(1, 2).is_contiguous():
            # heads of a (B, T, n·hs) projection: turned in that layout (cos (T, 1, d)), one pass over memory
            # in order instead of a strided one; the same products and sums, bit for bit
            return rotate(t.transpose(1, 2), cos[:, None], sin[:, None], interleaved=spec.rotary_interleaved
                          ).transpose(1, 2)
        return rotate(t, cos, sin, interleaved=spec.rotary_interleaved)
    return torch.cat([rotate(t[..., :d], cos, sin, interleaved=spec.rotary_interleaved), t[..., d:]], dim=-1)


def _rotary_angles(spec: LayerSpec, T: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of positions 0 .. T-1: (T, d), or (B, 1, T, d) with one row per text."""
    if spec.rotary_angles is not None:  # angles of each position's own (DINOv3: 2-D patch centres)
        cos, sin = angles_cos_sin(spec.rotary_angles(T).float().to(device), spec.rope_scaling,
                                  interleaved=spec.rotary_interleaved)  # (T, d), or (B, T, d): one row per text
        if cos.dim() == 3:  # Qwen-VL's 3-D positions: each batch row its own angles, the same for every head
            cos, sin = cos[:, None], sin[:, None]
    else:
        inv_freq = spec.inv_freq(T) if callable(spec.inv_freq) else spec.inv_freq
        positions = torch.arange(T, device=device)
        cos, sin = rotary_cos_sin(inv_freq.float().to(device), positions, spec.rope_scaling,
                                  interleaved=spec.rotary_interleaved)
    return cos.to(dtype), sin.to(dtype)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 1.0,
              kind: Literal["rms", "layer"] = "rms") -> torch.Tensor:
    # x: (..., d); weight (d,), or (n, d) one row per head for x (B, n, T, d)
    xf = x.float()
    if kind == "layer":
        xf = xf - xf.mean(-1, keepdim=True)  # centred: the mean square is now the variance
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    w = weight.float()[:, None, :] if weight.dim() == 2 else weight.float()  # (n, d) -> (n, 1, d)
    return (normed * (offset + w)).to(x.dtype)


def _norm_qk(q: torch.Tensor, k: torch.Tensor, spec: LayerSpec) -> tuple[torch.Tensor, torch.Tensor]:
    return (_rms_norm(q, spec.q_norm, spec.norm_eps, spec.norm_offset, spec.norm_kind),
            _rms_norm(k, spec.k_norm, spec.norm_eps, spec.norm_offset, spec.norm_kind))


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi's per-head slopes (Press et al. 2022): a geometric sequence from 2^(-8/n) for n a power of
    two; otherwise the closest power of two's slopes, then every other slope of the next one.

    >>> alibi_slopes(4)
    tensor([0.2500, 0.0625, 0.0156, 0.0039])
    >>> [round(float(s), 4) for s in alibi_slopes(6)]
    [0.25, 0.0625, 0.0156, 0.0039, 0.5, 0.125]
    """
    closest = 2 ** math.floor(math.log2(n_heads))
    base = 2.0 ** (-8.0 / closest)
    slopes = [base ** (i + 1) for i in range(closest)]
    if closest < n_heads:
        extra = 2.0 ** (-4.0 / closest)  # the slopes of 2 × closest heads, odd powers only
        slopes += [extra ** (2 * i + 1) for i in range(n_heads - closest)]
    return torch.tensor(slopes, dtype=torch.float32)


def relative_position_buckets(relative: torch.Tensor, *, bidirectional: bool, n_buckets: int,
                              max_distance: int) -> torch.Tensor:
    """T5's bucket of each relative position `key - query`: exact buckets for small distances,
    logarithmic ones up to `max_distance`, the last bucket beyond; half the buckets per direction when
    `bidirectional` (an encoder), only the past when not (a decoder).

    >>> relative_position_buckets(torch.tensor([-3, -1, 0, 1, 3]), bidirectional=True, n_buckets=8, max_distance=16)
    tensor([2, 1, 0, 5, 6])
    """
    buckets = torch.zeros_like(relative)
    if bidirectional:
        n_buckets //= 2
        buckets = buckets + (relative > 0).long() * n_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp_min(0)  # only keys before the query have a distance
    exact = n_buckets // 2
    is_small = distance < exact
    log_ratio = torch.log(distance.float().clamp_min(1) / exact) / math.log(max_distance / exact)
    large = (exact + (log_ratio * (n_buckets - exact)).long()).clamp_max(n_buckets - 1)
    return buckets + torch.where(is_small, distance, large)


def visible_keys(
    key_valid: torch.Tensor,
    *,
    causal: bool,
    sliding_window: int | None,
    local_window: int | None = None,
    rows: tuple[int, int] | None = None,
    key_start: int = 0,
    chunk_size: int | None = None,
    blocks: torch.Tensor | None = None,
    block_past_window: bool = False,
    visible: torch.Tensor | None = None,
) -> torch.Tensor:
    """(B, 1, R, K) bool: True where query i may see key j — `build_mask` before it becomes 0 / -inf.
    `blocks` (B, T): a query and a key of one block >= 0 see each other although the key comes later (causal
    or a block; then the sliding window, as transformers composes Gemma 3's mask); `block_past_window`: a block
    sees itself whole whatever the window (causal and window, or a block: PaliGemma's).

    >>> visible_keys(torch.tensor([[1, 1, 1]]), causal=True, sliding_window=2, rows=(2, 3))[0, 0]
    tensor([[False,  True,  True]])
    >>> prefix = torch.tensor([[0, 0, 0, -1]])  # the prefix's last token, two past the first
    >>> visible_keys(torch.ones(1, 4), causal=True, sliding_window=2, rows=(2, 3), blocks=prefix,
    ...              block_past_window=True)[0, 0, 0]
    tensor([ True,  True,  True, False])
    >>> visible_keys(torch.ones(1, 4), causal=True, sliding_window=2, rows=(2, 3), blocks=prefix)[0, 0, 0]
    tensor([False,  True,  True, False])

    """
    K = key_valid.shape[-1]
    start, stop = rows if rows is not None else (key_start, key_start + K)
    i = torch.arange(start, stop, device=key_valid.device)[:, None]
    j = torch.arange(key_start, key_start + K, device=key_valid.device)[None, :]
    valid = key_valid.bool()[:, None, None, :].expand(-1, 1, stop - start, K)  # (B, 1, R, K)
    allowed, block = valid, None
    if causal:
        order = j <= i
        if blocks is not None:
            b_q = blocks[:, start:stop].to(key_valid.device)[:, None, :, None]  # (B, 1, R, 1)
            b_k = blocks[:, key_start:key_start + K].to(key_valid.device)[:, None, None, :]  # (B, 1, 1, K)
            block = (b_q == b_k) & (b_q >= 0)
            order = order | block
        allowed = allowed & order
    if visible is not None:  # (B, T, S): an input-dependent mask, ANDed in
        allowed = allowed & visible[:, None, start:stop, key_start:key_start + K].to(key_valid.device)
    if sliding_window is not None:
        allowed = allowed & (i - j < sliding_window)
    if local_window is not None:
        allowed = allowed & ((i - j).abs() <= local_window)
    if chunk_size is not None:  # chunked local attention: only keys of the query's own chunk
        allowed = allowed & (torch.div(i, chunk_size, rounding_mode="floor") == torch.div(j, chunk_size, rounding_mode="floor"))
    if block is not None and block_past_window:
        allowed = allowed | (block & valid)
    return allowed


def temperature_scales(T: int, floor_scale: float, attn_scale: float) -> torch.Tensor:
    """Llama 4's attention temperature of the queries at positions 0 .. T-1, (T,):
    1 + attn_scale · log(1 + ⌊(t + 1) / floor_scale⌋) — 1 within the first floor_scale tokens, then growing.

    >>> temperature_scales(6, 2, 0.5)
    tensor([1.0000, 1.3466, 1.3466, 1.5493, 1.5493, 1.6931])
    """
    positions = torch.arange(T, dtype=torch.float32)
    return torch.log1p(torch.floor((positions + 1.0) / floor_scale)) * attn_scale + 1.0


def build_mask(
    key_valid: torch.Tensor,
    *,
    causal: bool,
    sliding_window: int | None,
    dtype: torch.dtype,
    local_window: int | None = None,
    rows: tuple[int, int] | None = None,
    key_start: int = 0,
    chunk_size: int | None = None,
    blocks: torch.Tensor | None = None,
    block_past_window: bool = False,
    visible: torch.Tensor | None = None,
) -> torch.Tensor:
    """Additive mask (B, 1, R, K): 0 where query i may see key j, -inf elsewhere.

    The keys are positions key_start .. key_start+K-1, `key_valid` (B, K) saying which are real
    tokens; the queries are `rows=(start, stop)`, by default the same K positions (self-attention).
    A block of query rows passes its own `rows`; cross-attention passes `rows=(0, T)` for its T target
    queries (with causal and windows off: every real source key is visible).

    >>> build_mask(torch.tensor([[1, 1, 0]]), causal=True, sliding_window=None, dtype=torch.float32)[0, 0]
    tensor([[0., -inf, -inf],
            [0., 0., -inf],
            [0., 0., -inf]])
    >>> build_mask(torch.tensor([[1, 1, 1]]), causal=False, sliding_window=None, local_window=1,
    ...            dtype=torch.float32)[0, 0]
    tensor([[0., 0., -inf],
            [0., 0., 0.],
            [-inf, 0., 0.]])
    """
    allowed = visible_keys(key_valid, causal=causal, sliding_window=sliding_window, local_window=local_window,
                           rows=rows, key_start=key_start, chunk_size=chunk_size, blocks=blocks,
                           block_past_window=block_past_window, visible=visible)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=key_valid.device)
    return mask.masked_fill(~allowed, float("-inf"))


def attention_from_scratch(
    x: torch.Tensor,
    spec: LayerSpec,
    key_valid: torch.Tensor,
    *,
    use_scale: bool = True,
    use_positions: bool = True,
    kv: torch.Tensor | None = None,
) -> ScratchResult:
    """One attention layer on input `x` (B, T, D); `key_valid` (B, S) is 1 for real key tokens.

    Self-attention: keys and values come from `x` too (S = T). Cross-attention: from `kv` (B, S, D),
    the encoder's output. `use_scale=False` drops the 1/√d factor and `use_positions=False` drops
    rotary positions and position biases — the two experiments of `probe.explain.scale_effect` and
    `permutation_check` (softmax saturation, permutation equivariance).
    """
    B, T, D = x.shape
    nh, nkv, vs = spec.n_heads, spec.n_kv_heads, spec.value_head_dim

    q, k = project_qk(x, spec, use_positions=use_positions, kv=kv)  # (B, nh, T, hs), (B, nkv, S, hs)
    v = project_v(x, spec, kv=kv)  # (B, nkv, S, vs)

    group = nh // nkv  # grouped-query attention: KV head g serves query heads g*group .. g*group+group-1
    k = k.repeat_interleave(group, dim=1)  # (B, nh, S, hs)
    v = v.repeat_interleave(group, dim=1)  # (B, nh, S, vs)

    scores, probs = row_probs(q, k, spec, key_valid, query_start=0, use_scale=use_scale,
                              use_positions=use_positions)  # (B, nh, T, S)

    heads_out = probs @ v  # (B, nh, T, vs)
    y = heads_out.transpose(1, 2).reshape(B, T, nh * vs)  # concat heads: (B, T, nh*vs)
    gate = None
    if spec.output_gate is not None:
        g = output_gate(x, spec)  # (B, T, nh*vs)
        y = y * g
        gate = _heads(g, nh, vs)  # (B, nh, T, vs)
    out = _add_bias(y @ spec.wo.T.to(x.dtype), spec.bo)  # (B, T, D)
    return ScratchResult(scores=scores, probs=probs, values=v, heads_out=heads_out, output=out, gate=gate)


def output_gate(x: torch.Tensor, spec: LayerSpec) -> torch.Tensor:
    """The output gate of each query token and head dim, sigmoid(x Wgᵀ + bg): (B, T, nh*hs) in the order of the
    heads' concat (head h owns dims h*hs .. h*hs+hs-1); only for a layer with one (`spec.output_gate`).

    >>> spec = LayerSpec(*[torch.zeros(2, 2)] * 4, *[None] * 4, n_heads=1, n_kv_heads=1, head_dim=2, scale=1.0,
    ...                  causal=True, output_gate=torch.zeros(2, 2))
    >>> output_gate(torch.ones(1, 1, 2), spec)
    tensor([[[0.5000, 0.5000]]])
    """
    return torch.sigmoid(_add_bias(x @ spec.output_gate.T.to(x.dtype), spec.output_gate_bias))  # (B, T, nh*hs)


def _heads(t: torch.Tensor, n: int, hs: int) -> torch.Tensor:
    B, T, _ = t.shape
    return t.view(B, T, n, hs).transpose(1, 2)  # (B, T, n*hs) -> (B, n, T, hs)


def project_v(x: torch.Tensor, spec: LayerSpec, *, kv: torch.Tensor | None = None) -> torch.Tensor:
    """Values (B, nkv, S, vs) of `kv` (default `x`), vs = `spec.value_head_dim`."""
    _check_kv_source(spec, kv)
    source = x if kv is None else kv
    if spec.latent is not None:
        c, _ = _kv_latent(source, spec)  # (B, S, r)
        return _heads(_add_bias(c @ spec.wv.T.to(x.dtype), spec.bv), spec.n_kv_heads, spec.value_head_dim)
    v = _heads(_add_bias(source @ spec.wv.T.to(x.dtype), spec.bv), spec.n_kv_heads, spec.value_head_dim)
    if spec.v_norm is not None:
        v = _rms_norm(v, spec.v_norm, spec.norm_eps, spec.norm_offset, spec.norm_kind)  # (B, nkv, S, vs)
    return v


def _check_kv_source(spec: LayerSpec, kv: torch.Tensor | None) -> None:
    if spec.kv_layer is not None and kv is None:
        raise UnsupportedFeature(f"this layer reuses layer {spec.kv_layer}'s keys and values (shared KV, Gemma 4); "
                                 f"pass kv= layer {spec.kv_layer}'s attention input")


def _kv_latent(source: torch.Tensor, spec: LayerSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """MLA's normed kv latent rms(c) (B, S, r) and its shared, not yet rotated key (B, 1, S, rope)."""
    lat = spec.latent
    B, S, _ = source.shape
    ckr = _add_bias(source @ lat.kv_a.T.to(source.dtype), lat.kv_a_bias)  # (B, S, r + rope)
    r = lat.kv_a_norm.shape[0]
    c, k_rope = ckr[..., :r], ckr[..., r:]  # (B, S, r), (B, S, rope)
    return _rms_norm(c, lat.kv_a_norm, lat.norm_eps, offset=0.0), k_rope.view(B, 1, S, -1)


def _project_qk_latent(x: torch.Tensor, spec: LayerSpec, *, use_positions: bool,
                       kv: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-head latent attention's queries (B, nh, T, hs) and keys (B, nh, S, hs), hs = nope + rope."""
    lat = spec.latent
    source = x if kv is None else kv
    if lat.q_a is not None:
        x = _rms_norm(_add_bias(x @ lat.q_a.T.to(x.dtype), lat.q_a_bias), lat.q_a_norm, lat.norm_eps, offset=0.0)
    q = _heads(_add_bias(x @ spec.wq.T.to(x.dtype), spec.bq), spec.n_heads, spec.head_dim)  # (B, nh, T, hs)
    c, k_rope = _kv_latent(source, spec)  # (B, S, r), (B, 1, S, rope)
    k_nope = _heads(_add_bias(c @ spec.wk.T.to(x.dtype), spec.bk), spec.n_kv_heads, lat.nope_dim)  # (B, nkv, S, nope)
    q_nope, q_rope = q[..., : lat.nope_dim], q[..., lat.nope_dim :]  # (B, nh, T, nope), (B, nh, T, rope)
    if spec.inv_freq is not None and use_positions:
        q_rope, k_rope = _apply_rotary(q_rope, spec), _apply_rotary(k_rope, spec)
    k_rope = k_rope.expand(-1, k_nope.shape[1], -1, -1)  # one rotary key, shared by every head: (B, nkv, S, rope)
    return torch.cat([q_nope, q_rope], dim=-1), torch.cat([k_nope, k_rope], dim=-1)


def project_qk(x: torch.Tensor, spec: LayerSpec, *, use_positions: bool = True,
               kv: torch.Tensor | None = None,
               projected: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries (B, nh, T, hs) of `x` and keys (B, nkv, S, hs) of `kv` (default `x`): projected, normed, rotated.

    Positions are 0 .. T-1, so `x` must start at the text's first token (right padding is fine).
    `projected`: `x`'s linear projections (B, T, nh*hs) and (B, S, nkv*hs), bias included, already made (the
    model's own, caught in its forward): only the norms and rotary are applied to them.
    """
    if spec.latent is not None:
        if projected is not None:
            raise ValueError("projected q/k are for plain projections, not latent attention")
        return _project_qk_latent(x, spec, use_positions=use_positions, kv=kv)
    _check_kv_source(spec, kv)
    source = x if kv is None else kv
    if projected is not None:
        q, k = projected
    else:
        q = _add_bias(x @ spec.wq.T.to(x.dtype), spec.bq)  # (B, T, nh*hs)
        k = _add_bias(source @ spec.wk.T.to(x.dtype), spec.bk)  # (B, S, nkv*hs)
    if spec.q_norm is not None and spec.norm_scope == "projection":
        q, k = _norm_qk(q, k, spec)
    q, k = _heads(q, spec.n_heads, spec.head_dim), _heads(k, spec.n_kv_heads, spec.head_dim)
    if spec.q_norm is not None and spec.norm_scope == "head" and not spec.norm_after_rotary:
        q, k = _norm_qk(q, k, spec)
    if (spec.inv_freq is not None or spec.rotary_angles is not None) and use_positions:
        angles = _rotary_angles(spec, q.shape[-2], q.device, q.dtype) if q.shape[-2] == k.shape[-2] else None
        q, k = _apply_rotary(q, spec, angles), _apply_rotary(k, spec, angles)  # the angles worked out once
    if spec.q_norm is not None and spec.norm_after_rotary:
        q, k = _norm_qk(q, k, spec)
    if spec.temperature is not None and use_positions:
        scales = temperature_scales(q.shape[-2], *spec.temperature).to(q.device)  # (T,)
        q = (q * scales[:, None]).to(q.dtype)  # (B, nh, T, hs), each query row by its position's temperature
    return q, k


def row_scores(
    q_rows: torch.Tensor,
    k: torch.Tensor,
    spec: LayerSpec,
    *,
    query_start: int,
    key_start: int = 0,
    use_scale: bool = True,
    use_positions: bool = True,
    heads: list[int] | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scores of a block of query rows: scaled, position-biased and softcapped, before the mask (B, h, R, K).

    Arguments as in `row_probs`; `out`: a (B, h, R, K) buffer the product is written into. The position
    bias is asked for this block's rows and keys only.
    """
    R, K = q_rows.shape[-2], k.shape[-2]
    scale = spec.scale if use_scale else 1.0
    scores = torch.matmul(q_rows, k.transpose(-2, -1), out=out)  # (B, h, R, K): the product is ours
    if scale != 1.0:  # scaled in place (a caller that scaled q already passes scale 1: no pass for nothing)
        scores.mul_(scale)
    if spec.score_bias is not None and use_positions:
        if query_start or key_start:
            bias = spec.score_bias(query_start + R, key_start + K, query_start=query_start, key_start=key_start)
        else:
            bias = spec.score_bias(R, K)  # (nh, R, K)
        scores = scores + (bias if heads is None else bias[heads]).to(scores)
    if spec.position_scores is not None and use_positions:
        if query_start or key_start or (heads is not None and list(heads) != list(range(spec.n_heads))):
            # DeBERTa's terms index relative positions of whole sequences; blocks would need offsets.
            raise UnsupportedFeature("content↔position scores (DeBERTa) are recomputed for whole sequences only; "
                                     "use attention='eager' for this model")
        scores = scores + spec.position_scores(q_rows, k)  # (B, nh, T, S)
    if spec.softcap is not None:
        scores = spec.softcap * torch.tanh(scores / spec.softcap)
    return scores


def row_probs(
    q_rows: torch.Tensor,
    k: torch.Tensor,
    spec: LayerSpec,
    key_valid: torch.Tensor,
    *,
    query_start: int,
    key_start: int = 0,
    use_scale: bool = True,
    use_positions: bool = True,
    heads: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores (position-biased, softcapped, before the mask) and probabilities of a block of query rows.

    `q_rows` (B, h, R, hs) are the queries of positions query_start .. query_start+R-1; `k` (B, h, K, hs)
    and `key_valid` (B, K) the keys key_start .. key_start+K-1 of the same heads — `heads` names them
    when they are not all nh heads (for the per-head position bias). With every query and every key
    (query_start = key_start = 0) this is the full attention. Keys left out must be ones the mask hides
    from these rows, or the rows no longer sum over what the model sees. Cross-attention is the same
    call with the source's keys (its causal and window settings are off).
    """
    R = q_rows.shape[-2]
    scores = row_scores(q_rows, k, spec, query_start=query_start, key_start=key_start, use_scale=use_scale,
                        use_positions=use_positions, heads=heads)
    mask = build_mask(key_valid, causal=spec.causal, sliding_window=spec.sliding_window, dtype=q_rows.dtype,
                      local_window=spec.local_window, rows=(query_start, query_start + R), key_start=key_start,
                      chunk_size=spec.chunk_size, blocks=spec.blocks, block_past_window=spec.block_past_window,
                      visible=spec.visible)
    if spec.sinks is not None:
        return scores, softmax_with_sink(scores + mask, _sink_logits(spec, heads))  # (B, h, R, K), rows sum < 1
    return scores, stable_softmax(scores + mask)  # (B, h, R, K)


def _sink_logits(spec: LayerSpec, heads: list[int] | None) -> torch.Tensor:
    sinks = spec.sinks.detach().float()
    return sinks if heads is None else sinks[list(heads)]  # (h,)


def softmax_with_sink(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """softmax over the keys plus one virtual sink key per head, the sink's column dropped (gpt-oss).

    `scores` (B, h, R, K), `sinks` (h,) logits. Each row sums to 1 − its sink share (`sink_share`).

    >>> softmax_with_sink(torch.zeros(1, 1, 1, 3), torch.tensor([0.0]))
    tensor([[[[0.2500, 0.2500, 0.2500]]]])
    """
    sink = sinks.to(scores.dtype)[None, :, None, None].expand(*scores.shape[:-1], 1)  # (B, h, R, 1)
    return stable_softmax(torch.cat([scores, sink], dim=-1))[..., :-1]  # (B, h, R, K)


def sink_share(probs: torch.Tensor) -> torch.Tensor:
    """The share of each row that went to the learned sink: 1 − row sum, (…, R) from probabilities (…, R, K).

    Zero (up to rounding) for a model without sinks, whose rows sum to 1.

    >>> sink_share(torch.tensor([[0.25, 0.25, 0.25]]))
    tensor([0.2500])
    """
    return (1.0 - probs.sum(dim=-1)).clamp_min(0.0)


def block_probs(
    q_rows: torch.Tensor,
    k: torch.Tensor,
    spec: LayerSpec,
    key_valid: torch.Tensor,
    *,
    query_start: int,
    key_start: int = 0,
    heads: list[int] | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`row_probs`'s probabilities without keeping the scores: (B, h, R, K).

    The same scores and mask, done in place on the one scores buffer this function makes (or `out`, a
    (B, h, R, K) buffer of the caller's, written over): hidden keys set to -inf (what adding the 0 / -inf
    mask gives), then the softmax. One (B, h, R, K) buffer instead of five. On the CPU, in float32 or
    float64 with every row seeing a key, the softmax is torch's fused one, written into the same buffer
    (per row: its max, exp and sum, then one multiply, while the row is in cache, where the written-out
    `stable_softmax` makes five passes over the whole block): the same probabilities within float
    rounding (max |Δ| about 1e-9 on rows of 6,000 keys), not bit for bit; elsewhere `stable_softmax`'s
    operations in its order, bit for bit.
    """
    R = q_rows.shape[-2]
    p = row_scores(q_rows, k, spec, query_start=query_start, key_start=key_start, heads=heads, out=out)
    # a plain causal mask hides no key left of the first row: only the keys from there on are masked
    d = (query_start - key_start if spec.causal and spec.sliding_window is None and spec.local_window is None
         and spec.chunk_size is None and 0 < query_start - key_start <= p.shape[-1]
         and bool(key_valid[:, : query_start - key_start].all()) else 0)
    visible = visible_keys(key_valid[:, d:], causal=spec.causal, sliding_window=spec.sliding_window,
                           local_window=spec.local_window, rows=(query_start, query_start + R),
                           key_start=key_start + d, chunk_size=spec.chunk_size)
    p[..., d:].masked_fill_(~visible, float("-inf"))
    if spec.sinks is not None:  # the sink column costs one more buffer; rows sum to < 1
        return softmax_with_sink(p, _sink_logits(spec, heads))
    if p.device.type == "cpu" and p.dtype in (torch.float32, torch.float64) and (d > 0 or bool(visible.any(-1).all())):
        # each row read before it is written: the CPU kernel may write over its input (a row with no visible
        # key would be NaN here, 0 below: such blocks take the written-out path)
        return torch.ops.aten._softmax.out(p, -1, False, out=p)
    row_max = p.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))  # fully masked rows
    p.sub_(row_max).exp_()
    return p.div_(p.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny))


def _add_bias(t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return t if bias is None else t + bias.to(t.dtype)

