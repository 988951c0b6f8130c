"""Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE and Qwen3.5 (Qwen2VLForConditionalGeneration, ...): a vision
encoder over flattened patches with a 2-D rotary (Qwen2.5-VL: windows; Qwen3-VL: learned positions and deepstack
features), a merger of 2 × 2 patches into one token, and a decoder with multimodal 3-D rotary positions (time,
row, column).

The processor expands each `<|image_pad|>` slot (between `<|vision_start|>` and `<|vision_end|>`) into one
token per merged cell of the resized picture, row by row (`probe.mrope.qwen_vl_positions`). The decoder stays
causal; its layers are verified by the `qwen2_vl` / `qwen3_vl` text family (Qwen3.5's hybrid decoder: the
`qwen3_next` family, its softmax-attention layers only, partial rotary) at the model's own 3-D positions
(`probe.mrope.at_positions`). transformers' Qwen-VL vision attention returns its output, not its weights, so
the vision encoder's layers are verified on their block outputs after `proj`, segment by segment
(`probe.qwen_vision`): their rows have no probability error to show.
"""

from __future__ import annotations

import torch

from ._reading import (both_refusals, grid_units, images_only, load_images_only, reading_family, text_config,
                       text_family, tiny_chat_template)
from ..family import Stack, VisionLanguage

START, IMAGE, END, VIDEO = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"
MERGE, PATCH, TEMPORAL = 2, 2, 2  # tiny models: 2 × 2 pixel patches, 2 × 2 merge, 2 frames per temporal patch
HYBRID = ("qwen3_5", "qwen3_5_moe")  # Qwen3.5: a hybrid decoder (gated delta-net layers) with partial 3-D rotary
TINY_SIDE = 16  # tiny models read a 16 × 16 picture: 8 × 8 patches, 4 × 4 merged tokens
VISION = {  # tiny vision encoders (as tests/test_qwen_vl.py builds them)
    "qwen2_vl": dict(depth=2, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=2),
    "qwen2_5_vl": dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                       window_size=8, fullatt_block_indexes=[1]),
    "qwen3_vl": dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                     num_position_embeddings=16, deepstack_visual_indexes=[0]),
    "qwen3_5": dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                    num_position_embeddings=16),
    "qwen3_5_moe": dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                        num_position_embeddings=16),
    "qwen3_vl_moe": dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                         num_position_embeddings=16, deepstack_visual_indexes=[0]),
}



def _visual(base):
    return base.visual


