"""The text towers of SigLIP and SigLIP 2 (SiglipTextModel, Siglip2TextModel): a bidirectional text encoder.

Unlike CLIP's text tower, SigLIP's does not mask causally: every token sees every real token (padding
masked); positions are absolute embeddings added before the first layer. It pools the LAST token's state
(the checkpoints pad every caption to 64 tokens). It never attends to the image: the two towers meet only in
the sigmoid of their pooled embeddings' similarity. No Auto class builds it: the tiny model and a saved folder
are built from the config's own model class.
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
                                projection_size=32, bos_token_id=0, eos_token_id=0, pad_token_id=0)


FAMILY = Family(
    name="siglip_text",
    model_types=("siglip_text_model", "siglip2_text_model"),
    kind="encoder",
    features=("bidirectional text encoder (no causal mask, unlike CLIP's)",
              "absolute positions (already in the layer input)", "pools the last token"),
    layer_spec=lambda base, i, cfg: projection_spec(_attn(base, i)),
    attention=_attn,
    out_proj=lambda base, i: out_projection(_attn(base, i)),
    refuses=(),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModel",
    position_embedding=lambda base: base.embeddings.position_embedding,
)
