"""What the vision–language families share: a text family for the decoder, an image-encoder family for the
vision tower, and the tiny models' processors.

A vision–language decoder (LLaVA, Gemma 3, PaliGemma) runs its image encoder over each picture, projects the
patch features into the decoder's embedding space and puts them where the text's image tokens stand; the
decoder then attends over text and image tokens alike. Its two stacks are verified by the families that
already verify each alone: the vision tower by its image-encoder family (`clip_vision`), the decoder by its
text family (`llama`, `gemma`, `gemma3`), given the real merged input embeddings (the hooks catch each
layer's input) and the model's real mask (`VisionLanguage.blocks`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..types import ImagePatch
from ..family import Family, Refusal, Stack, VisionLanguage

def language_model(base):
    """The decoder of a LLaVA-layout composite (LLaVA, LLaVA-NeXT, OneVision, Gemma 3, PaliGemma, Qwen-VL)."""
    return base.language_model


def vision_tower(base):
    """Its vision tower's transformer: CLIPVisionModel and SigLIP hold their layers themselves, an older layout
    under `.vision_model`."""
    tower = base.vision_tower
    return getattr(tower, "vision_model", tower)


def tiny_chat_template(slot: str) -> str:
    """A tiny model's chat template: `role: ` turns, each image as `slot` and a newline, then `assistant:`."""
    return ("{% for message in messages %}{{ message['role'] }}: {% for part in message['content'] %}"
            "{% if part['type'] == 'image' %}" + slot + "\n{% else %}{{ part['text'] }}{% endif %}{% endfor %}\n"
            "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")


def text_config(cfg):
    """The decoder's config: `DecoderConfig.text`, or a composite config's `text_config`."""
    text = getattr(cfg, "text", None)
    return text if text is not None and hasattr(text, "model_type") else cfg.text_config


def composite(cfg):
    """The composite (vision–language) config behind a `DecoderConfig`, or `cfg` itself."""
    return getattr(cfg, "composite", cfg)


def text_family(cfg) -> Family:
    from . import family_of_type

    return family_of_type(text_config(cfg).model_type)


def vision_family(cfg) -> Family:
    from . import family_of_type

    return family_of_type(composite(cfg).vision_config.model_type)


def decoder_spec(language_model):
    """The decoder's `layer_spec` on a vision–language base model: the text family's, on its language model."""
    def spec(base, i: int, cfg):
        return text_family(cfg).layer_spec(language_model(base), i, text_config(cfg))
    return spec


def decoder_attention(language_model):
    def attention(base, i: int):
        lm = language_model(base)
        return _text_family_of(lm).attention(lm, i)
    return attention


def decoder_out_proj(language_model):
    def out_proj(base, i: int):
        lm = language_model(base)
        return _text_family_of(lm).out_proj(lm, i)
    return out_proj


def _text_family_of(language_model) -> Family:
    from . import family_of_type

    return family_of_type(language_model.config.model_type)


def vision_stack(tower) -> Stack:
    """The image encoder's layers (`tower(base)`: the vision transformer whose `encoder.layers` they are), verified
    by the image-encoder family of the config's `vision_config`."""
    def spec(base, i: int, cfg):
        return vision_family(cfg).layer_spec(tower(base), i, composite(cfg).vision_config)

    def attention(base, i: int):
        return tower(base).encoder.layers[i].self_attn

    def out_proj(base, i: int):
        attn = attention(base, i)
        return attn.o_proj if hasattr(attn, "o_proj") else attn.out_proj

    return Stack(kind="vision", layer_spec=spec, attention=attention, out_proj=out_proj,
                 n_layers=lambda cfg: composite(cfg).vision_config.num_hidden_layers)


def both_refusals(*, mask_from_model: bool = False) -> tuple[Refusal, ...]:
    """The text family's refusals on the decoder's config and the image family's on the vision config.
    `mask_from_model`: the vision–language model builds the decoder's mask itself (PaliGemma's prefix-LM mask,
    reproduced by `VisionLanguage.blocks`), so the text config's `use_bidirectional_attention` is not refused."""
    def text_reason(cfg) -> str | None:
        family = text_family(cfg)
        if mask_from_model:
            family = dataclasses.replace(family, refuses=tuple(r for r in family.refuses
                                                               if r.feature != "bidirectional attention"))
        return _first_reason(family, text_config(cfg))

    def vision_reason(cfg) -> str | None:
        return _first_reason(vision_family(cfg), composite(cfg).vision_config)

    return Refusal("decoder", text_reason), Refusal("vision tower", vision_reason)


def _first_reason(family: Family, cfg) -> str | None:
    for refusal in family.refuses:
        reason = refusal.reason(cfg)
        if reason is not None:
            return reason
    return None


def grid_units(image: int, rows: int, cols: int, *, before: tuple[str, ...] = ()) -> list:
    """Image `image`'s units on one whole-picture grid, row by row, after the labels of tokens `before` it."""
    return [*before, *(ImagePatch(image, r, c, rows, cols) for r in range(rows) for c in range(cols))]


def tiny_parts(model_type: str, vocab: int) -> dict:
    """The tiny `text_config` and `vision_config` (dicts) of a vision–language `model_type`: the tiny configs of the
    decoder and vision types its default config names (LLaVA: llama and clip_vision_model)."""
    from transformers import AutoConfig

    from . import family_of_type

    default = AutoConfig.for_model(model_type)
    text, vision = default.text_config.model_type, default.vision_config.model_type
    return {"text_config": family_of_type(text).tiny_config(vocab, text).to_dict(),
            "vision_config": family_of_type(vision).tiny_config(0, vision).to_dict()}


