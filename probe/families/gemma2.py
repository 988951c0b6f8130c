"""Gemma 2 and VaultGemma (the same attention): attention-logit softcapping, `query_pre_attn_scalar`,
alternating sliding-window layers.

Softcapping bends every score s to c · tanh(s / c) after the scaling and before the mask, so no
score can exceed ±c (`attn_logit_softcapping`, 50 in the released models).
"""

from __future__ import annotations

from ..rotary import ROPE_INV_FREQ, rope, unsupported_rope
from ..scratch import LayerSpec
from ..family import Family, Refusal, linear_weights


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].self_attn
    (wq, bq), (wk, bk) = linear_weights(attn.q_proj), linear_weights(attn.k_proj)
    (wv, bv), (wo, bo) = linear_weights(attn.v_proj), linear_weights(attn.o_proj)
    return LayerSpec(
        wq, wk, wv, wo, bq, bk, bv, bo, n_heads=cfg.num_attention_heads, n_kv_heads=cfg.num_key_value_heads,
        head_dim=attn.head_dim, scale=cfg.query_pre_attn_scalar**-0.5, causal=True,
        sliding_window=cfg.sliding_window if cfg.layer_types[i] == "sliding_attention" else None,
        **rope(cfg, attn.head_dim, whole_head=True).spec_fields(), softcap=cfg.attn_logit_softcapping,
    )


def _bidirectional(cfg) -> str | None:
    if getattr(cfg, "use_bidirectional_attention", False):
        return "use_bidirectional_attention=True is not reproduced"
    return None


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    # A cap of 5 bends this model's scores (they reach about ±6), so a missing softcap shows.
    return AutoConfig.for_model(model_type, vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8,
                        attn_logit_softcapping=5.0, sliding_window=4,
                        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                        max_position_embeddings=128)


FAMILY = Family(
    name="gemma2",
    model_types=("gemma2", "vaultgemma"),
    kind="decoder",
    features=("attention-logit softcapping", "query_pre_attn_scalar", "sliding-window layers",
              f"rotary: {', '.join(ROPE_INV_FREQ)}", "grouped-query KV heads"),
    layer_spec=_spec,
    attention=lambda base, i: base.layers[i].self_attn,
    out_proj=lambda base, i: base.layers[i].self_attn.o_proj,
    refuses=(Refusal("bidirectional attention", _bidirectional), Refusal("rope type", lambda cfg: unsupported_rope(cfg, whole_head=True))),
    tiny_config=_tiny_config,
    tokenizer="sentencepiece",
    auto_class="AutoModelForCausalLM",
)
