"""Marian (OPUS-MT translation models) and Pegasus: BART's attention layers with sinusoidal absolute positions,
which are added before the first layer, so the three attention kinds are BART's (`bart.py`)."""

from __future__ import annotations

import dataclasses

from .bart import FAMILY as BART
from .bart import tiny_sizes


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **tiny_sizes(vocab), pad_token_id=0)


FAMILY = dataclasses.replace(
    BART,  # BART's layers: the same three stacks, modules, refusals and Auto class
    name="marian",
    model_types=("marian", "pegasus"),
    features=("sinusoidal absolute positions (already in the layer input)", "causal decoder", "cross-attention"),
    tiny_config=_tiny_config,
    tokenizer="sentencepiece",
)
