"""LLaVA-OneVision-1.5 (`model_type` "llava_onevision1_5", LlavaOnevision15ForConditionalGeneration): a RiceViT vision
encoder (GLM-Image's blocks, Qwen2.5-VL's fused-qkv attention and 2-D rotary, no windows) with a class token before
each image's patches, a merger of 2 × 2 patches into one token, and a Qwen3 decoder at 1-D positions (transformers'
model is EXAONE 4.5's, whose decoder reads `arange` positions).

The processor (Exaone4_5_Processor on Qwen2-VL's image processor, one frame per patch: the patch embedding is a 2-D
convolution) expands each `<|image_pad|>` slot into one token per merged cell, row by row. The vision blocks attend
within each image and its class token (the model's `cu_seqlens` shifted by one per image); the class token is turned
by its own learned rotary angles (`cls_embeddings.class_pos_emb`), the patches by the 2-D rotary of their row and
column. The attention returns no weights, so the blocks are verified on their outputs after `proj`; the class token
is dropped before the merger, so no image token stands for it.
"""

from __future__ import annotations


import torch

from ..family import VisionLanguage
from ..qwen_vision import segment_error, vision_calls
from ._reading import both_refusals, images_only, load_images_only, reading_family, tiny_chat_template
from .qwen_vl import END, IMAGE, START, VIDEO, grid_picture, image_units

MERGE, PATCH, TINY_SIDE = 2, 2, 16  # tiny models: 16 × 16 pictures of 2-pixel patches, 4 × 4 merged tokens


def _visual(base):
    return base.visual


def _vision_stack():
    from ..qwen_vision import visual_stack

    return visual_stack(_visual)


def vision_angles_with_cls(visual, grid: torch.Tensor) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """The rotary angles (N, head_dim / 2) of every token the blocks see, and each image's (start, stop) segment:
    per image its class token (the learned `class_pos_emb`), then its patches block-major over the merge blocks,
    each by its (row, column) (`probe.qwen_vision.vision_angles`)."""
    from transformers.vision_utils import get_vision_position_ids

    from ..qwen_vision import vision_angles

    patches = vision_angles(visual, get_vision_position_ids(grid, visual.spatial_merge_size))
    cls = visual.cls_embeddings.class_pos_emb.detach().float().reshape(1, -1)
    angles, segments, first, at = [], [], 0, 0
    for n in (grid[:, 1] * grid[:, 2]).repeat_interleave(grid[:, 0]).tolist():
        angles += [cls, patches[first : first + n]]
        segments.append((at, at + n + 1))
        first, at = first + n, at + n + 1
    return torch.cat(angles), segments


def _vision_outputs(stack, base, cfg, inputs) -> list[float]:
    """Each vision block's relative |Δ| of its output after `proj`, recomputed from its captured input image by image
    (class token included) with the angles of `vision_angles_with_cls`."""

    visual = _visual(base)
    pixels, grid = inputs["pixel_values"], inputs["image_grid_thw"]
    n = len(visual.blocks)
    ins, cus, outs = vision_calls(lambda: visual(pixels.to(next(visual.parameters()).dtype), grid_thw=grid),
                                  [block.attn for block in visual.blocks], [block.attn.proj for block in visual.blocks])
    angles, segments = vision_angles_with_cls(visual, grid)
    errors = []
    for i in range(n):
        if cus[i] is not None and [0, *(b for _, b in segments)] != cus[i].tolist():
            errors.append(float("inf"))  # the model's own segments are not ours
            continue
        errors.append(segment_error(stack.layer_spec(base, i, cfg), ins[i], outs[i], angles, segments))
    return errors


def _picture(cfg, inputs: dict, image: int) -> torch.Tensor:
    """Image `image` (3, H, W) as the model saw it: Qwen-VL's patch layout, no time axis."""
    return grid_picture(inputs, image, cfg.vision_config.spatial_merge_size, cfg.vision_config.patch_size)


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    from . import family_of_type

    # the tokenizer's last four tokens are <|vision_start|>, <|image_pad|>, <|vision_end|>, <|video_pad|>
    kind = AutoConfig.for_model(model_type).text_config.model_type  # the decoder type of its default config
    text = family_of_type(kind).tiny_config(vocab, kind)
    vision = dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=text.hidden_size,
                  patch_size=PATCH, spatial_merge_size=MERGE)
    return AutoConfig.for_model(model_type, text_config=text.to_dict(), vision_config=vision,
                                vision_start_token_id=vocab - 4, image_token_id=vocab - 3, vision_end_token_id=vocab - 2,
                                video_token_id=vocab - 1)


def _tiny_processor(cfg, tokenizer):
    import transformers

    pixels = TINY_SIDE * TINY_SIDE
    images = transformers.Qwen2VLImageProcessorPil(
        size={"shortest_edge": pixels, "longest_edge": pixels}, patch_size=PATCH, merge_size=MERGE,
        temporal_patch_size=1, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    return images_only(transformers.Exaone4_5_Processor)(image_processor=images, tokenizer=tokenizer,
                                                        chat_template=tiny_chat_template(START + IMAGE + END))


FAMILY = reading_family(
    name="llava_onevision1_5",
    model_types=("llava_onevision1_5",),
    features=("decoder: the qwen3 text family at 1-D positions",
              "vision encoder: RiceViT, a class token before each image's patches (its own learned rotary angles), "
              "2-D rotary, per image; verified on block outputs (its attention returns no weights)",
              "one image token per 2 × 2 merged cell, row by row (the class token dropped)"),
    refuses=both_refusals()[:1],
    tiny_config=_tiny_config,
    vision_language=VisionLanguage(vision=_vision_stack(), vision_family="qwen_vision", image_units=image_units,
                                   tiny_processor=_tiny_processor, image_tokens=lambda cfg: (START, IMAGE, END, VIDEO),
                                   vision_outputs=_vision_outputs, picture=_picture, load_processor=load_images_only),
)
