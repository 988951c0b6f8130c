"""LFM2 (dense and MoE): a hybrid stack of short gated convolutions and Llama-like attention.

The convolution layers (`layer_types` "conv") have no softmax attention, no map, and keep their numbers. The
attention layers are Llama's with an RMS norm of each query and key head (plain weight) before rotary, and
their output projection is named `out_proj`.
"""

from __future__ import annotations

from ..rotary import ROPE_INV_FREQ, rope, unsupported_rope
from ..scratch import LayerSpec
from ..family import Family, Refusal, linear_weights, norm_eps
from .llama import cached_length, tiny_llama_config


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].self_attn
    (wq, bq), (wk, bk) = linear_weights(attn.q_proj), linear_weights(attn.k_proj)
    (wv, bv), (wo, bo) = linear_weights(attn.v_proj), linear_weights(attn.out_proj)
    hs = attn.head_dim
    rotary = getattr(base, "rotary_emb", None) or base.pos_emb  # LFM2-MoE names its rotary module pos_emb
    positions = rope(cfg, hs, whole_head=True, longest_seen=cached_length(rotary))
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=cfg.num_attention_heads,
                     n_kv_heads=cfg.num_key_value_heads, head_dim=hs, scale=attn.scaling, causal=True,
                     **positions.spec_fields(), q_norm=attn.q_layernorm.weight.detach(),
                     k_norm=attn.k_layernorm.weight.detach(), norm_eps=norm_eps(attn.q_layernorm),
                     norm_offset=0.0)


def _tiny_config(vocab: int, model_type: str):
    # convolutions at layers 0 and 2, attention at 1 and 3; the MoE type's first layer dense, the others 2 experts
    return tiny_llama_config(vocab, model_type, num_hidden_layers=4, layer_types=["conv", "full_attention"] * 2,
                             conv_L_cache=2, block_auto_adjust_ff_dim=False, num_dense_layers=1)


FAMILY = Family(
    name="lfm2",
    model_types=("lfm2", "lfm2_moe"),
    kind="decoder",
    features=("hybrid stack: short-convolution layers have no softmax attention (named, never renumbered)",
              "QK norm per head (plain weight)", f"rotary: {', '.join(ROPE_INV_FREQ)}", "grouped-query KV heads"),
    layer_spec=_spec,
    attention=lambda base, i: base.layers[i].self_attn,
    out_proj=lambda base, i: base.layers[i].self_attn.out_proj,
    refuses=(Refusal("rope type", lambda cfg: unsupported_rope(cfg, whole_head=True)),),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModelForCausalLM",
)
