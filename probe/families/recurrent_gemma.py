"""RecurrentGemma (Griffin): recurrent blocks (RG-LRU, no softmax attention: `layer_types` "linear_attention",
named and never renumbered) interleaved with local attention blocks.

The attention block (`temporal_block`) is Llama-like with a sliding window of `attention_window_size` keys, rotary
on the first `partial_rotary_factor` of each head (half of it by default), half-split, grouped KV heads and a bias
on the output projection; the model multiplies its embeddings by √D before the first block, which the captured
layer input already holds.
"""

from __future__ import annotations

from ..rotary import ROPE_INV_FREQ, rope, unsupported_rope
from ..scratch import LayerSpec
from ..family import Family, Refusal, linear_weights


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].temporal_block
    (wq, bq), (wk, bk) = linear_weights(attn.q_proj), linear_weights(attn.k_proj)
    (wv, bv), (wo, bo) = linear_weights(attn.v_proj), linear_weights(attn.o_proj)
    hs = attn.head_dim
    positions = rope(cfg, hs)  # partial: the model computes frequencies for partial_rotary_factor of a head
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=cfg.num_attention_heads,
                     n_kv_heads=cfg.num_key_value_heads, head_dim=hs, scale=attn.scaling, causal=True,
                     sliding_window=attn.sliding_window, **positions.spec_fields())


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    # recurrent blocks at layers 0 and 2, local attention at 1 and 3 over a window of 4 keys
    return AutoConfig.for_model(model_type, vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                num_attention_heads=4, num_key_value_heads=2, lru_width=32, attention_window_size=4,
                                block_types=["recurrent", "attention"], conv1d_width=2, max_position_embeddings=128)


FAMILY = Family(
    name="recurrent_gemma",
    model_types=("recurrent_gemma",),
    kind="decoder",
    features=("hybrid stack: recurrent (RG-LRU) blocks have no softmax attention (named, never renumbered)",
              "local attention: a sliding window of attention_window_size keys",
              "partial rotary (partial_rotary_factor, half by default), half-split",
              f"rotary: {', '.join(ROPE_INV_FREQ)}", "grouped-query KV heads"),
    layer_spec=_spec,
    attention=lambda base, i: base.layers[i].temporal_block,
    out_proj=lambda base, i: base.layers[i].temporal_block.o_proj,
    refuses=(Refusal("rope type", unsupported_rope),),
    tiny_config=_tiny_config,
    tokenizer="sentencepiece",
    auto_class="AutoModelForCausalLM",
)
