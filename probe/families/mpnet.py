"""MPNet: BERT's attention with T5's bidirectional relative position bias, shared by every layer.

Absolute position embeddings are in the layer input already; on top, every layer adds the same learned bias per
head and relative-position bucket (`encoder.relative_attention_bias`, computed once in the encoder) to the scaled
scores — T5's bidirectional buckets, always 32 of them up to a distance of 128 (what the model passes whatever the
config says). Fits the `score_bias` mechanism, as T5's bias does.
"""

from __future__ import annotations

from ..scratch import LayerSpec
from ..family import Family, linear_weights
from .t5 import relative_bias

N_BUCKETS, MAX_DISTANCE = 32, 128  # MPNetEncoder.compute_position_bias's own defaults


def _spec(base, i: int, cfg) -> LayerSpec:
    sa = base.encoder.layer[i].attention.attn
    (wq, bq), (wk, bk), (wv, bv), (wo, bo) = (linear_weights(sa.q), linear_weights(sa.k), linear_weights(sa.v),
                                              linear_weights(sa.o))
    hs = sa.attention_head_size
    bias = relative_bias(base.encoder.relative_attention_bias.weight, bidirectional=True, n_buckets=N_BUCKETS,
                         max_distance=MAX_DISTANCE)
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=sa.num_attention_heads,
                     n_kv_heads=sa.num_attention_heads, head_dim=hs, scale=hs**-0.5, causal=False, score_bias=bias)


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=4, intermediate_size=64,
                                max_position_embeddings=130)  # positions start after the padding index (1): 128 tokens


FAMILY = Family(
    name="mpnet",
    model_types=("mpnet",),
    kind="encoder",
    features=("relative bias: T5's bidirectional buckets (32, up to 128), one table shared by every layer",
              "absolute positions (already in the layer input)", "bidirectional"),
    layer_spec=_spec,
    attention=lambda base, i: base.encoder.layer[i].attention.attn,
    out_proj=lambda base, i: base.encoder.layer[i].attention.attn.o,
    refuses=(),
    tiny_config=_tiny_config,
    tokenizer="wordpiece",
    auto_class="AutoModel",
    position_embedding=lambda base: base.embeddings.position_embeddings,
)
