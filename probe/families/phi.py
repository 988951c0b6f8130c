"""Phi (Phi-1, Phi-1.5, Phi-2) and StableLM: separate q/k/v projections with bias, rotary on the first
`partial_rotary_factor` of each head's dims (half-split pairs), the rest passed through unchanged.

Phi's output projection is `dense`, StableLM's `o_proj`; StableLM may group its KV heads. Their
optional QK layer norms (`qk_layernorm`, with bias) are refused.
"""

from __future__ import annotations

from ..rotary import ROPE_INV_FREQ, rope, unsupported_rope
from ..scratch import LayerSpec
from ..family import Family, Refusal, linear_weights
from .llama import cached_length


def _out(attn):
    return attn.dense if hasattr(attn, "dense") else attn.o_proj  # Phi | StableLM


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].self_attn
    (wq, bq), (wk, bk) = linear_weights(attn.q_proj), linear_weights(attn.k_proj)
    (wv, bv), (wo, bo) = linear_weights(attn.v_proj), linear_weights(_out(attn))
    hs = attn.head_dim
    positions = rope(cfg, hs, longest_seen=cached_length(base.rotary_emb))  # rotary_dim = int(hs × factor)
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=cfg.num_attention_heads,
                     n_kv_heads=cfg.num_key_value_heads, head_dim=hs, scale=attn.scaling, causal=True,
                     **positions.spec_fields())


def _qk_layernorm(cfg) -> str | None:
    if getattr(cfg, "qk_layernorm", False):
        return "qk_layernorm=True (a LayerNorm with bias on queries and keys) is not reproduced"
    return None


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    # A head of 8 dims, 4 of them rotated (Phi-2's factor is 0.4, StableLM's 0.25).
    return AutoConfig.for_model(model_type, vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                max_position_embeddings=128, partial_rotary_factor=0.5,
                                bos_token_id=None, eos_token_id=None, pad_token_id=None)


FAMILY = Family(
    name="phi",
    model_types=("phi", "stablelm"),
    kind="decoder",
    features=("partial rotary (partial_rotary_factor), half-split", f"rotary: {', '.join(ROPE_INV_FREQ)}",
              "q/k/v bias", "grouped-query KV heads"),
    layer_spec=_spec,
    attention=lambda base, i: base.layers[i].self_attn,
    out_proj=lambda base, i: _out(base.layers[i].self_attn),
    refuses=(Refusal("QK layer norm", _qk_layernorm), Refusal("rope type", unsupported_rope)),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModelForCausalLM",
)
