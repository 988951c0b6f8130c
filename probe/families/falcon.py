"""Falcon: rotary or ALiBi positions, and three layouts of the fused QKV projection.

- `new_decoder_architecture` (Falcon-40B/180B): per KV group, its query heads' rows, then one K and one V.
- `multi_query` (Falcon-7B): all query heads' rows, then the one K and V shared by every head.
- neither: [q_h, k_h, v_h] per head, as in BLOOM.

With `alibi=True` (Falcon-RW), Falcon adds slope_h × key position as BLOOM does, with quirks of its
own that we reproduce as the model computes them: the slopes and the bias are rounded to bfloat16, and
the model folds the bias, divided by √d, into the mask it builds. Up to transformers 5.24 the attention
layer also took the bias (its `forward` has an `alibi` argument) and added it to the scores before
scaling them by 1/√d, so the bias entered twice; from 5.25 the layer has no such argument and the bias
enters once, through the mask. Which of the two the loaded model does is read off its attention layer.
"""

from __future__ import annotations

import inspect

import torch

from ..rotary import rope, unsupported_rope
from ..scratch import LayerSpec, alibi_slopes
from ..family import Family, Refusal, linear_weights
from .bloom import key_position_bias, split_per_head_qkv


def _split(attn, cfg):
    """(wq, wk, wv), (bq, bk, bv), number of KV heads, from the fused `query_key_value`."""
    w, b = linear_weights(attn.query_key_value)
    nh, hs = attn.num_heads, attn.head_dim
    if cfg.new_decoder_architecture:
        nkv = attn.num_kv_heads
        group = nh // nkv
        rows = w.view(nkv, group + 2, hs, -1)  # per KV group: `group` query heads, then K, then V
        brows = None if b is None else b.view(nkv, group + 2, hs)
        ws = [rows[:, :group].reshape(nh * hs, -1), rows[:, group].reshape(nkv * hs, -1),
              rows[:, group + 1].reshape(nkv * hs, -1)]
        bs = [None] * 3 if brows is None else [brows[:, :group].reshape(-1), brows[:, group].reshape(-1),
                                                 brows[:, group + 1].reshape(-1)]
        return ws, bs, nkv
    if cfg.multi_query:
        rows = w.view(nh + 2, hs, -1)  # all query heads, then the shared K, then the shared V
        brows = None if b is None else b.view(nh + 2, hs)
        ws = [rows[:nh].reshape(nh * hs, -1), rows[nh], rows[nh + 1]]
        bs = [None] * 3 if brows is None else [brows[:nh].reshape(-1), brows[nh], brows[nh + 1]]
        return ws, bs, 1
    ws, bs = split_per_head_qkv(w, b, nh, hs)
    return ws, bs, nh


def _alibi_slopes_as_falcon_rounds_them(n_heads: int) -> torch.Tensor:
    return alibi_slopes(n_heads).bfloat16()  # Falcon multiplies bfloat16 slopes by the positions


def _layer_adds_alibi(attn) -> bool:
    """True when the attention layer takes the ALiBi bias itself (transformers up to 5.24: its `forward` has an
    `alibi` argument), on top of the copy folded into the mask; False when the mask carries it alone (5.25)."""
    return "alibi" in inspect.signature(type(attn).forward).parameters


def _alibi(n_heads: int, scale: float, *, times: int = 1):
    """Falcon's ALiBi bias, scaled with the scores and added `times` times (2 where the layer adds it too)."""
    per_key = key_position_bias(_alibi_slopes_as_falcon_rounds_them(n_heads))

    def bias(n_queries: int, n_keys: int, **block) -> torch.Tensor:
        once = per_key(n_queries, n_keys, **block).float() * scale  # bfloat16 product, then scaled with the scores
        return once * times  # through the mask, and (up to 5.24) again in the layer

    return bias


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.h[i].self_attention
    (wq, wk, wv), (bq, bk, bv), nkv = _split(attn, cfg)
    wo, bo = linear_weights(attn.dense)
    nh, hs = attn.num_heads, attn.head_dim
    scale = attn.inv_norm_factor
    if cfg.alibi:
        positions = dict(score_bias=_alibi(nh, scale, times=2 if _layer_adds_alibi(attn) else 1))
    else:
        positions = rope(cfg, hs, whole_head=True).spec_fields()
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=nh, n_kv_heads=nkv, head_dim=hs, scale=scale,
                     causal=True, **positions)


def _rope(cfg) -> str | None:
    return None if cfg.alibi else unsupported_rope(cfg, whole_head=True)


def _tiny_config(vocab: int, model_type: str):
    from transformers import FalconConfig

    # The default layout (multi-query, rotary); six heads so that alibi=True exercises both slope rules.
    return FalconConfig(vocab_size=vocab, hidden_size=48, num_hidden_layers=2, num_attention_heads=6,
                        max_position_embeddings=128)


FAMILY = Family(
    name="falcon",
    model_types=("falcon",),
    kind="decoder",
    features=("rotary or ALiBi (bfloat16 slopes, added once or twice as the model does)",
              "multi-query, grouped (new_decoder_architecture) or per-head fused QKV", "causal"),
    layer_spec=_spec,
    attention=lambda base, i: base.h[i].self_attention,
    out_proj=lambda base, i: base.h[i].self_attention.dense,
    refuses=(Refusal("rope type", _rope),),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModelForCausalLM",
)
