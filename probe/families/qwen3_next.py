"""Qwen3-Next and Qwen3.5 (dense and MoE): hybrid stacks whose full-attention layers are gated.

Three layers in four are gated delta-nets (linear attention, `layer_types` "linear_attention"): they have no
softmax attention, no map and no LayerSpec, and keep their layer numbers (`Family.attention_layers`). The
other layers are Qwen 3's attention — an RMS norm of each query and key head (weight 1 + w), partial rotary on
the first quarter of each head, half-split — with an output gate: `q_proj` makes, per head, the query's hs dims
followed by the gate's hs dims, and the heads' concat is multiplied by sigmoid(gate) before `o_proj`
(`LayerSpec.output_gate`, part of the verified block output).
"""

from __future__ import annotations


from ..rotary import ROPE_INV_FREQ, rope, unsupported_rope
from ..mrope import MRope
from ..scratch import LayerSpec
from ..family import Family, Refusal, linear_weights, norm_eps
from .llama import cached_length, tiny_llama_config


def _split_query_gate(w, nh: int, hs: int):
    """q_proj's weight (nh*2*hs, D) or bias (nh*2*hs,) -> the query's (nh*hs, ...) and the gate's (nh*hs, ...)."""
    if w is None:
        return None, None
    per_head = w.reshape(nh, 2, hs, *w.shape[1:])  # head h: rows of the query, then rows of its gate
    return per_head[:, 0].reshape(nh * hs, *w.shape[1:]), per_head[:, 1].reshape(nh * hs, *w.shape[1:])


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].self_attn
    nh, hs = cfg.num_attention_heads, attn.head_dim
    w2, b2 = linear_weights(attn.q_proj)  # (nh*2*hs, D)
    (wq, wg), (bq, bg) = _split_query_gate(w2, nh, hs), _split_query_gate(b2, nh, hs)
    (wk, bk), (wv, bv), (wo, bo) = linear_weights(attn.k_proj), linear_weights(attn.v_proj), linear_weights(attn.o_proj)
    positions = rope(cfg, hs, longest_seen=cached_length(base.rotary_emb))  # partial: the first quarter of a head
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=nh, n_kv_heads=cfg.num_key_value_heads, head_dim=hs,
                     scale=attn.scaling, causal=True, **positions.spec_fields(),
                     q_norm=attn.q_norm.weight.detach(), k_norm=attn.k_norm.weight.detach(),
                     norm_eps=norm_eps(attn.q_norm), norm_offset=1.0, output_gate=wg, output_gate_bias=bg)


def _tiny_config(vocab: int, model_type: str):
    # 4 layers: gated full attention at 0, 1 and 3, a gated delta-net at 2 (so L3 is the third attention layer,
    # row 2 of a map, never "L2"); delta-net heads as small as the attention's.
    return tiny_llama_config(vocab, model_type, num_hidden_layers=4, partial_rotary_factor=0.5,
                             layer_types=["full_attention", "full_attention", "linear_attention", "full_attention"],
                             linear_num_key_heads=2,
                             linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                             linear_conv_kernel_dim=2, decoder_sparse_step=1, mlp_only_layers=[])


FAMILY = Family(
    name="qwen3_next",
    model_types=("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"),
    kind="decoder",
    features=("hybrid stack: gated delta-net layers have no softmax attention (named, never renumbered)",
              "output gate sigmoid(x W_gᵀ) on the heads' concat, part of the block output",
              "QK norm per head (1 + w)", "partial rotary (partial_rotary_factor), half-split",
              f"rotary: {', '.join(ROPE_INV_FREQ)}", "grouped-query KV heads"),
    layer_spec=_spec,
    attention=lambda base, i: base.layers[i].self_attn,
    out_proj=lambda base, i: base.layers[i].self_attn.o_proj,
    refuses=(Refusal("rope type", unsupported_rope),),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModelForCausalLM",
    # Qwen3.5's decoders (qwen3_5_text, qwen3_5_moe_text) under Qwen3.5 with vision: interleaved 3-D sections over the
    # partial rotary (Qwen3-Next itself reads text only)
    mrope=MRope((11, 11, 10), interleaved=True),
)