def image_units(cfg, inputs: dict, image: int) -> list:
    """Image `image`'s merged cells, row by row: its (t, h, w) patches make (h / m) × (w / m) tokens."""
    _, h, w = (int(x) for x in inputs["image_grid_thw"][image])
    merge = cfg.vision_config.spatial_merge_size
    return grid_units(image, h // merge, w // merge)


def decoder_at(model, cfg, ids, inputs):
    """The decoder's layers at this input's own 3-D positions (the model's `get_rope_index`)."""
    from ..mrope import at_positions, qwen_vl_positions

    grid = None if inputs is None else inputs.get("image_grid_thw")
    position_ids = qwen_vl_positions(model, ids, image_grid_thw=grid).position_ids
    text, scheme = text_config(cfg), text_family(cfg).mrope  # the decoder family hands down its scheme
    return lambda spec: at_positions(spec, text, position_ids, scheme=scheme)


def _vision_outputs(stack: Stack, base, cfg, inputs) -> list[float]:
    """Each vision layer's relative |Δ| of its block output after `proj` (`probe.qwen_vision.block_output_errors`):
    the vision attention returns no weights to compare."""
    from ..qwen_vision import block_output_errors

    return block_output_errors(stack, _visual, base, cfg, inputs)


def _vision_stack() -> Stack:
    from ..qwen_vision import visual_stack

    return visual_stack(_visual)


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    from . import family_of_type

    # the tokenizer's last four tokens are <|vision_start|>, <|image_pad|>, <|vision_end|>, <|video_pad|>
    text = family_of_type(f"{model_type}_text").tiny_config(vocab, f"{model_type}_text")
    if model_type in HYBRID:  # Qwen3.5: 16-dim heads, half of them rotated: 4 frequencies in 3-D sections
        text.head_dim = 16
        text.rope_parameters = {**text.rope_parameters, "mrope_section": [2, 1, 1], "mrope_interleaved": True}
    vision = dict(VISION[model_type], patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=TEMPORAL)
    return AutoConfig.for_model(model_type, text_config=text.to_dict(), vision_config=vision,
                                vision_start_token_id=vocab - 4, image_token_id=vocab - 3, vision_end_token_id=vocab - 2,
                                video_token_id=vocab - 1)


def _tiny_processor(cfg, tokenizer):
    import transformers

    from ._reading import composite

    # Qwen3-VL-MoE's and Qwen3.5's checkpoints name Qwen3VLProcessor (transformers has no processor of their own)
    kind = "Qwen2VLProcessor" if composite(cfg).model_type in ("qwen2_vl", "qwen2_5_vl") else "Qwen3VLProcessor"
    pixels = TINY_SIDE * TINY_SIDE
    images = transformers.Qwen2VLImageProcessorPil(
        size={"shortest_edge": pixels, "longest_edge": pixels}, patch_size=PATCH, merge_size=MERGE,
        temporal_patch_size=TEMPORAL, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    return images_only(getattr(transformers, kind))(image_processor=images, tokenizer=tokenizer,
                                                      chat_template=tiny_chat_template(START + IMAGE + END))


def picture(cfg, inputs: dict, image: int) -> torch.Tensor:
    """Image `image` (3, H, W) as the model saw it (normalised), from the processor's flattened patches."""
    vision = cfg.vision_config
    return grid_picture(inputs, image, vision.spatial_merge_size, vision.patch_size, vision.temporal_patch_size)


def grid_picture(inputs: dict, image: int, merge: int, patch: int, frames: int = 1) -> torch.Tensor:
    """Image `image` (3, H, W) from flattened patches laid out as Qwen-VL's processor writes them (also RiceViT's
    and VideoLLaMA3's: `image_grid_thw` rows, `frames` = 1 where a patch has no time axis): each row holds
    (channel, frame, p, p) of one patch, the patches block-major over the m × m merge blocks."""
    grid = inputs["image_grid_thw"]
    t, h, w = (int(x) for x in grid[image])
    first = int(grid[:image].prod(-1).sum())
    rows = inputs["pixel_values"][first : first + t * h * w]
    m, p = merge, patch
    x = rows.reshape(t, h // m, w // m, m, m, -1, frames, p, p)[0, :, :, :, :, :, 0]  # (h/m, w/m, m, m, C, p, p)
    return x.permute(4, 0, 2, 5, 1, 3, 6).reshape(-1, h * p, w * p)


FAMILY = reading_family(
    name="qwen_vl",
    model_types=("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"),
    features=("decoder: the qwen2_vl / qwen3_vl text family (Qwen3.5: qwen3_next, its attention layers) at the model's "
              "own 3-D positions (time, row, column)",
              "vision encoder: 2-D rotary, per image (Qwen2.5-VL: windows), verified on block outputs (its attention "
              "returns no weights)", "one image token per 2 × 2 merged cell, row by row"),
    refuses=both_refusals()[:1],
    tiny_config=_tiny_config,
    vision_language=VisionLanguage(vision=_vision_stack(), vision_family="qwen_vision", image_units=image_units,
                                   tiny_processor=_tiny_processor, image_tokens=lambda cfg: (START, IMAGE, END, VIDEO),
                                   decoder_at=decoder_at, vision_outputs=_vision_outputs, picture=picture,
                                   load_processor=load_images_only),
)
