"""Mllama (Llama 3.2 Vision): a tiled vision encoder and a Llama decoder that reads the image through
cross-attention layers, not through image tokens in its text.

The text holds one `<|image|>` marker per image and nothing else of the picture. The processor cuts each
picture into up to `max_image_tiles` square tiles (a `rows × cols` arrangement, `aspect_ratio_ids`); each tile
becomes a CLS token and a `side × side` grid of patches. The vision encoder runs a local transformer over the
tiles of an image together (its tokens padded to a multiple of 8; the mask hides a padding key from a padding
query only, so a real token also sees padding — transformers' `_prepare_aspect_ratio_attention_mask`) and then
a global transformer of gated layers (`gate_attn`, `gate_ffn`) over the same tokens; both are verified here
as one "vision" stack numbered local layers first, then global ones.

The decoder's layers listed in `cross_attention_layers` are cross-attention blocks: the text tokens' queries
(RMS-normed per head) over the keys of every image's tiles' tokens (RMS-normed per head, from the projected
vision output, padding removed: image, tile, then CLS and patches row by row). Which tiles a text token may see
comes from `cross_attention_mask` (the processor's: from an image's marker on); a token that may see none
attends to every key, and its row is zeroed after the block (`full_text_row_masked_out_mask`). The block's
output is multiplied by tanh(`cross_attn_attn_gate`) before it joins the residual stream (and the MLP's by
tanh(`cross_attn_mlp_gate`)): the gates scale what the block adds, after W_O, so the verified attention and
W_O output are those of the block itself; `gates` reports them. The other decoder layers are Llama's causal
self-attention over the text tokens (the `llama` family's spec).
"""

from __future__ import annotations

import math

import torch

from ..scratch import LayerSpec
from ..types import ImagePatch
from ._reading import composite, text_config, tiny_chat_template, tiny_pil_processor
from ..family import Family, Refusal, Stack, VisionLanguage, linear_weights, norm_eps

IMAGE_TOKEN = "<|image|>"

__all__ = ["FAMILY", "gates", "key_patches", "tile_grid"]


def _text(base):
    return base.language_model


def _vision(base):
    return base.vision_model


def _cross_layers(cfg) -> tuple[int, ...]:
    return tuple(sorted(text_config(cfg).cross_attention_layers))


def _self_layers(cfg) -> tuple[int, ...]:
    cross = set(_cross_layers(cfg))
    return tuple(i for i in range(text_config(cfg).num_hidden_layers) if i not in cross)


# --- vision encoder: local layers, then the gated global layers --------------------------------------------


def _vision_layer(base, i: int):
    vision = _vision(base)
    local = len(vision.transformer.layers)
    return vision.transformer.layers[i] if i < local else vision.global_transformer.layers[i - local]


def _vision_spec(base, i: int, cfg) -> LayerSpec:
    attn = _vision_layer(base, i).self_attn
    (wq, bq), (wk, bk) = linear_weights(attn.q_proj), linear_weights(attn.k_proj)
    (wv, bv), (wo, bo) = linear_weights(attn.v_proj), linear_weights(attn.o_proj)
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=attn.num_heads, n_kv_heads=attn.num_heads,
                     head_dim=attn.head_dim, scale=attn.scaling, causal=False)


def _patches_per_tile(cfg) -> int:
    vision = composite(cfg).vision_config
    return (vision.image_size // vision.patch_size) ** 2 + 1  # the CLS token first


def _vision_visible(cfg, inputs: dict, T: int, S: int) -> torch.Tensor:
    """(B·images, T, T): a query and a key are both padding (a padded patch of a tile, or a tile the image does
    not have) -> hidden; every other pair sees each other."""
    tiles_real = inputs["aspect_ratio_mask"].reshape(-1, inputs["aspect_ratio_mask"].shape[-1]).bool()  # (BI, tiles)
    n_tiles = tiles_real.shape[1]
    length = T // n_tiles
    n_real = _patches_per_tile(cfg)
    # transformers masks the last (length - n_real) patches of each tile; with none to pad, `[-0:]` masks all
    real_patch = torch.arange(length) < n_real if length > n_real else torch.zeros(length, dtype=torch.bool)
    real = (tiles_real[:, :, None] & real_patch[None, None, :]).reshape(tiles_real.shape[0], T)
    return ~(~real[:, :, None] & ~real[:, None, :])


# --- decoder: self-attention layers (Llama's) and cross-attention layers ------------------------------------


def _self_spec(base, i: int, cfg) -> LayerSpec:
    from .llama import llama_spec

    return llama_spec(_text(base), i, text_config(cfg))


def _cross_spec(base, i: int, cfg) -> LayerSpec:
    attn = _text(base).layers[i].cross_attn
    (wq, bq), (wk, bk) = linear_weights(attn.q_proj), linear_weights(attn.k_proj)
    (wv, bv), (wo, bo) = linear_weights(attn.v_proj), linear_weights(attn.o_proj)
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=attn.num_heads, n_kv_heads=attn.num_key_value_heads,
                     head_dim=attn.head_dim, scale=attn.scaling, causal=False, q_norm=attn.q_norm.weight.detach(),
                     k_norm=attn.k_norm.weight.detach(), norm_eps=norm_eps(attn.q_norm), norm_offset=0.0)


