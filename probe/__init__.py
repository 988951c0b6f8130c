"""probe: models, real attention extraction, its sources, from-scratch attention and its verification.

The names below are looked up in their home module on first use, so `import headscope.probe` (and
`headscope.probe.names`, the choices every room shares) imports nothing until one is asked for.
Extraction itself is `headscope.probe.extract.extract` (the module `probe.extract` keeps its name).
"""

from __future__ import annotations

import importlib

# public name -> the module of this package that defines it
_HOMES = {
    "extract_ids": "extract", "iter_extract": "extract",
    "cache_dir": "loading", "load_model": "loading",
    "LoadedModel": "model",
    "DEFAULT_MODEL": "registry", "KNOWN_MODELS": "registry", "ModelNotAvailable": "registry", "model_table": "registry",
    "AttentionMap": "types", "CrossAttentionMap": "types", "Seq2SeqAttention": "types", "Units": "types",
    "Level": "names",
    "to_word_level": "words", "word_spans": "words",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
