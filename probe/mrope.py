"""Multimodal rotary positions (M-RoPE) of Qwen2-VL, Qwen2.5-VL and Qwen3-VL: three position streams.

Every token of a Qwen-VL decoder has three positions, (time, row, column): a text token has the same
number in all three (its place in the text, counted on after each image); an image token has the
image's start in time and its row and column in the image's grid of merged patches (2 × 2 patches of
the vision encoder make one token). Each rotary frequency of a head reads one of the three streams:

- Qwen2-VL and Qwen2.5-VL: in contiguous sections, `mrope_section = [t, h, w]` frequencies in turn
  (the first t read the time, the next h the row, the last w the column);
- Qwen3-VL: interleaved, frequency j reads the row where j % 3 == 1 and the column where j % 3 == 2
  (within 3 × the section's size), the time elsewhere.

With all three streams equal (text only) this is the ordinary 1-D rotary. The positions themselves are the
model's own (`get_rope_index` of transformers' Qwen-VL models): `qwen_vl_positions` reads them and
says, for every image token, which image, row and column it stands for.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .scratch import LayerSpec
from .types import ImagePatch

__all__ = ["MRope", "mrope_streams", "mrope_angles", "at_positions", "ImageToken", "VLPositions",
           "image_token_types", "qwen_vl_positions"]


@dataclass(frozen=True)
class MRope:
    """A decoder family's multimodal rotary scheme (its `Family.mrope`), handed here by the composite that runs it:
    the sections its config gives when its rope parameters name none, and whether the frequencies interleave the
    streams (Qwen3-VL, Qwen3.5) rather than take them in contiguous sections (Qwen2-VL, Qwen2.5-VL).

    >>> MRope((16, 24, 24), interleaved=False).layout(object())
    ((16, 24, 24), False)
    """

    default_sections: tuple[int, int, int]
    interleaved: bool

    def layout(self, config) -> tuple[tuple[int, ...], bool]:
        """(mrope_section, interleaved) of a text config of this scheme: the sections from its rope parameters, or
        the scheme's defaults ([16, 24, 24] in Qwen2-VL and Qwen2.5-VL, [24, 20, 20] in Qwen3-VL, [11, 11, 10] in
        Qwen3.5)."""
        params = getattr(config, "rope_parameters", None) or {}
        return tuple(int(s) for s in params.get("mrope_section", self.default_sections)), self.interleaved


def mrope_streams(sections, half: int, *, interleaved: bool) -> torch.Tensor:
    """Which stream (0 time, 1 row, 2 column) each of a head's `half` rotary frequencies reads.

    >>> mrope_streams((2, 1, 1), 4, interleaved=False).tolist(), mrope_streams((2, 1, 1), 4, interleaved=True).tolist()
    ([0, 0, 1, 2], [0, 1, 2, 0])
    """
    if interleaved:  # transformers' Qwen3VLTextRotaryEmbedding.recomposition_frequencies
        streams = torch.zeros(half, dtype=torch.long)
        for stream in (1, 2):
            streams[stream : 3 * sections[stream] : 3] = stream
        return streams
    if sum(sections) != half:
        raise ValueError(f"mrope_section {list(sections)} covers {sum(sections)} frequencies; a head has {half}")
    return torch.cat([torch.full((n,), i % 3, dtype=torch.long) for i, n in enumerate(sections)])


def mrope_angles(position_ids: torch.Tensor, inv_freq: torch.Tensor, sections, *, interleaved: bool) -> torch.Tensor:
    """Rotary angles (B, T, half) of positions (3, B, T): frequency j turns by the position of its stream."""
    streams = mrope_streams(sections, inv_freq.shape[0], interleaved=interleaved).to(position_ids.device)
    chosen = position_ids.float()[streams]  # (half, B, T)
    return chosen.permute(1, 2, 0) * inv_freq.float().to(position_ids.device)


def at_positions(spec: LayerSpec, config, position_ids: torch.Tensor, *, scheme: MRope) -> LayerSpec:
    """A Qwen-VL decoder layer's `LayerSpec` (whose rotary is 1-D, right for text alone) at the model's own 3-D
    positions (3, B, T): its `rotary_angles` give each batch row's (B, T, half) angles, so image tokens turn by
    their rows and columns. `scheme` is the decoder family's (`Family.mrope`)."""
    if spec.inv_freq is None or callable(spec.inv_freq):
        raise ValueError("at_positions takes a layer with fixed rotary frequencies (a Qwen-VL decoder's)")
    sections, interleaved = scheme.layout(config)
    angles = mrope_angles(position_ids, spec.inv_freq, sections, interleaved=interleaved)
    return replace(spec, rotary_angles=lambda T: angles[:, :T])


