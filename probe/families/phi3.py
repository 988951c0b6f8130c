"""Phi-3: one fused qkv projection ([all Q | all K | all V]), grouped-query KV heads, partial rotary
where configured, longrope (short / long factors by sequence length), sliding window where configured."""

from __future__ import annotations

from ..rotary import rope, unsupported_rope
from ..scratch import LayerSpec
from ..family import Family, Refusal, linear_weights
from .llama import cached_length


def _spec(base, i: int, cfg) -> LayerSpec:
    attn = base.layers[i].self_attn
    nh, nkv, hs = cfg.num_attention_heads, cfg.num_key_value_heads, attn.head_dim
    w, b = linear_weights(attn.qkv_proj)
    wq, wk, wv = w.split([nh * hs, nkv * hs, nkv * hs])
    bq, bk, bv = b.split([nh * hs, nkv * hs, nkv * hs]) if b is not None else (None, None, None)
    wo, bo = linear_weights(attn.o_proj)
    positions = rope(cfg, hs, longest_seen=cached_length(base.rotary_emb))
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=nh, n_kv_heads=nkv, head_dim=hs, scale=attn.scaling,
                     causal=True, sliding_window=cfg.sliding_window, **positions.spec_fields())


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                max_position_embeddings=128, original_max_position_embeddings=128,
                                bos_token_id=None, eos_token_id=None, pad_token_id=None)


FAMILY = Family(
    name="phi3",
    model_types=("phi3",),
    kind="decoder",
    features=("fused qkv", "grouped-query KV heads", "partial rotary where configured",
              "rotary: default, longrope (the types Phi3Config accepts)", "sliding window where configured"),
    layer_spec=_spec,
    attention=lambda base, i: base.layers[i].self_attn,
    out_proj=lambda base, i: base.layers[i].self_attn.o_proj,
    refuses=(Refusal("rope type", unsupported_rope),),
    tiny_config=_tiny_config,
    tokenizer="sentencepiece",
    auto_class="AutoModelForCausalLM",
)
