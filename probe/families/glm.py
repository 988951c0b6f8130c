"""GLM and ERNIE 4.5: the Llama layout with interleaved rotary — pairs (x0, x1), (x2, x3), ... turn
together (GPT-J's "rotate every two") — on the first `partial_rotary_factor` of each head (GLM: half).

GLM-4 has GLM's attention; GLM-4-MoE turns the half-split pairs (x_i, x_{i+d/2}) of its rotated dims
instead (transformers' `rotate_half` there) and adds an optional RMS norm of each query and key head
before rotary (`use_qk_norm`); ERNIE 4.5 (dense and MoE) rotates whole heads, interleaved.
"""

from __future__ import annotations

import dataclasses

from ..rotary import ROPE_INV_FREQ, rope, unsupported_rope
from ..scratch import LayerSpec
from ..family import Family, Refusal, norm_eps
from .llama import cached_length, llama_spec, tiny_llama_config

HALF_SPLIT = ("glm4_moe",)  # the types of this family whose rotary pairs are half-split, not interleaved


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].self_attn
    positions = rope(cfg, attn.head_dim, longest_seen=cached_length(base.rotary_emb))  # partial where configured
    spec = dataclasses.replace(llama_spec(base, i, cfg), rotary_interleaved=cfg.model_type not in HALF_SPLIT,
                               **positions.spec_fields())
    if getattr(attn, "use_qk_norm", False):  # GLM-4-MoE
        spec = dataclasses.replace(spec, q_norm=attn.q_norm.weight.detach(), k_norm=attn.k_norm.weight.detach(),
                                   norm_eps=norm_eps(attn.q_norm), norm_offset=0.0, norm_scope="head")
    return spec


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    extra = {"use_qk_norm": True} if hasattr(AutoConfig.for_model(model_type), "use_qk_norm") else {}
    return tiny_llama_config(vocab, model_type, first_k_dense_replace=1, moe_layer_start_index=1,
                             bos_token_id=None, eos_token_id=None, pad_token_id=None, **extra)


FAMILY = Family(
    name="glm",
    model_types=("glm", "glm4", "glm4_moe", "ernie4_5", "ernie4_5_moe"),
    kind="decoder",
    features=("interleaved rotary (rotate every two; half-split in GLM-4-MoE)",
              "partial rotary (partial_rotary_factor)",
              f"rotary: {', '.join(ROPE_INV_FREQ)}", "grouped-query KV heads", "QK norm per head where configured"),
    layer_spec=_spec,
    attention=lambda base, i: base.layers[i].self_attn,
    out_proj=lambda base, i: base.layers[i].self_attn.o_proj,
    refuses=(Refusal("rope type", unsupported_rope),),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModelForCausalLM",
)
