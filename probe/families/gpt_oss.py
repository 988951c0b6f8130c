"""gpt-oss: the Llama layout (with q/k/v/o bias), alternating sliding-window and full layers, yarn
rotary — and learned attention sinks.

Each head has one learned sink logit that joins the softmax of every row as an extra, virtual key and
is then dropped (`LayerSpec.sinks`): the probabilities over the real keys sum to less than 1, the rest
being the sink's share (`scratch.sink_share`). Nothing is renormalised — the maps show the model's own
weights, and the missing mass is the sink's.
"""

from __future__ import annotations

import dataclasses

from ..rotary import ROPE_INV_FREQ, unsupported_rope
from ..scratch import LayerSpec
from ..family import Family, Refusal
from .llama import llama_spec, tiny_llama_config


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].self_attn
    return dataclasses.replace(llama_spec(base, i, cfg), sinks=attn.sinks.detach())  # (nh,)


def _tiny_config(vocab: int, model_type: str):
    # yarn as released (truncate=False), scaled for the tiny context: factor 4 over an original 32 positions.
    return tiny_llama_config(vocab, model_type, sliding_window=4,
                             layer_types=["sliding_attention", "full_attention"],
                             rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                              "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                              "original_max_position_embeddings": 32})


FAMILY = Family(
    name="gpt_oss",
    model_types=("gpt_oss",),
    kind="decoder",
    features=("learned attention sinks (rows sum to 1 − sink share, never renormalised)",
              "sliding-window layers", f"rotary: {', '.join(ROPE_INV_FREQ)}", "grouped-query KV heads"),
    layer_spec=_spec,
    attention=lambda base, i: base.layers[i].self_attn,
    out_proj=lambda base, i: base.layers[i].self_attn.o_proj,
    refuses=(Refusal("rope type", lambda cfg: unsupported_rope(cfg, whole_head=True)),),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModelForCausalLM",
)
