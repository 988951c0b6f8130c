"""The text tower of CLIP (CLIPTextModel): a causal text encoder.

CLIP's text transformer masks causally (each token sees itself and the tokens before it) although it
is an encoder with no next-word head; its positions are absolute embeddings added before the first
layer. It never attends to the image: CLIP compares the two towers' pooled outputs only.
"""

from __future__ import annotations

from ..family import Family
from ._vision import out_projection, projection_spec


def _attn(base, i: int):
    return base.encoder.layers[i].self_attn


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=4, intermediate_size=64, max_position_embeddings=128,
                                bos_token_id=0, eos_token_id=0, pad_token_id=0)  # tiny_model sets the tokenizer's


FAMILY = Family(
    name="clip_text",
    model_types=("clip_text_model",),
    kind="decoder",
    features=("causal mask in a text encoder", "absolute positions (already in the layer input)"),
    layer_spec=lambda base, i, cfg: projection_spec(_attn(base, i), causal=True),
    attention=_attn,
    out_proj=lambda base, i: out_projection(_attn(base, i)),
    refuses=(),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModel",
    position_embedding=lambda base: base.embeddings.position_embedding,
)
