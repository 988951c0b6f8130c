"""Gemma 3: QK-norm, `query_pre_attn_scalar`, sliding-window layers, local/global rotary bases."""

from __future__ import annotations

from ..rotary import ROPE_INV_FREQ, rope, unsupported_rope
from ..scratch import LayerSpec
from ..family import Family, Refusal, linear_weights, norm_eps
from .llama import cached_length


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].self_attn
    (wq, bq), (wk, bk) = linear_weights(attn.q_proj), linear_weights(attn.k_proj)
    (wv, bv), (wo, bo) = linear_weights(attn.v_proj), linear_weights(attn.o_proj)
    layer_type = cfg.layer_types[i]
    hs = attn.head_dim
    return LayerSpec(
        wq, wk, wv, wo, bq, bk, bv, bo, n_heads=cfg.num_attention_heads, n_kv_heads=cfg.num_key_value_heads,
        head_dim=hs, scale=cfg.query_pre_attn_scalar**-0.5, causal=True,
        sliding_window=cfg.sliding_window if layer_type == "sliding_attention" else None,
        **rope(cfg, hs, layer_type, whole_head=True,
               longest_seen=cached_length(base.rotary_emb, layer_type)).spec_fields(),
        q_norm=attn.q_norm.weight.detach(), k_norm=attn.k_norm.weight.detach(), norm_eps=norm_eps(attn.q_norm),
    )


def _softcapping(cfg) -> str | None:
    if getattr(cfg, "attn_logit_softcapping", None) is not None:
        return f"attn_logit_softcapping={cfg.attn_logit_softcapping}: softcapping is not reproduced"
    return None


def _bidirectional(cfg) -> str | None:
    if getattr(cfg, "use_bidirectional_attention", False):
        return "use_bidirectional_attention=True is not reproduced"
    return None


def _rope_per_layer_type(cfg) -> str | None:
    return unsupported_rope(cfg, set(cfg.layer_types), whole_head=True)


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                query_pre_attn_scalar=8, sliding_window=4, max_position_embeddings=128,
                                layer_types=["sliding_attention", "sliding_attention", "full_attention"])


FAMILY = Family(
    name="gemma3",
    model_types=("gemma3_text",),
    kind="decoder",
    features=("QK norm", "query_pre_attn_scalar", "sliding-window layers",
              f"rotary: {', '.join(ROPE_INV_FREQ)}, local/global bases", "grouped-query KV heads"),
    layer_spec=_spec,
    attention=lambda base, i: base.layers[i].self_attn,
    out_proj=lambda base, i: base.layers[i].self_attn.o_proj,
    refuses=(Refusal("attention-logit softcapping", _softcapping),
             Refusal("bidirectional attention", _bidirectional),
             Refusal("rope type", _rope_per_layer_type)),
    tiny_config=_tiny_config,
    tokenizer="sentencepiece",
    auto_class="AutoModelForCausalLM",
)
