"""GPT-NeoX (Pythia): one fused QKV projection laid out head by head, rotary on the first
`partial_rotary_factor` (`rotary_pct`) of each head's dims, half-split."""

from __future__ import annotations

from ..rotary import ROPE_INV_FREQ, rope, unsupported_rope
from ..scratch import LayerSpec
from ..family import Family, Refusal, linear_weights
from .llama import cached_length


def _per_head_split(t, nh: int, hs: int):
    """The fused (3·D, …) weight or bias rows are [q_h, k_h, v_h] per head h: regroup into Q, K, V (nh·hs, …)."""
    grouped = t.reshape(nh, 3, hs, *t.shape[1:])  # (nh, 3, hs, ...)
    return tuple(grouped[:, j].reshape(nh * hs, *t.shape[1:]) for j in range(3))


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].attention
    nh, hs = cfg.num_attention_heads, attn.head_size
    w, b = linear_weights(attn.query_key_value)
    wq, wk, wv = _per_head_split(w, nh, hs)
    bq, bk, bv = _per_head_split(b, nh, hs) if b is not None else (None, None, None)
    wo, bo = linear_weights(attn.dense)
    positions = rope(cfg, hs, longest_seen=cached_length(base.rotary_emb))
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=nh, n_kv_heads=nh, head_dim=hs, scale=attn.scaling,
                     causal=True, **positions.spec_fields())


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    # Pythia's rotary_pct = 0.25 of a head of 8 dims: the first 2 dims turn, the other 6 do not.
    return AutoConfig.for_model(model_type, vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128,
                                rotary_pct=0.25, bos_token_id=None, eos_token_id=None)


FAMILY = Family(
    name="gpt_neox",
    model_types=("gpt_neox",),
    kind="decoder",
    features=("fused per-head QKV", "partial rotary (rotary_pct)", f"rotary: {', '.join(ROPE_INV_FREQ)}"),
    layer_spec=_spec,
    attention=lambda base, i: base.layers[i].attention,
    out_proj=lambda base, i: base.layers[i].attention.dense,
    refuses=(Refusal("rope type", unsupported_rope),),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModelForCausalLM",
)
