"""probe: models, real attention extraction, from-scratch attention and its verification."""

from .extract import extract, extract_ids, iter_extract
from .loading import cache_dir, load_model
from .model import LoadedModel
from .registry import DEFAULT_MODEL, KNOWN_MODELS, ModelNotAvailable, model_table
from .types import AttentionMap, CrossAttentionMap, Level, Seq2SeqAttention, Units
from .words import to_word_level, word_spans

__all__ = [
    "AttentionMap",
    "CrossAttentionMap",
    "DEFAULT_MODEL",
    "KNOWN_MODELS",
    "Level",
    "LoadedModel",
    "ModelNotAvailable",
    "Seq2SeqAttention",
    "Units",
    "cache_dir",
    "extract",
    "extract_ids",
    "iter_extract",
    "load_model",
    "model_table",
    "to_word_level",
    "word_spans",
]
