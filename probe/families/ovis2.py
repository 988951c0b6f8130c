"""Ovis2 (`model_type` "ovis2", Ovis2ForConditionalGeneration): an AIMv2 vision transformer on the whole picture and
on each tile, its patch features grouped `hidden_stride` × `hidden_stride` into one visual token (a probability over
a visual vocabulary, embedded by a table), and a Qwen2 decoder in LLaVA's layout.

The processor expands each `<image>` slot into `<IMG_START>`, the whole picture's tokens, `<IMG_GRID>`, then, where
it cut the picture into rows × columns tiles (`grids`), each tile's tokens row by row (`<IMG_COL>` between the tiles
of a row, `<IMG_ROW>` between rows), and `<IMG_END>`. Each picture's frames are the global one first, then its tiles
(`pixel_values` in that order). A frame is a g × g grid of `<IMG_ATOM>` tokens, g = image_size / patch_size /
hidden_stride, row by row. The indicator tokens are the visual table's own embeddings (labels, on no cell). The
decoder is causal, verified by its text family (llama); the tower by a projection spec (q, k, v, out_proj) per frame.
"""

from __future__ import annotations

import math

from ..family import Stack, VisionLanguage
from ..types import ImagePatch
from ._reading import both_refusals, reading_family, tiny_chat_template
from ._vision import out_projection, projection_spec
from .idefics3 import tile_units

IMAGE, ATOM = "<image>", "<IMG_ATOM>"
INDICATORS = ("<IMG_START>", "<IMG_GRID>", "<IMG_COL>", "<IMG_ROW>", "<IMG_END>")
TOKENS = (IMAGE, ATOM, *INDICATORS)  # the tiny tokenizer's last tokens, in this order


def _layer(base, i: int):
    return base.vision_tower.transformer.encoder.layers[i].attention


VISION = Stack(kind="vision", layer_spec=lambda base, i, cfg: projection_spec(_layer(base, i)), attention=_layer,
               out_proj=lambda base, i: out_projection(_layer(base, i)),
               n_layers=lambda cfg: getattr(cfg, "composite", cfg).vision_config.num_hidden_layers)


def _side(cfg) -> int:
    """Tokens per side of a frame: the patches per side, grouped by hidden_stride (padded up to a whole group)."""
    vision = cfg.vision_config
    return math.ceil(vision.image_size // vision.patch_size / vision.hidden_stride)


def _grid(inputs: dict, image: int) -> tuple[int, int]:
    """The (rows, columns) of tiles the processor cut image `image` into (`with_grids`: its own `grids`)."""
    rows, cols = (int(x) for x in inputs["grids"][image])
    return rows, cols


def with_grids(cls):
    """Ovis2's processor class `cls` whose call also returns each picture's tile grid, `grids` (rows, columns) as a
    list: the prompt it built follows that grid, which its own call drops (`unused_input_names`), and a list is no
    model input. Saved with `save_pretrained` it writes `cls`'s files."""
    def unused_input_names(self) -> list[str]:
        return [name for name in cls.unused_input_names.fget(self) if name != "grids"]

    def __call__(self, *args, **kwargs):
        out = cls.__call__(self, *args, **kwargs)
        if "grids" in out:
            out["grids"] = [[int(x) for x in grid] for grid in out["grids"]]
        return out

    return type(cls.__name__, (cls,), {"__call__": __call__, "unused_input_names": property(unused_input_names),
                                       "__module__": cls.__module__})


def _as_reader(processor):
    processor.__class__ = with_grids(type(processor))
    return processor


def _image_units(cfg, inputs: dict, image: int) -> list:
    g = _side(cfg)
    rows, cols = _grid(inputs, image)
    if rows * cols == 1:  # the whole picture alone
        return [ImagePatch(image, i, j, g, g) for i in range(g) for j in range(g)]
    units = tile_units(image, rows, cols, g)  # tiles, then the global image: Ovis2 reads the global image first
    return units[-g * g:] + units[: -g * g]


def _picture(cfg, inputs: dict, image: int):
    """The picture's global image: the first of its frames (a frame per tile follows it where it was tiled)."""
    frames = [1 if r * c == 1 else 1 + r * c for r, c in (_grid(inputs, k) for k in range(len(inputs["grids"])))]
    return inputs["pixel_values"][sum(frames[:image])]


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    from . import family_of_type

    default = AutoConfig.for_model(model_type)
    kind = default.text_config.model_type
    text = family_of_type(kind).tiny_config(vocab, kind)
    # 32-pixel frames of 8-pixel patches (4 x 4), grouped 2 x 2 (the checkpoints' hidden_stride) into 2 x 2 tokens
    vision = dict(image_size=32, patch_size=8, hidden_stride=2, num_hidden_layers=2, hidden_size=32,
                  num_attention_heads=4, intermediate_size=64, vocab_size=64, num_channels=3)
    first = vocab - len(TOKENS)
    # the visual table and the LM head are sized by the composite's own hidden_size and vocab_size: the decoder's
    return AutoConfig.for_model(model_type, text_config=text.to_dict(), vision_config=vision,
                                hidden_size=text.hidden_size, vocab_size=text.vocab_size,
                                image_token_id=first + TOKENS.index(ATOM),
                                visual_indicator_token_ids=[first + TOKENS.index(t) for t in INDICATORS])


def _tiny_processor(cfg, tokenizer):
    """Ovis2Processor on its PIL image processor: frames of the tower's image size, at most 4 tiles a picture."""
    import transformers

    size = cfg.vision_config.image_size
    images = transformers.Ovis2ImageProcessorPil(size={"height": size, "width": size}, crop_to_patches=True,
                                                 max_patches=4, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    return with_grids(transformers.Ovis2Processor)(image_processor=images, tokenizer=tokenizer, image_seq_length=_side(cfg) ** 2,
                                       chat_template=tiny_chat_template(IMAGE))


FAMILY = reading_family(
    name="ovis2",
    model_types=("ovis2",),
    features=("decoder: its text family (Qwen2: llama), causal", "vision tower: AIMv2 attention on every frame",
              "one visual token per hidden_stride x hidden_stride patches", "the global image first, then tiles row "
              "by row (view 'tile r,c' on the picture) between indicator tokens"),
    refuses=both_refusals()[:1],
    tiny_config=_tiny_config,
    vision_language=VisionLanguage(vision=VISION, vision_family="clip_vision", image_units=_image_units,
                                   tiny_processor=_tiny_processor, image_tokens=lambda cfg: TOKENS, picture=_picture,
                                   as_reader=_as_reader),
)
