"""BART (encoder–decoder): plain scaled attention in three kinds — encoder self, causal decoder
self, and cross-attention from the decoder to the encoder's output.

Positions are learned absolute embeddings added before the first layer of each stack, so the
attention itself has nothing positional to reproduce; `position_embedding` names the encoder's, which
`permutation_check` switches off. mBART has the same layers, and so have Marian and Pegasus
(`marian.py`), whose positions are sinusoidal (in the same place).
"""

from __future__ import annotations

from ..scratch import LayerSpec
from ..family import Family, Stack, linear_weights


def attention_spec(attn, *, causal: bool) -> LayerSpec:
    """LayerSpec of one BART-style attention module (q_proj, k_proj, v_proj, out_proj, with biases)."""
    (wq, bq), (wk, bk) = linear_weights(attn.q_proj), linear_weights(attn.k_proj)
    (wv, bv), (wo, bo) = linear_weights(attn.v_proj), linear_weights(attn.out_proj)
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=attn.num_heads, n_kv_heads=attn.num_heads,
                     head_dim=attn.head_dim, scale=attn.scaling, causal=causal)


ENCODER = Stack("encoder", lambda base, i, cfg: attention_spec(base.encoder.layers[i].self_attn, causal=False),
                attention=lambda base, i: base.encoder.layers[i].self_attn,
                out_proj=lambda base, i: base.encoder.layers[i].self_attn.out_proj,
                n_layers=lambda cfg: cfg.encoder_layers)
DECODER = Stack("decoder", lambda base, i, cfg: attention_spec(base.decoder.layers[i].self_attn, causal=True),
                attention=lambda base, i: base.decoder.layers[i].self_attn,
                out_proj=lambda base, i: base.decoder.layers[i].self_attn.out_proj,
                n_layers=lambda cfg: cfg.decoder_layers)
CROSS = Stack("cross", lambda base, i, cfg: attention_spec(base.decoder.layers[i].encoder_attn, causal=False),
              attention=lambda base, i: base.decoder.layers[i].encoder_attn,
              out_proj=lambda base, i: base.decoder.layers[i].encoder_attn.out_proj,
              n_layers=lambda cfg: cfg.decoder_layers, keys="encoder")
STACKS = (ENCODER, DECODER, CROSS)


def tiny_sizes(vocab: int) -> dict:
    """The tiny encoder–decoder's sizes, shared with Marian."""
    return dict(vocab_size=vocab, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
                decoder_start_token_id=0)


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **tiny_sizes(vocab))


FAMILY = Family(
    name="bart",
    model_types=("bart", "mbart"),
    kind="encoder-decoder",
    features=("absolute positions (already in the layer input)", "causal decoder", "cross-attention"),
    layer_spec=ENCODER.layer_spec,
    attention=ENCODER.attention,
    out_proj=ENCODER.out_proj,
    refuses=(),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModelForSeq2SeqLM",
    stacks=STACKS,
    position_embedding=lambda base: base.encoder.embed_positions,  # the encoder's: layer_spec is the encoder's
)
