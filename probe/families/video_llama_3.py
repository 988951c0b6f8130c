"""VideoLLaMA 3 (`model_type` "video_llama_3", VideoLlama3ForConditionalGeneration): a SigLIP vision encoder over
flattened patches with a 2-D rotary (Qwen2.5-VL's axial one), each image attending to itself, its features
downsampled by the image's merge size (bilinear, `pixel_unshuffle`) and projected, and a Qwen2 decoder at 1-D
positions (the model has no 3-D rotary index).

The processor (VideoLlama3Processor, its own image processor on the PIL path) expands each `<|image_pad|>` slot into
one token per merged cell of the resized picture, row by row: the image's (t, h, w) patches and its merge size m
(`image_merge_sizes`: 1 for images in the checkpoints, 2 for video frames) make (h / m) × (w / m) tokens. The
vision attention runs per image segment and is verified on its outputs after `out_proj`, recomputed with the 2-D
rotary of each patch's row and column (`probe.qwen_vision.vision_angles`); the decoder by its text family (llama).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ..family import Stack, VisionLanguage
from ..qwen_vision import segment_error, vision_calls
from ._reading import both_refusals, grid_units, images_only, load_images_only, reading_family, tiny_chat_template
from ._vision import projection_spec
from .qwen_vl import grid_picture

IMAGE, VIDEO = "<|image_pad|>", "<|video_pad|>"
PATCH, TINY_SIDE = 2, 16  # tiny models: 16 × 16 pictures of 2-pixel patches


def _visual(base):
    return base.vision_model


def _layer(base, i: int):
    return _visual(base).encoder.layers[i].self_attn


VISION = Stack(kind="vision", layer_spec=lambda base, i, cfg: projection_spec(_layer(base, i)), attention=_layer,
               out_proj=lambda base, i: _layer(base, i).out_proj,
               n_layers=lambda cfg: getattr(cfg, "composite", cfg).vision_config.num_hidden_layers)


def _merge(inputs: dict, image: int) -> int:
    return int(inputs["image_merge_sizes"][image])


def _image_units(cfg, inputs: dict, image: int) -> list:
    """Image `image`'s merged cells, row by row: its (t, h, w) patches and merge size m make (h / m) × (w / m)."""
    _, h, w = (int(x) for x in inputs["image_grid_thw"][image])
    m = _merge(inputs, image)
    return grid_units(image, h // m, w // m)


def _picture(cfg, inputs: dict, image: int) -> torch.Tensor:
    """Image `image` (3, H, W) as the model saw it: Qwen-VL's patch layout at the image's own merge size, no
    time axis."""
    return grid_picture(inputs, image, _merge(inputs, image), cfg.vision_config.patch_size)


def _vision_outputs(stack: Stack, base, cfg, inputs) -> list[float]:
    """Each vision layer's relative |Δ| of its output after `out_proj`, recomputed from its captured input image by
    image, each patch turned by the 2-D rotary of its (row, column) (block-major over the merge blocks)."""
    from transformers.vision_utils import get_vision_position_ids

    from ..qwen_vision import vision_angles

    visual = _visual(base)
    pixels, grid, merges = inputs["pixel_values"], inputs["image_grid_thw"], inputs["image_merge_sizes"]
    layers = visual.encoder.layers
    ins, cus, outs = vision_calls(
        lambda: visual(pixels.to(next(visual.parameters()).dtype), grid_thw=grid, merge_sizes=merges),
        [layer.self_attn for layer in layers], [layer.self_attn.out_proj for layer in layers])
    # Qwen2.5-VL's axial rotary on this config (which names its head count num_attention_heads)
    own = visual.config
    axial = SimpleNamespace(config=SimpleNamespace(hidden_size=own.hidden_size, num_heads=own.num_attention_heads,
                                                   rope_parameters=own.rope_parameters))
    angles = vision_angles(axial, get_vision_position_ids(grid, merges))
    cu = [0, *torch.cumsum(grid.prod(-1), 0).tolist()]
    segments = [(a, b) for a, b in zip(cu[:-1], cu[1:]) if b > a]
    errors = []
    for i in range(len(layers)):
        if cus[i] is not None and [0, *(b for _, b in segments)] != cus[i].tolist():
            errors.append(float("inf"))  # the model's own segments are not ours
            continue
        errors.append(segment_error(stack.layer_spec(base, i, cfg), ins[i], outs[i], angles, segments))
    return errors


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    from . import family_of_type

    kind = AutoConfig.for_model(model_type).text_config.model_type  # the decoder type of its default config
    text = family_of_type(kind).tiny_config(vocab, kind)
    text.max_position_embeddings = 512  # images unmerged: two pictures and a text take ~140 tokens
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, patch_size=PATCH)
    # the tokenizer's last two tokens are <|image_pad|>, <|video_pad|>
    return AutoConfig.for_model(model_type, text_config=text.to_dict(), vision_config=vision,
                                image_token_id=vocab - 2, video_token_id=vocab - 1)


def _tiny_processor(cfg, tokenizer):
    """VideoLlama3Processor (images only) on its PIL image processor: 16 × 16 pictures, images unmerged (merge 1)."""
    import transformers

    pixels = TINY_SIDE * TINY_SIDE
    images = transformers.VideoLlama3ImageProcessorPil(
        size={"shortest_edge": pixels, "longest_edge": pixels}, patch_size=PATCH, merge_size=1,
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    return images_only(transformers.VideoLlama3Processor)(image_processor=images, tokenizer=tokenizer,
                                                          chat_template=tiny_chat_template(IMAGE))


FAMILY = reading_family(
    name="video_llama_3",
    model_types=("video_llama_3",),
    features=("decoder: its text family (Qwen2: llama) at 1-D positions",
              "vision encoder: SigLIP attention with a 2-D rotary, per image; verified on its outputs (per-segment "
              "attention)", "one image token per merged cell (image_merge_sizes), row by row"),
    refuses=both_refusals()[:1],
    tiny_config=_tiny_config,
    vision_language=VisionLanguage(vision=VISION, vision_family="qwen_vision", image_units=_image_units,
                                   tiny_processor=_tiny_processor, image_tokens=lambda cfg: (IMAGE, VIDEO),
                                   vision_outputs=_vision_outputs, picture=_picture, load_processor=load_images_only),
)
