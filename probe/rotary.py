"""Rotary position frequencies, one entry per rope type, looked up by name.

Like transformers' `ROPE_INIT_FUNCTIONS`: each entry turns a config's rope parameters, the number of
rotated dimensions and the model's `max_position_embeddings` into the inverse frequencies
`inv_freq` (dim/2,) that `scratch.rotary_cos_sin` turns into angles, and the attention factor that
multiplies cos and sin (yarn, longrope). Where the frequencies depend on the sequence length
(dynamic NTK, longrope), the entry returns a function of the length T instead. A rope type without
an entry here is refused, never approximated; supporting one more is one more entry.

`partial_rotary_factor` rotates only the first `int(head_dim × factor)` dims of each head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Union

import torch

from .errors import UnsupportedFeature

__all__ = ["ROPE_INV_FREQ", "Rope", "Frequencies", "rope", "rope_params", "unsupported_rope",
           "default_inv_freq", "llama3_inv_freq", "yarn_inv_freq", "dynamic_theta"]

Frequencies = Union[torch.Tensor, Callable[[int], torch.Tensor]]  # (dim/2,), or T -> (dim/2,)


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


def yarn_inv_freq(theta: float, dim: int, factor: float, original_max: int, *, beta_fast: float = 32,
                  beta_slow: float = 1, truncate: bool = True) -> torch.Tensor:
    """YaRN (Peng et al. 2023): dims that turn more than `beta_fast` times over the original context keep
    their frequency, dims that turn fewer than `beta_slow` times are slowed by `factor`, a linear ramp between."""

    def dim_turning(n_turns: float) -> float:  # the dim index whose wavelength fits n_turns times in original_max
        return dim * math.log(original_max / (n_turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_turning(beta_fast), dim_turning(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a ramp of zero width would divide by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)  # 0 keep .. 1 slow down
    pos_freqs = theta ** (torch.arange(0, dim, 2).float() / dim)
    keep = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep


def dynamic_theta(theta: float, factor: float, dim: int, max_positions: int, T: int) -> torch.Tensor:
    """Dynamic NTK: beyond `max_positions` the base grows with the length T, θ·(f·T/max − (f−1))^(d/(d−2)).
    In float32 tensors, the arithmetic transformers does on the length it reads off the position ids."""
    length = torch.tensor(T, dtype=torch.int64)
    return theta * ((factor * length / max_positions) - (factor - 1)) ** (dim / (dim - 2))


def _default(p: dict, dim: int, max_positions: int | None) -> tuple[Frequencies, float]:
    return default_inv_freq(float(p["rope_theta"]), dim), 1.0


def _linear(p: dict, dim: int, max_positions: int | None) -> tuple[Frequencies, float]:
    return default_inv_freq(float(p["rope_theta"]), dim) / float(p["factor"]), 1.0  # positions divided by `factor`


def _llama3(p: dict, dim: int, max_positions: int | None) -> tuple[Frequencies, float]:
    return llama3_inv_freq(default_inv_freq(float(p["rope_theta"]), dim), float(p["factor"]),
                           float(p["low_freq_factor"]), float(p["high_freq_factor"]),
                           int(p["original_max_position_embeddings"])), 1.0


def _dynamic(p: dict, dim: int, max_positions: int | None) -> tuple[Frequencies, float]:
    theta, factor = float(p["rope_theta"]), float(p["factor"])
    original = default_inv_freq(theta, dim)

    def at_length(T: int) -> torch.Tensor:
        if T <= max_positions:  # within the trained length the frequencies are the default ones
            return original
        base = dynamic_theta(theta, factor, dim, max_positions, T)
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))

    return at_length, 1.0


def _original_max(p: dict, max_positions: int | None) -> int:
    return int(p.get("original_max_position_embeddings") or max_positions)


def _scale_factor(p: dict, max_positions: int | None) -> float:
    # Phi-3 and DeepSeek leave `factor` out and mean the ratio of the new to the original length.
    factor = p.get("factor")
    return float(factor) if factor is not None else max_positions / _original_max(p, max_positions)


def _yarn(p: dict, dim: int, max_positions: int | None) -> tuple[Frequencies, float]:
    factor, original = _scale_factor(p, max_positions), _original_max(p, max_positions)

    def mscale(m: float = 1.0) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    attention = p.get("attention_factor")
    if attention is None:
        mscale_, all_dim = p.get("mscale"), p.get("mscale_all_dim")
        attention = float(mscale(mscale_) / mscale(all_dim)) if mscale_ and all_dim else mscale()
    freq = yarn_inv_freq(float(p["rope_theta"]), dim, factor, original, beta_fast=p.get("beta_fast") or 32,
                         beta_slow=p.get("beta_slow") or 1, truncate=p.get("truncate", True))
    return freq, float(attention)


def _proportional(p: dict, dim: int, max_positions: int | None) -> tuple[Frequencies, float]:
    # Gemma 4's global layers: `dim` is the whole head; the first partial_rotary_factor of its angle pairs turn at
    # θ^(-2i/dim) (exponents over the whole head), the others have frequency 0 and never turn.
    turning = int(float(p.get("partial_rotary_factor") or 1.0) * dim // 2)
    inv_freq = 1.0 / (float(p["rope_theta"]) ** (torch.arange(0, 2 * turning, 2, dtype=torch.int64).float() / dim))
    inv_freq = torch.cat([inv_freq, torch.zeros(dim // 2 - turning)])
    return inv_freq / float(p.get("factor") or 1.0), 1.0


def _longrope(p: dict, dim: int, max_positions: int | None) -> tuple[Frequencies, float]:
    # Per-dim stretch factors: `short_factor` up to the original length, `long_factor` beyond it.
    factor, original = _scale_factor(p, max_positions), _original_max(p, max_positions)
    attention = p.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    theta = float(p["rope_theta"])
    short = 1.0 / (torch.tensor(p["short_factor"], dtype=torch.float32) * theta**shape)
    long = 1.0 / (torch.tensor(p["long_factor"], dtype=torch.float32) * theta**shape)
    return (lambda T: long if T > original else short), float(attention)


# rope type -> (rope parameters, rotated dims, max_position_embeddings) -> (inv_freq or T -> inv_freq, attention factor)
ROPE_INV_FREQ: dict[str, Callable[[dict, int, int | None], tuple[Frequencies, float]]] = {
    "default": _default,
    "linear": _linear,
    "llama3": _llama3,
    "dynamic": _dynamic,
    "yarn": _yarn,
    "longrope": _longrope,
    "proportional": _proportional,
}


@dataclass(frozen=True, eq=False)
class Rope:
    """One layer's rotary positions, as the `LayerSpec` fields they fill."""

    inv_freq: Frequencies  # (rotary_dim/2,), or a function of the sequence length T
    attention_factor: float = 1.0  # multiplies cos and sin
    rotary_dim: int | None = None  # rotate only the first rotary_dim dims of a head; None = all

    def spec_fields(self) -> dict:
        """Keyword arguments of `LayerSpec`: inv_freq, rope_scaling, rotary_dim."""
        return {"inv_freq": self.inv_freq, "rope_scaling": self.attention_factor, "rotary_dim": self.rotary_dim}


