"""The vision towers of CLIP and SigLIP (image encoders): CLIPVisionModel, SiglipVisionModel.

CLIP puts a CLS token before the patches; SigLIP has none (it pools with an attention head after the
last layer, which is not a layer of self-attention and is not shown). Positions are absolute
embeddings added before the first layer. The two towers of a CLIP model never attend to each other:
there is no cross-attention between image and text in CLIP or SigLIP.
"""

from __future__ import annotations

from . import Family
from ._vision import out_projection, projection_spec, tiny_image_processor, tiny_vision_config


def _attn(base, i: int):
    return base.encoder.layers[i].self_attn


def _prefix(cfg) -> tuple[str, ...]:
    return ("[CLS]",) if cfg.model_type.startswith("clip") else ()


FAMILY = Family(
    name="clip_vision",
    model_types=("clip_vision_model", "siglip_vision_model"),
    kind="encoder",
    features=("image patches (+ CLIP's CLS)", "absolute positions (already in the layer input)", "bidirectional"),
    layer_spec=lambda base, i, cfg: projection_spec(_attn(base, i)),
    attention=_attn,
    out_proj=lambda base, i: out_projection(_attn(base, i)),
    refuses=(),
    tiny_config=lambda vocab, model_type: tiny_vision_config(model_type),
    tokenizer=None,
    auto_class="AutoModel",
    modality="image",
    prefix_tokens=_prefix,
    tiny_processor=tiny_image_processor,
    tiny_std=0.5,  # patch embeddings of a smooth image are alike: 0.2 would leave the attention near uniform
)
