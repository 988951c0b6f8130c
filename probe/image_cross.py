"""Maps of a decoder that reads its images through cross-attention layers (Mllama): the self-attention layers'
map over the text, and the cross-attention layers' map of text queries over the image's vision tokens.

Such a decoder keeps no image tokens among its text tokens (Mllama's text holds one `<|image|>` marker per
image), so its image is on the key side of a `CrossAttentionMap`: each key unit carries its `ImagePatch`
(picture, cell of the picture's whole grid, view `tile r,c`), or None for a tile's CLS token and a padding tile.
The family declares which layers are which (`VisionLanguage.decoder`, `VisionLanguage.cross`) and where each
key sits (`VisionLanguage.key_patches`); the gates that scale what each block adds are reported
(`VisionLanguage.gates`).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .encoding import model_batch
from .families import family_for
from .forward import base_model, extra_inputs, forward_one_stream
from .hooks import catch
from .images import check_images
from .maps import make_map
from .model import LoadedModel
from .types import CrossAttentionMap, ImageCrossAttention, Units

__all__ = ["ImageCrossAttention", "image_cross_attention"]


def _key_label(patch, k: int) -> str:
    if patch is None:
        return f"vis{k}"
    return f"img{patch.image}:{patch.view}:r{patch.row}c{patch.col}"


@torch.inference_mode()
def image_cross_attention(lm: LoadedModel, texts: str | Sequence[str] | None = None, *,
                          images: object) -> list[ImageCrossAttention]:
    """Both maps of each text (and its images, placed as `hs.extract` places them) of a cross-attention reader."""
    from .vision_language import default_texts, encode_with_images

    family = family_for(lm.config)
    reading = family.vision_language
    if reading is None or reading.cross is None:
        raise ValueError(f"{lm.name} reads no image through cross-attention layers; use hs.extract(lm, texts, "
                         "images=...) for a decoder whose image tokens stand in its text")
    images = check_images(images)  # once: an iterator is read here, not emptied by a second look
    texts = default_texts(images) if texts is None else ([texts] if isinstance(texts, str) else list(texts))
    base, cfg = base_model(lm), lm.config
    out = []
    for enc in encode_with_images(lm, texts, images):
        modules = {(stack.kind, i): stack.attention(base, i)
                   for stack in (reading.decoder, reading.cross) for i in stack.layer_numbers(cfg)}
        batch = model_batch([enc], lm.device)
        with catch(modules, take=lambda result: result[-1].detach()) as caught:  # the weights come last
            forward_one_stream(lm, batch, output_attentions=True, extra=extra_inputs(lm, [enc]))
        self_layers, cross_layers = reading.decoder.layer_numbers(cfg), reading.cross.layer_numbers(cfg)
        a_self = torch.stack([caught[("decoder", i)][0] for i in self_layers]).float().cpu()
        a_cross = torch.stack([caught[("cross", i)][0] for i in cross_layers]).float().cpu()
        decoder = make_map(lm, enc, a_self, layers=self_layers, causal=True)
        patches = reading.key_patches(cfg, enc.inputs)
        if len(patches) != a_cross.shape[-1]:
            raise RuntimeError(f"{lm.name}: {a_cross.shape[-1]} cross-attention keys, but the layout of the images "
                               f"has {len(patches)}; this checkpoint's image layout is not known")
        keys = Units(text="", level="token", labels=tuple(_key_label(p, k) for k, p in enumerate(patches)),
                     spans=((0, 0),) * len(patches), special=tuple(p is None for p in patches), patches=patches)
        mask = enc.inputs.get("cross_attention_mask")  # [1, text, image, tile]: which text rows may read a tile
        reads = [True] * len(decoder) if mask is None else [bool(x) for x in mask[0].flatten(1).gt(0).any(-1)]
        # a row the mask gives no image is still a softmax over every key, but the model zeroes what it adds
        cross = CrossAttentionMap(queries=Units.of(decoder), keys=keys, attention=a_cross, layers=cross_layers,
                                  meta={**decoder.meta, "reads_image": reads})
        out.append(ImageCrossAttention(decoder=decoder, cross=cross,
                                       gates={} if reading.gates is None else reading.gates(base, cfg)))
    return out
