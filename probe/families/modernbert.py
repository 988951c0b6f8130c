"""ModernBERT: a rotary encoder with a fused Wqkv and alternating global / local layers.

Every `global_attn_every_n_layers`-th layer (from layer 0) attends to the whole text; the others see
a bidirectional band, key j visible from query i only if |i − j| <= local_attention // 2
(`config.sliding_window`). The two layer types have their own rotary bases. The fused `Wqkv` weight
holds all of q's rows, then k's, then v's.
"""

from __future__ import annotations

from ..rotary import ROPE_INV_FREQ, rope, unsupported_rope
from ..scratch import LayerSpec
from ..family import Family, Refusal, linear_weights


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].attn
    w, b = linear_weights(attn.Wqkv)
    wq, wk, wv = w.chunk(3, dim=0)
    bq, bk, bv = (None, None, None) if b is None else b.chunk(3)
    wo, bo = linear_weights(attn.Wo)
    layer_type = cfg.layer_types[i]
    hs = attn.head_dim
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=cfg.num_attention_heads,
                     n_kv_heads=cfg.num_attention_heads, head_dim=hs, scale=hs**-0.5, causal=False,
                     local_window=cfg.local_attention // 2 if layer_type == "sliding_attention" else None,
                     **rope(cfg, hs, layer_type, whole_head=True).spec_fields())


def _rope_per_layer_type(cfg) -> str | None:
    return unsupported_rope(cfg, set(cfg.layer_types), whole_head=True)


def _tiny_config(vocab: int, model_type: str):
    from transformers import ModernBertConfig

    # A band of ±2 tokens on layers 1 and 2, so the local layers see far less than the global one.
    return ModernBertConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                            num_attention_heads=4, global_attn_every_n_layers=3, local_attention=4,
                            max_position_embeddings=128, bos_token_id=None, eos_token_id=None,
                            cls_token_id=None, sep_token_id=None, pad_token_id=None)  # ids set from the tiny tokenizer


FAMILY = Family(
    name="modernbert",
    model_types=("modernbert",),
    kind="encoder",
    features=(f"rotary: {', '.join(ROPE_INV_FREQ)}, global/local bases", "fused Wqkv",
              "alternating global / local bidirectional band layers", "bidirectional"),
    layer_spec=_spec,
    attention=lambda base, i: base.layers[i].attn,
    out_proj=lambda base, i: base.layers[i].attn.Wo,
    refuses=(Refusal("rope type", _rope_per_layer_type),),
    tiny_config=_tiny_config,
    tokenizer="wordpiece",
    auto_class="AutoModel",
)
