"""InternVL 2.5 / 3 / 3.5 in transformers' layout (InternVLForConditionalGeneration, the "-hf" checkpoints): an
InternViT vision model, a pixel-shuffle projector, and a Qwen2 (or Llama) decoder.

The image processor (GotOcr2's, `crop_to_patches`) picks the grid of tiles, columns × rows between
`min_patches` and `max_patches`, whose aspect ratio is closest to the picture's, stretches the picture onto it and
cuts it into tiles of the tower's size, row by row, then adds the whole picture resized to one tile (the
thumbnail, last); a picture that fits one tile is read whole. The vision model reads every tile (its CLS token
first); the model drops the CLS and the pixel shuffle puts each 1/`downsample_ratio` × 1/`downsample_ratio`
block of patches into one token, so a tile is a g × g grid of tokens, g = image_size / patch_size ×
downsample_ratio, row by row. The processor expands each `<IMG_CONTEXT>` slot into `<img>`, g² tokens per tile
(tiles first, the thumbnail last) and `</img>`.

An image's tokens: each tile's grid (view "tile r,c", each cell's box its place on the picture), then the
thumbnail's (view "thumbnail"; "base" for a picture read whole). The processor's outputs do not say how it cut
a picture; its grid is the one transformers' own `get_optimal_tiled_canvas` picks for the picture's size among
the grids of exactly that many tiles (those the processor's ids hold), which is the processor's choice.

The decoder is causal, verified by its text family (qwen2, llama: the llama family). InternViT's attention:
q, k, v (biases where `attention_bias`), an optional RMS norm of the whole q and k projections (plain weight:
the 6B towers' `use_qk_norm`), scale 1/√d, bidirectional, output projection `projection_layer`; its layer
scale multiplies the block output after W_O, outside the attention.
"""

from __future__ import annotations

import dataclasses

import torch

from ..scratch import LayerSpec
from ._reading import both_refusals, composite, images_only, load_images_only, reading_family, tiny_chat_template
from ._vision import out_projection, projection_spec
from ..family import Stack, VisionLanguage, norm_eps
from ..types import ImagePatch

START, END, CONTEXT, VIDEO = "<img>", "</img>", "<IMG_CONTEXT>", "<video>"
PLACEHOLDER = "<image>"  # Qianfan-OCR's slot, which its processor expands to START, CONTEXT ... and END
TILE, PATCH, MOST = 32, 4, 4  # tiny models: 32 x 32 tiles of 4 x 4 patches, at most 4 tiles a picture


def _attention(base, i: int):
    tower = base.vision_tower  # InternVL's layers under `encoder.layer`, Qianfan-OCR's under `layers`
    layers = tower.encoder.layer if hasattr(tower, "encoder") else tower.layers
    return layers[i].attention


def _vision_spec(base, i: int, cfg) -> LayerSpec:
    attn = _attention(base, i)
    spec = projection_spec(attn)
    if isinstance(attn.q_norm, torch.nn.Identity):
        return spec
    return dataclasses.replace(spec, q_norm=attn.q_norm.weight.detach(), k_norm=attn.k_norm.weight.detach(),
                               norm_scope="projection", norm_offset=0.0, norm_eps=norm_eps(attn.q_norm))


VISION = Stack(kind="vision", layer_spec=_vision_spec, attention=_attention,
               out_proj=lambda base, i: out_projection(_attention(base, i)),
               n_layers=lambda cfg: composite(cfg).vision_config.num_hidden_layers)


