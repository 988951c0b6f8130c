"""Zamba 2: Mamba layers (`layer_types` "linear_attention", no softmax attention, named and never renumbered)
and "hybrid" layers that run a shared attention block before their Mamba mixer.

The shared block's weights are tied across the hybrid layers (`num_mem_blocks` sets of them, used in turn), but
every hybrid layer holds its own module, so each is captured and verified as its own layer. Its input is the
previous layer's output concatenated with the token embeddings (2·D wide, normed); each hybrid layer adds its own
low-rank adapter to the q, k and v projections (`use_shared_attention_adapter`): x Wᵀ + x Aᵀ Bᵀ = x (W + B A)ᵀ, so
the layer's effective projections are W + B A. The scale is 1/√(head_dim / 2); rotary only with `use_mem_rope`.
"""

from __future__ import annotations

import torch

from ..rotary import ROPE_INV_FREQ, rope, unsupported_rope
from ..scratch import LayerSpec
from ..family import Family, Refusal
from .llama import cached_length


def _projection(attn, name: str, slot: int | None) -> torch.Tensor:
    """The effective weight (out, in) of q_proj, k_proj or v_proj: with this layer's adapter B A added."""
    w = getattr(attn, f"{name}_proj").weight.detach()
    if slot is None:
        return w
    down, up = getattr(attn, f"linear_{name}_adapter_list")[slot]  # x -> x Aᵀ -> (x Aᵀ) Bᵀ
    return w + up.weight.detach() @ down.weight.detach()  # (out, r) @ (r, in)


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].shared_transformer.self_attn
    slot = cfg.hybrid_layer_ids.index(i) if cfg.use_shared_attention_adapter else None
    hs = attn.head_dim
    positions = (rope(cfg, hs, longest_seen=cached_length(base.rotary_emb)).spec_fields()
                 if cfg.use_mem_rope else {})
    return LayerSpec(_projection(attn, "q", slot), _projection(attn, "k", slot), _projection(attn, "v", slot),
                     attn.o_proj.weight.detach(), None, None, None, None, n_heads=cfg.num_attention_heads,
                     n_kv_heads=cfg.num_key_value_heads, head_dim=hs, scale=attn.scaling, causal=True, **positions)


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    # Mamba at layers 0 and 2, the shared attention block at 1 and 3, each with its own adapter; as many KV heads
    # as query heads (transformers' adapters are as wide as all heads, so grouped KV heads fail there)
    return AutoConfig.for_model(model_type, vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=4,
                                num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                                layers_block_type=["mamba", "hybrid", "mamba", "hybrid"], mamba_d_state=8,
                                mamba_d_conv=2, mamba_expand=1, n_mamba_heads=2, chunk_size=16, num_mem_blocks=1,
                                use_shared_attention_adapter=True, adapter_rank=2, use_mem_rope=True)


FAMILY = Family(
    name="zamba2",
    model_types=("zamba2",),
    kind="decoder",
    features=("hybrid stack: Mamba layers have no softmax attention (named, never renumbered)",
              "shared attention blocks (tied weights), verified in every hybrid layer that runs them",
              "per-layer low-rank q/k/v adapters folded into the projections (W + B A)",
              "input: the layer's stream concatenated with the embeddings", "scale 1/√(head_dim / 2)",
              f"rotary (use_mem_rope): {', '.join(ROPE_INV_FREQ)}", "grouped-query KV heads"),
    layer_spec=_spec,
    attention=lambda base, i: base.layers[i].shared_transformer.self_attn,
    out_proj=lambda base, i: base.layers[i].shared_transformer.self_attn.o_proj,
    refuses=(Refusal("rope type", lambda cfg: unsupported_rope(cfg) if cfg.use_mem_rope else None),),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModelForCausalLM",
)
