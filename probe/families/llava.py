"""LLaVA: a CLIP (or SigLIP) vision tower, a two-layer projector, and a text decoder (Llama, Mistral, Qwen2) that
reads the projected patches where the text's `<image>` tokens stand.

The processor turns each `<image>` slot into one image token per patch of the resized picture (row by row; with
`vision_feature_select_strategy="full"` the tower's CLS token first). The decoder's mask stays causal over text
and image tokens alike, so the decoder is verified by its text family on the merged input embeddings, and the
vision tower by `clip_vision` on the pixels.
"""

from __future__ import annotations

from ._reading import grid_units, reading_family, tiny_chat_template, tiny_parts, tiny_pil_processor, tower_reading

IMAGE_TOKEN = "<image>"




def _image_units(cfg, inputs: dict, image: int) -> list:
    """Image `image`'s units: its patches row by row (after the CLS token where the strategy keeps it)."""
    vision = cfg.vision_config
    patch = vision.patch_size
    height, width = inputs["pixel_values"][image].shape[-2:]
    before = ("<image_cls>",) if cfg.vision_feature_select_strategy == "full" and vision.model_type.startswith("clip") else ()
    return grid_units(image, height // patch, width // patch, before=before)


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    # the tokenizer's last token is <image> (added by tiny_model before the config is made)
    return AutoConfig.for_model(model_type, **tiny_parts(model_type, vocab), image_token_id=vocab - 1,
                                projector_hidden_act="gelu", vision_feature_layer=-1,
                                vision_feature_select_strategy="default")


def _tiny_processor(cfg, tokenizer):
    from transformers import LlavaProcessor

    vision = cfg.vision_config
    return LlavaProcessor(image_processor=tiny_pil_processor(vision.image_size, "CLIPImageProcessorPil",
                                                             crop_size={"height": vision.image_size,
                                                                        "width": vision.image_size}),
                          tokenizer=tokenizer, patch_size=vision.patch_size, vision_feature_select_strategy="default",
                          num_additional_image_tokens=1, chat_template=tiny_chat_template(IMAGE_TOKEN), image_token=IMAGE_TOKEN)


FAMILY = reading_family(
    name="llava",
    model_types=("llava",),
    features=("decoder: its text family's attention (Llama, Mistral, Qwen2), causal over text and image tokens",
              "vision tower: clip_vision (CLIP, SigLIP)", "one image token per patch, row by row"),
    tiny_config=_tiny_config,
    vision_language=tower_reading(image_units=_image_units,
                                   tiny_processor=_tiny_processor, image_tokens=lambda cfg: (IMAGE_TOKEN,)),
)
