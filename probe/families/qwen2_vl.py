"""The decoders of Qwen2-VL and Qwen2.5-VL (Qwen2VLTextModel, Qwen2_5_VLTextModel): Qwen2's attention with
multimodal 3-D rotary positions (M-RoPE: time, row, column).

Each layer is Llama's layout (q/k/v with biases, grouped KV heads, causal), but every token has three
positions and each rotary frequency reads one of them, in contiguous sections (`mrope_section`:
time, then row, then column; `probe.mrope`). On text alone the three are equal and the rotary is the
ordinary 1-D one, which this family's `LayerSpec` reproduces; an input with image tokens is verified at
the model's own 3-D positions (`probe.mrope.qwen_vl_positions` and `at_positions`). The vision encoder
and the merger are not these layers.
"""

from __future__ import annotations

import dataclasses

from ..mrope import MRope
from ..scratch import LayerSpec
from .llama import FAMILY as LLAMA
from .llama import llama_spec

MROPE_SECTION = [2, 1, 1]  # tiny models: head_dim 8, 4 rotary frequencies: 2 on time, 1 on the row, 1 on the column


def _spec(base, i: int, cfg) -> LayerSpec:
    return llama_spec(base, i, cfg)


def tiny_vl_text_config(vocab: int, model_type: str, **extra):
    """A 2-layer, 4-head (2 KV heads of 8 dims) Qwen-VL decoder config with 3-D rotary sections."""
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                max_position_embeddings=128,
                                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                 "mrope_section": list(MROPE_SECTION)}, **extra)


FAMILY = dataclasses.replace(
    LLAMA,
    name="qwen2_vl",
    model_types=("qwen2_vl_text", "qwen2_5_vl_text"),
    features=("Qwen2's attention (q/k/v biases, grouped-query KV heads, causal)",
              "multimodal 3-D rotary (time, row, column) in contiguous sections; 1-D on text, the model's own "
              "3-D positions with image tokens (probe.mrope)"),
    layer_spec=_spec,
    tiny_config=tiny_vl_text_config,
    auto_class="AutoModel",
    mrope=MRope((16, 24, 24), interleaved=False),  # contiguous sections: time, then row, then column
)
