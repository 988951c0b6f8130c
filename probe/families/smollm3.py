"""SmolLM3: the Llama layout where some layers use no rotary at all (`no_rope_layers[i] == 0`, NoPE)."""

from __future__ import annotations

import dataclasses

from ..rotary import ROPE_INV_FREQ
from ..scratch import LayerSpec
from .llama import FAMILY as LLAMA
from .llama import llama_spec, tiny_llama_config


def _spec(base, i: int, cfg) -> LayerSpec:
    spec = llama_spec(base, i, cfg)
    if cfg.no_rope_layers[i]:
        return spec
    return dataclasses.replace(spec, inv_freq=None, rope_scaling=1.0, rotary_dim=None)  # a NoPE layer


def _tiny_config(vocab: int, model_type: str):
    # Every other layer without rotary, so the tiny model has both kinds.
    return tiny_llama_config(vocab, model_type, no_rope_layer_interval=2, bos_token_id=None, eos_token_id=None,
                             pad_token_id=None)


FAMILY = dataclasses.replace(
    LLAMA,  # the Llama layout: same modules, refusals, tokenizer kind and Auto class
    name="smollm3",
    model_types=("smollm3",),
    features=("layers without rotary (no_rope_layers)", f"rotary: {', '.join(ROPE_INV_FREQ)}",
              "grouped-query KV heads", "sliding-window layers where configured"),
    layer_spec=_spec,
    tiny_config=_tiny_config,
)
