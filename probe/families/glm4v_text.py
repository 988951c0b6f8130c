"""The decoders of GLM-4.1V, GLM-4.5V, GLM-4.6V and GLM-OCR (Glm4vTextModel, Glm4vMoeTextModel, GlmOcrTextModel):
GLM's attention with multimodal 3-D rotary positions (M-RoPE: time, row, column).

Each layer is the Llama layout (grouped KV heads, causal; q/k/v biases in GLM-4.1V / 4.5V, none in GLM-OCR, no
output bias) with partial rotary (GLM-4.1V, 4.5V: half of each head, `partial_rotary_factor`; GLM-OCR: the whole
head, 128 dims beside a 1536-wide hidden state). Rotary frequency j reads one of the three position streams in
contiguous sections (`mrope_section`: j's section i reads stream i % 3), as Qwen2-VL's do; the rotated pairs are
GLM's (x0, x1), (x2, x3), ... (rotate every two) in GLM-4.1V and GLM-OCR, the half-split (x_i, x_{i+d/2}) of the
rotated dims in GLM-4.5V (transformers' Glm4vMoe `rotate_half`). On text alone the three streams are equal and the
rotary is the ordinary 1-D one, which this family's `LayerSpec` reproduces; an input with image tokens is verified
at the model's own 3-D positions (`probe.mrope.at_positions`, handed this family's `mrope` by the composite).
GLM-4.5V's mixture of experts is only in its MLP; GLM's extra norms after attention are outside the attention.
"""

from __future__ import annotations

import dataclasses

from ..family import Family, Refusal
from ..mrope import MRope
from ..rotary import ROPE_INV_FREQ, rope, unsupported_rope
from ..scratch import LayerSpec
from .llama import cached_length, llama_spec

HALF_SPLIT = ("glm4v_moe_text",)  # the types whose rotated pairs are half-split, not interleaved
# tiny models: 4 heads of 32 dims over 2 KV heads; half of each head rotated (GLM-OCR: all of it), its frequencies in
# sections of the real checkpoints' proportions: [8, 12, 12] / 4 on 8 frequencies, GLM-OCR's [16, 24, 24] / 4 on 16
TINY_SECTIONS = {"glm_ocr_text": [4, 6, 6]}
TINY_MOE = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1,
                first_k_dense_replace=1, n_group=1, topk_group=1)


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].self_attn
    positions = rope(cfg, attn.head_dim, longest_seen=cached_length(base.rotary_emb))  # partial where configured
    return dataclasses.replace(llama_spec(base, i, cfg), rotary_interleaved=cfg.model_type not in HALF_SPLIT,
                               **positions.spec_fields())


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    full = model_type in TINY_SECTIONS
    rope_parameters = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0 if full else 0.5,
                       "mrope_section": list(TINY_SECTIONS.get(model_type, [2, 3, 3]))}
    return AutoConfig.for_model(model_type, vocab_size=vocab, hidden_size=128 if not full else 96,
                                intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                head_dim=32, max_position_embeddings=128, rope_parameters=rope_parameters,
                                **(TINY_MOE if model_type in HALF_SPLIT else {}))


FAMILY = Family(
    name="glm4v_text",
    model_types=("glm4v_text", "glm4v_moe_text", "glm_ocr_text"),
    kind="decoder",
    features=("GLM's attention (q/k/v biases but GLM-OCR's, grouped-query KV heads, causal)",
              "partial rotary (GLM-4.1V / 4.5V: half of each head; GLM-OCR: whole heads wider than hidden / heads), "
              "rotate every two (GLM-4.5V: half-split)",
              "multimodal 3-D rotary (time, row, column) in contiguous sections; 1-D on text, the model's own 3-D "
              "positions with image tokens (probe.mrope)", f"rotary: {', '.join(ROPE_INV_FREQ)}"),
    layer_spec=_spec,
    attention=lambda base, i: base.layers[i].self_attn,
    out_proj=lambda base, i: base.layers[i].self_attn.o_proj,
    refuses=(Refusal("rope type", unsupported_rope),),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModel",
    mrope=MRope((8, 12, 12), interleaved=False),  # contiguous sections: time, then row, then column
)
