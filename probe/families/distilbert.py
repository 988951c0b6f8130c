"""DistilBERT: a six-layer BERT distilled from BERT, with its own module names (`q_lin`, `out_lin`).

Positions are absolute embeddings (learned or sinusoidal), added before the first layer, so the
attention itself has nothing positional to reproduce.
"""

from __future__ import annotations

from ..scratch import LayerSpec
from ..family import Family, linear_weights


def _spec(base, i: int, cfg) -> LayerSpec:
    sa = base.transformer.layer[i].attention
    (wq, bq), (wk, bk), (wv, bv) = linear_weights(sa.q_lin), linear_weights(sa.k_lin), linear_weights(sa.v_lin)
    wo, bo = linear_weights(sa.out_lin)
    hs = sa.attention_head_size
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=sa.n_heads, n_kv_heads=sa.n_heads, head_dim=hs,
                     scale=hs**-0.5, causal=False)


def _tiny_config(vocab: int, model_type: str):
    from transformers import DistilBertConfig

    return DistilBertConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=128)


FAMILY = Family(
    name="distilbert",
    model_types=("distilbert",),
    kind="encoder",
    features=("absolute positions (already in the layer input)", "bidirectional"),
    layer_spec=_spec,
    attention=lambda base, i: base.transformer.layer[i].attention,
    out_proj=lambda base, i: base.transformer.layer[i].attention.out_lin,
    refuses=(),
    tiny_config=_tiny_config,
    tokenizer="wordpiece",
    auto_class="AutoModel",
    position_embedding=lambda base: base.embeddings.position_embeddings,
)
