"""Marian (OPUS-MT translation models): BART's attention layers with sinusoidal absolute positions,
which are added before the first layer, so the three attention kinds are BART's (`bart.py`)."""

from __future__ import annotations

from . import Family
from .bart import ENCODER, STACKS, tiny_sizes


def _tiny_config(vocab: int, model_type: str):
    from transformers import MarianConfig

    return MarianConfig(**tiny_sizes(vocab), pad_token_id=0)


FAMILY = Family(
    name="marian",
    model_types=("marian",),
    kind="encoder-decoder",
    features=("sinusoidal absolute positions (already in the layer input)", "causal decoder", "cross-attention"),
    layer_spec=ENCODER.layer_spec,
    attention=ENCODER.attention,
    out_proj=ENCODER.out_proj,
    refuses=(),
    tiny_config=_tiny_config,
    tokenizer="sentencepiece",
    auto_class="AutoModelForSeq2SeqLM",
    stacks=STACKS,
)
