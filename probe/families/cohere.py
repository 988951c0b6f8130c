"""Cohere (Command R) and Cohere 2: the Llama layout with interleaved rotary (pairs (x0, x1), (x2, x3), ...).

Cohere's optional QK norm (`use_qk_norm`) is a LayerNorm without bias — mean-centred, unlike the RMS
norms of other families — with its own weight row for every head. Cohere 2 alternates sliding-window
layers, which use rotary, with full-attention layers that use no positions at all (NoPE).
"""

from __future__ import annotations

import dataclasses

from ..rotary import ROPE_INV_FREQ, rope, unsupported_rope
from ..scratch import LayerSpec
from ..family import Family, Refusal, norm_eps
from .llama import cached_length, llama_spec, tiny_llama_config


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].self_attn
    spec = dataclasses.replace(llama_spec(base, i, cfg), rotary_interleaved=True,
                               **rope(cfg, attn.head_dim, longest_seen=cached_length(base.rotary_emb)).spec_fields())
    if getattr(attn, "use_qk_norm", False):  # weights (nh, hs) and (nkv, hs): one row per head
        spec = dataclasses.replace(spec, q_norm=attn.q_norm.weight.detach(), k_norm=attn.k_norm.weight.detach(),
                                   norm_eps=norm_eps(attn.q_norm), norm_offset=0.0, norm_scope="head",
                                   norm_kind="layer")
    if getattr(cfg, "layer_types", None) is not None and attn.sliding_window is None:  # Cohere 2's NoPE layers
        spec = dataclasses.replace(spec, inv_freq=None, rope_scaling=1.0, rotary_dim=None)
    return spec


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    if hasattr(AutoConfig.for_model(model_type), "layer_types"):  # Cohere 2: a sliding layer and a NoPE layer
        return tiny_llama_config(vocab, model_type, sliding_window=4,
                                 layer_types=["sliding_attention", "full_attention"])
    return tiny_llama_config(vocab, model_type, use_qk_norm=True)


FAMILY = Family(
    name="cohere",
    model_types=("cohere", "cohere2"),
    kind="decoder",
    features=("interleaved rotary (rotate every two)", "mean-centred QK layer norm, one weight row per head",
              f"rotary: {', '.join(ROPE_INV_FREQ)}", "sliding-window layers with rotary, NoPE full layers (Cohere 2)",
              "grouped-query KV heads"),
    layer_spec=_spec,
    attention=lambda base, i: base.layers[i].self_attn,
    out_proj=lambda base, i: base.layers[i].self_attn.o_proj,
    refuses=(Refusal("rope type", unsupported_rope),),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModelForCausalLM",
)
