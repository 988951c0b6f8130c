"""The vision encoders of Qwen2-VL, Qwen2.5-VL and Qwen3-VL, layer by layer from scratch.

The encoder reads an image as a sequence of flattened patches (the processor's `pixel_values`, one row per
patch of 2 frames × 3 channels × p × p) and its grid `image_grid_thw` (t, h, w). The patches stand in 2 × 2
merge blocks (block-major: the four patches of a block, then the next block), each image attends only to
itself, and every layer turns q and k by a 2-D rotary: half of each head's frequencies by the patch's row,
half by its column (`vision_angles`). Qwen2.5-VL reorders the blocks by window and attends within windows
of `window_size` pixels, except in its full-attention layers (`fullatt_block_indexes`); Qwen3-VL adds learned
position embeddings before the first layer (they are in every layer's input already).

transformers' vision attention returns its output, not its weights, so the model has no probability to
compare with: these layers are verified on their block outputs after the projection (`proj`), computed from
the captured inputs with our probabilities (tests/test_qwen_vl.py). The decoder's layers are
`probe/families/qwen2_vl.py` and `qwen3_vl.py`; its 3-D positions `probe.mrope`.
"""

from __future__ import annotations

import torch

from .scratch import LayerSpec

__all__ = ["vision_layer_spec", "vision_positions", "vision_angles", "vision_segments"]


def vision_layer_spec(visual, i: int, angles: torch.Tensor | None = None) -> LayerSpec:
    """Layer `i` of a Qwen-VL vision encoder (`model.visual`): q, k and v from one fused `qkv` projection, the
    output projection `proj`, every head sees every patch of its segment; `angles` (N, head_dim / 2) of the
    segment's patches (`vision_angles`), or None for no rotary."""
    attn = visual.blocks[i].attn
    w, b = attn.qkv.weight.detach(), attn.qkv.bias.detach()
    dim = w.shape[1]
    wq, wk, wv = w.split(dim)
    bq, bk, bv = b.split(dim)
    n_heads = attn.num_heads
    return LayerSpec(wq, wk, wv, attn.proj.weight.detach(), bq, bk, bv, attn.proj.bias.detach(), n_heads=n_heads,
                     n_kv_heads=n_heads, head_dim=dim // n_heads, scale=float(attn.scaling), causal=False,
                     rotary_angles=None if angles is None else (lambda T: angles[:T]))


def vision_positions(visual, grid_thw: torch.Tensor) -> torch.Tensor:
    """(row, column) of every patch (N, 2), in the order the layers see them: block-major over the 2 × 2 merge
    blocks, image after image (transformers' `get_vision_position_ids`), reordered by window in Qwen2.5-VL
    (its `get_vision_window_index`)."""
    from transformers.vision_utils import get_vision_position_ids

    merge = visual.spatial_merge_size
    positions = get_vision_position_ids(grid_thw, merge)
    if hasattr(visual, "window_size"):  # Qwen2.5-VL: the merge blocks taken window by window
        from transformers.vision_utils import get_vision_window_index

        window_index, _ = get_vision_window_index(grid_thw, spatial_merge_size=merge, window_size=visual.window_size,
                                                  patch_size=visual.patch_size)
        positions = positions.reshape(-1, merge**2, 2)[window_index].reshape(-1, 2)
    return positions


def vision_angles(visual, positions: torch.Tensor) -> torch.Tensor:
    """The rotary angles (N, head_dim / 2) of patches at `positions` (N, 2): the first half of a head's
    frequencies turn by the row, the second half by the column, at θ^(-4i/d) (θ = the config's rope_theta)."""
    cfg = visual.config
    head_dim = cfg.hidden_size // cfg.num_heads if not hasattr(cfg, "embed_dim") else cfg.embed_dim // cfg.num_heads
    theta = float((getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0))
    quarter = head_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, quarter, 2, dtype=torch.float) / quarter))  # (head_dim / 4,)
    return torch.cat([positions[:, :1].float() * inv_freq, positions[:, 1:].float() * inv_freq], dim=-1)


def vision_segments(visual, i: int, grid_thw: torch.Tensor) -> list[tuple[int, int]]:
    """The (start, stop) slices of the patches that attend to each other in layer `i`: each image, or in
    Qwen2.5-VL's window layers each window."""
    if hasattr(visual, "window_size") and i not in visual.fullatt_block_indexes:
        from transformers.vision_utils import get_vision_window_index

        _, cu = get_vision_window_index(grid_thw, spatial_merge_size=visual.spatial_merge_size,
                                        window_size=visual.window_size, patch_size=visual.patch_size)
        cu = torch.unique_consecutive(torch.as_tensor(cu)).tolist()
    else:
        cu = [0] + torch.cumsum(grid_thw.prod(-1), 0).tolist()
    return [(a, b) for a, b in zip(cu[:-1], cu[1:]) if b > a]
