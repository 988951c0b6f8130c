"""LLaVA-NeXT (LLaVA 1.6): LLaVA with "any resolution" images. The processor picks the best of
`image_grid_pinpoints` for each picture, cuts the picture at that resolution into tiles of the tower's size and
adds the whole picture resized (the thumbnail) as one more tile; the tower reads every tile.

An image's tokens, in order: the thumbnail's patches row by row (view "thumbnail"), then the tiles' patches as
one grid over the picture (view "tiles": the tiles side by side, the rows and columns of padding the processor
added to keep the aspect ratio removed), each row of that grid followed by an `<image_newline>` token (a learned
embedding, no cell). Both grids span the whole picture, so each cell's box is its place on it. The decoder is
causal, verified by its text family; the tower by `clip_vision` on every tile.
"""

from __future__ import annotations

from ._reading import reading_family, tiny_chat_template, tiny_parts, tiny_pil_processor, tower_reading
from .llava import IMAGE_TOKEN
from ..types import ImagePatch

PINPOINTS = [[32, 64], [64, 32], [64, 64]]  # the tiny model's resolutions: one to four 32 x 32 tiles




def _best_resolution(size: tuple[int, int], pinpoints) -> tuple[int, int]:
    """The processor's choice (transformers' `select_best_resolution`): the resolution that keeps the most of the
    picture's pixels after an aspect-preserving fit, then the least wasted area."""
    from transformers.image_processing_utils import select_best_resolution

    return tuple(int(x) for x in select_best_resolution(list(size), [list(p) for p in pinpoints]))


def unpadded_grid(cfg, size: tuple[int, int], tile: tuple[int, int]) -> tuple[int, int]:
    """The rows and columns of patches of the tiles side by side over a picture of `size` (H, W) read in tiles of
    `tile` pixels, less the rows or columns of padding the processor added to keep the aspect ratio
    (transformers' `unpad_image`)."""
    height, width = size
    ph, pw = tile[0] // cfg.vision_config.patch_size, tile[1] // cfg.vision_config.patch_size
    best_h, best_w = _best_resolution((height, width), cfg.image_grid_pinpoints)
    rows, cols = ph * (best_h // tile[0]), pw * (best_w // tile[1])  # the tiles side by side, in patches
    if width / height > cols / rows:  # a wide picture: rows of padding above and below
        pad = (rows - int(round(height * (cols / width), 7))) // 2
        rows -= 2 * pad
    else:
        pad = (cols - int(round(width * (rows / height), 7))) // 2
        cols -= 2 * pad
    return rows, cols


def tile_units(image: int, rows: int, cols: int) -> list:
    """The tiles' grid (view "tiles") row by row, each row followed by `<image_newline>`."""
    units: list = []
    for r in range(rows):
        units += [ImagePatch(image, r, c, rows, cols, view="tiles") for c in range(cols)]
        units.append("<image_newline>")
    return units


def _image_units(cfg, inputs: dict, image: int) -> list:
    vision = cfg.vision_config
    tile_h, tile_w = inputs["pixel_values"][image].shape[-2:]
    ph, pw = tile_h // vision.patch_size, tile_w // vision.patch_size
    size = tuple(int(x) for x in inputs["image_sizes"][image])
    rows, cols = unpadded_grid(cfg, size, (tile_h, tile_w))
    thumbnail = [ImagePatch(image, r, c, ph, pw, view="thumbnail") for r in range(ph) for c in range(pw)]
    return thumbnail + tile_units(image, rows, cols)


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    # the tokenizer's last token is <image> (added by tiny_model before the config is made)
    parts = tiny_parts(model_type, vocab)
    parts["text_config"]["max_position_embeddings"] = 512  # two tiled pictures and a text: ~160 tokens
    return AutoConfig.for_model(model_type, **parts, image_token_id=vocab - 1,
                                projector_hidden_act="gelu", vision_feature_layer=-1,
                                vision_feature_select_strategy="default", image_grid_pinpoints=PINPOINTS)


def _tiny_processor(cfg, tokenizer):
    from transformers import LlavaNextProcessor

    vision = cfg.vision_config
    size = vision.image_size
    images = tiny_pil_processor(size, "LlavaNextImageProcessorPil", crop_size={"height": size, "width": size},
                                image_grid_pinpoints=PINPOINTS)
    images.size = {"shortest_edge": size}
    return LlavaNextProcessor(image_processor=images, tokenizer=tokenizer, patch_size=vision.patch_size,
                              vision_feature_select_strategy="default", num_additional_image_tokens=1,
                              chat_template=tiny_chat_template(IMAGE_TOKEN), image_token=IMAGE_TOKEN)


FAMILY = reading_family(
    name="llava_next",
    model_types=("llava_next",),
    features=("decoder: its text family (Llama, Mistral, Qwen2), causal", "vision tower: clip_vision on every tile",
              "any-resolution images: a thumbnail grid, then the tiles as one unpadded grid with an <image_newline> "
              "per row"),
    tiny_config=_tiny_config,
    vision_language=tower_reading(image_units=_image_units,
                                   tiny_processor=_tiny_processor, image_tokens=lambda cfg: (IMAGE_TOKEN,)),
)
