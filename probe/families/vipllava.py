"""ViP-LLaVA (VipLlavaForConditionalGeneration): LLaVA with a CLIP tower whose features are read from several of
its layers at once (`vision_feature_layer`: -2, -5, -8, -11 and 6 in the released checkpoints), concatenated and
layer-normed before the projector, and a Llama decoder.

The tower's CLS token is always dropped, so the processor (LlavaProcessor, strategy "default") expands each
`<image>` slot into one image token per patch, row by row. Which layers feed the projector changes what the
image tokens carry, not how any layer attends: the decoder is causal over text and image tokens alike, verified
by its text family (llama); the tower by `clip_vision`, every layer of it.
"""

from __future__ import annotations

from ._reading import grid_units, reading_family, tiny_chat_template, tiny_parts, tiny_pil_processor, tower_reading
from .llava import IMAGE_TOKEN


def _image_units(cfg, inputs: dict, image: int) -> list:
    """Image `image`'s patches row by row (the CLS token is never read)."""
    patch = cfg.vision_config.patch_size
    height, width = inputs["pixel_values"][image].shape[-2:]
    return grid_units(image, height // patch, width // patch)


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    # the tokenizer's last token is <image>; the tiny tower has 2 layers (3 hidden states): read the first layer's
    # output and the last's, as the real ones read an early and several late layers
    return AutoConfig.for_model(model_type, **tiny_parts(model_type, vocab), image_token_index=vocab - 1,
                                vision_feature_layers=[-1, 1])


def _tiny_processor(cfg, tokenizer):
    from transformers import LlavaProcessor

    vision = cfg.vision_config
    images = tiny_pil_processor(vision.image_size, "CLIPImageProcessorPil",
                                crop_size={"height": vision.image_size, "width": vision.image_size})
    return LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=vision.patch_size,
                          vision_feature_select_strategy="default", num_additional_image_tokens=1,
                          chat_template=tiny_chat_template(IMAGE_TOKEN), image_token=IMAGE_TOKEN)


FAMILY = reading_family(
    name="vipllava",
    model_types=("vipllava",),
    features=("decoder: its text family (Llama), causal over text and image tokens",
              "vision tower: clip_vision (CLIP), features of several layers concatenated",
              "one image token per patch, row by row (no CLS)"),
    tiny_config=_tiny_config,
    vision_language=tower_reading(image_units=_image_units, tiny_processor=_tiny_processor,
                                   image_tokens=lambda cfg: (IMAGE_TOKEN,)),
)
