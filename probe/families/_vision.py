"""What the vision-transformer families share: a plain multi-head self-attention over patch tokens.

ViT, DeiT, DINOv2 (with registers), CLIP's and SigLIP's towers all attend the same way: q, k and v
projections of the layer's (layer-normed) input, one scale 1/√d, no mask, no positions in the attention
(the positions are added to the patch embeddings before the first layer, so they are already in every
layer's input). Only where the modules live and which tokens stand before the patches differ.
"""

from __future__ import annotations

from ..scratch import LayerSpec
from ..family import linear_weights

IMAGE_SIZE, PATCH_SIZE = 32, 8  # tiny models: a 4 × 4 grid of patches


def projection_spec(attn, *, causal: bool = False) -> LayerSpec:
    """The `LayerSpec` of an attention module with q_proj, k_proj, v_proj and o_proj (or out_proj)."""
    (wq, bq), (wk, bk), (wv, bv) = linear_weights(attn.q_proj), linear_weights(attn.k_proj), linear_weights(attn.v_proj)
    wo, bo = linear_weights(out_projection(attn))
    hs = attn.head_dim
    n_heads = wq.shape[0] // hs
    scale = getattr(attn, "scaling", None) or getattr(attn, "scale", None) or hs**-0.5
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=n_heads, n_kv_heads=n_heads, head_dim=hs,
                     scale=float(scale), causal=causal)


def out_projection(attn):
    """The attention's output projection, under the names transformers gives it (Janus's: `projection_layer`)."""
    for name in ("o_proj", "out_proj", "projection_layer"):
        if hasattr(attn, name):
            return getattr(attn, name)
    raise AttributeError(f"{type(attn).__name__} has no output projection under the names headscope knows "
                         f"(o_proj, out_proj, projection_layer)")


def tiny_vision_config(model_type: str, **extra):
    """A 2-layer, 4-head, 32-wide model of `model_type` over 32 × 32 images in 8 × 8 patches (4 × 4 = 16)."""
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=64, image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, num_channels=3,
                                **extra)


def tiny_image_processor(cfg):
    """The slow (PIL) image processor of a tiny model: resize to its image size, rescale, normalise
    (the PIL path: the torchvision backend cannot be installed beside every torch)."""
    from transformers import ViTImageProcessorPil

    size = getattr(cfg, "image_size", IMAGE_SIZE)
    return ViTImageProcessorPil(size={"height": size, "width": size}, image_mean=[0.5, 0.5, 0.5],
                                image_std=[0.5, 0.5, 0.5])