def _cross_visible(cfg, inputs: dict, T: int, S: int) -> torch.Tensor:
    """(B, T, S): text token t sees the keys of the tiles `cross_attention_mask[t]` allows (every token of a
    tile: CLS and patches); a token allowed none sees every key (transformers zeroes its mask row)."""
    allowed = inputs["cross_attention_mask"].bool()  # (B, T, images, tiles)
    per_key = allowed.flatten(2).repeat_interleave(S // allowed[0, 0].numel(), dim=2)  # (B, T, S)
    return per_key | ~per_key.any(dim=2, keepdim=True)


def _cross_memory(args: tuple, kwargs: dict) -> torch.Tensor:
    """The keys' source: the projected vision tokens, (B, images·tiles·patches, D)."""
    hidden = args[0] if args else kwargs["hidden_states"]
    states = kwargs["cross_attention_states"]
    return states.reshape(hidden.shape[0], -1, states.shape[-1])


VISION = Stack(kind="vision", layer_spec=_vision_spec, attention=lambda base, i: _vision_layer(base, i).self_attn,
               out_proj=lambda base, i: _vision_layer(base, i).self_attn.o_proj,
               n_layers=lambda cfg: composite(cfg).vision_config.num_hidden_layers
               + composite(cfg).vision_config.num_global_layers, visible=_vision_visible)
DECODER = Stack(kind="decoder", layer_spec=_self_spec, attention=lambda base, i: _text(base).layers[i].self_attn,
                out_proj=lambda base, i: _text(base).layers[i].self_attn.o_proj,
                n_layers=lambda cfg: text_config(cfg).num_hidden_layers, layers=_self_layers)
CROSS = Stack(kind="cross", layer_spec=_cross_spec, attention=lambda base, i: _text(base).layers[i].cross_attn,
              out_proj=lambda base, i: _text(base).layers[i].cross_attn.o_proj,
              n_layers=lambda cfg: text_config(cfg).num_hidden_layers, keys="encoder", layers=_cross_layers,
              visible=_cross_visible, memory=_cross_memory)


# --- where each key sits on its picture ---------------------------------------------------------------------


def tile_grid(cfg, aspect_ratio_id: int) -> tuple[int, int]:
    """The (rows, cols) of tiles of an image with `aspect_ratio_id` (1-based, the processor's id; 0: padding)."""
    from transformers.models.mllama.image_processing_pil_mllama import get_all_supported_aspect_ratios

    return tuple(get_all_supported_aspect_ratios(composite(cfg).vision_config.max_num_tiles)[aspect_ratio_id - 1])


def key_patches(cfg, inputs: dict, batch: int = 0) -> tuple[ImagePatch | None, ...]:
    """Each cross-attention key's place (image, tile, then CLS and patches row by row): an `ImagePatch` on the
    picture's whole grid (tiles side by side), `view` "tile r,c"; None for a tile's CLS token and for a
    tile the image does not have."""
    vision = composite(cfg).vision_config
    side = vision.image_size // vision.patch_size
    ids = inputs["aspect_ratio_ids"][batch]
    n_tiles = inputs["cross_attention_mask"].shape[-1]
    out: list = []
    for image, ratio in enumerate(int(r) for r in ids):
        rows, cols = tile_grid(cfg, ratio) if ratio > 0 else (0, 0)
        for tile in range(n_tiles):
            tr, tc = divmod(tile, max(cols, 1))
            out.append(None)  # the tile's CLS token
            for p in range(side * side):
                r, c = divmod(p, side)
                out.append(ImagePatch(image, tr * side + r, tc * side + c, rows * side, cols * side,
                                      view=f"tile {tr},{tc}") if tile < rows * cols else None)
    return tuple(out)


def _picture(config, inputs: dict, image: int) -> torch.Tensor:
    """The whole picture as the model saw it: the image's tiles put back side by side, (3, rows·H, cols·W)."""
    tiles = inputs["pixel_values"][0, image]  # (tiles, 3, H, W)
    ratio = int(inputs["aspect_ratio_ids"][0, image])
    n = int(inputs["aspect_ratio_mask"][0, image].sum())
    from transformers.models.mllama.image_processing_pil_mllama import get_all_supported_aspect_ratios

    max_tiles = tiles.shape[0]
    rows, cols = get_all_supported_aspect_ratios(max_tiles)[ratio - 1]
    if rows * cols != n:
        raise RuntimeError(f"image {image}: {n} real tiles but aspect ratio {rows} x {cols}")
    grid = tiles[: rows * cols].reshape(rows, cols, *tiles.shape[1:])  # (rows, cols, 3, H, W)
    return grid.permute(2, 0, 3, 1, 4).reshape(tiles.shape[1], rows * tiles.shape[2], cols * tiles.shape[3])


def gates(lm) -> dict[str, dict[int, float]]:
    """The tanh of every gate, by the model's own layer numbers: the cross-attention layers' attention and MLP
    gates (what multiplies the block's output before the residual stream) and the vision global layers'."""
    return _gates(lm.model.model if hasattr(lm.model, "model") else lm.model, lm.config)


def _gates(base, cfg) -> dict[str, dict[int, float]]:
    text, vision = _text(base), _vision(base)
    local = len(vision.transformer.layers)
    return {
        "cross_attn": {i: math.tanh(float(text.layers[i].cross_attn_attn_gate.detach())) for i in _cross_layers(cfg)},
        "cross_mlp": {i: math.tanh(float(text.layers[i].cross_attn_mlp_gate.detach())) for i in _cross_layers(cfg)},
        "vision_attn": {local + k: math.tanh(float(layer.gate_attn.detach())) for k, layer in enumerate(vision.global_transformer.layers)},
        "vision_ffn": {local + k: math.tanh(float(layer.gate_ffn.detach())) for k, layer in enumerate(vision.global_transformer.layers)},
    }


# --- the tiny model -----------------------------------------------------------------------------------------


def _tiny_config(vocab: int, model_type: str):
    from transformers import AutoConfig

    vision = dict(hidden_size=32, attention_heads=4, num_hidden_layers=2, num_global_layers=1, intermediate_size=64,
                  image_size=16, patch_size=4, max_num_tiles=2, intermediate_layers_indices=[0, 1],
                  vision_output_dim=32 * 3, supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]])
    text = dict(vocab_size=vocab, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3,
                cross_attention_layers=[1], intermediate_size=64, max_position_embeddings=256,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, pad_token_id=0, bos_token_id=1,
                eos_token_id=2)
    # the tokenizer's last token is <|image|> (added by tiny_model before the config is made)
    return AutoConfig.for_model(model_type, vision_config=vision, text_config=text, image_token_index=vocab - 1)


