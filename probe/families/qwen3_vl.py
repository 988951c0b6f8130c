"""The decoder of Qwen3-VL (Qwen3VLTextModel): Qwen3's attention (an RMS norm of each query and key head)
with multimodal 3-D rotary positions whose frequencies interleave the three streams.

Frequency j of a head reads the row where j % 3 == 1, the column where j % 3 == 2 (within three times
their `mrope_section`) and the time elsewhere (`probe.mrope`); Qwen2-VL takes them in contiguous
sections instead. On text alone the three streams are equal and the rotary is 1-D. Qwen3-VL's
"deepstack" adds visual features to the first layers' hidden states, which is in each layer's input and
so needs nothing here. The vision encoder is not these layers. Qwen3-VL-MoE's decoder has this attention
module line for line; only its MLP differs.
"""

from __future__ import annotations

import dataclasses

from ..mrope import MRope
from .qwen2_vl import FAMILY as QWEN2_VL
from .qwen2_vl import tiny_vl_text_config
from .qwen3 import FAMILY as QWEN3

# Qwen3-VL-MoE's decoder (qwen3_vl_moe_text): the same attention; only its MLP is a mixture of experts, here 4
# experts of 16 dims, 2 of them per token (the 30B-A3B / 235B-A22B checkpoints: 128 experts, 8 per token)
TINY_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, decoder_sparse_step=1)

FAMILY = dataclasses.replace(
    QWEN2_VL,
    name="qwen3_vl",
    model_types=("qwen3_vl_text", "qwen3_vl_moe_text"),
    features=("QK norm per head (plain weight), before rotary", "grouped-query KV heads, causal",
              "multimodal 3-D rotary (time, row, column), interleaved; 1-D on text, the model's own 3-D positions "
              "with image tokens (probe.mrope)"),
    layer_spec=QWEN3.layer_spec,
    tiny_config=lambda vocab, model_type: tiny_vl_text_config(vocab, model_type, head_dim=8,
                                                              **(TINY_MOE if model_type.endswith("moe_text") else {})),
    mrope=MRope((24, 20, 20), interleaved=True),  # frequency j: row where j % 3 == 1, column where j % 3 == 2
)