def tiny_pil_processor(size: int, kind: str = "ViTImageProcessorPil", **extra) -> Any:
    """A tiny model's image processor on the PIL path: resize to size × size, rescale, normalise by 0.5."""
    import transformers

    return getattr(transformers, kind)(size={"height": size, "width": size}, image_mean=[0.5, 0.5, 0.5],
                                       image_std=[0.5, 0.5, 0.5], **extra)


def images_only(cls):
    """Processor class `cls` without its video processor (LlavaOnevisionProcessor, SmolVLMProcessor): in
    transformers 5.25 a video processor needs torchvision, which a CPU install may lack, and images never use it.
    Saved with `save_pretrained` it writes `cls`'s files (no video processor's)."""
    import inspect

    def __init__(self, image_processor=None, tokenizer=None, **kwargs):
        cls.__init__(self, image_processor, tokenizer, None, **kwargs)
        self.video_processor = None

    # `cls`'s own signature less the video processor: what `save_pretrained` saves (num_image_tokens, ...) is read
    # from it
    own = inspect.signature(cls.__init__)
    __init__.__signature__ = own.replace(parameters=[p for n, p in own.parameters.items() if n != "video_processor"])
    def apply_chat_template(self, conversation, chat_template=None, **kwargs):
        """The chat template rendered as every processor renders it: a class's own override adds only its video
        processor's defaults (SmolVLM's frames and rate), which an images-only processor has none of."""
        from transformers.processing_utils import ProcessorMixin

        return ProcessorMixin.apply_chat_template(self, conversation, chat_template, **kwargs)

    return type(cls.__name__, (cls,), {"__init__": __init__, "apply_chat_template": apply_chat_template,
                                       "__module__": cls.__module__})


def load_images_only(path: str, at: dict):
    """A checkpoint's processor without its video processor (`images_only`), for a folder whose processor class
    takes one (Qwen-VL, GLM-4V, LLaVA-OneVision, SmolVLM) where the video processor cannot be built (it needs
    torchvision): the class transformers maps the model type to (else the one the folder's processor_config.json
    names: GLM-OCR's), its tokenizer, its image processor on the PIL
    path, and its own settings and chat template as `processor_config.json` and the chat template file hold them
    (a hub folder's separate files or one nested `processor_config.json` alike). A package the processor class
    itself needs (SmolVLM's num2words) still raises its ImportError."""
    import inspect

    import transformers
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    from transformers.processing_utils import ProcessorMixin

    model_type = transformers.AutoConfig.from_pretrained(path, **at).model_type
    settings, _ = ProcessorMixin.get_processor_dict(path, **at)
    # the class transformers maps the type to, else the one the folder names (GLM-OCR's: GLM-4.6V's processor)
    name = PROCESSOR_MAPPING_NAMES.get(model_type) or settings.get("processor_class")
    if not isinstance(name, str) or not isinstance(getattr(transformers, name, None), type):
        raise ValueError(f"{path} names no processor class this transformers has for model type {model_type!r} "
                         f"({name!r}); give its processor_config.json the processor_class of its checkpoint")
    cls = getattr(transformers, name)
    own = set(inspect.signature(cls.__init__).parameters) - {"self", "image_processor", "tokenizer", "video_processor"}
    return images_only(cls)(image_processor=transformers.AutoImageProcessor.from_pretrained(path, backend="pil", **at),
                            tokenizer=transformers.AutoTokenizer.from_pretrained(path, **at),
                            **{k: v for k, v in settings.items() if k in own})


def reading_family(*, name: str, model_types: tuple[str, ...], features: tuple[str, ...], tiny_config,
                   vision_language: VisionLanguage, tokenizer="bytebpe", refuses: tuple[Refusal, ...] | None = None,
                   decoder=language_model) -> Family:
    """The `Family` of a vision–language composite whose decoder is its text family's layers under `decoder(base)`
    (`language_model`: the LLaVA layout of LLaVA, LLaVA-NeXT, OneVision, ViP-LLaVA, DeepSeek-VL, Aya Vision, Gemma 3,
    PaliGemma, InternVL, Janus, LightOnOCR, Qwen-VL; Idefics3's and SmolVLM's `text_model`), built by the Auto class
    of image-text models; its decoder is
    verified by the text family of its text config and its tower by `vision_language`. `refuses`: both families'
    refusals unless given. Write `model_types` out in the call: the registry reads it from the file's source."""
    return Family(name=name, model_types=model_types, kind="decoder", features=features,
                  layer_spec=decoder_spec(decoder), attention=decoder_attention(decoder),
                  out_proj=decoder_out_proj(decoder), refuses=both_refusals() if refuses is None else refuses,
                  tiny_config=tiny_config, tokenizer=tokenizer, auto_class="AutoModelForImageTextToText",
                  modality="vision-language", vision_language=vision_language)


def tower_reading(image_units, tiny_processor, *, image_tokens, tower=vision_tower, **more) -> VisionLanguage:
    """The `VisionLanguage` of a composite whose image tower is a CLIP or SigLIP vision model under `tower(base)`,
    verified by `clip_vision`; `more`: the other `VisionLanguage` fields (picture, blocks, load_processor, ...)."""
    return VisionLanguage(vision=vision_stack(tower), vision_family="clip_vision", image_units=image_units,
                          tiny_processor=tiny_processor, image_tokens=image_tokens, **more)
