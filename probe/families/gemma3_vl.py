"""Gemma 3 with vision (`model_type` "gemma3", Gemma3ForConditionalGeneration): a SigLIP vision tower, its patch
features average-pooled to `mm_tokens_per_image` tokens (a square grid) and projected, and the Gemma 3 text
decoder.

The text's slot is `<start_of_image>`; the processor expands it to `\\n\\n<start_of_image>`, the image's tokens
(row by row over the pooled grid) and `<end_of_image>\\n\\n`. The decoder's mask is not purely causal: the image
tokens of one image attend to each other both ways (`token_type_ids` mark them; transformers' blockwise
overlay: causal OR same image, then the sliding window on sliding layers), while text stays causal. The decoder
is verified by the `gemma3` text family with those blocks, the vision tower by `clip_vision`.
"""

from __future__ import annotations

import torch

from ._reading import grid_units, reading_family, tiny_chat_template, tiny_parts, tiny_pil_processor, tower_reading

BOI, IMAGE, EOI = "<start_of_image>", "<image_soft_token>", "<end_of_image>"


def image_units(cfg, inputs: dict, image: int) -> list:
    """The pooled grid: `mm_tokens_per_image` tokens, a square, each the mean of a block of patches."""
    side = int(round(cfg.mm_tokens_per_image**0.5))
    return grid_units(image, side, side)


def image_blocks(cfg, token_type_ids, ids, layer: int):
    """One block per image: the image tokens of one run of `token_type_ids == 1` (transformers'
    `get_block_sequence_ids_for_mask`); text tokens -1. The same on full and sliding layers."""
    if token_type_ids is None:
        return None
    is_image = token_type_ids == 1
    start = is_image & ~torch.nn.functional.pad(is_image, (1, 0), value=False)[:, :-1]
    group = torch.cumsum(start.int(), dim=1) - 1
    return torch.where(is_image, group, -1)


def tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    # the tokenizer's last three tokens are <start_of_image>, <image_soft_token>, <end_of_image>
    return AutoConfig.for_model(model_type, **tiny_parts(model_type, vocab), mm_tokens_per_image=4,
                                boi_token_index=vocab - 3, image_token_index=vocab - 2, eoi_token_index=vocab - 1)


def _tiny_processor(cfg, tokenizer):
    from transformers import Gemma3Processor

    return processor_on(Gemma3Processor, cfg, tokenizer)


def processor_on(cls, cfg, tokenizer):
    """Processor class `cls` (Gemma 3's, ShieldGemma 2's) on the tiny tokenizer and a tiny PIL image processor."""
    # named special tokens, as Gemma 3's tokenizer has them (kept by save_pretrained)
    tokenizer._set_model_specific_special_tokens(special_tokens={"boi_token": BOI, "image_token": IMAGE,
                                                                 "eoi_token": EOI})
    size = cfg.vision_config.image_size
    return cls(image_processor=tiny_pil_processor(size, "Gemma3ImageProcessorPil"), tokenizer=tokenizer,
                           image_seq_length=cfg.mm_tokens_per_image, chat_template=tiny_chat_template(BOI))


FAMILY = reading_family(
    name="gemma3_vl",
    model_types=("gemma3",),
    features=("decoder: the gemma3 text family", "each image's tokens attend to each other both ways, text causal "
              "(token_type_ids blocks, then the sliding window)", "vision tower: clip_vision (SigLIP)",
              "image tokens on the pooled square grid (mm_tokens_per_image)"),
    tiny_config=tiny_config,
    tokenizer="sentencepiece",
    vision_language=tower_reading(image_units=image_units,
                                   tiny_processor=_tiny_processor, image_tokens=lambda cfg: (BOI, IMAGE, EOI),
                                   blocks=image_blocks),
)