def _tiny_processor(cfg, tokenizer):
    from transformers import MllamaProcessor

    size = cfg.vision_config.image_size
    image = tiny_pil_processor(size, "MllamaImageProcessorPil", max_image_tiles=cfg.vision_config.max_num_tiles)
    return MllamaProcessor(image_processor=image, tokenizer=tokenizer, chat_template=tiny_chat_template(IMAGE_TOKEN))


def _refuse_text(cfg) -> str | None:
    from .llama import FAMILY as LLAMA

    for refusal in LLAMA.refuses:
        reason = refusal.reason(text_config(cfg))
        if reason is not None:
            return reason
    return None


FAMILY = Family(
    name="mllama",
    model_types=("mllama",),
    kind="decoder",
    features=("decoder self-attention: llama's (rotary, grouped KV heads), over the text tokens only",
              "cross-attention layers: text queries over every image's tile tokens, q and k RMS-normed per head, "
              "the processor's cross_attention_mask per text token (none allowed: every key)",
              "tanh gates after W_O reported (gates), not part of the block",
              "vision: local then gated global layers, padding hidden from padding only"),
    layer_spec=_self_spec,
    attention=DECODER.attention,
    out_proj=DECODER.out_proj,
    refuses=(Refusal("decoder", _refuse_text),),
    tiny_config=_tiny_config,
    tokenizer="bytebpe",
    auto_class="AutoModelForImageTextToText",
    modality="vision-language",
    vision_language=VisionLanguage(vision=VISION, vision_family="mllama", image_units=lambda cfg, inputs, k: [IMAGE_TOKEN],
                                   tiny_processor=_tiny_processor, image_tokens=lambda cfg: (IMAGE_TOKEN,),
                                   decoder=DECODER, cross=CROSS, picture=_picture,
                                   key_patches=key_patches, gates=_gates),
)
