"""Mamba hybrids: Jamba, Bamba, Granite 4 hybrid (granitemoehybrid) and Falcon-H1.

Jamba, Bamba and Granite hybrid interleave Mamba layers (`layer_types` "linear_attention": no softmax attention,
no map, their numbers kept) with Llama-layout attention layers; Falcon-H1 runs a Mamba mixer beside the attention
in every layer, so all its layers have a map. The attention is Llama's: q/k/v/o projections under `self_attn`,
grouped KV heads, causal. What differs is read off the module and the config:

- positions: none in Jamba (NoPE: the Mamba layers carry the order) and in a Granite hybrid with
  `position_embedding_type=None`; rotary in the others, on the first `partial_rotary_factor` of each head in Bamba;
- scale: the module's own (`attention_multiplier` in Granite hybrid), times Falcon-H1's `key_multiplier`
  (it multiplies every key before rotary, which is linear, so it multiplies each score: a scale).
  Falcon-H1's `attention_in_multiplier` scales the block's input, which the verification captures as it is.
"""

from __future__ import annotations

from ..rotary import ROPE_INV_FREQ, rope, unsupported_rope
from ..scratch import LayerSpec
from ..family import Family, Refusal, linear_weights
from .llama import cached_length, tiny_llama_config

PARTIAL_ROTARY = ("bamba",)  # the types whose rotary covers only partial_rotary_factor of a head


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].self_attn
    (wq, bq), (wk, bk) = linear_weights(attn.q_proj), linear_weights(attn.k_proj)
    (wv, bv), (wo, bo) = linear_weights(attn.v_proj), linear_weights(attn.o_proj)
    hs = attn.head_dim
    rotary = getattr(base, "rotary_emb", None)
    positions = {} if rotary is None else rope(
        cfg, hs, whole_head=cfg.model_type not in PARTIAL_ROTARY, longest_seen=cached_length(rotary)).spec_fields()
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=cfg.num_attention_heads,
                     n_kv_heads=cfg.num_key_value_heads, head_dim=hs,
                     scale=attn.scaling * float(getattr(attn, "key_multiplier", 1.0)), causal=True, **positions)


def _rope(cfg) -> str | None:
    if cfg.model_type == "jamba" or getattr(cfg, "position_embedding_type", "rope") is None:
        return None  # no positions in the attention
    return unsupported_rope(cfg, whole_head=cfg.model_type not in PARTIAL_ROTARY)


def _tiny_config(vocab: int, model_type: str):
    # Mamba layers as small as the attention (16-dim state, 2 heads of 8 dims); attention at layers 1 and 3
    mamba = dict(mamba_d_state=16, mamba_d_conv=2, mamba_expand=1, mamba_n_heads=4, mamba_d_head=8,
                 mamba_n_groups=1, mamba_chunk_size=16, mamba_dt_rank=4, mamba_d_ssm=32, use_mamba_kernels=False)
    extra = {
        "jamba": dict(attn_layer_period=2, attn_layer_offset=1, num_experts=2, expert_layer_period=2,
                      expert_layer_offset=1),
        "bamba": dict(attn_layer_indices=[1, 3], partial_rotary_factor=0.5),
        "granitemoehybrid": dict(layer_types=["linear_attention", "full_attention"] * 2, position_embedding_type="rope",
                                 attention_multiplier=0.9, shared_intermediate_size=16),
        "falcon_h1": dict(key_multiplier=0.7, attention_in_multiplier=1.3, attention_out_multiplier=0.8,
                          num_hidden_layers=2),  # attention in every layer
    }[model_type]
    return tiny_llama_config(vocab, model_type, **{"num_hidden_layers": 4, **mamba, **extra})


FAMILY = Family(
    name="jamba",
    model_types=("jamba", "bamba", "granitemoehybrid", "falcon_h1"),
    kind="decoder",
    features=("hybrid stack: Mamba layers have no softmax attention (named, never renumbered); Falcon-H1: "
              "attention beside Mamba in every layer",
              "no positions (Jamba; Granite hybrid without rope)", "partial rotary (Bamba)",
              f"rotary: {', '.join(ROPE_INV_FREQ)}",
              "the module's own scale (attention_multiplier), times Falcon-H1's key_multiplier",
              "grouped-query KV heads"),
    layer_spec=_spec,
    attention=lambda base, i: base.layers[i].self_attn,
    out_proj=lambda base, i: base.layers[i].self_attn.o_proj,
    refuses=(Refusal("rope type", _rope),),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModelForCausalLM",
)
