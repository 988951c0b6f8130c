"""Llama and its close kin: Llama, Mistral, Qwen2, SmolLM2 (rotary positions, grouped-query attention)."""

from __future__ import annotations

from ..rotary import ROPE_INV_FREQ, inv_freq, unsupported_rope
from ..scratch import LayerSpec
from . import Family, Refusal, linear_weights


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].self_attn
    (wq, bq), (wk, bk) = linear_weights(attn.q_proj), linear_weights(attn.k_proj)
    (wv, bv), (wo, bo) = linear_weights(attn.v_proj), linear_weights(attn.o_proj)
    hs = attn.head_dim
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=cfg.num_attention_heads,
                     n_kv_heads=cfg.num_key_value_heads, head_dim=hs, scale=attn.scaling, causal=True,
                     sliding_window=_window(cfg, i), inv_freq=inv_freq(cfg, hs))


def _window(cfg, i: int) -> int | None:
    types = getattr(cfg, "layer_types", None)
    window = getattr(cfg, "sliding_window", None)
    if types is not None:
        return window if types[i] == "sliding_attention" else None
    if cfg.model_type == "mistral":  # Mistral configs without layer_types slide on every layer
        return window
    return None


def _tensor_parallel_split(cfg) -> str | None:
    if getattr(cfg, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1 splits projections; not reproduced"
    return None


def _tiny_config(vocab: int):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


FAMILY = Family(
    name="llama",
    model_types=("llama", "mistral", "qwen2"),
    kind="decoder",
    features=(f"rotary: {', '.join(ROPE_INV_FREQ)}", "grouped-query KV heads", "sliding window where configured"),
    layer_spec=_spec,
    attention=lambda base, i: base.layers[i].self_attn,
    out_proj=lambda base, i: base.layers[i].self_attn.o_proj,
    refuses=(Refusal("rope type", unsupported_rope), Refusal("pretraining_tp", _tensor_parallel_split)),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModelForCausalLM",
)
