"""Aya Vision (AyaVisionForConditionalGeneration, 8B and 32B): a SigLIP 2 tower, a pixel-shuffle projector with a
SwiGLU, and a Cohere 2 decoder.

The image processor (GotOcr2's, `crop_to_patches`) picks the grid of tiles, columns × rows between
`min_patches` and `max_patches`, whose aspect ratio is closest to the picture's, stretches the picture onto it and
cuts it into tiles of the tower's size, row by row, then adds the whole picture resized to one tile (the
thumbnail, last); a picture that fits one tile is read whole. The tower reads every tile (SigLIP: no CLS, every
patch kept); the pixel shuffle puts each `downsample_factor` × `downsample_factor` block of patches into one
token, so a tile is a g × g grid of `<|IMG_PATCH|>` tokens, g = image_size / patch_size / downsample_factor, row
by row. The processor expands each `<image>` slot into `<|START_OF_IMG|>`, then for each tile the text
`TILE_k` (k = 1, 2, ...) and its tokens, then `TILE_GLOBAL` and the thumbnail's tokens, and `<|END_OF_IMG|>`.

An image's tokens: each tile's grid (view "tile r,c", each cell's box its place on the picture), then the
thumbnail's (view "thumbnail"; "base" for a picture read whole). The tiles of each picture are read from the
processor's ids (a run of image tokens per tile; a picture's last run follows `TILE_GLOBAL`); its grid of
tiles is the one transformers' own `get_optimal_tiled_canvas` picks for the picture's size among the grids of
exactly that many tiles (internvl.py). The decoder is causal (sliding-window layers, NoPE global layers),
verified by its text family (cohere2: the cohere family); the tower by `clip_vision` on every tile.
"""

from __future__ import annotations

import torch

from ._reading import reading_family, tiny_chat_template, tiny_parts, tower_reading
from .idefics3 import frames
from .internvl import tiled_units

IMAGE, START, END = "<image>", "<|START_OF_IMG|>", "<|END_OF_IMG|>"
PATCH_TOKEN, BREAK = "<|IMG_PATCH|>", "<|IMG_LINE_BREAK|>"
TILE, MOST = 32, 4  # tiny models: 32 x 32 tiles, at most 4 a picture


def _side(cfg) -> int:
    vision = cfg.vision_config
    return vision.image_size // vision.patch_size // cfg.downsample_factor


def _frames(cfg, inputs: dict) -> list:
    """Each picture's runs of image tokens, its tiles' first and its thumbnail's last."""
    return frames(cfg, [int(i) for i in inputs["input_ids"][0]])


def _image_units(cfg, inputs: dict, image: int) -> list:
    g = _side(cfg)
    mine = _frames(cfg, inputs)[image]
    if any(end - start != g * g for start, end in mine):
        raise ValueError(f"a tile of {mine[0][1] - mine[0][0]} image tokens, not {g} x {g}; this checkpoint's image "
                         "layout is not known")
    return tiled_units(image, g, len(mine), tuple(inputs["picture_sizes"][image]), cfg.vision_config.image_size)


def _picture(cfg, inputs: dict, image: int) -> torch.Tensor:
    """The picture as the model saw it whole: its thumbnail (its last tile), or its one tile."""
    return inputs["pixel_values"][sum(len(f) for f in _frames(cfg, inputs)[: image + 1]) - 1]


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    parts = tiny_parts(model_type, vocab)
    parts["text_config"]["max_position_embeddings"] = 512  # two pictures of five tiles and a text: ~120 tokens
    parts["text_config"]["eos_token_id"] = None  # Cohere 2's own (255001) is past the tiny vocabulary
    # the tokenizer's last five tokens are IMAGE, START, END, PATCH_TOKEN, BREAK
    return AutoConfig.for_model(model_type, **parts, image_token_index=vocab - 2, downsample_factor=2,
                                vision_feature_layer=-1, vision_feature_select_strategy="full")


def _tiny_processor(cfg, tokenizer):
    from transformers import AyaVisionProcessor, GotOcr2ImageProcessorPil

    if tokenizer.pad_token is None:  # the processor pads (Aya's own tokenizer has <PAD>)
        tokenizer.pad_token = tokenizer.eos_token
    vision = cfg.vision_config
    tile = vision.image_size  # the vision tower's tile, not the tiny default's (another size: other tiles)
    images = GotOcr2ImageProcessorPil(size={"height": tile, "width": tile}, crop_to_patches=True, min_patches=1,
                                      max_patches=MOST, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    return AyaVisionProcessor(image_processor=images, tokenizer=tokenizer, patch_size=vision.patch_size,
                              img_size=vision.image_size, downsample_factor=cfg.downsample_factor, image_token=IMAGE,
                              start_of_img_token=START, end_of_img_token=END, img_patch_token=PATCH_TOKEN,
                              img_line_break_token=BREAK, chat_template=tiny_chat_template(IMAGE))


FAMILY = reading_family(
    name="aya_vision",
    model_types=("aya_vision",),
    features=("decoder: its text family (Cohere 2: cohere), causal", "vision tower: clip_vision (SigLIP 2) on every tile",
              "pixel shuffle: one image token per downsample_factor x downsample_factor patches",
              "tiles after TILE_k (view 'tile r,c' on the picture), then the thumbnail after TILE_GLOBAL"),
    tiny_config=_tiny_config,
    vision_language=tower_reading(image_units=_image_units,
                                   tiny_processor=_tiny_processor, picture=_picture,
                                   image_tokens=lambda cfg: (IMAGE, START, END, PATCH_TOKEN, BREAK)),
)
