"""Llama and its close kin: Llama, Mistral, Qwen2, SmolLM2 (rotary positions, grouped-query attention).

Their attention layout (q/k/v/o projections under `self_attn`, one rotary module on the base model)
is shared by later decoders (Qwen3, OLMo 2, SmolLM3), whose families build on `llama_spec`.
"""

from __future__ import annotations

from ..rotary import ROPE_INV_FREQ, rope, unsupported_rope
from ..scratch import LayerSpec
from . import Family, Refusal, linear_weights


def llama_spec(base, i: int, cfg) -> LayerSpec:
    """Layer i of a Llama-layout decoder: projections, grouped KV heads, rotary, sliding window."""
    attn = base.layers[i].self_attn
    (wq, bq), (wk, bk) = linear_weights(attn.q_proj), linear_weights(attn.k_proj)
    (wv, bv), (wo, bo) = linear_weights(attn.v_proj), linear_weights(attn.o_proj)
    hs = attn.head_dim
    positions = rope(cfg, hs, whole_head=True, longest_seen=cached_length(base.rotary_emb))
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=cfg.num_attention_heads,
                     n_kv_heads=cfg.num_key_value_heads, head_dim=hs, scale=attn.scaling, causal=True,
                     sliding_window=layer_window(cfg, i), **positions.spec_fields())


def cached_length(rotary_emb, layer_type: str | None = None) -> int | None:
    """The longest length a transformers rotary module has cached its frequencies for (dynamic NTK)."""
    prefix = "" if layer_type is None else f"{layer_type}_"
    length = getattr(rotary_emb, f"{prefix}max_seq_len_cached", getattr(rotary_emb, "max_seq_len_cached", None))
    return None if length is None else int(length)  # a tensor once transformers has grown it


def layer_window(cfg, i: int) -> int | None:
    """The sliding window of layer i, from `layer_types` where the config has them."""
    types = getattr(cfg, "layer_types", None)
    window = getattr(cfg, "sliding_window", None)
    if types is not None:
        return window if types[i] == "sliding_attention" else None
    if cfg.model_type == "mistral":  # Mistral configs without layer_types slide on every layer
        return window
    return None


def tiny_llama_config(vocab: int, model_type: str, **extra):
    """The tiny random config of a Llama-layout `model_type`: 2 layers, 4 query heads over 2 KV heads."""
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                max_position_embeddings=128, **extra)


FAMILY = Family(
    name="llama",
    model_types=("llama", "mistral", "qwen2"),
    kind="decoder",
    features=(f"rotary: {', '.join(ROPE_INV_FREQ)}", "grouped-query KV heads", "sliding window where configured"),
    layer_spec=llama_spec,
    attention=lambda base, i: base.layers[i].self_attn,
    out_proj=lambda base, i: base.layers[i].self_attn.o_proj,
    refuses=(Refusal("rope type", lambda cfg: unsupported_rope(cfg, whole_head=True)),),
    tiny_config=tiny_llama_config,
    tokenizer="bytebpe",
    auto_class="AutoModelForCausalLM",
)
