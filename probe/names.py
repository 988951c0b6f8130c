"""The choices every room shares, each named once as a `Literal` (TransformerLens's `head_detector` style).

This file imports nothing but `typing`, so the façade (`import headscope`), the CLI's option lists
and `--help` read these without importing torch. Every other file takes its choices from here:

    Level      units of a map: sub-word tokens, or words (Clark et al. 2019's aggregation)
    Weight     what a map's values are: attention probabilities α, or Kobayashi et al.'s
               norm-based weights ‖α_ij f(x_j)‖ normalised per query row
    Attention  where attention comes from: the model's eager weights, recomputed from scratch in
               blocks of query rows, or recomputed only where eager would exceed the memory budget
               (`probe.sources`, the registry of attention sources)
    Mode       how one text's attention was obtained by its source: eager, or recomputed
    Device, DType   where and in which dtype a model runs (`device_spec` also takes `cuda:N`, one GPU)
    AblationMethod  how a head is switched off (`probe.interventions.ABLATION_METHODS`)
    Stronger   which direction of an effect means "more": a loss rises, a cosine falls
    PatchWhat, PatchDirection, PatchPositions   what activation patching overwrites, which run
               it patches (denoise: the corrupt run with clean activations; noise: the reverse),
               and at which positions (`probe.patching`)

>>> from typing import get_args
>>> get_args(Attention)
('eager', 'recompute', 'auto')
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["Level", "Weight", "Attention", "Mode", "Device", "DType", "AblationMethod", "Stronger", "PatchWhat", "PatchDirection",
           "PatchPositions", "DEFAULT_ATTENTION", "device_spec",
           "DEFAULT_LEVEL", "DEFAULT_INCLUDE_SPECIAL", "DEFAULT_ABLATION_METHOD", "choices"]

Level = Literal["token", "word"]
Weight = Literal["attention", "norm"]
Attention = Literal["eager", "recompute", "auto"]
Mode = Literal["eager", "recompute"]
Device = Literal["cpu", "cuda", "mps", "auto"]
DType = Literal["float32", "float16", "bfloat16"]
AblationMethod = Literal["zero", "mean", "uniform"]
Stronger = Literal["higher", "lower"]
PatchWhat = Literal["head_out", "mlp", "resid", "pattern", "q", "k", "v", "path"]
PatchDirection = Literal["denoise", "noise"]
PatchPositions = Literal["all", "each"]

# Auto by default: every text whose eager attention fits the memory budget (a quarter of RAM) is eager,
# bit for bit the numbers eager gives; only a text that would not fit is recomputed in blocks (to about
# 1e-7 of eager) instead of failing in a huge allocation.
DEFAULT_ATTENTION: Attention = "auto"

# The head analyses' default setting (Clark et al. 2019): words, with [CLS]/[SEP]/<bos> kept as units.
DEFAULT_LEVEL: Level = "word"
DEFAULT_INCLUDE_SPECIAL = True

# How a head is ablated when no one says: its mean output over reference texts, which keeps the layer's input
# in range (zero ablation moves it off what the model ever sees). The API and every --method read this.
DEFAULT_ABLATION_METHOD: AblationMethod = "mean"


def device_spec(text: str) -> str:
    """`text`, lower-cased, when it names a place for a model: one of `Device`, or `cuda:N` (GPU number N).

    >>> device_spec("cpu"), device_spec("CUDA:1")
    ('cpu', 'cuda:1')
    """
    spec = str(text).strip().lower()
    index = spec[len("cuda:"):] if spec.startswith("cuda:") else None
    if spec in get_args(Device) or (index and index.isascii() and index.isdigit()):
        return spec
    raise ValueError(f"{text!r} is not a device; give auto, cpu, cuda, cuda:N (GPU number N, from 0) or mps")


def choices(name: object, first: str | None = None) -> list[str]:
    """The values of a `Literal` as a list (for the CLI's option lists), `first` moved to the front.

    >>> choices(Level), choices(Level, first="word")
    (['token', 'word'], ['word', 'token'])
    """
    values = list(get_args(name))
    return values if first is None else [first, *(v for v in values if v != first)]
