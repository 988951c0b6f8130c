"""EXAONE 4.5 (`model_type` "exaone4_5", Exaone4_5_ForConditionalGeneration): Qwen2.5-VL's vision encoder (flattened
patches, 2-D rotary, windows between full-attention blocks, 2 × 2 merge) with grouped-query attention in its
vision blocks, and an EXAONE 4 decoder.

The processor (Exaone4_5_Processor, Qwen2-VL's image processor) expands each `<|image_pad|>` slot into one token per
merged cell of the resized picture, row by row, as Qwen-VL's does. Unlike Qwen-VL, the decoder reads plain 1-D
positions (transformers' `Exaone4_5_Model` passes `arange` and has no 3-D rotary index), so its layers are verified
by the `qwen3` family's EXAONE 4 (QK norm, sliding and full layers) at their own positions. The vision blocks fuse
q, k and v in one `qkv` whose key and value parts have `num_key_value_heads` heads; their attention returns no
weights, so they are verified on their block outputs as Qwen-VL's are (`probe.qwen_vision.block_output_errors`).
"""

from __future__ import annotations

import dataclasses

from ..family import VisionLanguage, linear_weights
from ..scratch import LayerSpec
from ._reading import both_refusals, images_only, load_images_only, reading_family, tiny_chat_template
from .qwen_vl import END, IMAGE, START, VIDEO, image_units, picture

MERGE, PATCH, TEMPORAL, TINY_SIDE = 2, 2, 2, 16  # as qwen_vl's tiny models: 16 × 16 pictures, 4 × 4 merged tokens


def _visual(base):
    return base.visual


def vision_layer_spec(base, i: int, cfg) -> LayerSpec:
    """Vision block `i`: q (`num_heads` heads), k and v (`num_key_value_heads` heads each) from one fused `qkv`,
    the output projection `proj`, bidirectional within its segment (the rotary is set per segment)."""
    attn = _visual(base).blocks[i].attn
    (w, b), (wo, bo) = linear_weights(attn.qkv), linear_weights(attn.proj)
    sizes = [attn.q_dim, attn.kv_dim, attn.kv_dim]
    (wq, wk, wv), (bq, bk, bv) = w.split(sizes), b.split(sizes)
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=attn.num_heads, n_kv_heads=attn.num_key_value_heads,
                     head_dim=attn.head_dim, scale=float(attn.scaling), causal=False)


def vision_stack():
    from ..qwen_vision import visual_stack

    return dataclasses.replace(visual_stack(_visual), layer_spec=vision_layer_spec)


def _vision_outputs(stack, base, cfg, inputs) -> list[float]:
    from ..qwen_vision import block_output_errors

    return block_output_errors(stack, _visual, base, cfg, inputs)


def tiny_vision(text_hidden: int) -> dict:
    """A tiny Qwen2.5-VL-style vision config with grouped-query heads: one window block, then a full-attention one."""
    return dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, num_key_value_heads=1,
                out_hidden_size=text_hidden, window_size=8, fullatt_block_indexes=[1], patch_size=PATCH,
                spatial_merge_size=MERGE, temporal_patch_size=TEMPORAL)


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    from . import family_of_type

    # the tokenizer's last four tokens are <|vision_start|>, <|image_pad|>, <|vision_end|>, <|video_pad|>
    kind = AutoConfig.for_model(model_type).text_config.model_type  # the decoder type of its default config
    text = family_of_type(kind).tiny_config(vocab, kind)
    return AutoConfig.for_model(model_type, text_config=text.to_dict(), vision_config=tiny_vision(text.hidden_size),
                                image_token_id=vocab - 3, video_token_id=vocab - 1)


def tiny_processor(cfg, tokenizer):
    """Exaone4_5_Processor (images only) on a tiny Qwen2-VL image processor: 16 × 16 pictures, 2-pixel patches."""
    import transformers

    pixels = TINY_SIDE * TINY_SIDE
    images = transformers.Qwen2VLImageProcessorPil(
        size={"shortest_edge": pixels, "longest_edge": pixels}, patch_size=PATCH, merge_size=MERGE,
        temporal_patch_size=TEMPORAL, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    return images_only(transformers.Exaone4_5_Processor)(image_processor=images, tokenizer=tokenizer,
                                                        chat_template=tiny_chat_template(START + IMAGE + END))


FAMILY = reading_family(
    name="exaone4_5",
    model_types=("exaone4_5",),
    features=("decoder: the qwen3 text family's EXAONE 4 (sliding and full layers) at 1-D positions",
              "vision encoder: Qwen2.5-VL's (2-D rotary, windows between full-attention blocks) with grouped-query "
              "heads, verified on block outputs (its attention returns no weights)",
              "one image token per 2 × 2 merged cell, row by row"),
    refuses=both_refusals()[:1],
    tiny_config=_tiny_config,
    vision_language=VisionLanguage(vision=vision_stack(), vision_family="qwen_vision", image_units=image_units,
                                   tiny_processor=tiny_processor, image_tokens=lambda cfg: (START, IMAGE, END, VIDEO),
                                   vision_outputs=_vision_outputs, picture=picture, load_processor=load_images_only),
)
