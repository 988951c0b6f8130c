"""CLIP's and SigLIP's two towers: an image tower and a text tower, each a model of its own, for an (image, caption) pair.

A CLIP model (`model_type` "clip"; SigLIP's "siglip" and "siglip2" alike) holds a vision transformer and a text transformer (causal in CLIP, bidirectional in SigLIP) that never
attend to each other: there is no cross-attention in CLIP (nor in SigLIP); the two meet only in the cosine
similarity of their pooled, projected embeddings. `towers` gives each as a `LoadedModel` (the same
weights), so each is extracted and verified like any image or text model; `image_text` gives both maps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .extract import extract
from .forward import pixel_inputs
from .images import check_images, encode_images, is_two_tower, tower
from .model import LoadedModel
from .types import AttentionMap

__all__ = ["towers", "ImageText", "image_text", "NO_CROSS_ATTENTION"]

NO_CROSS_ATTENTION = ("CLIP and SigLIP have no cross-attention: the image tower and the text tower never attend to "
                      "each other; each one's attention is its own input's, and the pair meets only in the cosine "
                      "similarity of their pooled embeddings")


def towers(lm: LoadedModel) -> tuple[LoadedModel, LoadedModel]:
    """A CLIP or SigLIP model's image tower and text tower as two `LoadedModel`s (the same weights, not copies):
    each is extracted and verified like any image or text model (families `clip_vision`, `clip_text`,
    `siglip_text`). The composite types and where their towers live are `probe.families.TOWERS`; every command
    reaches a tower the same way (`probe.images.for_input`: images go to the image tower, texts to the text one)."""
    if not is_two_tower(lm):
        tower(lm, "image")  # raises: not a two-tower model
    return tower(lm, "image"), tower(lm, "text")


@dataclass(frozen=True, eq=False)
class ImageText:
    """Both towers' attention for one (image, caption) pair: two separate maps, no attention between them."""

    image: AttentionMap  # the image tower's, over [CLS] (CLIP) and the patches
    text: AttentionMap  # the text tower's (causal in CLIP, bidirectional in SigLIP), over the caption's tokens
    similarity: float  # cosine similarity of the pooled, projected embeddings
    note: str = NO_CROSS_ATTENTION
    meta: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"image": self.image.text, "caption": self.text.text, "similarity": self.similarity,
                "image_units": len(self.image), "text_units": len(self.text), "cross_attention": None,
                "note": self.note, **self.meta}


def image_text(lm: LoadedModel, image: object, caption: str) -> ImageText:
    """The attention of both towers of a CLIP or SigLIP model for an (image, caption) pair, and their similarity.

    There is no cross-attention to show: `ImageText.note` says so, and the result holds none."""
    import torch

    if len(check_images(image)) != 1:  # the rest were dropped without a word
        raise ValueError(f"image_text takes one (image, caption) pair, got {len(check_images(image))} images; "
                         "call it once per image")
    vision, text = towers(lm)
    [image_map] = extract(vision, images=check_images(image)[:1])
    [text_map] = extract(text, caption)
    with torch.inference_mode():
        pix = encode_images(vision, check_images(image)[:1])[0].pixels[None].to(lm.device, lm.dtype)
        ids = torch.tensor([text_map.token_ids], device=lm.device)
        a = lm.model.get_image_features(**pixel_inputs(vision.model, vision, pix))  # SigLIP 2: its patch rows
        b = lm.model.get_text_features(input_ids=ids)
        a, b = (getattr(x, "pooler_output", x) for x in (a, b))
        sim = float(torch.nn.functional.cosine_similarity(a, b).item())
    return ImageText(image=image_map, text=text_map, similarity=sim, meta={"model": lm.name})
