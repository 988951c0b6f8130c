"""Hub-fidelity fixtures (issue 49): each vision–language type's tiny checkpoint, saved as a hub folder of that type
is laid out, naming the real checkpoint it mirrors and keeping that checkpoint's relations that change the
computation (only the sizes shrunk). One home, looked up by model type: `HUB[model_type]`.

`overrides(default_config)` gives the config settings that put the real relation into the tiny model (the tiny
defaults of `probe/families/` are kept where they already hold it); `relations` names each relation with a check
on the built model (`LoadedModel`), asserted on the folder loaded by path, so a fixture that loses one fails."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


def _text(cfg, **changes):
    """The decoder config of `cfg` with `changes`: a new config object of its type (the tiny one is not mutated)."""
    return type(cfg.text_config)(**{**cfg.text_config.to_dict(), **changes})


def _side(cfg) -> int:
    size, patch = cfg.vision_config.image_size, cfg.vision_config.patch_size
    size, patch = (size[0], patch[0]) if isinstance(size, (list, tuple)) else (size, patch)
    return size // patch


def _mrope(lm) -> bool:
    """M-RoPE: the (t, h, w) sections cover the rotary half of each head exactly."""
    t = lm.config.text_config if hasattr(lm.config, "text_config") else lm.config
    rope = t.rope_parameters
    head = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    return sum(rope["mrope_section"]) * 2 == int(head * rope.get("partial_rotary_factor", 1.0))


def _windowed_vision(lm) -> bool:  # Qwen2.5-VL: windowed vision blocks with full-attention ones between
    v = lm.config.vision_config
    return bool(v.fullatt_block_indexes) and len(v.fullatt_block_indexes) < v.depth and v.window_size > 0


def _sliding_and_full(lm) -> bool:
    kinds = set(lm.config.text_config.layer_types)
    return kinds == {"sliding_attention", "full_attention"}


def _tiles_and_thumbnail(lm) -> bool:  # Idefics3 / SmolVLM: split into tiles, then the global image
    return lm.processor.image_processor.do_image_splitting


def _pixel_shuffle_tokens(lm) -> bool:  # Idefics3 / SmolVLM: tokens per frame = (patches per side / scale)^2
    return lm.processor.image_seq_len == (_side(lm.config) // lm.config.scale_factor) ** 2


def _internvl_shuffle(lm) -> bool:  # InternVL: pixel shuffle by downsample_ratio, at most max_patches tiles
    p = lm.processor
    return (p.image_seq_length == int(_side(lm.config) * lm.config.downsample_ratio) ** 2
            and p.image_processor.crop_to_patches and p.image_processor.max_patches > 1)


def _glm_sections(lm, ratio, partial: float) -> bool:  # GLM-4V: the sections in the checkpoint's t : h : w ratio
    rope = lm.config.text_config.rope_parameters
    s = rope["mrope_section"]
    return (_mrope(lm) and float(rope.get("partial_rotary_factor", 1.0)) == partial
            and all(a * ratio[0] == s[0] * r for a, r in zip(s, ratio)))


def _glm_merge(lm) -> bool:  # GLM-4V: 2 x 2 merge, 2 frames per patch, the processor's patches the encoder's
    v, images = lm.config.vision_config, lm.processor.image_processor
    return (v.spatial_merge_size == images.merge_size == 2 and v.temporal_patch_size == images.temporal_patch_size == 2
            and v.patch_size == images.patch_size)


@dataclass(frozen=True)
class HubFixture:
    mirrors: str  # the real hub checkpoint this tiny one is laid out and related as
    relations: dict[str, Callable[[Any], bool]] = field(default_factory=dict)
    overrides: Callable[[Any], dict] = lambda cfg: {}


HUB: dict[str, HubFixture] = {
    "llava": HubFixture("llava-hf/llava-1.5-7b-hf", {
        "CLS dropped: one token per patch": lambda lm: lm.config.vision_feature_select_strategy == "default",
        "features of the second-to-last vision layer": lambda lm: lm.config.vision_feature_layer == -2},
        lambda cfg: {"vision_feature_layer": -2}),
    "vipllava": HubFixture("llava-hf/vip-llava-7b-hf", {
        "several vision layers concatenated": lambda lm: len(lm.config.vision_feature_layers) > 1}),
    "llava_next": HubFixture("llava-hf/llava-v1.6-mistral-7b-hf", {
        "tiles on pinpoints after a thumbnail": lambda lm: len(lm.config.image_grid_pinpoints) > 1}),
    "llava_onevision": HubFixture("llava-hf/llava-onevision-qwen2-0.5b-ov-hf", {
        "tiles shrunk past anyres_max_9": lambda lm: lm.config.vision_aspect_ratio == "anyres_max_9",
        "CLS kept (full)": lambda lm: lm.config.vision_feature_select_strategy == "full"},
        lambda cfg: {"vision_aspect_ratio": "anyres_max_9"}),
    "gemma3": HubFixture("google/gemma-3-4b-it", {
        "sliding window wider than one image's tokens (1024 > 256)":
            lambda lm: lm.config.text_config.sliding_window > lm.config.mm_tokens_per_image,
        "sliding and full layers": _sliding_and_full},
        lambda cfg: {"text_config": _text(cfg, sliding_window=2 * cfg.mm_tokens_per_image)}),
    "paligemma": HubFixture("google/paligemma2-3b-pt-896", {
        "Gemma 2 decoder, attention soft-capped":
            lambda lm: lm.config.text_config.model_type == "gemma2" and lm.config.text_config.attn_logit_softcapping,
        "window shorter than the image+prefix (4096 image tokens, 4096 window)":
            lambda lm: (lm.config.text_config.sliding_window or 0) > 0
            and lm.config.text_config.sliding_window <= _side(lm.config) ** 2},
        lambda cfg: {"text_config": _gemma2_text(cfg)}),
    "idefics3": HubFixture("HuggingFaceM4/Idefics3-8B-Llama3", {
        "tiles then the global image": _tiles_and_thumbnail, "pixel shuffle by scale_factor 2": _pixel_shuffle_tokens}),
    "smolvlm": HubFixture("HuggingFaceTB/SmolVLM-256M-Instruct", {
        "tiles then the global image": _tiles_and_thumbnail,
        "pixel shuffle by scale_factor 4": lambda lm: lm.config.scale_factor == 4 and _pixel_shuffle_tokens(lm)},
        lambda cfg: {"scale_factor": 4}),
    "internvl": HubFixture("OpenGVLab/InternVL3-1B-hf", {"pixel shuffle 0.5, tiles and a thumbnail": _internvl_shuffle}),
    "qianfan_ocr": HubFixture("baidu/Qianfan-OCR", {"pixel shuffle 0.5, tiles and a thumbnail": _internvl_shuffle}),
    "aya_vision": HubFixture("CohereForAI/aya-vision-8b", {
        "pixel shuffle by downsample_factor 2": lambda lm: lm.config.downsample_factor == 2,
        "Cohere 2 sliding and full layers": _sliding_and_full}),
    "qwen2_vl": HubFixture("Qwen/Qwen2-VL-2B-Instruct", {"M-RoPE sections": _mrope,
                                                          "2 x 2 merge": lambda lm: lm.config.vision_config.spatial_merge_size == 2}),
    "qwen2_5_vl": HubFixture("Qwen/Qwen2.5-VL-3B-Instruct", {"M-RoPE sections": _mrope,
                                                              "windowed vision blocks": _windowed_vision}),
    "qwen3_vl": HubFixture("Qwen/Qwen3-VL-4B-Instruct", {
        "M-RoPE sections": _mrope, "deepstack layers": lambda lm: bool(lm.config.vision_config.deepstack_visual_indexes)}),
    "qwen3_vl_moe": HubFixture("Qwen/Qwen3-VL-30B-A3B-Instruct", {
        "M-RoPE sections": _mrope, "deepstack layers": lambda lm: bool(lm.config.vision_config.deepstack_visual_indexes)}),
    "qwen3_5": HubFixture("Qwen/Qwen3.5-27B", {
        "M-RoPE sections on a partial rotary": _mrope,
        "linear-attention layers between full ones": lambda lm: "linear_attention" in lm.config.text_config.layer_types}),
    "qwen3_5_moe": HubFixture("Qwen/Qwen3.5-35B-A3B", {
        "M-RoPE sections on a partial rotary": _mrope,
        "linear-attention layers between full ones": lambda lm: "linear_attention" in lm.config.text_config.layer_types}),
    "deepseek_vl": HubFixture("deepseek-community/deepseek-vl-1.3b-chat"),  # one token per patch of a padded square
    "janus": HubFixture("deepseek-community/Janus-Pro-1B"),
    "lighton_ocr": HubFixture("lightonai/LightOnOCR-1B-1025", {
        "2 x 2 merge": lambda lm: lm.config.spatial_merge_size == 2}),
    # --- GLM-4V family (glm4v, glm4v_moe, glm46v, glm_ocr): M-RoPE sections in the checkpoints' proportions
    "glm4v": HubFixture("zai-org/GLM-4.1V-9B-Thinking", {
        "M-RoPE sections [8, 12, 12] on half of each head": lambda lm: _glm_sections(lm, (2, 3, 3), 0.5),
        "2 x 2 merge of 2-frame patches, the processor's": _glm_merge}),
    "glm4v_moe": HubFixture("zai-org/GLM-4.5V", {
        "M-RoPE sections [8, 12, 12] on half of each head": lambda lm: _glm_sections(lm, (2, 3, 3), 0.5),
        "2 x 2 merge of 2-frame patches, the processor's": _glm_merge,
        "dense first layer, then mixtures of experts": lambda lm: 0 < lm.config.text_config.first_k_dense_replace
        < lm.config.text_config.num_hidden_layers}),
    "glm46v": HubFixture("zai-org/GLM-4.6V", {
        "M-RoPE sections [8, 12, 12] on half of each head": lambda lm: _glm_sections(lm, (2, 3, 3), 0.5),
        "2 x 2 merge of 2-frame patches, the processor's": _glm_merge}),
    "glm_ocr": HubFixture("zai-org/GLM-OCR", {
        "M-RoPE sections [16, 24, 24] on whole heads": lambda lm: _glm_sections(lm, (2, 3, 3), 1.0),
        "heads x head_dim wider than the hidden size (16 x 128 > 1536)": lambda lm: lm.config.text_config.head_dim
        * lm.config.text_config.num_attention_heads > lm.config.text_config.hidden_size,
        "2 x 2 merge of 2-frame patches, the processor's": _glm_merge,
        "QK-normed vision heads, no position embeddings": lambda lm: hasattr(lm.model.model.visual.blocks[0].attn, "q_norm")
        and not hasattr(lm.model.model.visual, "embeddings")}),
    "mllama": HubFixture("meta-llama/Llama-3.2-11B-Vision", {
        "cross-attention layers between self-attention ones":
            lambda lm: 0 < len(lm.config.text_config.cross_attention_layers) < lm.config.text_config.num_hidden_layers}),
}


# issue 49, more types (branch i49-more): each mirrors its named checkpoint
HUB.update({
    "shieldgemma2": HubFixture("google/shieldgemma-2-4b-it", {
        "sliding window wider than one image's tokens (1024 > 256)":
            lambda lm: lm.config.text_config.sliding_window > lm.config.mm_tokens_per_image,
        "sliding and full layers": _sliding_and_full,
        "the given text read, not the policy prompts":
            lambda lm: len(lm.processor(text=["a <start_of_image> b"], images=[_white()])["input_ids"]) == 1},
        lambda cfg: {"text_config": _text(cfg, sliding_window=2 * cfg.mm_tokens_per_image)}),
    "exaone4_5": HubFixture("LGAI-EXAONE/EXAONE-4.5-33B", {
        "windowed vision blocks": _windowed_vision, "2 x 2 merge": lambda lm: lm.config.vision_config.spatial_merge_size == 2,
        "grouped-query vision heads (16 heads, 8 key/value)":
            lambda lm: lm.config.vision_config.num_key_value_heads < lm.config.vision_config.num_heads,
        "EXAONE 4 sliding and full layers": _sliding_and_full,
        "1-D decoder positions (no M-RoPE sections)":
            lambda lm: "mrope_section" not in (lm.config.text_config.rope_parameters or {})}),
    # the transformers-format conversion of lmms-lab/LLaVA-OneVision-1.5-4B-Instruct
    "llava_onevision1_5": HubFixture("Deep-VLM/LLaVA-OneVision-1.5-4B-Instruct-hf", {
        "a class token before each image's patches": lambda lm: hasattr(lm.model.model.visual, "cls_embeddings"),
        "2 x 2 merge, the processor's": lambda lm: lm.config.vision_config.spatial_merge_size
        == lm.processor.image_processor.merge_size == 2,
        "one frame per patch (a 2-D patch convolution)": lambda lm: lm.processor.image_processor.temporal_patch_size == 1,
        "Qwen3 decoder at 1-D positions": lambda lm: lm.config.text_config.model_type == "qwen3"
        and "mrope_section" not in (lm.config.text_config.rope_parameters or {})}),
    # the transformers-format Granite Docling (ibm-granite/granite-docling-258M is Idefics3's type, verified there)
    "granite_docling": HubFixture("ibm-granite/granite-for-docling-500m", {
        "pixel shuffle by scale_factor 4 (64 tokens a 512-pixel tile of 16-pixel patches)":
            lambda lm: lm.config.vision_config.scale_factor == 4
            and lm.processor.image_seq_len == (_side(lm.config) // 4) ** 2,
        "tiles then the global image (GOT-OCR 2 tiling)":
            lambda lm: lm.processor.image_processor.crop_to_patches and lm.processor.image_processor.max_patches > 1,
        "DeepStack taps of vision layers into the decoder": lambda lm: 0 < len(lm.config.vision_config
                                                                          .deepstack_visual_indexes)
        < lm.config.vision_config.num_hidden_layers,
        "Granite's multipliers": lambda lm: lm.config.text_config.attention_multiplier != 1.0}),
    "ovis2": HubFixture("thisisiron/Ovis2-1B-hf", {
        "patches grouped 2 x 2 into one visual token (hidden_stride 2)": lambda lm: lm.config.vision_config.hidden_stride
        == 2 and lm.processor.image_seq_length == (_side(lm.config) // 2) ** 2,
        "the global image, then tiles": lambda lm: lm.processor.image_processor.crop_to_patches
        and lm.processor.image_processor.max_patches > 1,
        "the processor's tile grid read (grids kept)":
            lambda lm: "grids" not in type(lm.processor).unused_input_names.fget(lm.processor)}),
    "video_llama_3": HubFixture("lkhl/VideoLLaMA3-2B-Image-HF", {
        "images unmerged (merge_size 1), one token per patch": lambda lm: lm.processor.image_processor.merge_size == 1,
        "2-D axial rotary in the vision encoder":
            lambda lm: lm.config.vision_config.rope_parameters["rope_type"] == "axial",
        "Qwen2 decoder at 1-D positions": lambda lm: "mrope_section" not in (lm.config.text_config.rope_parameters
                                                                             or {})}),
})


def _white():
    import numpy as np

    return np.ones((8, 8, 3), dtype=np.uint8) * 255


def _gemma2_text(cfg):
    """PaliGemma 2's Gemma 2 decoder, its window (4 here) no longer than the image tokens ahead of the prompt."""
    from headscope.probe.families import family_of_type

    text = family_of_type("gemma2").tiny_config(cfg.text_config.vocab_size, "gemma2")
    text.pad_token_id, text.sliding_window = cfg.text_config.pad_token_id, 4
    return text


