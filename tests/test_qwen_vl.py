"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL decoders: verified from scratch on text (1-D rotary) and with image tokens
at the model's own 3-D positions (time, row, column), and the image / row / column of every image token."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from conftest import _tiny
from headscope.probe.families import FAMILIES, family_of_type
from headscope.probe.mrope import at_positions, image_token_types, mrope_angles, qwen_vl_positions
from headscope.probe.scratch import attention_from_scratch
from headscope.probe.verify import verify

COMPOSITES = {"qwen2_vl": "qwen2_vl", "qwen2_5_vl": "qwen2_vl", "qwen3_vl": "qwen3_vl"}  # model type -> family
VISION = {  # tiny vision encoders: 2 x 2 pixel patches, 2 frames per temporal patch, 2 x 2 merge
    "qwen2_vl": dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=2),
    "qwen2_5_vl": dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=2,
                       window_size=8, fullatt_block_indexes=[1]),
    "qwen3_vl": dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=2,
                     num_position_embeddings=16, deepstack_visual_indexes=[0]),
}


@functools.lru_cache(maxsize=None)
def composite(model_type: str, seed: int = 0):
    """A tiny random Qwen-VL model (vision encoder, merger and decoder) whose decoder is the family's tiny config."""
    from transformers import AutoConfig, AutoModel

    family = FAMILIES[COMPOSITES[model_type]]
    vocab = 64
    text = family.tiny_config(vocab + 4, f"{model_type}_text")
    cfg = AutoConfig.for_model(model_type, text_config=text.to_dict(), vision_config=VISION[model_type],
                               image_token_id=vocab, video_token_id=vocab + 1, vision_start_token_id=vocab + 2,
                               vision_end_token_id=vocab + 3)
    torch.manual_seed(seed)
    model = AutoModel.from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


