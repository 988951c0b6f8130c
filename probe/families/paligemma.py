"""PaliGemma (1 and 2): a SigLIP vision tower, one linear projection, and a Gemma (or Gemma 2) decoder with a
prefix-LM mask.

The processor puts the image tokens first (one per patch, row by row), then `<bos>`, the prompt and a newline;
`token_type_ids` mark the prefix (0: image and prompt) and the suffix (1: the answer being generated or trained
on). The image tokens and the prompt attend to each other both ways; the suffix is causal (transformers' blockwise
overlay with block 0 over the prefix, on full and sliding layers alike: on a sliding layer of a Gemma 2 decoder
the block is ORed into the windowed causal mask, so a prefix longer than the window, PaliGemma 2's 4,096 image
tokens at 896 px beside a 4,096-token window, still sees itself whole). The decoder config's
`use_bidirectional_attention` is set by PaliGemma's config, but the mask the decoder runs is the one PaliGemma
builds, so it is not refused here. The decoder is verified by its text family (`llama` for Gemma, `gemma2`) with
that prefix block, the vision tower by `clip_vision`.
"""

from __future__ import annotations

import torch

from ._reading import both_refusals, grid_units, reading_family, tiny_parts, tiny_pil_processor, tower_reading

IMAGE_TOKEN = "<image>"




def _image_units(cfg, inputs: dict, image: int) -> list:
    side = cfg.vision_config.image_size // cfg.vision_config.patch_size
    return grid_units(image, side, side)


def _blocks(cfg, token_type_ids, ids, layer: int):
    """The prefix (token type 0: the images and the prompt) is one block; the suffix (1) is causal."""
    if token_type_ids is None:
        return None
    return torch.where(token_type_ids == 0, 0, -1)


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    parts = tiny_parts(model_type, vocab)  # the tokenizer's last token is <image>
    return AutoConfig.for_model(model_type, **parts, image_token_index=vocab - 1, vocab_size=vocab,
                                projection_dim=parts["text_config"]["hidden_size"],
                                hidden_size=parts["text_config"]["hidden_size"])


def _tiny_processor(cfg, tokenizer):
    from transformers import PaliGemmaProcessor

    size = cfg.vision_config.image_size
    images = tiny_pil_processor(size, "SiglipImageProcessorPil")
    images.image_seq_length = (size // cfg.vision_config.patch_size) ** 2
    tokenizer.image_token, tokenizer.image_token_id = IMAGE_TOKEN, tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    return PaliGemmaProcessor(image_processor=images, tokenizer=tokenizer)


FAMILY = reading_family(
    name="paligemma",
    model_types=("paligemma",),
    features=("decoder: its text family (Gemma: llama; Gemma 2: gemma2)", "prefix-LM mask: image and prompt attend "
              "both ways, the suffix causal (token_type_ids)", "vision tower: clip_vision (SigLIP)",
              "image tokens first, one per patch, row by row"),
    refuses=both_refusals(mask_from_model=True),
    tiny_config=_tiny_config,
    tokenizer="sentencepiece",
    vision_language=tower_reading(image_units=_image_units,
                                   tiny_processor=_tiny_processor, image_tokens=lambda cfg: (IMAGE_TOKEN,),
                                   blocks=_blocks, block_past_window=True),
)