def hidden_sizes(cfg, overrides: dict) -> dict:
    """`overrides` with other sizes, as an unseen checkpoint of the type has: the decoder's heads halved, each twice
    as wide (the hidden size, and so the projector, kept); the M-RoPE sections doubled with them (they still cover
    the rotary half of a head) and at most as many key/value heads as heads; a fixed-size vision tower's image
    twice as large (more patches per tile or picture; Qwen-VL's dynamic resolution has no image size)."""
    text = overrides.get("text_config", cfg.text_config)
    heads = text.num_attention_heads // 2
    head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    changes = {"num_attention_heads": heads, "head_dim": 2 * head,
               "num_key_value_heads": max(1, min(getattr(text, "num_key_value_heads", heads) or heads, heads) // 2)}
    rope = dict(getattr(text, "rope_parameters", None) or {})
    if "mrope_section" in rope:
        changes["rope_parameters"] = {**rope, "mrope_section": [2 * s for s in rope["mrope_section"]]}
    overrides = {**overrides, "text_config": type(text)(**{**text.to_dict(), **changes})}
    vision = cfg.vision_config
    size = getattr(vision, "image_size", None)
    if size is not None:
        size = [2 * s for s in size] if isinstance(size, (list, tuple)) else 2 * size
        overrides["vision_config"] = type(vision)(**{**vision.to_dict(), "image_size": size})
    return overrides