def inputs(model, grids, seed: int = 0):
    """Two rows: text, an image (its merged tokens between vision start and end), more text, a second image in
    the first row only (the second row is padded on the right)."""
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    merge = cfg.vision_config.spatial_merge_size
    words = lambda n: torch.randint(0, 60, (n,), generator=g).tolist()  # noqa: E731
    image = lambda t, h, w: [cfg.vision_start_token_id] + [cfg.image_token_id] * (t * h * w // merge**2) + [cfg.vision_end_token_id]  # noqa: E731
    rows = [words(3) + image(*grids[0]) + words(4) + image(*grids[1]) + words(2),
            words(2) + image(*grids[2]) + words(3)]
    T = max(map(len, rows))
    ids = torch.tensor([r + [0] * (T - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])
    vc = cfg.vision_config
    n_patches = sum(t * h * w for t, h, w in grids)
    pixels = torch.randn(n_patches, vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2, generator=g)
    return ids, mask, pixels, torch.tensor(grids)


def captured(model, family, ids, mask, pixels, grid_thw):
    """One forward pass of the whole model: each decoder layer's input, attention weights and output after W_O."""
    lm_base = model.language_model
    n = lm_base.config.num_hidden_layers
    ins, outs, handles = [None] * n, [None] * n, []
    for i in range(n):
        handles.append(family.attention(lm_base, i).register_forward_pre_hook(
            lambda m, a, k, i=i: ins.__setitem__(i, (a[0] if a else k["hidden_states"]).detach()), with_kwargs=True))
        handles.append(family.out_proj(lm_base, i).register_forward_hook(
            lambda m, a, o, i=i: outs.__setitem__(i, o.detach())))
    try:
        with torch.inference_mode():
            out = model(input_ids=ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grid_thw,
                        mm_token_type_ids=image_token_types(model, ids), output_attentions=True, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return ins, out.attentions, outs


def worst_error(model, family, ids, mask, pixels, grid_thw, spec_for) -> float:
    """The largest |Δ| of the probabilities and the outputs over every layer and every real query / key."""
    ins, probs, outs = captured(model, family, ids, mask, pixels, grid_thw)
    lm_base, cfg = model.language_model, model.language_model.config
    worst = 0.0
    for i in range(cfg.num_hidden_layers):
        res = attention_from_scratch(ins[i], spec_for(family.layer_spec(lm_base, i, cfg)), mask)
        for b, n in enumerate(mask.sum(1).tolist()):
            worst = max(worst, (res.probs[b, :, :n, :n] - probs[i][b, :, :n, :n]).abs().max().item(),
                        (res.output[b, :n] - outs[i][b, :n]).abs().max().item() / outs[i][b, :n].abs().max().item())
    return worst


GRIDS = [[1, 4, 6], [1, 2, 2], [1, 6, 4]]  # (t, h, w) patches: 2 x 3, 1 x 1 and 3 x 2 merged tokens


@pytest.mark.parametrize("model_type", sorted(COMPOSITES))
def test_the_decoder_is_verified_at_the_models_own_3d_positions_and_fails_at_1d_ones(model_type):
    model = composite(model_type)
    family = FAMILIES[COMPOSITES[model_type]]
    ids, mask, pixels, grid_thw = inputs(model, GRIDS)
    pos = qwen_vl_positions(model, ids, image_grid_thw=grid_thw, attention_mask=mask)
    cfg = model.language_model.config
    assert worst_error(model, family, ids, mask, pixels, grid_thw,
                       lambda spec: at_positions(spec, cfg, pos.position_ids, scheme=family_of_type(cfg.model_type).mrope)) <= 1e-5
    # break it: positions 0 .. T-1 on every stream (text rotary) miss what the image tokens' rows and columns add
    assert worst_error(model, family, ids, mask, pixels, grid_thw, lambda spec: spec) > 1e-3
    # break it: the other layout of the frequencies (sections for Qwen3-VL, interleaved for Qwen2-VL)
    sections, interleaved = family_of_type(cfg.model_type).mrope.layout(cfg)  # the scheme its decoder family declares

    def other_layout(spec):
        angles = mrope_angles(pos.position_ids, spec.inv_freq, sections, interleaved=not interleaved)
        return dataclasses.replace(spec, rotary_angles=lambda T: angles[:, :T])

    assert worst_error(model, family, ids, mask, pixels, grid_thw, other_layout) > 1e-3


@pytest.mark.parametrize("model_type", sorted(COMPOSITES))
def test_a_hidden_checkpoint_of_another_seed_and_grid_verifies_too(model_type):
    model = composite(model_type, seed=7)
    family = FAMILIES[COMPOSITES[model_type]]
    ids, mask, pixels, grid_thw = inputs(model, [[1, 2, 4], [1, 4, 4], [1, 2, 2]], seed=3)
    pos = qwen_vl_positions(model, ids, image_grid_thw=grid_thw, attention_mask=mask)
    cfg = model.language_model.config
    assert worst_error(model, family, ids, mask, pixels, grid_thw,
                       lambda spec: at_positions(spec, cfg, pos.position_ids, scheme=family_of_type(cfg.model_type).mrope)) <= 1e-5


def test_every_image_token_knows_its_image_row_and_column():
    model = composite("qwen2_vl")
    ids, mask, _, grid_thw = inputs(model, GRIDS)
    pos = qwen_vl_positions(model, ids, image_grid_thw=grid_thw, attention_mask=mask)
    assert pos.grids == ((2, 3), (1, 1), (3, 2))  # (h / 2, w / 2) merged tokens per image
    # by hand: row 0 is 3 words, vision start, image 0's 6 tokens (2 x 3, row by row), vision end, 4 words, vision
    # start, image 1's one token; row 1 is 2 words, vision start, image 2's 6 tokens (3 x 2)
    first = [(t.index, t.image, t.row, t.col) for t in pos.tokens if t.batch == 0]
    assert first == [(4, 0, 0, 0), (5, 0, 0, 1), (6, 0, 0, 2), (7, 0, 1, 0), (8, 0, 1, 1), (9, 0, 1, 2), (16, 1, 0, 0)]
    second = [(t.index, t.image, t.row, t.col) for t in pos.tokens if t.batch == 1]
    assert second == [(3 + k, 2, k // 2, k % 2) for k in range(6)]
    patches = pos.patches(1)  # AttentionMap.patches of row 1: image 2's cells, None for its text tokens
    assert patches[:3] == (None,) * 3 and patches[9:] == (None,) * (len(patches) - 9)
    assert [(p.image, p.row, p.col, p.rows, p.cols) for p in patches[3:9]] == [(2, k // 2, k % 2, 3, 2) for k in range(6)]
    assert patches[8].box == (2 / 3, 0.5, 1.0, 1.0)  # the last cell of 3 x 2: bottom right
    # the model's own positions agree: an image token's row and column streams differ from its time by (row, col)
    p = pos.position_ids
    for t in pos.tokens:
        assert p[1, t.batch, t.index] - p[0, t.batch, t.index] == t.row
        assert p[2, t.batch, t.index] - p[0, t.batch, t.index] == t.col
    # text tokens: the three streams are equal; after an image they go on from its largest position + 1
    assert p[0, 0, 10] == p[1, 0, 10] == p[2, 0, 10] == 4 + 3  # 4 before the image; its grid spans 3 columns
    with pytest.raises(ValueError, match="image"):
        qwen_vl_positions(model, ids, image_grid_thw=grid_thw[:2], attention_mask=mask)


def test_mrope_angles_by_hand():
    pos = torch.tensor([[[5]], [[7]], [[11]]])  # (3, B=1, T=1): time 5, row 7, column 11
    inv = torch.tensor([1.0, 0.5, 0.25, 0.125])
    contiguous = mrope_angles(pos, inv, (2, 1, 1), interleaved=False)[0, 0]
    torch.testing.assert_close(contiguous, torch.tensor([5 * 1.0, 5 * 0.5, 7 * 0.25, 11 * 0.125]))
    interleaved = mrope_angles(pos, inv, (2, 1, 1), interleaved=True)[0, 0]
    torch.testing.assert_close(interleaved, torch.tensor([5 * 1.0, 7 * 0.5, 11 * 0.25, 5 * 0.125]))


@pytest.mark.parametrize("model_type", ["qwen2_vl_text", "qwen2_5_vl_text", "qwen3_vl_text"])
def test_the_tiny_decoders_verify_on_text_alone(model_type):
    v = verify(_tiny(model_type))
    assert v.passed and v.max_abs_err <= 1e-5 and v.family == COMPOSITES[model_type.removesuffix("_text")]


# --- the vision encoders ------------------------------------------------------------------------------------


def vision_error(visual, pixels, grid_thw, *, angles_of=None, segments_of=None) -> float:
    """The largest normwise |Δ| of every layer's attention output after `proj`, recomputed from its captured input
    segment by segment (transformers' vision attention returns no weights to compare)."""
    from headscope.probe.qwen_vision import vision_angles, vision_layer_spec, vision_positions, vision_segments

    n = len(visual.blocks)
    ins, outs, cus, handles = [None] * n, [None] * n, [None] * n, []
    for i, block in enumerate(visual.blocks):
        def grab(m, a, k, i=i):
            ins[i], cus[i] = (a[0] if a else k["hidden_states"]).detach(), k["cu_seqlens"].tolist()
        handles.append(block.attn.register_forward_pre_hook(grab, with_kwargs=True))
        handles.append(block.attn.proj.register_forward_hook(lambda m, a, o, i=i: outs.__setitem__(i, o.detach())))
    try:
        with torch.inference_mode():
            visual(pixels, grid_thw=grid_thw)
    finally:
        for h in handles:
            h.remove()
    positions = vision_positions(visual, grid_thw)
    angles = (angles_of or vision_angles)(visual, positions)
    worst = 0.0
    for i in range(n):
        segments = (segments_of or vision_segments)(visual, i, grid_thw)
        assert segments_of or [0] + [b for _, b in segments] == list(dict.fromkeys(cus[i]))  # the model's own blocks
        for a, b in segments:
            spec = vision_layer_spec(visual, i, None if angles is None else angles[a:b])
            res = attention_from_scratch(ins[i][a:b][None], spec, torch.ones(1, b - a))
            ref = outs[i][a:b]
            worst = max(worst, (res.output[0] - ref).abs().max().item() / ref.abs().max().item())
    return worst


VISION_GRIDS = [[1, 8, 12], [1, 4, 4]]  # Qwen2.5-VL: 8-pixel windows of 2 x 2 merged tokens -> 2 x 3 and 1 x 1


@pytest.mark.parametrize("model_type", sorted(COMPOSITES))
def test_the_vision_encoder_is_reproduced_with_its_2d_rotary_and_windows(model_type):
    visual = composite(model_type).visual
    _, _, pixels, grid_thw = inputs(composite(model_type), VISION_GRIDS + [[1, 2, 2]])
    assert vision_error(visual, pixels, grid_thw) <= 1e-5
    # break it: no rotary; rows and columns swapped
    assert vision_error(visual, pixels, grid_thw, angles_of=lambda v, p: None) > 1e-3
    from headscope.probe.qwen_vision import vision_angles

    assert vision_error(visual, pixels, grid_thw, angles_of=lambda v, p: vision_angles(v, p.flip(-1))) > 1e-3
    if model_type == "qwen2_5_vl":  # break it: each image whole in the window layer
        whole = lambda v, i, g: [(a, b) for a, b in zip([0, 96], [96, 112])] + [(112, 116)]  # noqa: E731
        assert vision_error(visual, pixels, grid_thw, segments_of=whole) > 1e-3
