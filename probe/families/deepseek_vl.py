"""DeepSeek-VL (DeepseekVLForConditionalGeneration, the 1.3B and 7B "chat" checkpoints): a SigLIP vision model, a
two-layer aligner, and a Llama decoder.

The image processor resizes each picture so that its longer side is `size` and pads the shorter one, centred,
with the mean colour, to a square; the tower reads that square. The processor expands each
`<image_placeholder>` slot into `num_image_tokens` image tokens, one per patch of the square, row by row (SigLIP
has no CLS token). The decoder is causal over text and image tokens alike, verified by its text family (llama);
the tower by `clip_vision`.
"""

from __future__ import annotations

from ._reading import grid_units, reading_family, tiny_chat_template, tiny_parts, tiny_pil_processor, tower_reading

IMAGE_TOKEN = "<image_placeholder>"


def _tower(base):
    """Its SiglipVisionModel, which holds its layers itself (an older layout under `.vision_model`)."""
    tower = base.vision_model
    return getattr(tower, "vision_model", tower)


def _image_units(cfg, inputs: dict, image: int) -> list:
    """The padded square's patches, row by row."""
    vision = cfg.vision_config
    side = vision.image_size // vision.patch_size
    return grid_units(image, side, side)


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    # the tokenizer's last token is <image_placeholder>
    return AutoConfig.for_model(model_type, **tiny_parts(model_type, vocab), image_token_id=vocab - 1)


def _tiny_processor(cfg, tokenizer):
    from transformers import DeepseekVLProcessor

    vision = cfg.vision_config
    size = vision.image_size
    # named special token, as DeepSeek-VL's tokenizer has it (kept by save_pretrained)
    tokenizer._set_model_specific_special_tokens(special_tokens={"image_token": IMAGE_TOKEN})
    images = tiny_pil_processor(size, "DeepseekVLImageProcessorPil", min_size=4)
    return DeepseekVLProcessor(image_processor=images, tokenizer=tokenizer, chat_template=tiny_chat_template(IMAGE_TOKEN),
                               num_image_tokens=(size // vision.patch_size) ** 2)


FAMILY = reading_family(
    name="deepseek_vl",
    model_types=("deepseek_vl",),
    features=("decoder: its text family (Llama), causal over text and image tokens", "vision tower: clip_vision (SigLIP)",
              "one image token per patch of the picture padded to a square, row by row"),
    tiny_config=_tiny_config,
    vision_language=tower_reading(tower=_tower, image_units=_image_units,
                                   tiny_processor=_tiny_processor, image_tokens=lambda cfg: (IMAGE_TOKEN,)),
)
