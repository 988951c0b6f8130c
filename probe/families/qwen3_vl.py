"""The decoder of Qwen3-VL (Qwen3VLTextModel): Qwen3's attention (an RMS norm of each query and key head)
with multimodal 3-D rotary positions whose frequencies interleave the three streams.

Frequency j of a head reads the row where j % 3 == 1, the column where j % 3 == 2 (within three times
their `mrope_section`) and the time elsewhere (`probe.mrope`); Qwen2-VL takes them in contiguous
sections instead. On text alone the three streams are equal and the rotary is 1-D. Qwen3-VL's
"deepstack" adds visual features to the first layers' hidden states, which is in each layer's input and
so needs nothing here. The vision encoder is not these layers.
"""

from __future__ import annotations

import dataclasses

from .qwen2_vl import FAMILY as QWEN2_VL
from .qwen2_vl import tiny_vl_text_config
from .qwen3 import FAMILY as QWEN3

FAMILY = dataclasses.replace(
    QWEN2_VL,
    name="qwen3_vl",
    model_types=("qwen3_vl_text",),
    features=("QK norm per head (plain weight), before rotary", "grouped-query KV heads, causal",
              "multimodal 3-D rotary (time, row, column), interleaved; 1-D on text, the model's own 3-D positions "
              "with image tokens (probe.mrope)"),
    layer_spec=QWEN3.layer_spec,
    tiny_config=lambda vocab, model_type: tiny_vl_text_config(vocab, model_type, head_dim=8),
)
