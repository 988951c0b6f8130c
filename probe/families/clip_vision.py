"""The vision towers of CLIP, SigLIP and SigLIP 2 (image encoders): CLIPVisionModel, SiglipVisionModel,
Siglip2VisionModel.

CLIP puts a CLS token before the patches; SigLIP has none (it pools with an attention head after the
last layer, which is not a layer of self-attention and is not shown). Positions are absolute
embeddings added before the first layer. The two towers of a CLIP model never attend to each other:
there is no cross-attention between image and text in CLIP or SigLIP.

The composites CLIP, SigLIP and SigLIP 2 (model types "clip", "siglip", "siglip2") are declared here too
(`towers`): their image tower is this family's, their text tower `clip_text`'s or `siglip_text`'s.

SigLIP 2 (naflex) keeps each image's aspect ratio: its processor cuts a grid of its own per image
(`spatial_shapes`, rows × columns, at most `max_num_patches`), pads the patch rows and masks the padding
(`pixel_attention_mask`); its position embeddings are resized to that grid. headscope reads the grid from
`spatial_shapes` (so each patch's (row, column) is right) and gives the model the real patches only, a
mask of ones: the padding keys are masked out of every real row, so the real rows are the same.
"""

from __future__ import annotations

from ..family import Family, Towers
from ._vision import IMAGE_SIZE, PATCH_SIZE, out_projection, projection_spec, tiny_image_processor, tiny_vision_config


def _attn(base, i: int):
    return base.encoder.layers[i].self_attn


def _prefix(cfg) -> tuple[str, ...]:
    return ("[CLS]",) if cfg.model_type.startswith("clip") else ()


def _tiny_config(vocab: int, model_type: str):
    if model_type == "siglip2_vision_model":  # no image_size: a 4 x 4 table of positions, resized to each grid
        return tiny_vision_config(model_type, num_patches=(IMAGE_SIZE // PATCH_SIZE) ** 2)
    return tiny_vision_config(model_type)


def _tiny_processor(cfg):
    if cfg.model_type != "siglip2_vision_model":
        return tiny_image_processor(cfg)
    from transformers import Siglip2ImageProcessorPil

    return Siglip2ImageProcessorPil(patch_size=cfg.patch_size, max_num_patches=cfg.num_patches,
                                    image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])


FAMILY = Family(
    name="clip_vision",
    model_types=("clip_vision_model", "siglip_vision_model", "siglip2_vision_model"),
    kind="encoder",
    features=("image patches (+ CLIP's CLS)", "absolute positions (already in the layer input)", "bidirectional",
              "SigLIP 2: a grid per image (naflex, read from spatial_shapes)"),
    layer_spec=lambda base, i, cfg: projection_spec(_attn(base, i)),
    attention=_attn,
    out_proj=lambda base, i: out_projection(_attn(base, i)),
    refuses=(),
    tiny_config=_tiny_config,
    tokenizer=None,
    auto_class="AutoModel",
    modality="image",
    prefix_tokens=_prefix,
    tiny_processor=_tiny_processor,
    # the two-tower composites whose image tower this is: an image tower and a text tower that never attend to each
    # other, compared only by their pooled embeddings (probe.towers); every command reaches a tower through
    # probe.images.for_input / tower. A saved SigLIP 2 folder reloads as transformers' Siglip2Tokenizer whatever
    # was saved, which needs an <unk>.
    towers={"clip": Towers(), "siglip": Towers(), "siglip2": Towers(tiny_tokenizer="sentencepiece")},
    tiny_std=0.5,  # patch embeddings of a smooth image are alike: 0.2 would leave the attention near uniform
)
