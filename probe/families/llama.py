"""Llama and its close kin: Llama, Mistral, Qwen2, SmolLM2 (rotary positions, grouped-query attention).

Also every model whose attention transformers copies from Llama's, whatever its MLP: the mixtures of
experts Mixtral, Qwen2-MoE, PhiMoE, Granite-MoE and Solar Open, and Starcoder2, Seed-OSS, Ministral,
Arcee, OLMo (v1; its optional clipping of q, k and v is refused), Granite (its `attention_multiplier` is
the scale, read off the module) and Gemma (v1).

Their attention layout (q/k/v/o projections under `self_attn`, one rotary module on the base model)
is shared by later decoders (Qwen3, OLMo 2, SmolLM3), whose families build on `llama_spec`.
"""

from __future__ import annotations

from ..rotary import ROPE_INV_FREQ, rope, unsupported_rope
from ..scratch import LayerSpec
from ..family import Family, Refusal, linear_weights


def llama_spec(base, i: int, cfg) -> LayerSpec:
    """Layer i of a Llama-layout decoder: projections, grouped KV heads, rotary, sliding window."""
    attn = base.layers[i].self_attn
    (wq, bq), (wk, bk) = linear_weights(attn.q_proj), linear_weights(attn.k_proj)
    (wv, bv), (wo, bo) = linear_weights(attn.v_proj), linear_weights(attn.o_proj)
    hs = attn.head_dim
    layer_type = rope_layer_type(cfg, i)
    positions = rope(cfg, hs, layer_type, whole_head=True, longest_seen=cached_length(base.rotary_emb, layer_type))
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=cfg.num_attention_heads,
                     n_kv_heads=cfg.num_key_value_heads, head_dim=hs, scale=attn.scaling, causal=True,
                     sliding_window=layer_window(cfg, i), **positions.spec_fields())


def cached_length(rotary_emb, layer_type: str | None = None) -> int | None:
    """The longest length a transformers rotary module has cached its frequencies for (dynamic NTK)."""
    prefix = "" if layer_type is None else f"{layer_type}_"
    length = getattr(rotary_emb, f"{prefix}max_seq_len_cached", getattr(rotary_emb, "max_seq_len_cached", None))
    return None if length is None else int(length)  # a tensor once transformers has grown it


def rope_layer_type(cfg, i: int) -> str | None:
    """Layer i's type where the config keys its rope parameters by layer type (OLMo 3), else None."""
    types = getattr(cfg, "layer_types", None)
    params = getattr(cfg, "rope_parameters", None) or {}
    return types[i] if types is not None and types[i] in params else None


def layer_window(cfg, i: int) -> int | None:
    """The sliding window of layer i, from `layer_types` where the config has them; a config with a
    window and no layer types (Mistral, Mixtral, Starcoder2, Qwen3-MoE) slides on every layer."""
    types = getattr(cfg, "layer_types", None)
    window = getattr(cfg, "sliding_window", None)
    if types is not None:
        return window if types[i] == "sliding_attention" else None
    return window


def tiny_llama_config(vocab: int, model_type: str, **extra):
    """The tiny random config of a Llama-layout `model_type`: 2 layers, 4 query heads over 2 KV heads of 8 dims
    (mixtures of experts: 2 experts of 16 dims, 2 per token, so the MLP stays as small as the attention)."""
    from transformers import AutoConfig

    moe = dict(num_experts=2, num_local_experts=2, num_experts_per_tok=2, moe_intermediate_size=16,
               shared_expert_intermediate_size=16, n_routed_experts=2, n_shared_experts=1, moe_num_experts=2,
               moe_k=2, moe_num_shared_experts=1, moe_topk=2)
    sizes = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, max_position_embeddings=128)
    return AutoConfig.for_model(model_type, **{**sizes, **moe, **extra})  # `extra` may change the sizes too


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    # Every type that can slide does, on a window of 4 tokens, shorter than the test texts; Granite's
    # attention_multiplier is far from 1/√8, so a model scaled by 1/√d would fail.
    default = AutoConfig.for_model(model_type)
    extra = {"sliding_window": 4} if hasattr(default, "sliding_window") else {}
    if hasattr(default, "attention_multiplier"):
        extra["attention_multiplier"] = 0.9
    return tiny_llama_config(vocab, model_type, **extra)


def _clip_qkv(cfg) -> str | None:
    if getattr(cfg, "clip_qkv", None) is not None:  # OLMo (v1)
        return f"clip_qkv={cfg.clip_qkv}: clamping q, k and v is not reproduced"
    return None


def _bidirectional(cfg) -> str | None:
    if getattr(cfg, "use_bidirectional_attention", False):  # Gemma's encoder use
        return "use_bidirectional_attention=True is not reproduced"
    return None


FAMILY = Family(
    name="llama",
    model_types=("llama", "mistral", "qwen2", "mixtral", "qwen2_moe", "phimoe", "granite", "granitemoe",
                 "starcoder2", "seed_oss", "gemma", "ministral", "arcee", "olmo", "solar_open"),
    kind="decoder",
    features=(f"rotary: {', '.join(ROPE_INV_FREQ)}", "grouped-query KV heads", "sliding window where configured",
              "the module's own scale (Granite's attention_multiplier)"),
    layer_spec=llama_spec,
    attention=lambda base, i: base.layers[i].self_attn,
    out_proj=lambda base, i: base.layers[i].self_attn.o_proj,
    refuses=(Refusal("rope type", lambda cfg: unsupported_rope(cfg, whole_head=True)),
             Refusal("bidirectional attention", _bidirectional), Refusal("clip_qkv", _clip_qkv)),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModelForCausalLM",
)
