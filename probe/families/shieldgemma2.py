"""ShieldGemma 2 (`model_type` "shieldgemma2"): Gemma 3 with vision read through ShieldGemma 2's processor.

transformers maps the type's image-text model to Gemma3ForConditionalGeneration (ShieldGemma2ForImageClassification
is that model with the Yes/No logits of the last token picked out), so the decoder, the SigLIP tower, the pooled
square grid of `mm_tokens_per_image` image tokens and the image blocks of the mask are Gemma 3's (`gemma3_vl`).

The processor is ShieldGemma 2's: the same image sequence (`\\n\\n<start_of_image>`, the image's tokens,
`<end_of_image>\\n\\n`) for its slot `<start_of_image>`, but its call drops the text it is given and builds its own
prompts, one per image and policy (`policy_definitions`). headscope reads the text it is given: the processor reads
it with ProcessorMixin's call (what ShieldGemma 2's own call ends in, on its policy prompts), the token types
renamed as its call renames them. To read a policy prompt, pass it as the text.
"""

from __future__ import annotations

from ._reading import reading_family, tower_reading
from .gemma3_vl import BOI, EOI, IMAGE, image_blocks, image_units, processor_on, tiny_config


def text_as_given(cls):
    """ShieldGemma 2's processor class `cls` whose call encodes the text it is given (its images in the text's
    slots) instead of its policy prompts; saved with `save_pretrained` it writes `cls`'s files."""
    def __call__(self, images=None, text=None, **kwargs):
        from transformers.processing_utils import ProcessorMixin

        out = ProcessorMixin.__call__(self, images=images, text=text, **kwargs)
        if "mm_token_type_ids" in out:
            out["token_type_ids"] = out.pop("mm_token_type_ids")
        return out

    return type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__})


def _tiny_processor(cfg, tokenizer):
    from transformers import ShieldGemma2Processor

    return processor_on(text_as_given(ShieldGemma2Processor), cfg, tokenizer)


def _as_reader(processor):
    """A loaded ShieldGemma 2 processor as one that encodes the text it is given (`text_as_given`)."""
    processor.__class__ = text_as_given(type(processor))
    return processor


FAMILY = reading_family(
    name="shieldgemma2",
    model_types=("shieldgemma2",),
    features=("Gemma 3 with vision (gemma3_vl): the gemma3 text decoder, the SigLIP tower (clip_vision), each image's "
              "tokens on the pooled square grid", "ShieldGemma 2's processor, reading the given text rather than its "
              "policy prompts"),
    tiny_config=tiny_config,
    tokenizer="sentencepiece",
    vision_language=tower_reading(image_units=image_units, tiny_processor=_tiny_processor,
                                  image_tokens=lambda cfg: (BOI, IMAGE, EOI), blocks=image_blocks,
                                  as_reader=_as_reader),
)
