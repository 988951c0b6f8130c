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

import dataclasses
from collections.abc import Callable, Sequence

import torch

from .hooks import catch, first_input
from .scratch import LayerSpec

__all__ = ["vision_layer_spec", "vision_positions", "vision_angles", "vision_segments", "visual_stack",
           "block_output_errors", "vision_calls", "segment_error"]


def vision_layer_spec(visual, i: int, angles: torch.Tensor | None = None) -> LayerSpec:
    """Layer `i` of a Qwen-VL-style vision encoder (`model.visual`: Qwen-VL's, GLM-4V's): q, k and v from one fused
    `qkv` projection (with or without biases), the output projection `proj`, every head sees every patch of its
    segment; an RMS norm of each query and key head before rotary where the module has one (GLM-OCR's `q_norm`,
    `k_norm`); `angles` (N, head_dim / 2) of the segment's patches (`vision_angles`), or None for no rotary."""
    from .family import linear_weights, norm_eps

    attn = visual.blocks[i].attn
    (w, b), (wo, bo) = linear_weights(attn.qkv), linear_weights(attn.proj)
    dim = w.shape[1]
    wq, wk, wv = w.split(dim)
    bq, bk, bv = (None, None, None) if b is None else b.split(dim)
    n_heads = attn.num_heads
    norms = {}
    if getattr(attn, "q_norm", None) is not None:  # GLM-OCR: plain-weight RMS norms per head
        norms = dict(q_norm=attn.q_norm.weight.detach(), k_norm=attn.k_norm.weight.detach(),
                     norm_eps=norm_eps(attn.q_norm), norm_offset=0.0, norm_scope="head")
    return LayerSpec(wq, wk, wv, wo, bq, bk, bv, bo, n_heads=n_heads, n_kv_heads=n_heads, head_dim=dim // n_heads,
                     scale=float(attn.scaling), causal=False,
                     rotary_angles=None if angles is None else (lambda T: angles[:T]), **norms)


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


def visual_stack(visual_of):
    """The vision encoder's layers as a `Stack` (`visual_of(base)`: the encoder, `model.visual`): each block's
    `attn` with its `proj`, specs by `vision_layer_spec`, `depth` layers."""
    from .family import Stack

    return Stack(kind="vision", layer_spec=lambda base, i, cfg: vision_layer_spec(visual_of(base), i),
                 attention=lambda base, i: visual_of(base).blocks[i].attn,
                 out_proj=lambda base, i: visual_of(base).blocks[i].attn.proj,
                 n_layers=lambda cfg: getattr(cfg, "composite", cfg).vision_config.depth)


def block_output_errors(stack, visual_of, base, cfg, inputs) -> list[float]:
    """Each vision layer's relative |Δ| of its block output after `proj`, recomputed from its captured input
    segment by segment (`stack`'s layer, turned by the 2-D rotary of the segment's patches): the vision
    attention returns no weights to compare. `visual_of(base)`: the encoder."""
    visual = visual_of(base)
    pixels, grid = inputs["pixel_values"], inputs["image_grid_thw"]
    n = len(visual.blocks)
    ins, cus, outs = vision_calls(lambda: visual(pixels.to(next(visual.parameters()).dtype), grid_thw=grid),
                                  [block.attn for block in visual.blocks], [block.attn.proj for block in visual.blocks])
    angles = vision_angles(visual, vision_positions(visual, grid))
    errors = []
    for i in range(n):
        segments = vision_segments(visual, i, grid)
        if cus[i] is not None and [0, *(b for _, b in segments)] != list(dict.fromkeys(cus[i].tolist())):
            errors.append(float("inf"))  # the model's own segments (images, windows) are not ours
            continue
        errors.append(segment_error(stack.layer_spec(base, i, cfg), ins[i], outs[i], angles, segments))
    return errors


def vision_calls(run: Callable[[], object], attentions: Sequence[torch.nn.Module],
                 projections: Sequence[torch.nn.Module]) -> tuple[list, list, list]:
    """From one `run()` of a vision tower (in inference mode): each layer's attention input, its `cu_seqlens`
    keyword (the segments the model attends within; None where not given) and its output after `projections[i]`,
    three lists by layer (None for a layer that did not run)."""
    def input_and_segments(call):
        return first_input(*call).detach(), call[1].get("cu_seqlens")

    with catch(dict(enumerate(attentions)), what="arguments", take=input_and_segments) as called, \
            catch(dict(enumerate(projections))) as outs, torch.inference_mode():
        run()
    n = len(attentions)
    ins, cus = ([called[i][k] if i in called else None for i in range(n)] for k in (0, 1))
    return ins, cus, [outs.get(i) for i in range(n)]


def segment_error(spec: LayerSpec, x: torch.Tensor, y: torch.Tensor, angles: torch.Tensor,
                  segments: list[tuple[int, int]]) -> float:
    """The largest relative error of one vision layer's output recomputed from scratch on each segment (an image,
    a window) alone, each token turned by its own rotary angles: `x` the layer's input, `y` its output,
    `[tokens, width]`. The check of every vision tower whose attention gives no weights (Qwen-VL's and its kin)."""
    from .scratch import attention_from_scratch

    worst = 0.0
    for a, b in segments:
        turned = angles[a:b]
        seg = dataclasses.replace(spec, rotary_angles=lambda T, turned=turned: turned[:T])
        res = attention_from_scratch(x[a:b][None].float(), seg, torch.ones(1, b - a))
        ref = y[a:b].float()
        worst = max(worst, (res.output[0] - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30))
    return worst
