"""LLaVA-OneVision: LLaVA-NeXT's any-resolution tiles read by a SigLIP tower, with a Qwen2 decoder.

The processor picks the best of `image_grid_pinpoints` for each picture, cuts it at that resolution into tiles of
the tower's size and puts the whole picture resized (the base view) first; the tower reads every tile. With
`vision_feature_select_strategy="full"` (SigLIP has no CLS token) every patch feature is kept.

An image's tokens, in order: the base view's patches row by row (view "thumbnail", no newline after it), then the
tiles as one grid over the picture (view "tiles": the tiles side by side, the processor's padding rows or columns
removed), each row followed by an `<image_newline>` token (a learned embedding, no cell). When that grid holds
more than 1.1² × `anyres_max_N` tiles' worth of patches (`vision_aspect_ratio`), the model shrinks it bilinearly by
that ratio (rows // ratio × columns // ratio); each token then stands for its cell of the smaller grid, still
spanning the whole picture. The decoder is causal, verified by its text family (qwen2: the llama family); the
tower by `clip_vision` on every tile.
"""

from __future__ import annotations

import math

from ._reading import (images_only, load_images_only, reading_family, tiny_chat_template, tiny_parts,
                       tiny_pil_processor, tower_reading)
from .llava import IMAGE_TOKEN
from .llava_next import PINPOINTS, tile_units, unpadded_grid
from ..types import ImagePatch

# the tiny model's `vision_aspect_ratio`: at most two tiles' worth of patches before the grid is shrunk, so the
# tests see both a plain grid (one or two tiles) and a shrunk one (four tiles: 8 x 8 patches -> 5 x 5)
TINY_ASPECT = "anyres_max_2"




def shrunk(cfg, rows: int, cols: int) -> tuple[int, int]:
    """The tiles' grid after the model's `anyres_max_N` limit (transformers' `pack_image_features`)."""
    side = cfg.vision_config.image_size // cfg.vision_config.patch_size
    most = int(cfg.vision_aspect_ratio.strip("anyres_max_"))
    ratio = math.sqrt(rows * cols / (most * side**2))
    return (int(rows // ratio), int(cols // ratio)) if ratio > 1.1 else (rows, cols)


def _image_units(cfg, inputs: dict, image: int) -> list:
    vision = cfg.vision_config
    if cfg.vision_feature_select_strategy != "full":
        raise ValueError("llava_onevision with vision_feature_select_strategy='default' drops the first patch of a "
                         "SigLIP tower; its image layout is not known")
    tile = tuple(int(x) for x in inputs["pixel_values"][image].shape[-2:])
    side = vision.image_size // vision.patch_size
    size = tuple(int(x) for x in inputs["image_sizes"][image])
    rows, cols = shrunk(cfg, *unpadded_grid(cfg, size, tile))
    base = [ImagePatch(image, r, c, side, side, view="thumbnail") for r in range(side) for c in range(side)]
    return base + tile_units(image, rows, cols)


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    # the tokenizer's last token is <image> (added by tiny_model before the config is made)
    parts = tiny_parts(model_type, vocab)
    parts["text_config"]["max_position_embeddings"] = 512  # two tiled pictures and a text: ~160 tokens
    return AutoConfig.for_model(model_type, **parts, image_token_id=vocab - 1, projector_hidden_act="gelu",
                                vision_feature_layer=-1, vision_feature_select_strategy="full",
                                image_grid_pinpoints=PINPOINTS, vision_aspect_ratio=TINY_ASPECT)


def _tiny_processor(cfg, tokenizer):
    from transformers import LlavaOnevisionProcessor

    vision = cfg.vision_config
    size = vision.image_size
    images = tiny_pil_processor(size, "LlavaOnevisionImageProcessorPil", image_grid_pinpoints=PINPOINTS)
    return images_only(LlavaOnevisionProcessor)(
        image_processor=images, tokenizer=tokenizer, num_image_tokens=(size // vision.patch_size) ** 2,
        vision_feature_select_strategy="full", vision_aspect_ratio=cfg.vision_aspect_ratio,
        chat_template=tiny_chat_template(IMAGE_TOKEN), image_token=IMAGE_TOKEN)


FAMILY = reading_family(
    name="llava_onevision",
    model_types=("llava_onevision",),
    features=("decoder: its text family (Qwen2), causal", "vision tower: clip_vision (SigLIP) on every tile",
              "any-resolution images: the base view's grid, then the tiles as one unpadded grid (shrunk past "
              "anyres_max_N) with an <image_newline> per row"),
    tiny_config=_tiny_config,
    vision_language=tower_reading(image_units=_image_units,
                                   tiny_processor=_tiny_processor, image_tokens=lambda cfg: (IMAGE_TOKEN,),
                                   load_processor=load_images_only),
)
