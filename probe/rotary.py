"""Rotary position frequencies, one entry per rope type, looked up by name.

Like transformers' `ROPE_INIT_FUNCTIONS`: each entry turns a config's rope parameters and the
head dimension into the inverse frequencies `inv_freq` (hs/2,) that `scratch.rotary_cos_sin`
turns into angles. A rope type without an entry here is refused, never approximated; supporting
one more is one more entry.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from .errors import UnsupportedFeature

__all__ = ["ROPE_INV_FREQ", "rope_params", "inv_freq", "default_inv_freq", "llama3_inv_freq"]


def default_inv_freq(theta: float, dim: int) -> torch.Tensor:
    """Rotary frequencies θ^(-2i/d), i = 0 .. d/2-1, in float32 as transformers computes them."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def llama3_inv_freq(base: torch.Tensor, factor: float, low: float, high: float, original_max: int) -> torch.Tensor:
    """Llama 3.1 rope scaling: long wavelengths slowed by `factor`, a smooth ramp in between."""
    low_wavelen, high_wavelen = original_max / low, original_max / high
    wavelen = 2 * math.pi / base
    scaled = torch.where(wavelen > low_wavelen, base / factor, base)
    smooth = (original_max / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _default(p: dict, head_dim: int) -> torch.Tensor:
    return default_inv_freq(float(p["rope_theta"]), head_dim)


def _linear(p: dict, head_dim: int) -> torch.Tensor:
    return _default(p, head_dim) / float(p["factor"])  # positions divided by `factor`


def _llama3(p: dict, head_dim: int) -> torch.Tensor:
    return llama3_inv_freq(_default(p, head_dim), float(p["factor"]), float(p["low_freq_factor"]),
                           float(p["high_freq_factor"]), int(p["original_max_position_embeddings"]))


# rope type -> (rope parameters, head_dim) -> inv_freq (head_dim/2,)
ROPE_INV_FREQ: dict[str, Callable[[dict, int], torch.Tensor]] = {
    "default": _default,
    "linear": _linear,
    "llama3": _llama3,
}


def rope_params(cfg, layer_type: str | None = None) -> dict:
    """The rope parameters of `cfg` (of `layer_type`'s layers where they differ per layer type)."""
    params = getattr(cfg, "rope_parameters", None) or {}
    if layer_type is not None and layer_type in params:
        params = params[layer_type]
    if not params and getattr(cfg, "rope_theta", None) is not None:
        params = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    return dict(params)


def inv_freq(cfg, head_dim: int, layer_type: str | None = None) -> torch.Tensor:
    """The rotary frequencies (head_dim/2,) of `cfg`; raises `UnsupportedFeature` for a rope it does not reproduce."""
    p = rope_params(cfg, layer_type)
    kind = p.get("rope_type", p.get("type", "default"))
    if p.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedFeature("partial rotary embeddings (partial_rotary_factor != 1) are not reproduced")
    init = ROPE_INV_FREQ.get(kind)
    if init is None:
        raise UnsupportedFeature(f"rope_type={kind!r} is not reproduced (supported: {', '.join(ROPE_INV_FREQ)})")
    return init(p, head_dim)


def unsupported_rope(cfg, layer_types=(None,)) -> str | None:
    """Why the rope of `cfg` (for each of `layer_types`) cannot be reproduced, or None when it can."""
    for layer_type in layer_types:
        try:
            inv_freq(cfg, 2, layer_type)
        except UnsupportedFeature as exc:
            return str(exc)
    return None
