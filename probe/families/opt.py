"""OPT (Meta's open GPT-3 replicas, an interpretability standard): learned absolute positions, q scaled
before the product.

OPT multiplies q by 1/√d before q kᵀ rather than the scores after it; the two are the same product.
Positions are learned embeddings added to the input, so the attention has nothing positional to reproduce.
"""

from __future__ import annotations

from ..scratch import LayerSpec
from ..family import Family, linear_weights


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.decoder.layers[i].self_attn
    (wq, bq), (wk, bk) = linear_weights(attn.q_proj), linear_weights(attn.k_proj)
    (wv, bv), (wo, bo) = linear_weights(attn.v_proj), linear_weights(attn.out_proj)
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=attn.num_heads, n_kv_heads=attn.num_heads,
                     head_dim=attn.head_dim, scale=attn.scaling, causal=True)


def _tiny_config(vocab: int, model_type: str):
    from transformers import OPTConfig

    return OPTConfig(vocab_size=vocab, hidden_size=32, word_embed_proj_dim=32, ffn_dim=64, num_hidden_layers=2,
                     num_attention_heads=4, max_position_embeddings=128)


FAMILY = Family(
    name="opt",
    model_types=("opt",),
    kind="decoder",
    features=("absolute positions (already in the layer input)", "causal"),
    layer_spec=_spec,
    attention=lambda base, i: base.decoder.layers[i].self_attn,
    out_proj=lambda base, i: base.decoder.layers[i].self_attn.out_proj,
    refuses=(),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModelForCausalLM",
    position_embedding=lambda base: base.decoder.embed_positions,
)
