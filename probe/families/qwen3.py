"""Qwen 3: the Llama layout plus an RMS norm of each query and key head (plain weight), before rotary.

The same attention in Qwen3-MoE, dots.llm1, Apertus and EXAONE 4 (whose global layers, in a model with sliding
layers, have no rotary: NoPE), and in HunYuan v1 (dense and MoE), which norms each head after rotary.
"""

from __future__ import annotations

import dataclasses

from ..rotary import ROPE_INV_FREQ
from ..scratch import LayerSpec
from ..family import norm_eps
from .llama import FAMILY as LLAMA
from .llama import llama_spec, tiny_llama_config


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].self_attn
    after = hasattr(attn, "query_layernorm")  # HunYuan names its head norms apart and applies them after rotary
    q_norm, k_norm = (attn.query_layernorm, attn.key_layernorm) if after else (attn.q_norm, attn.k_norm)
    spec = dataclasses.replace(llama_spec(base, i, cfg), q_norm=q_norm.weight.detach(),
                               k_norm=k_norm.weight.detach(), norm_eps=norm_eps(q_norm),
                               norm_offset=0.0, norm_scope="head", norm_after_rotary=after)
    if _global_nope(attn):
        spec = dataclasses.replace(spec, inv_freq=None, rope_scaling=1.0, rotary_dim=None)
    return spec


def _global_nope(attn) -> bool:
    """EXAONE 4: in a model with sliding layers, its full-attention layers use no positions (NoPE)."""
    return hasattr(attn, "is_sliding") and attn.sliding_window is not None and not attn.is_sliding


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    if hasattr(AutoConfig.for_model(model_type), "sliding_window_pattern"):  # EXAONE 4: a local and a global layer
        return tiny_llama_config(vocab, model_type, sliding_window=4, sliding_window_pattern=2)
    return tiny_llama_config(vocab, model_type)


FAMILY = dataclasses.replace(
    LLAMA,  # the Llama layout: same modules, refusals, tokenizer kind and Auto class
    name="qwen3",
    model_types=("qwen3", "qwen3_moe", "apertus", "exaone4", "hunyuan_v1_dense", "hunyuan_v1_moe", "dots1"),
    features=("QK norm per head (plain weight), after rotary in HunYuan", f"rotary: {', '.join(ROPE_INV_FREQ)}",
              "grouped-query KV heads", "sliding-window layers where configured", "NoPE global layers (EXAONE 4)"),
    layer_spec=_spec,
    tiny_config=_tiny_config,
)
