"""Granite Docling (`model_type` "granite_docling", GraniteDoclingForConditionalGeneration): Idefics3's layout (a
SigLIP-like tower on every tile, a pixel-shuffle connector, `<row_R_col_C>` tiles then the global image) over a
Granite decoder, with DeepStack features of some vision layers added to the first decoder layers' inputs.

The processor (GOT-OCR 2's tiling) cuts a page into rows × columns tiles of `image_size` pixels and, where it cut
more than one, adds the whole page as one more tile (the global image, after `<global-img>`); a page of one tile is
read as that tile alone, without a global image (unlike Idefics3). Each tile is a g × g grid of image tokens,
g = image_size / patch_size / scale_factor (the coarse path; the fine path, `fine_route=True`, halves the factor).
The decoder is Granite's attention (GraniteDoclingTextConfig is GraniteConfig with other defaults), verified by the
family of that parent type at each layer's captured input, DeepStack features included; the tower by a projection
spec (q, k, v, out_proj: SigLIP's attention) on every tile.
"""

from __future__ import annotations

import dataclasses

from ..family import Refusal, VisionLanguage
from ..types import ImagePatch
from ._reading import reading_family, text_config, tiny_chat_template
from ._vision import tiny_vision_config
from .idefics3 import IMAGE, TOKENS, VISION, runs, tile_units

TILE, PATCH, SCALE = 64, 4, 4  # tiny tiles: 16 × 16 patches, shuffled 4 × 4 (the checkpoint's factor) into 4 × 4 tokens


def _language_model(base):
    return base.text_model


def _granite() -> str:
    """Granite's model type: GraniteDoclingTextConfig is GraniteConfig with other defaults (transformers' modular
    file), and its attention is Granite's."""
    from transformers import GraniteConfig

    return GraniteConfig.model_type


def _text_family(cfg):
    """The decoder's family: Granite's (the text config's own type has no causal-LM model to verify alone)."""
    from . import family_of_type

    return family_of_type(_granite())


def _layer_spec(base, i: int, cfg):
    return _text_family(cfg).layer_spec(_language_model(base), i, text_config(cfg))


def _attention(base, i: int):
    return _language_model(base).layers[i].self_attn


def _decoder_refusal(cfg) -> str | None:
    family = _text_family(cfg)
    return next((r for r in (refusal.reason(text_config(cfg)) for refusal in family.refuses) if r is not None), None)


def pages(cfg, ids: list[int]) -> list[list[tuple[int, int]]]:
    """Each picture's frames (runs of image tokens) in a text's ids: a picture starts at a run after the marker of
    its first tile (`<row_1_col_1>`, the marker before the text's first run); its tiles, then its global image."""
    found = runs(ids, cfg.image_token_id)
    if not found:
        return []
    first = ids[found[0][0] - 1]
    pictures: list = []
    for run in found:
        if ids[run[0] - 1] == first:
            pictures.append([])
        pictures[-1].append(run)
    return pictures


def _side(cfg) -> int:
    vision = cfg.vision_config
    return vision.image_size // vision.patch_size // vision.scale_factor


def _image_units(cfg, inputs: dict, image: int) -> list:
    ids = [int(i) for i in inputs["input_ids"][0]]
    mine = pages(cfg, ids)[image]
    g = _side(cfg)
    if any(end - start != g * g for start, end in mine):
        raise ValueError(f"a tile of {mine[0][1] - mine[0][0]} image tokens, not {g} x {g}; this checkpoint's image "
                         "layout is not known (the fine route, fine_route=True, is not read)")
    if len(mine) == 1:  # one tile: the page itself, no global image
        return [ImagePatch(image, i, j, g, g) for i in range(g) for j in range(g)]
    tiles = mine[:-1]
    parts = [b[0] - a[1] for a, b in zip(tiles, tiles[1:])]  # 2: <fake><row_r_col_c>; a new row adds the newline
    cols = next((k + 1 for k, n in enumerate(parts) if n != 2), len(tiles))
    rows = len(tiles) // cols
    if rows * cols != len(tiles):
        raise ValueError(f"{len(tiles)} tiles in rows of {cols}; this checkpoint's image layout is not known")
    return tile_units(image, rows, cols, g)


def _picture(cfg, inputs: dict, image: int):
    """The page as the model saw it whole: its global image, or its only tile."""
    ids = [int(i) for i in inputs["input_ids"][0]]
    index = sum(len(f) for f in pages(cfg, ids)[: image + 1]) - 1
    return inputs["pixel_values"][0][index]


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    from . import family_of_type

    default = AutoConfig.for_model(model_type)
    parent = _granite()
    text = {**family_of_type(parent).tiny_config(vocab, parent).to_dict(), "max_position_embeddings": 1024}
    text.pop("model_type", None)
    vision = {**tiny_vision_config(default.vision_config.model_type).to_dict(), "image_size": TILE,
              "patch_size": PATCH, "scale_factor": SCALE, "deepstack_visual_indexes": [0],
              "out_hidden_size": text["hidden_size"]}
    # the tokenizer's last tokens are idefics3's TOKENS (added by tiny_model before the config is made)
    return AutoConfig.for_model(model_type, text_config=text, vision_config=vision,
                                image_token_id=vocab - len(TOKENS) + TOKENS.index(IMAGE))


def _tiny_processor(cfg, tokenizer):
    """GraniteDoclingProcessor on its PIL image processor: tiles of the tower's image size, at most 4 per page."""
    import transformers

    tile = cfg.vision_config.image_size
    images = transformers.GraniteDoclingImageProcessorPil(size={"height": tile, "width": tile}, max_patches=4,
                                                          image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    return transformers.GraniteDoclingProcessor(image_processor=images, tokenizer=tokenizer, image_seq_len=_side(cfg) ** 2,
                                                chat_template=tiny_chat_template(IMAGE))


_READING = reading_family(
    name="granite_docling",
    model_types=("granite_docling",),
    features=("decoder: Granite's attention (the llama family) at each layer's input, DeepStack features included",
              "vision tower: SigLIP-like attention on every tile", "pixel shuffle: one image token per scale_factor x "
              "scale_factor patches", "tiles with <row_R_col_C> markers (view 'tile r,c' on the picture), then the "
              "global image ('thumbnail'); a one-tile page read whole"),
    decoder=_language_model,
    refuses=(Refusal("decoder", _decoder_refusal),),
    tiny_config=_tiny_config,
    vision_language=VisionLanguage(vision=VISION, vision_family="clip_vision", image_units=_image_units,
                                   tiny_processor=_tiny_processor, image_tokens=lambda cfg: TOKENS, picture=_picture),
)
# the decoder's layers by Granite's family (`_text_family`): its text config's own type has no family of its own
FAMILY = dataclasses.replace(_READING, model_types=("granite_docling",), layer_spec=_layer_spec, attention=_attention,
                             out_proj=lambda base, i: _attention(base, i).o_proj)