@dataclass(frozen=True)
class ImageToken:
    """One image token of a Qwen-VL input: where it stands and what it shows, after the 2 × 2 spatial merge."""

    batch: int  # the batch row
    index: int  # its place in the row's tokens
    image: int  # which image (0, 1, ... in the order of image_grid_thw)
    row: int  # its row and column in the image's grid of merged patches
    col: int


@dataclass(frozen=True, eq=False)
class VLPositions:
    """The 3-D positions of a Qwen-VL input and its image tokens."""

    position_ids: torch.Tensor  # (3, B, T): time, row, column of every token (the model's own)
    tokens: tuple[ImageToken, ...]  # every image token, batch row by batch row, in order
    grids: tuple[tuple[int, int], ...]  # each image's (rows, columns) of merged tokens

    def patches(self, batch: int) -> tuple[ImagePatch | None, ...]:
        """`AttentionMap.patches` of batch row `batch`: each token's `ImagePatch` (its image, row and column of
        the image's grid of merged tokens), None for a text token; one entry per token of the row, padding included
        (cut them to the map's units)."""
        out: list[ImagePatch | None] = [None] * self.position_ids.shape[-1]
        for t in self.tokens:
            if t.batch == batch:
                rows, cols = self.grids[t.image]
                out[t.index] = ImagePatch(image=t.image, row=t.row, col=t.col, rows=rows, cols=cols)
        return tuple(out)


def image_token_types(model, input_ids: torch.Tensor) -> torch.Tensor:
    """`mm_token_type_ids` (B, T) of a Qwen-VL input: 1 at the image tokens, 0 elsewhere (what the processor returns
    beside `input_ids`, and what the model's forward pass and `get_rope_index` need with images)."""
    return (input_ids == getattr(model, "model", model).config.image_token_id).int()


def qwen_vl_positions(model, input_ids: torch.Tensor, *, image_grid_thw: torch.Tensor | None = None,
                      attention_mask: torch.Tensor | None = None) -> VLPositions:
    """The model's own 3-D positions (its `get_rope_index`) of `input_ids` (B, T) with images of `image_grid_thw`
    (n, 3), and the image, row and column of every image token (the images' tokens fill the image-token slots in
    order; each image's (t, h, w) patches become (h / m) × (w / m) tokens, m = the spatial merge size).
    `model` is a Qwen2-VL, Qwen2.5-VL or Qwen3-VL model (for conditional generation, or its base)."""
    base = getattr(model, "model", model)
    if not hasattr(base, "get_rope_index"):
        raise ValueError(f"{type(model).__name__} has no get_rope_index: not a Qwen-VL model")
    cfg = base.config
    merge = cfg.vision_config.spatial_merge_size
    grids = tuple((int(h) // merge, int(w) // merge) for _, h, w in ([] if image_grid_thw is None else image_grid_thw.tolist()))
    tokens, image, seen = [], 0, 0
    for b in range(input_ids.shape[0]):
        for index in (input_ids[b] == cfg.image_token_id).nonzero().flatten().tolist():
            if image >= len(grids):
                raise ValueError(f"more image tokens than the {len(grids)} image(s) of image_grid_thw fill")
            rows, cols = grids[image]
            tokens.append(ImageToken(b, index, image, seen // cols, seen % cols))
            seen += 1
            if seen == rows * cols:
                image, seen = image + 1, 0
    if image != len(grids) or seen:
        raise ValueError(f"the image tokens fill {image} of the {len(grids)} image(s) of image_grid_thw; give each "
                         "image its (t·h·w) / merge² tokens")
    with torch.inference_mode():
        position_ids, _ = base.get_rope_index(input_ids, mm_token_type_ids=image_token_types(base, input_ids),
                                              image_grid_thw=image_grid_thw, video_grid_thw=None,
                                              attention_mask=attention_mask)
    return VLPositions(position_ids, tuple(tokens), grids)
