"""GLM-4.1V, GLM-4.5V, GLM-4.6V and GLM-OCR (Glm4vForConditionalGeneration, Glm4vMoe..., Glm46V..., GlmOcr...): a
vision encoder over flattened patches with a 2-D rotary, a spatial merge of 2 × 2 patches into one token (a strided
convolution, `downsample`, then the merger), and a GLM decoder with multimodal 3-D rotary positions.

The vision encoder is Qwen2-VL's in layout (`probe.qwen_vision`): the processor's patches stand in 2 × 2 merge blocks
(block-major), each image attends only to itself, and every layer turns q and k by a 2-D rotary, half of each head's
frequencies by the patch's row, half by its column, rotated half-split. GLM-4V adds learned position embeddings
interpolated (bicubic) to each image's grid before the first layer — they are in every layer's input already —
and RMS norms around the blocks; GLM-OCR drops those embeddings, adds q/k/v and output biases and an RMS norm of
each query and key head before the rotary. transformers' vision attention returns its output, not its weights, so
the vision layers are verified on their block outputs after `proj`, segment by segment
(`qwen_vision.block_output_errors`).

The processor expands each `<|image|>` (between `<|begin_of_image|>` and `<|end_of_image|>`) into one token per
merged cell of the resized picture, row by row, as Qwen-VL's does; the decoder's layers are verified by the
`glm4v_text` family (GLM's partial, pairwise rotary in contiguous M-RoPE sections) at the model's own 3-D positions
(its `get_rope_index`). GLM-4.6V is GLM-4.1V's model under its own config and processor; GLM-4.5V's decoder is a
mixture of experts in its MLP only.
"""

from __future__ import annotations

from ._reading import both_refusals, images_only, load_images_only, reading_family, tiny_chat_template
from .qwen_vl import decoder_at, image_units, picture
from ..family import Stack, VisionLanguage

BEGIN, IMAGE, END = "<|begin_of_image|>", "<|image|>", "<|end_of_image|>"
VIDEO_BEGIN, VIDEO_END, VIDEO = "<|begin_of_video|>", "<|end_of_video|>", "<|video|>"
MERGE, PATCH, TEMPORAL = 2, 2, 2  # tiny models: 2 × 2 pixel patches, 2 × 2 merge, 2 frames per temporal patch
TINY_SIDE = 16  # tiny models read at most 2 frames of 16 × 16 pixels (GLM's pixel budget counts both frames)
# tiny vision encoders: 2 layers of 2 heads of 16 dims (4 rotary frequencies: 2 on the row, 2 on the column), a
# position-embedding table of 8 × 8 patches; out_hidden_size is the decoder's width (the merger's output)
VISION = dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=32, image_size=16)
PROCESSORS = {"glm4v": ("Glm4vProcessor", "Glm4vImageProcessorPil"), "glm4v_moe": ("Glm4vProcessor", "Glm4vImageProcessorPil"),
              "glm46v": ("Glm46VProcessor", "Glm46VImageProcessorPil"),
              # GLM-OCR's checkpoint names GLM-4.6V's processor (transformers maps none to glm_ocr)
              "glm_ocr": ("Glm46VProcessor", "Glm46VImageProcessorPil")}


def _visual(base):
    return base.visual


def _vision_outputs(stack: Stack, base, cfg, inputs) -> list[float]:
    from ..qwen_vision import block_output_errors

    return block_output_errors(stack, _visual, base, cfg, inputs)


def _vision_stack() -> Stack:
    from ..qwen_vision import visual_stack

    return visual_stack(_visual)


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    from . import family_of_type

    # the tokenizer's last six tokens: <|begin_of_image|>, <|image|>, <|end_of_image|>, then the video's three
    text_type = AutoConfig.for_model(model_type).text_config.model_type  # GLM-4.6V's default: GLM-4.1V's decoder
    text = family_of_type(text_type).tiny_config(vocab, text_type)
    vision = dict(VISION, patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=TEMPORAL,
                  out_hidden_size=text.hidden_size, attention_bias=model_type == "glm_ocr")
    return AutoConfig.for_model(model_type, text_config=text.to_dict(), vision_config=vision,
                                image_start_token_id=vocab - 6, image_token_id=vocab - 5, image_end_token_id=vocab - 4,
                                video_start_token_id=vocab - 3, video_end_token_id=vocab - 2, video_token_id=vocab - 1)


def _tiny_processor(cfg, tokenizer):
    import transformers

    from ._reading import composite

    kind, images_kind = PROCESSORS[composite(cfg).model_type]
    pixels = TEMPORAL * TINY_SIDE * TINY_SIDE
    images = getattr(transformers, images_kind)(
        size={"shortest_edge": pixels, "longest_edge": pixels}, patch_size=PATCH, merge_size=MERGE,
        temporal_patch_size=TEMPORAL, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    return images_only(getattr(transformers, kind))(image_processor=images, tokenizer=tokenizer,
                                                      chat_template=tiny_chat_template(BEGIN + IMAGE + END))


FAMILY = reading_family(
    name="glm4v",
    model_types=("glm4v", "glm4v_moe", "glm46v", "glm_ocr"),
    features=("decoder: the glm4v_text family at the model's own 3-D positions (time, row, column)",
              "vision encoder: 2-D rotary, per image, interpolated position embeddings in its input (GLM-OCR: none; "
              "QK norm per head), verified on block outputs (its attention returns no weights)",
              "one image token per 2 × 2 merged cell (strided-convolution downsample), row by row"),
    refuses=both_refusals()[:1],
    tiny_config=_tiny_config,
    vision_language=VisionLanguage(vision=_vision_stack(), vision_family="glm4v", image_units=image_units,
                                   tiny_processor=_tiny_processor,
                                   image_tokens=lambda cfg: (BEGIN, IMAGE, END, VIDEO_BEGIN, VIDEO_END, VIDEO),
                                   decoder_at=decoder_at, vision_outputs=_vision_outputs, picture=picture,
                                   load_processor=load_images_only),
)
