"""Llama 4 (the text model): the Llama layout with four attention mechanisms of its own.

- chunked local attention (`attention_chunk_size`): on the rotary layers a query sees only the keys
  of its own chunk of positions (`LayerSpec.chunk_size`), causally;
- NoPE layers (`no_rope_layers[i]` = 0: no rotary): every `no_rope_layer_interval`-th layer has no
  positions at all and attends over the whole causal context;
- attention temperature tuning (`attn_temperature_tuning`, `floor_scale`, `attn_scale`) on the NoPE
  layers: the query at position t is multiplied by 1 + attn_scale · log(1 + ⌊(t + 1) / floor_scale⌋)
  (`LayerSpec.temperature`, `scratch.temperature_scales`);
- an L2 norm of each query and key head after rotary (`use_qk_norm`, rotary layers only): an RMS norm
  with no weight, i.e. a unit weight (`q_norm` of ones, `norm_after_rotary`).

Rotary turns consecutive pairs (x0, x1), (x2, x3), ... (its complex rotary: interleaved). The mixture
of experts of its MLP does not touch attention.
"""

from __future__ import annotations

import dataclasses

import torch

from ..rotary import ROPE_INV_FREQ, unsupported_rope
from ..scratch import LayerSpec
from ..family import Family, Refusal, norm_eps
from .llama import llama_spec


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].self_attn
    spec = dataclasses.replace(llama_spec(base, i, cfg), sliding_window=None, rotary_interleaved=True)
    if not attn.use_rope:  # a NoPE layer: no positions, full causal attention, the temperature where tuned
        return dataclasses.replace(spec, inv_freq=None, rotary_dim=None, temperature=(
            (float(attn.floor_scale), float(attn.attn_scale)) if attn.attn_temperature_tuning else None))
    if cfg.layer_types[i] == "chunked_attention":
        spec = dataclasses.replace(spec, chunk_size=cfg.attention_chunk_size)
    if hasattr(attn, "qk_norm"):  # L2 norm: x / rms(x), no weight
        ones = torch.ones(spec.head_dim, dtype=spec.wq.dtype, device=spec.wq.device)
        spec = dataclasses.replace(spec, q_norm=ones, k_norm=ones, norm_eps=norm_eps(attn.qk_norm), norm_offset=0.0,
                                   norm_after_rotary=True)
    return spec


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    # Three layers: two rotary layers with chunks of 3 tokens (shorter than the test texts), then one NoPE layer
    # whose temperature steps up every 2 tokens (floor_scale 2, not the real 8192, so that the test texts reach it).
    return AutoConfig.for_model(model_type, vocab_size=vocab, hidden_size=32, intermediate_size=16,
                                intermediate_size_mlp=64, num_hidden_layers=3, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                                no_rope_layers=[1, 1, 0], attention_chunk_size=3, attn_temperature_tuning=True,
                                floor_scale=2, attn_scale=0.5, use_qk_norm=True, interleave_moe_layer_step=2,
                                num_local_experts=2, num_experts_per_tok=1,
                                rope_parameters={"rope_type": "default", "rope_theta": 500000.0})


FAMILY = Family(
    name="llama4",
    model_types=("llama4_text",),
    kind="decoder",
    features=("chunked local attention (attention_chunk_size)", "NoPE layers (no_rope_layers)",
              "attention temperature tuning on NoPE layers (floor_scale, attn_scale)",
              "L2 q/k norm after rotary (use_qk_norm)", f"rotary: {', '.join(ROPE_INV_FREQ)}, interleaved",
              "grouped-query KV heads"),
    layer_spec=_spec,
    attention=lambda base, i: base.layers[i].self_attn,
    out_proj=lambda base, i: base.layers[i].self_attn.o_proj,
    refuses=(Refusal("rope type", lambda cfg: unsupported_rope(cfg, whole_head=True)),),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModelForCausalLM",
)
