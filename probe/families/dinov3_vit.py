"""DINOv3 (image encoder): ViT's attention with 2-D rotary positions on the patch tokens only.

Before the patches stand [CLS] and the register tokens (Darcet et al. 2024); nothing is added to the
patch embeddings. Instead each layer rotates q and k of every patch by angles from the patch's centre
(y, x), normalised to [-1, 1] on the grid: the first quarter of a head's dims turn with y, the second
with x (2π·y·f and 2π·x·f, f = 1 / θ^(4i/hs)), the second half repeats them (half-split layout).
[CLS] and registers are not rotated (angle 0). Layer scale multiplies the attention block's output after
W_O, outside the attention; the attention itself is plain (scale 1/√hs, no mask, no bias on k by default).
Only square grids are reproduced: the grid is read back from the number of patches.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ..family import Family, Refusal
from ..errors import UnsupportedFeature
from ._vision import projection_spec, tiny_image_processor, tiny_vision_config


def _layer(base, i: int):
    return base.model.layer[i]


def prefix_tokens(cfg) -> tuple[str, ...]:
    """[CLS], then the registers [REG0] ... (the embeddings' order)."""
    return ("[CLS]", *(f"[REG{r}]" for r in range(getattr(cfg, "num_register_tokens", 0) or 0)))


def patch_angles(rows: int, cols: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotary angles (rows·cols, hs/2) of each patch, row by row: 2π·y·f then 2π·x·f, (y, x) its centre in [-1, 1].

    >>> patch_angles(1, 2, torch.tensor([1.0])) / math.pi
    tensor([[ 0., -1.],
            [ 0.,  1.]])
    """
    ys = torch.arange(0.5, rows, dtype=torch.float32) / rows * 2.0 - 1.0  # (rows,)
    xs = torch.arange(0.5, cols, dtype=torch.float32) / cols * 2.0 - 1.0  # (cols,)
    centres = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1).flatten(0, 1)  # (rows*cols, 2)
    return (2 * math.pi * centres[:, :, None] * inv_freq[None, None, :]).flatten(1, 2)  # (rows*cols, hs/2)


def _spec(base, i: int, cfg):
    spec = projection_spec(_layer(base, i).attention)
    inv_freq = 1 / cfg.rope_theta ** torch.arange(0, 1, 4 / spec.head_dim, dtype=torch.float32)  # (hs/4,)
    n_prefix = len(prefix_tokens(cfg))

    def rotary_angles(T: int) -> torch.Tensor:
        side = math.isqrt(max(T - n_prefix, 0))
        if side * side != T - n_prefix:
            raise UnsupportedFeature(f"DINOv3: {T - n_prefix} patches are not a square grid; only square grids "
                                     "are reproduced (resize the image to a square)")
        none = torch.zeros(n_prefix, spec.head_dim // 2)  # [CLS] and registers: no rotation
        return torch.cat([none, patch_angles(side, side, inv_freq)])  # (T, hs/2)

    return dataclasses.replace(spec, rotary_angles=rotary_angles)


def _grid_only(cfg) -> str | None:
    size = cfg.image_size
    if not isinstance(size, int) and size[0] != size[1]:
        return f"image_size={size}: only square grids are reproduced"
    return None


def _tiny_config(vocab: int, model_type: str):
    return tiny_vision_config(model_type, num_register_tokens=2, layerscale_value=0.5)


FAMILY = Family(
    name="dinov3_vit",
    model_types=("dinov3_vit",),
    kind="encoder",
    features=("image patches (+ CLS, registers)", "2-D rotary positions on the patches only (not CLS/registers)",
              "layer scale after W_O", "bidirectional"),
    layer_spec=_spec,
    attention=lambda base, i: _layer(base, i).attention,
    out_proj=lambda base, i: _layer(base, i).attention.o_proj,
    refuses=(Refusal("non-square grid", _grid_only),),
    tiny_config=_tiny_config,
    tokenizer=None,
    auto_class="AutoModel",
    modality="image",
    prefix_tokens=prefix_tokens,
    tiny_processor=tiny_image_processor,
    tiny_std=0.5,
)
