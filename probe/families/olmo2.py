"""OLMo 2: the Llama layout plus an RMS norm of the whole query and key projections (all heads at once,
plain weight), before the split into heads and rotary.

The same attention in OLMoE and FlexOlmo (mixtures of experts) and OLMo 3 (sliding-window layers, rope per layer type)."""

from __future__ import annotations

import dataclasses

from ..rotary import ROPE_INV_FREQ
from ..scratch import LayerSpec
from ..family import norm_eps
from .llama import FAMILY as LLAMA
from .llama import llama_spec, tiny_llama_config


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].self_attn
    return dataclasses.replace(llama_spec(base, i, cfg), q_norm=attn.q_norm.weight.detach(),  # (nh*hs,)
                               k_norm=attn.k_norm.weight.detach(), norm_eps=norm_eps(attn.q_norm),  # (nkv*hs,)
                               norm_offset=0.0, norm_scope="projection")


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    extra = {}
    if hasattr(AutoConfig.for_model(model_type), "layer_types"):  # OLMo 3: a sliding and a full layer
        extra = dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"])
    return tiny_llama_config(vocab, model_type, bos_token_id=None, eos_token_id=None, pad_token_id=None, **extra)


FAMILY = dataclasses.replace(
    LLAMA,  # the Llama layout: same modules, refusals, tokenizer kind and Auto class
    name="olmo2",
    model_types=("olmo2", "olmoe", "olmo3", "flex_olmo"),
    features=("QK norm over the whole projection (plain weight)", f"rotary: {', '.join(ROPE_INV_FREQ)}",
              "grouped-query KV heads", "sliding-window layers where configured"),
    layer_spec=_spec,
    tiny_config=_tiny_config,
)
