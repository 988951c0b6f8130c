"""T5 (encoder–decoder): bucketed relative position bias, no 1/√d scaling, and cross-attention.

T5 has no position embeddings. The first layer of each stack owns a table `relative_attention_bias`
(n_buckets, nh); every layer of that stack adds the same per-head bias, looked up by the bucket of
`key - query` (both directions in the encoder, only the past in the decoder). Cross-attention has
no position bias. Scores are q·k with no 1/√d: T5 folds the scale into its initialisation.

mT5 has T5's layers; UMT5's are the same except that every layer owns its own bias table.
"""

from __future__ import annotations

import torch

from ..scratch import LayerSpec, relative_position_buckets
from ..family import Family, Stack, linear_weights


def relative_bias(table: torch.Tensor, *, bidirectional: bool, n_buckets: int, max_distance: int):
    """score_bias (Tq, Tk) -> (nh, Tq, Tk) from T5's bias table (n_buckets, nh); with query_start= and
    key_start= only those rows and keys (a block of recompute mode), never the whole Tq × Tk."""
    table = table.detach()

    def bias(Tq: int, Tk: int, *, query_start: int = 0, key_start: int = 0) -> torch.Tensor:
        relative = torch.arange(key_start, Tk)[None, :] - torch.arange(query_start, Tq)[:, None]  # key - query: (Tq, Tk)
        buckets = relative_position_buckets(relative, bidirectional=bidirectional, n_buckets=n_buckets,
                                            max_distance=max_distance)
        return table[buckets].permute(2, 0, 1)  # (Tq, Tk, nh) -> (nh, Tq, Tk)

    return bias


def _attention_spec(attn, cfg, *, causal: bool, score_bias=None) -> LayerSpec:
    (wq, _), (wk, _), (wv, _), (wo, _) = (linear_weights(m) for m in (attn.q, attn.k, attn.v, attn.o))
    return LayerSpec(wq, wk, wv, wo, None, None, None, None, n_heads=cfg.num_heads, n_kv_heads=cfg.num_heads,
                     head_dim=cfg.d_kv, scale=1.0, causal=causal, score_bias=score_bias)


def _self_spec(stack: str, *, bidirectional: bool):
    def spec(base, i: int, cfg) -> LayerSpec:
        blocks = getattr(base, stack).block
        owner = blocks[i] if hasattr(blocks[i].layer[0].SelfAttention, "relative_attention_bias") else blocks[0]
        table = owner.layer[0].SelfAttention.relative_attention_bias.weight  # the stack's (T5) or the layer's (UMT5)
        bias = relative_bias(table, bidirectional=bidirectional, n_buckets=cfg.relative_attention_num_buckets,
                             max_distance=cfg.relative_attention_max_distance)
        return _attention_spec(blocks[i].layer[0].SelfAttention, cfg, causal=not bidirectional, score_bias=bias)

    return spec


def _cross_spec(base, i: int, cfg) -> LayerSpec:
    return _attention_spec(base.decoder.block[i].layer[1].EncDecAttention, cfg, causal=False)


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    # 8 buckets up to distance 16: the tiny texts reach the logarithmic buckets and the last one.
    return AutoConfig.for_model(model_type, vocab_size=vocab, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                num_decoder_layers=2, num_heads=4,
                    relative_attention_num_buckets=8, relative_attention_max_distance=16, decoder_start_token_id=0)


ENCODER = Stack("encoder", _self_spec("encoder", bidirectional=True),
                attention=lambda base, i: base.encoder.block[i].layer[0].SelfAttention,
                out_proj=lambda base, i: base.encoder.block[i].layer[0].SelfAttention.o,
                n_layers=lambda cfg: cfg.num_layers)
DECODER = Stack("decoder", _self_spec("decoder", bidirectional=False),
                attention=lambda base, i: base.decoder.block[i].layer[0].SelfAttention,
                out_proj=lambda base, i: base.decoder.block[i].layer[0].SelfAttention.o,
                n_layers=lambda cfg: cfg.num_decoder_layers)
CROSS = Stack("cross", _cross_spec,
              attention=lambda base, i: base.decoder.block[i].layer[1].EncDecAttention,
              out_proj=lambda base, i: base.decoder.block[i].layer[1].EncDecAttention.o,
              n_layers=lambda cfg: cfg.num_decoder_layers, keys="encoder")

FAMILY = Family(
    name="t5",
    model_types=("t5", "mt5", "umt5"),
    kind="encoder-decoder",
    features=("relative bias: bucketed, from the first layer of each stack (every layer's own in UMT5)",
              "no 1/√d scaling",
              "causal decoder", "cross-attention"),
    layer_spec=ENCODER.layer_spec,
    attention=ENCODER.attention,
    out_proj=ENCODER.out_proj,
    refuses=(),
    tiny_config=_tiny_config,
    tokenizer="sentencepiece",
    auto_class="AutoModelForSeq2SeqLM",
    stacks=(ENCODER, DECODER, CROSS),
)
