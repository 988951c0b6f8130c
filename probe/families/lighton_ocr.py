"""LightOnOCR (LightOnOcrForConditionalGeneration): a Pixtral vision encoder, a patch merger of
`spatial_merge_size` × `spatial_merge_size` patches into one token, and a Qwen3 decoder.

The image processor (Pixtral's) resizes each picture so that its longest edge fits `longest_edge`, its sides whole
multiples of `patch_size × spatial_merge_size`; the processor expands each `[IMG]` slot into one `[IMG]` token per
merged cell, row by row (no row breaks, unlike Pixtral's own processor). The decoder is causal, verified by its
text family (qwen3).

The Pixtral encoder reads all of a text's pictures as one sequence of patches: each picture's patches see only
that picture's (a block-diagonal mask, `Stack.visible`), and each patch's query and key are turned by a 2-D rotary
of its (row, column) in its picture (`Stack.angles`): of the head's rotary frequencies θ^(-2j/d), the even ones
(j = 0, 2, ...) turn by the row and the odd ones by the column, the row's half first, half-split pairs, no CLS
token. Its attention returns its weights, so its layers are verified like any other: an RMS norm before the
attention, q, k, v and o without biases, scale 1/√d.
"""

from __future__ import annotations

import torch

from ..scratch import LayerSpec
from ._reading import both_refusals, composite, grid_units, reading_family, tiny_chat_template
from ._vision import projection_spec
from ..family import Refusal, Stack, VisionLanguage

IMAGE, BREAK, END = "[IMG]", "[IMG_BREAK]", "[IMG_END]"
PATCH, MERGE, LONGEST = 4, 2, 32  # tiny models: 4-pixel patches merged 2 x 2, pictures at most 32 pixels a side


def _tower(base):
    return base.vision_encoder


def _patches(cfg, inputs: dict) -> list[tuple[int, int]]:
    """Each picture's patch grid (rows, columns): its real size (`image_sizes`, before the batch's padding) over
    the patch size."""
    p = composite(cfg).vision_config.patch_size
    return [(int(h) // p, int(w) // p) for h, w in inputs["image_sizes"]]


def pixtral_angles(cfg, inputs: dict) -> torch.Tensor:
    """(patches, head_dim / 2): each patch's rotary angles, its row times the even frequencies, then its column
    times the odd ones, picture after picture."""
    vision = composite(cfg).vision_config
    d = vision.head_dim or vision.hidden_size // vision.num_attention_heads
    inv = 1.0 / (vision.rope_parameters["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    out = []
    for rows, cols in _patches(cfg, inputs):
        r, c = torch.meshgrid(torch.arange(rows, dtype=torch.float32), torch.arange(cols, dtype=torch.float32),
                              indexing="ij")
        out.append(torch.cat([r.reshape(-1, 1) * inv[0::2], c.reshape(-1, 1) * inv[1::2]], dim=-1))
    return torch.cat(out)


def pixtral_visible(cfg, inputs: dict, T: int, S: int) -> torch.Tensor:
    """(1, T, T): a patch sees the patches of its own picture only."""
    sizes = torch.tensor([r * c for r, c in _patches(cfg, inputs)])
    owner = torch.repeat_interleave(torch.arange(len(sizes)), sizes)
    return (owner[:, None] == owner[None, :])[None]


def pixtral_stack(tower) -> Stack:
    """A Pixtral vision encoder's layers (`tower(base)`: the PixtralVisionModel), each at its input's own 2-D
    positions and block-diagonal mask."""
    def spec(base, i: int, cfg) -> LayerSpec:
        return projection_spec(tower(base).transformer.layers[i].attention)

    return Stack(kind="vision", layer_spec=spec, attention=lambda base, i: tower(base).transformer.layers[i].attention,
                 out_proj=lambda base, i: tower(base).transformer.layers[i].attention.o_proj,
                 n_layers=lambda cfg: composite(cfg).vision_config.num_hidden_layers, visible=pixtral_visible,
                 angles=pixtral_angles)


def _axial(cfg) -> str | None:
    kind = (composite(cfg).vision_config.rope_parameters or {}).get("rope_type", "axial")
    return None if kind == "axial" else f"Pixtral's rope_type={kind!r} is not reproduced (only 'axial')"


def _image_units(cfg, inputs: dict, image: int) -> list:
    """Image `image`'s tokens: its merged cells row by row."""
    merge = cfg.spatial_merge_size
    rows, cols = _patches(cfg, inputs)[image]
    return grid_units(image, rows // merge, cols // merge)


def _picture(cfg, inputs: dict, image: int) -> torch.Tensor:
    """Image `image` as the encoder read it: its pixels without the batch's padding (right and bottom)."""
    h, w = (int(x) for x in inputs["image_sizes"][image])
    return inputs["pixel_values"][image][:, :h, :w]


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    from . import family_of_type

    kind = AutoConfig.for_model(model_type).text_config.model_type  # the decoder type LightOnOCR defaults to
    text = family_of_type(kind).tiny_config(vocab, kind).to_dict()
    text["max_position_embeddings"] = 512
    vision = dict(model_type=AutoConfig.for_model(model_type).vision_config.model_type, hidden_size=32,
                  intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, head_dim=8, image_size=LONGEST,
                  patch_size=PATCH, rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})
    # the tokenizer's last three tokens are [IMG], [IMG_BREAK], [IMG_END]
    return AutoConfig.for_model(model_type, text_config=text, vision_config=vision, image_token_id=vocab - 3,
                                spatial_merge_size=MERGE)


def _tiny_processor(cfg, tokenizer):
    from transformers import LightOnOcrProcessor, PixtralImageProcessorPil

    p = cfg.vision_config.patch_size
    # named special tokens, as LightOnOCR's tokenizer has them (kept by save_pretrained)
    tokenizer._set_model_specific_special_tokens(special_tokens={"image_token": IMAGE, "image_break_token": BREAK,
                                                                 "image_end_token": END})
    images = PixtralImageProcessorPil(size={"longest_edge": LONGEST}, patch_size={"height": p, "width": p},
                                      image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    return LightOnOcrProcessor(image_processor=images, tokenizer=tokenizer, patch_size=p,
                               spatial_merge_size=cfg.spatial_merge_size, chat_template=tiny_chat_template(IMAGE))


FAMILY = reading_family(
    name="lighton_ocr",
    model_types=("lighton_ocr",),
    features=("decoder: its text family (Qwen3: qwen3), causal over text and image tokens",
              "vision encoder (Pixtral): 2-D rotary of each patch's (row, column), even frequencies on the row, odd "
              "on the column; each picture's patches see their own picture only (block-diagonal)",
              "one [IMG] token per spatial_merge_size x spatial_merge_size patches, row by row"),
    refuses=(*both_refusals()[:1], Refusal("vision rotary", _axial)),  # Pixtral is verified here, not by a family
    tiny_config=_tiny_config,
    vision_language=VisionLanguage(vision=pixtral_stack(_tower), vision_family="pixtral", image_units=_image_units,
                                   tiny_processor=_tiny_processor, image_tokens=lambda cfg: (IMAGE, BREAK, END),
                                   picture=_picture),
)
