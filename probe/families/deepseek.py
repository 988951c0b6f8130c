"""DeepSeek-V2/V3: multi-head latent attention (MLA), and the models that copy its attention module
(GLM-4.7-Flash `glm4_moe_lite`, Youtu, MiniCPM3).

Queries go through a low-rank latent with its own RMS norm (`q_lora_rank`; V2-Lite has none), keys
and values through one shared latent (`kv_lora_rank`) with its RMS norm; each q/k head has
`qk_nope_head_dim` dims without positions and `qk_rope_head_dim` rotated dims, the rotated key being
one for all heads; a value head has `v_head_dim` dims, not the q/k head size (`LayerSpec.latent`,
`LayerSpec.v_head_dim`). The scale is the module's own: 1/√(nope + rope), times yarn's mscale² where
the rope parameters carry `mscale_all_dim`. DeepSeek-V2 rotates interleaved pairs (x0, x1), (x2, x3),
... (its complex rotary), V3 where `rope_interleave` says so, MiniCPM3 half-split pairs.
"""

from __future__ import annotations

from ..rotary import ROPE_INV_FREQ, rope
from ..scratch import LayerSpec, MultiHeadLatent
from ..family import Family, Refusal, UnsupportedFeature, linear_weights, norm_eps
from .llama import cached_length

# The types whose rotary pairs do not follow `rope_interleave`: DeepSeek-V2's complex rotary turns consecutive
# pairs (interleaved), MiniCPM3's cos/sin rotary half-split pairs.
ROTARY_LAYOUT = {"deepseek_v2": True, "minicpm3": False}


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].self_attn
    nh, nope, rope_dim, vd = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    if attn.q_a_proj is not None:
        (q_a, q_a_bias), (wq, bq) = linear_weights(attn.q_a_proj), linear_weights(attn.q_b_proj)
        q_a_norm = attn.q_a_layernorm.weight.detach()
    else:
        (wq, bq), q_a, q_a_bias, q_a_norm = linear_weights(attn.q_proj), None, None, None
    kv_a, kv_a_bias = linear_weights(attn.kv_a_proj_with_mqa)
    kv_b = attn.kv_b_proj.weight.detach().view(nh, nope + vd, -1)  # (nh, nope+vd, r): per head k rows, then v rows
    wo, bo = linear_weights(attn.o_proj)
    latent = MultiHeadLatent(q_a=q_a, q_a_bias=q_a_bias, q_a_norm=q_a_norm, kv_a=kv_a, kv_a_bias=kv_a_bias,
                             kv_a_norm=attn.kv_a_layernorm.weight.detach(), nope_dim=nope,
                             norm_eps=norm_eps(attn.kv_a_layernorm))
    positions = rope(cfg, rope_dim, longest_seen=cached_length(base.rotary_emb))
    interleaved = ROTARY_LAYOUT.get(cfg.model_type, bool(getattr(cfg, "rope_interleave", False)))
    return LayerSpec(wq, kv_b[:, :nope].reshape(nh * nope, -1), kv_b[:, nope:].reshape(nh * vd, -1), wo,
                     bq, None, None, bo, n_heads=nh, n_kv_heads=nh, head_dim=nope + rope_dim, v_head_dim=vd,
                     scale=attn.scaling, causal=True, latent=latent, rotary_interleaved=interleaved,
                     **positions.spec_fields())


def _rope(cfg) -> str | None:
    try:
        rope(cfg, cfg.qk_rope_head_dim)
    except UnsupportedFeature as exc:
        return str(exc)
    if float((getattr(cfg, "rope_parameters", None) or {}).get("partial_rotary_factor") or 1.0) != 1.0:
        return "partial_rotary_factor with multi-head latent attention is not reproduced"
    return None


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    # A value head (6) narrower than a q/k head (4 + 4): a spec that sliced W_O by the q/k size would fail.
    # DeepSeek-V3 and its copies: a query latent, yarn with mscale_all_dim (mscale² in the scale), interleaved
    # rotary; V2 (V2-Lite's layout): no query latent, yarn through its complex rotary.
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
    return AutoConfig.for_model(
        model_type, vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None if model_type == "deepseek_v2" else 16,
        kv_lora_rank=12, qk_nope_head_dim=4, qk_rope_head_dim=4, head_dim=4, v_head_dim=6,
        max_position_embeddings=128, rope_parameters=yarn, rope_interleave=True,
        # the mixture of experts, as small as the attention
        n_routed_experts=2, num_local_experts=2, num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1,
        n_group=1, topk_group=1, first_k_dense_replace=1, mlp_layer_types=["dense", "sparse"])


FAMILY = Family(
    name="deepseek",
    model_types=("deepseek_v2", "deepseek_v3", "glm4_moe_lite", "youtu", "minicpm3"),
    kind="decoder",
    features=("multi-head latent attention: low-rank q and kv with their RMS norms",
              "rotary key shared across heads (qk_rope_head_dim) beside qk_nope_head_dim",
              "value head size of its own (v_head_dim)", "yarn mscale in the scale",
              f"rotary: {', '.join(ROPE_INV_FREQ)}, interleaved where configured"),
    layer_spec=_spec,
    attention=lambda base, i: base.layers[i].self_attn,
    out_proj=lambda base, i: base.layers[i].self_attn.o_proj,
    refuses=(Refusal("rope type", _rope),),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModelForCausalLM",
)