def rope_params(cfg, layer_type: str | None = None) -> dict:
    """The rope parameters of `cfg` (of `layer_type`'s layers where they differ per layer type)."""
    params = getattr(cfg, "rope_parameters", None) or {}
    if layer_type is not None and layer_type in params:
        params = params[layer_type]
    if not params and getattr(cfg, "rope_theta", None) is not None:
        params = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    return dict(params)


def rope(cfg, head_dim: int, layer_type: str | None = None, *, whole_head: bool = False,
         longest_seen: int | None = None) -> Rope:
    """The rotary positions of `cfg`'s layers (of `layer_type`'s layers); `UnsupportedFeature` for a rope
    it does not reproduce.

    `whole_head`: the model rotates every dim of a head whatever `partial_rotary_factor` says — Llama's
    rotary module computes the default frequencies for the whole head and applies cos and sin to all
    dims, so a partial factor is ignored by the default rope and breaks the others. `longest_seen`: for
    dynamic NTK, the longest length the model's rotary module has cached (transformers keeps that
    length's frequencies for shorter sequences until one is shorter than `max_position_embeddings`).
    """
    p = rope_params(cfg, layer_type)
    kind = p.get("rope_type", p.get("type", "default"))
    init = ROPE_INV_FREQ.get(kind)
    if init is None:
        raise UnsupportedFeature(f"rope_type={kind!r} is not reproduced (supported: {', '.join(ROPE_INV_FREQ)})")
    partial = float(p.get("partial_rotary_factor") or 1.0) if kind != "proportional" else 1.0  # its own share
    if whole_head and partial != 1.0:
        if kind != "default":
            raise UnsupportedFeature(
                f"partial_rotary_factor={partial:g} with rope_type={kind!r}: this model applies the rotary angles to "
                f"the whole head, so frequencies for part of it do not fit (transformers fails on it too)")
        partial = 1.0  # the default rope of these models ignores the factor
    dim = int(head_dim * partial)
    max_positions = getattr(cfg, "max_position_embeddings", None)
    freq, attention = init(p, dim, max_positions)
    if kind == "dynamic" and longest_seen is not None and max_positions is not None:
        at_length = freq
        freq = lambda T: at_length(T if T < max_positions else max(T, longest_seen))  # noqa: E731
    return Rope(freq, attention, None if dim == head_dim else dim)


def unsupported_rope(cfg, layer_types=(None,), *, whole_head: bool = False) -> str | None:
    """Why the rope of `cfg` (for each of `layer_types`) cannot be reproduced, or None when it can."""
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    params, types = getattr(cfg, "rope_parameters", None) or {}, getattr(cfg, "layer_types", None) or ()
    if tuple(layer_types) == (None,) and any(t in params for t in types):  # rope parameters per layer type (OLMo 3)
        layer_types = sorted(set(types))
    for layer_type in layer_types:
        try:
            rope(cfg, head_dim, layer_type, whole_head=whole_head)
        except UnsupportedFeature as exc:
            return str(exc)
    return None
