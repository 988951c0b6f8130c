"""Vision transformers with ViT's attention: ViT, DeiT, DINOv2 and DINOv2 with registers (image encoders).

The input is an image cut into patches; before the patches stand a CLS token, DeiT's distillation
token and DINOv2's register tokens (Darcet et al. 2024). Positions are absolute embeddings added to
the patches before the first layer, so the attention has nothing positional to reproduce.
"""

from __future__ import annotations

from ..family import Family
from ._vision import projection_spec, tiny_image_processor, tiny_vision_config


def _layer(base, i: int):
    layers = base.layers if hasattr(base, "layers") else base.encoder.layer  # ViT, DeiT | DINOv2
    return layers[i]


def prefix_tokens(cfg) -> tuple[str, ...]:
    """[CLS], DeiT's [DIST], then DINOv2's registers [REG0] ... in the order the embeddings put them."""
    dist = ("[DIST]",) if cfg.model_type == "deit" else ()
    registers = tuple(f"[REG{r}]" for r in range(getattr(cfg, "num_register_tokens", 0) or 0))
    return ("[CLS]", *dist, *registers)


def _tiny_config(vocab: int, model_type: str):
    extra = {"num_register_tokens": 2} if model_type == "dinov2_with_registers" else {}
    return tiny_vision_config(model_type, **extra)


FAMILY = Family(
    name="vit",
    model_types=("vit", "deit", "dinov2", "dinov2_with_registers"),
    kind="encoder",
    features=("image patches (+ CLS, DeiT's distillation token, DINOv2's registers)",
              "absolute positions (already in the layer input)", "bidirectional"),
    layer_spec=lambda base, i, cfg: projection_spec(_layer(base, i).attention),
    attention=lambda base, i: _layer(base, i).attention,
    out_proj=lambda base, i: _layer(base, i).attention.o_proj,
    refuses=(),
    tiny_config=_tiny_config,
    tokenizer=None,
    auto_class="AutoModel",
    modality="image",
    prefix_tokens=prefix_tokens,
    tiny_processor=tiny_image_processor,
    tiny_std=0.5,  # patch embeddings of a smooth image are alike: 0.2 would leave the attention near uniform
)