def _side(cfg) -> int:
    """g: a tile's tokens per side after the pixel shuffle."""
    vision = cfg.vision_config
    return int(vision.image_size[0] // vision.patch_size[0] * cfg.downsample_ratio)


def _tiles(cfg, inputs: dict) -> list[int]:
    """How many tiles each picture of the text was read as (its thumbnail included): its run of image tokens
    (between `<img>` and `</img>`) over g² tokens a tile."""
    ids = [int(i) for i in inputs["input_ids"][0]]
    runs, t = [], 0
    while t < len(ids):
        if ids[t] == cfg.image_token_id:
            start = t
            while t < len(ids) and ids[t] == cfg.image_token_id:
                t += 1
            runs.append(t - start)
        t += 1
    g = _side(cfg)
    if any(n % (g * g) for n in runs):
        raise ValueError(f"a picture of {runs} image tokens, not whole tiles of {g} x {g}; this checkpoint's image "
                         "layout is not known")
    return [n // (g * g) for n in runs]


def tiled_units(image: int, g: int, n: int, size: tuple[int, int], tile: int) -> list:
    """Image `image`'s units when the processor (GotOcr2's `crop_to_patches`) read it as `n` frames of `tile`
    pixels a side, each a g × g grid of tokens: one frame, the picture read whole (view "base"); more, the tiles
    row by row (view "tile r,c", each cell's box its place on the picture), then the thumbnail. The grid of the
    n - 1 tiles is transformers' own choice (`get_optimal_tiled_canvas`) for a picture of `size` (H, W) among the
    grids of exactly that many tiles: the processor's, since it chose the closest of a wider set."""
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import get_optimal_tiled_canvas

    if n == 1:
        return [ImagePatch(image, i, j, g, g) for i in range(g) for j in range(g)]
    cols, rows = get_optimal_tiled_canvas(size, (tile, tile), n - 1, n - 1)
    units: list = []
    for r in range(rows):
        for c in range(cols):
            units += [ImagePatch(image, i, j, g, g, view=f"tile {r},{c}",
                                 box=((r + i / g) / rows, (c + j / g) / cols, (r + (i + 1) / g) / rows,
                                      (c + (j + 1) / g) / cols)) for i in range(g) for j in range(g)]
    return units + [ImagePatch(image, i, j, g, g, view="thumbnail") for i in range(g) for j in range(g)]


def _image_units(cfg, inputs: dict, image: int) -> list:
    return tiled_units(image, _side(cfg), _tiles(cfg, inputs)[image], tuple(inputs["picture_sizes"][image]),
                       cfg.vision_config.image_size[0])


def _picture(cfg, inputs: dict, image: int) -> torch.Tensor:
    """The picture as the model saw it whole: its thumbnail (its last tile), or its one tile."""
    return inputs["pixel_values"][sum(_tiles(cfg, inputs)[: image + 1]) - 1]


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    from . import family_of_type

    kind = AutoConfig.for_model(model_type).text_config.model_type  # the decoder type InternVL defaults to
    text = family_of_type(kind).tiny_config(vocab, kind).to_dict()
    text["max_position_embeddings"] = 512  # two pictures of five tiles and a text: ~180 tokens
    vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                  image_size=[TILE, TILE], patch_size=[PATCH, PATCH], attention_bias=True, use_qk_norm=True)
    # the tokenizer's last five tokens are <img>, </img>, <IMG_CONTEXT>, <video>, <image>
    return AutoConfig.for_model(model_type, text_config=text, vision_config=vision, image_token_id=vocab - 3,
                                downsample_ratio=0.5, vision_feature_layer=-1, vision_feature_select_strategy="default")


def _tiny_processor(cfg, tokenizer):
    from transformers import GotOcr2ImageProcessorPil, InternVLProcessor, QianfanOCRProcessor

    # named special tokens, as InternVL's tokenizer has them (kept by save_pretrained)
    tokenizer._set_model_specific_special_tokens(special_tokens={"start_image_token": START, "end_image_token": END,
                                                                 "context_image_token": CONTEXT, "video_token": VIDEO})
    tile = cfg.vision_config.image_size[0]  # the vision model's tile, not the tiny default's (another size: other tiles)
    images = GotOcr2ImageProcessorPil(size={"height": tile, "width": tile}, crop_to_patches=True, min_patches=1,
                                      max_patches=MOST, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    if composite(cfg).model_type == "qianfan_ocr":  # its own processor: no video part, the slot is <image>
        return QianfanOCRProcessor(image_processor=images, tokenizer=tokenizer, image_seq_length=_side(cfg) ** 2,
                                   chat_template=tiny_chat_template(PLACEHOLDER), image_placeholder_token=PLACEHOLDER)
    return images_only(InternVLProcessor)(image_processor=images, tokenizer=tokenizer, image_seq_length=_side(cfg) ** 2,
                                          chat_template=tiny_chat_template(CONTEXT))


FAMILY = reading_family(
    name="internvl",
    model_types=("internvl", "qianfan_ocr"),
    features=("decoder: its text family (Qwen2, Llama), causal",
              "vision model (InternViT): q/k/v biases, RMS norm of the whole q and k projections where "
              "use_qk_norm, bidirectional over each tile (CLS first)",
              "pixel shuffle: one image token per 1/downsample_ratio x 1/downsample_ratio patches",
              "tiles (view 'tile r,c' on the picture), then the thumbnail"),
    refuses=both_refusals()[:1],  # InternViT is verified here, not by an image family of its own
    tiny_config=_tiny_config,
    vision_language=VisionLanguage(vision=VISION, vision_family="internvl", image_units=_image_units,
                                   tiny_processor=_tiny_processor, image_tokens=lambda cfg: (START, END, CONTEXT, VIDEO, PLACEHOLDER),
                                   picture=_picture, load_processor=load_images_only),
)
