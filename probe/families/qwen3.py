"""Qwen 3: the Llama layout plus an RMS norm of each query and key head (plain weight), before rotary."""

from __future__ import annotations

import dataclasses

from ..rotary import ROPE_INV_FREQ
from ..scratch import LayerSpec
from .llama import FAMILY as LLAMA
from .llama import llama_spec, tiny_llama_config


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].self_attn
    return dataclasses.replace(llama_spec(base, i, cfg), q_norm=attn.q_norm.weight.detach(),
                               k_norm=attn.k_norm.weight.detach(), norm_eps=attn.q_norm.variance_epsilon,
                               norm_offset=0.0, norm_scope="head")


def _tiny_config(vocab: int, model_type: str):
    return tiny_llama_config(vocab, model_type, head_dim=8)


FAMILY = dataclasses.replace(
    LLAMA,  # the Llama layout: same modules, refusals, tokenizer kind and Auto class
    name="qwen3",
    model_types=("qwen3",),
    features=("QK norm per head (plain weight)", f"rotary: {', '.join(ROPE_INV_FREQ)}", "grouped-query KV heads",
              "sliding-window layers where configured"),
    layer_spec=_spec,
    tiny_config=_tiny_config,
)
