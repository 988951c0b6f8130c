"""BLOOM: ALiBi positions (no position embeddings at all) and a fused per-head QKV projection.

BLOOM adds slope_h × j to the score of key j: ALiBi's −slope_h × (i − j) without the −slope_h × i
term, which is the same for every key of query i and so cannot change a softmax row. We add exactly
what the model adds, so the scores match too. The fused `query_key_value` weight is laid out per
head: for head h, its q, k and v rows follow one another.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..scratch import LayerSpec, alibi_slopes
from ..family import Family, linear_weights


def key_position_bias(slopes: torch.Tensor) -> Callable[[int, int], torch.Tensor]:
    """ALiBi as BLOOM and Falcon add it: slope_h × key position j, the same for every query row."""

    def bias(n_queries: int, n_keys: int, *, query_start: int = 0, key_start: int = 0) -> torch.Tensor:
        j = torch.arange(key_start, n_keys, dtype=slopes.dtype)
        return (slopes[:, None, None] * j[None, None, :]).expand(-1, n_queries - query_start, -1)  # (nh, Tq, Tk)

    return bias


def split_per_head_qkv(w: torch.Tensor, b: torch.Tensor | None, n_heads: int, head_dim: int):
    """Rows of a fused (nh·3·hs, D) projection laid out [q_h, k_h, v_h] per head -> three (nh·hs, D) blocks."""
    w3 = w.view(n_heads, 3, head_dim, -1)
    b3 = None if b is None else b.view(n_heads, 3, head_dim)
    weights = [w3[:, k].reshape(n_heads * head_dim, -1) for k in range(3)]
    biases = [None] * 3 if b3 is None else [b3[:, k].reshape(-1) for k in range(3)]
    return weights, biases


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.h[i].self_attention
    nh, hs = attn.num_heads, attn.head_dim
    (wq, wk, wv), (bq, bk, bv) = split_per_head_qkv(*linear_weights(attn.query_key_value), nh, hs)
    wo, bo = linear_weights(attn.dense)
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=nh, n_kv_heads=nh, head_dim=hs,
                     scale=attn.inv_norm_factor, causal=True, score_bias=key_position_bias(alibi_slopes(nh)))


def _tiny_config(vocab: int, model_type: str):
    from transformers import BloomConfig

    # Six heads: four from the power of two below, two from the next one, so both slope rules are exercised.
    # ALiBi has no length limit of its own; the tiny model declares 128 positions as every tiny model does.
    return BloomConfig(vocab_size=vocab, hidden_size=48, n_layer=2, n_head=6, max_position_embeddings=128)


FAMILY = Family(
    name="bloom",
    model_types=("bloom",),
    kind="decoder",
    features=("ALiBi (slope × key position)", "fused per-head QKV", "causal"),
    layer_spec=_spec,
    attention=lambda base, i: base.h[i].self_attention,
    out_proj=lambda base, i: base.h[i].self_attention.dense,
    refuses=(),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModelForCausalLM",
)
