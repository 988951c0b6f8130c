"""Janus and Janus-Pro (JanusForConditionalGeneration) reading an image: a SigLIP-like vision model, a two-layer
aligner, and a Llama decoder. (Janus also writes images through a VQ-VAE and a head of its own; reading one
does not run them.)

The image processor resizes each picture so that its longer side is `size` and pads the shorter one, centred,
with the mean colour, to a square. The processor expands each `<image_placeholder>` slot into
`<begin_of_image>`, `num_image_tokens` image tokens (one per patch of the square, row by row: the vision model
has no CLS token) and `<end_of_image>`. The decoder is causal over text and image tokens alike, verified by its
text family (llama). The vision model's attention is SigLIP's (q, k, v with biases, scale 1/√d, bidirectional,
positions added to the patch embeddings), its output projection named `projection_layer`; its optional q/k norm
(`use_qk_norm`) is refused.
"""

from __future__ import annotations

from ._reading import both_refusals, composite, grid_units, reading_family, tiny_chat_template, tiny_pil_processor
from ._vision import out_projection, projection_spec, tiny_vision_config
from ..family import Refusal, Stack, VisionLanguage

IMAGE, BOI, EOI = "<image_placeholder>", "<begin_of_image>", "<end_of_image>"


def _attention(base, i: int):
    return base.vision_model.encoder.layers[i].self_attn


VISION = Stack(kind="vision", layer_spec=lambda base, i, cfg: projection_spec(_attention(base, i)),
               attention=_attention, out_proj=lambda base, i: out_projection(_attention(base, i)),
               n_layers=lambda cfg: composite(cfg).vision_config.num_hidden_layers)


def _qk_norm(cfg) -> str | None:
    if composite(cfg).vision_config.use_qk_norm:
        return "Janus's vision q/k norm (use_qk_norm=True) is not reproduced"
    return None


def _image_units(cfg, inputs: dict, image: int) -> list:
    """The padded square's patches, row by row."""
    vision = cfg.vision_config
    side = vision.image_size // vision.patch_size
    return grid_units(image, side, side)


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    # the tokenizer's last three tokens are <image_placeholder>, <begin_of_image>, <end_of_image>
    from . import family_of_type

    kind = AutoConfig.for_model(model_type).text_config.model_type  # the decoder type Janus's config defaults to
    text = family_of_type(kind).tiny_config(vocab, kind).to_dict()
    width = text["hidden_size"]
    vision = tiny_vision_config("janus_vision_model", projection_dim=width, depth=2).to_dict()
    vision["num_image_tokens"] = (vision["image_size"] // vision["patch_size"]) ** 2
    # the image-writing parts, as small as they build (32 channels: its group norms take 32 groups): 16 codes
    vq = dict(embed_dim=8, num_embeddings=16, latent_channels=32, base_channels=32, channel_multiplier=[1, 1],
              num_res_blocks=1, num_patches=4, projection_dim=width, image_token_embed_dim=width)
    return AutoConfig.for_model(model_type, text_config=text, vision_config=vision, vq_config=vq,
                                image_token_id=vocab - 3)


def _tiny_processor(cfg, tokenizer):
    from transformers import JanusProcessor

    vision = cfg.vision_config
    size = vision.image_size
    # named special tokens, as Janus's tokenizer has them (kept by save_pretrained)
    tokenizer._set_model_specific_special_tokens(special_tokens={"image_token": IMAGE, "boi_token": BOI,
                                                                 "eoi_token": EOI})
    images = tiny_pil_processor(size, "JanusImageProcessorPil", min_size=4)
    return JanusProcessor(image_processor=images, tokenizer=tokenizer, chat_template=tiny_chat_template(IMAGE),
                          num_image_tokens=(size // vision.patch_size) ** 2)


FAMILY = reading_family(
    name="janus",
    model_types=("janus",),
    features=("decoder: its text family (Llama), causal over text and image tokens",
              "vision model: SigLIP's attention (q/k/v biases, bidirectional, absolute positions already in the "
              "layer input)", "one image token per patch of the picture padded to a square, row by row, between "
              "<begin_of_image> and <end_of_image>"),
    refuses=(*both_refusals()[:1], Refusal("vision q/k norm", _qk_norm)),
    tiny_config=_tiny_config,
    vision_language=VisionLanguage(vision=VISION, vision_family="janus", image_units=_image_units,
                                   tiny_processor=_tiny_processor, image_tokens=lambda cfg: (IMAGE, BOI, EOI)),
)
