"""Vision–language types added in issue 49, each on what its own processor does (the tests every reading family
shares are in tests/test_vision_language_decoders.py): image-token counts worked out by hand from the tiny
config, and the picture each token's cell lies on."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import _tiny
from headscope.probe.extract import extract
from headscope.probe.families import UnsupportedFeature, family_for


def _picture(seed: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).random(shape)


def test_deepseek_vl_reads_the_picture_padded_to_a_square():
    """A 30 x 100 picture: its longer side resized to the tower's 32, its shorter one padded, centred, with the mean
    colour (127 of 255) to a 32 x 32 square; one image token per 8 x 8 patch of the square: 4 x 4 = 16."""
    lm = _tiny("deepseek_vl")
    [m] = extract(lm, "A <image_placeholder> wide one", images=[_picture(4, (30, 100, 3))])
    cells = [p for p in m.patches if p is not None]
    assert len(cells) == 16 and {(p.rows, p.cols, p.view) for p in cells} == {(4, 4, "base")}
    seen = m.pictures[0]
    assert seen.shape == (32, 32, 3)
    np.testing.assert_allclose(seen[[0, -1]], 127 / 255, atol=1e-6)  # the padding above and below
    assert seen[16].std() > 0.05  # the picture itself in the middle


def test_janus_puts_each_images_patches_between_its_markers():
    """Janus: <begin_of_image>, one token per 8 x 8 patch of the 32 x 32 square (16), <end_of_image>; the markers
    are on no cell."""
    lm = _tiny("janus")
    [m] = extract(lm, "A <image_placeholder> and <image_placeholder> two", images=[_picture(1, (40, 52, 3)),
                                                                               _picture(2, (20, 20, 3))])
    for k in (0, 1):
        start = [i for i, label in enumerate(m.labels) if label == "<begin_of_image>"][k]
        assert m.labels[start + 17] == "<end_of_image>"
        assert [m.patches[start + 1 + j] for j in range(16)] == [
            type(m.patches[start + 1])(k, r, c, 4, 4) for r in range(4) for c in range(4)]
        assert m.patches[start] is None and m.patches[start + 17] is None


def test_janus_refuses_its_vision_qk_norm_by_name():
    cfg = _tiny("janus").model.config.__class__.from_dict(_tiny("janus").model.config.to_dict())
    cfg.vision_config.use_qk_norm = True
    with pytest.raises(UnsupportedFeature, match="use_qk_norm=True"):
        family_for(cfg)


def test_vipllava_drops_the_cls_token_and_reads_several_tower_layers():
    """ViP-LLaVA: the 32 x 32 picture's 4 x 4 patches, 16 image tokens (the tower's CLS is never read), and the
    projector takes the concatenated features of both tiny layers (2 x 32 wide)."""
    lm = _tiny("vipllava")
    [m] = extract(lm, "A <image> one", images=[_picture(3, (40, 52, 3))])
    assert sum(p is not None for p in m.patches) == 16 and "<image_cls>" not in m.labels
    assert lm.model.model.multi_modal_projector.linear_1.in_features == 2 * lm.model.config.vision_config.hidden_size


def test_internvl_tiles_a_wide_picture_in_one_row_then_its_thumbnail():
    """InternVL: a 30 x 100 picture (aspect 3.33) is cut into the grid of at most 4 tiles closest to it, 3 columns x
    1 row (aspect 3: off by 0.33; 4 x 1 is off by 0.67); each 32 x 32 tile's 8 x 8 patches shuffle 2 x 2 into 4 x 4
    tokens, the thumbnail's too: 4 x 16 = 64 image tokens between <img> and </img>. The tiles' cells cover the
    picture exactly once."""
    lm = _tiny("internvl")
    [m] = extract(lm, "A <IMG_CONTEXT> wide one", images=[_picture(4, (30, 100, 3))])
    start, end = m.labels.index("<img>"), m.labels.index("</img>")
    cells = m.patches[start + 1 : end]
    assert len(cells) == 64 and all(p is not None for p in cells)
    assert [p.view for p in cells[::16]] == ["tile 0,0", "tile 0,1", "tile 0,2", "thumbnail"]
    tiles = [p for p in cells if p.view != "thumbnail"]
    assert sum((p.box[2] - p.box[0]) * (p.box[3] - p.box[1]) for p in tiles) == pytest.approx(1.0)
    assert len({p.box for p in tiles}) == 48
    last = tiles[-1]  # tile (0, 2), cell (3, 3): the picture's bottom-right corner
    assert last.box == pytest.approx((0.75, 2 / 3 + 0.75 / 3, 1.0, 1.0))
    assert m.pictures[0].shape == (32, 32, 3)  # the thumbnail: the whole picture as one tile


def test_internvl_reads_a_small_picture_whole():
    """A 20 x 20 picture fits one tile: read whole (no thumbnail), one 4 x 4 grid over the picture."""
    lm = _tiny("internvl")
    [m] = extract(lm, "A <IMG_CONTEXT> small one", images=[_picture(5, (20, 20, 3))])
    cells = [p for p in m.patches if p is not None]
    assert [(p.row, p.col, p.rows, p.cols, p.view) for p in cells] == [(i, j, 4, 4, "base") for i in range(4)
                                                                        for j in range(4)]


def test_internvl_vision_q_k_norm_is_part_of_the_recomputation():
    """The tiny InternViT normalises its whole q and k projections (use_qk_norm): the vision layers recomputed
    without that norm fail."""
    import dataclasses

    from headscope.probe.verify import verify

    lm = _tiny("internvl")
    family = family_for(lm.config)
    vl = family.vision_language
    plain = dataclasses.replace(vl.vision, layer_spec=lambda base, i, cfg: dataclasses.replace(
        vl.vision.layer_spec(base, i, cfg), q_norm=None, k_norm=None))
    broken = dataclasses.replace(family, vision_language=dataclasses.replace(vl, vision=plain))
    images = [_picture(6, (40, 52, 3))]
    assert verify(lm, ["A <IMG_CONTEXT> one"], images=images).passed
    v = verify(lm, ["A <IMG_CONTEXT> one"], images=images, family=broken)
    assert not any(c.passed for c in v.layers if c.kind == "vision")
    assert all(c.passed for c in v.layers if c.kind == "decoder")


def test_aya_vision_names_each_tile_then_the_global_image():
    """Aya Vision: a 30 x 100 picture in 3 x 1 tiles (as InternVL's), each 32 x 32 tile's 4 x 4 patches shuffled 2 x 2
    into 2 x 2 tokens: <|START_OF_IMG|>, TILE_1 and tile (0, 0)'s 4 tokens, TILE_2 ..., TILE_3 ..., TILE_GLOBAL and
    the thumbnail's 4, <|END_OF_IMG|>; the TILE_ texts are the processor's (special), on no cell."""
    lm = _tiny("aya_vision")
    [m] = extract(lm, "A <image> wide one", images=[_picture(4, (30, 100, 3))])
    start, end = m.labels.index("<|START_OF_IMG|>"), m.labels.index("<|END_OF_IMG|>")
    cells = [p for p in m.patches[start:end] if p is not None]
    assert [p.view for p in cells] == ["tile 0,0"] * 4 + ["tile 0,1"] * 4 + ["tile 0,2"] * 4 + ["thumbnail"] * 4
    text = "".join(label for label, p in zip(m.labels[start + 1 : end], m.patches[start + 1 : end]) if p is None)
    assert text == "TILE_1TILE_2TILE_3TILE_GLOBAL" and all(m.special[start:end + 1])
    assert cells[7].box == pytest.approx((0.5, 1 / 3 + 0.5 / 3, 1.0, 2 / 3))  # tile (0, 1), cell (1, 1)


@pytest.mark.parametrize("shape", [(30, 100, 3), (100, 30, 3), (60, 64, 3)])
def test_internvl_each_tile_cell_shows_the_pixels_the_processor_cut_there(shape):
    """The tiles' grid read from the layout is the processor's own: the picture stretched onto that grid (PIL's
    bicubic resize, done here) and cut at each tile's box gives the pixels the processor put in that tile."""
    from PIL import Image

    lm = _tiny("internvl")
    picture = (_picture(7, shape) * 255).astype(np.uint8)
    [m] = extract(lm, "A <IMG_CONTEXT> one", images=[picture])
    tiles = [p for p in m.patches if p is not None and p.view.startswith("tile")]
    rows = 1 + max(int(p.view.split()[1].split(",")[0]) for p in tiles)
    cols = 1 + max(int(p.view.split(",")[1]) for p in tiles)
    out = lm.processor(text=["A <IMG_CONTEXT> one"], images=[picture], return_tensors="pt")
    assert out["pixel_values"].shape[0] == rows * cols + 1  # the tiles and the thumbnail
    stretched = np.asarray(Image.fromarray(picture).resize((32 * cols, 32 * rows), Image.BICUBIC), dtype=np.float32)
    stretched = (stretched / 255 - 0.5) / 0.5
    for k in range(rows * cols):
        r, c = divmod(k, cols)
        first = next(p for p in tiles if p.view == f"tile {r},{c}")
        assert first.box == pytest.approx((r / rows, c / cols, (r + 0.25) / rows, (c + 0.25) / cols))
        mine = stretched[32 * r : 32 * (r + 1), 32 * c : 32 * (c + 1)].transpose(2, 0, 1)
        np.testing.assert_allclose(out["pixel_values"][k].numpy(), mine, atol=2e-2)


@pytest.mark.parametrize("broken", ["rows and columns swapped", "every picture sees every picture"])
def test_lighton_ocr_pixtral_positions_and_picture_blocks_are_part_of_the_recomputation(broken):
    """LightOnOCR's Pixtral encoder reads two pictures as one sequence: each patch turned by its own (row, column),
    each picture seeing only itself. Recomputed with the positions read as (column, row), or without the blocks,
    its layers fail; the decoder's do not."""
    import dataclasses

    from headscope.probe.families.lighton_ocr import pixtral_angles
    from headscope.probe.verify import verify

    lm = _tiny("lighton_ocr")
    family = family_for(lm.config)
    vl = family.vision_language
    if broken == "rows and columns swapped":
        stack = dataclasses.replace(vl.vision, angles=lambda cfg, inputs: pixtral_angles(
            cfg, {**inputs, "image_sizes": inputs["image_sizes"].flip(-1)}))
    else:
        stack = dataclasses.replace(vl.vision, visible=None)
    broken_family = dataclasses.replace(family, vision_language=dataclasses.replace(vl, vision=stack))
    text, images = ["Two [IMG] and [IMG] here"], [_picture(8, (40, 52, 3)), _picture(9, (30, 60, 3))]
    assert verify(lm, text, images=images).passed
    v = verify(lm, text, images=images, family=broken_family)
    assert not any(c.passed for c in v.layers if c.kind == "vision")
    assert all(c.passed for c in v.layers if c.kind == "decoder")


def test_lighton_ocr_tokens_follow_the_resized_picture():
    """A 40 x 52 picture fits 32 pixels as 24 x 32 (floor of 40 / 1.625 and 52 / 1.625), whole 8-pixel cells (4-pixel
    patches merged 2 x 2): 3 x 4 = 12 [IMG] tokens, no row breaks; the picture seen is the 24 x 32 one, unpadded."""
    lm = _tiny("lighton_ocr")
    [m] = extract(lm, "A [IMG] one and [IMG] two", images=[_picture(1, (40, 52, 3)), _picture(2, (64, 16, 3))])
    first = [p for p in m.patches if p is not None and p.image == 0]
    assert [(p.row, p.col, p.rows, p.cols) for p in first] == [(r, c, 3, 4) for r in range(3) for c in range(4)]
    assert m.pictures[0].shape == (24, 32, 3) and m.pictures[1].shape == (32, 8, 3)  # 64 x 16 -> 32 x 8
    assert "[IMG_BREAK]" not in m.labels


def test_qianfan_ocr_reads_its_image_slot_and_its_saved_folder_loads_without_a_video_processor(tmp_path):
    """Qianfan-OCR: InternVL's layout whose processor takes `<image>` as the slot (expanded to <img>, the tiles'
    <IMG_CONTEXT> tokens and </img>) and has no video part, so its saved folder loads here (no torchvision) and
    reads a picture as the model it was saved from does."""
    from conftest import _tiny_type
    from headscope.probe.loading import load_model

    lm = _tiny_type("qianfan_ocr")
    [m] = extract(lm, "A <image> wide one", images=[_picture(4, (30, 100, 3))])
    cells = [p for p in m.patches if p is not None]
    assert len(cells) == 64 and m.labels[m.labels.index("<img>") + 65] == "</img>" and "<image>" not in m.labels
    lm.model.save_pretrained(tmp_path)
    lm.processor.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    [n] = extract(loaded, "A <image> wide one", images=[_picture(4, (30, 100, 3))])
    assert n.token_ids == m.token_ids and n.patches == m.patches
    torch.testing.assert_close(n.attention, m.attention)


# --- issue 49, more types (branch i49-more)

def test_llava_onevision1_5_class_tokens_own_rotary_is_part_of_the_recomputation(monkeypatch):
    """RiceViT turns each image's class token by its learned angles (`class_pos_emb`): recomputed with the class token
    unturned, the vision blocks no longer match; with its angles they do."""
    from headscope.probe.families import llava_onevision1_5 as family
    from headscope.probe.verify import verify

    lm = _tiny("llava_onevision1_5")
    picture = [_picture(5, (40, 52, 3))]
    assert all(c.passed for c in verify(lm, "What is here?", images=picture).layers if c.kind == "vision")
    real = family.vision_angles_with_cls

    def unturned_class_token(visual, grid):
        angles, segments = real(visual, grid)
        angles = angles.clone()
        angles[[a for a, _ in segments]] = 0.0
        return angles, segments

    monkeypatch.setattr(family, "vision_angles_with_cls", unturned_class_token)
    assert not any(c.passed for c in verify(lm, "What is here?", images=picture).layers if c.kind == "vision")


@pytest.mark.parametrize("shape", [(100, 230, 3), (200, 120, 3), (40, 52, 3)])
def test_granite_docling_tiles_follow_the_image_processors_grid_and_a_one_tile_page_has_no_global_image(shape):
    """GOT-OCR 2's tiling: the tiles (rows x columns) the image processor's own `get_tile_grid` gives for the page,
    each 4 x 4 tokens (64-pixel tiles of 4-pixel patches, shuffled 4 x 4), then the global image only when the page
    was cut in more than one tile."""
    lm = _tiny("granite_docling")
    rows, cols = lm.processor.image_processor.get_tile_grid(shape[0], shape[1])
    [m] = extract(lm, "A <image> page", images=[_picture(6, shape)])
    cells = [p for p in m.patches if p is not None]
    views = [f"tile {r},{c}" for r in range(rows) for c in range(cols)] + ["thumbnail"] if rows * cols > 1 else ["base"]
    assert list(dict.fromkeys(p.view for p in cells)) == views
    assert len(cells) == 16 * len(views) and all((p.rows, p.cols) == (4, 4) for p in cells)
    assert ("<global-img>" in m.labels) == (rows * cols > 1)


@pytest.mark.parametrize("shape", [(100, 230, 3), (40, 52, 3), (30, 30, 3)])
def test_ovis2_reads_the_global_image_first_then_the_tiles_of_the_image_processors_grid(shape):
    """Ovis2: the whole picture's 2 x 2 tokens (32-pixel frames of 8-pixel patches, grouped 2 x 2) first, then the
    tiles of the grid the image processor itself returns for the picture (`grids`, rows x columns), row by row; a
    picture of one tile is read whole."""
    lm = _tiny("ovis2")
    picture = _picture(7, shape)
    rows, cols = (int(x) for x in lm.processor.image_processor(images=[picture])["grids"][0])
    [m] = extract(lm, "A <image> picture", images=[picture])
    cells = [p for p in m.patches if p is not None]
    tiles = [f"tile {r},{c}" for r in range(rows) for c in range(cols)]
    views = ["thumbnail", *tiles] if rows * cols > 1 else ["base"]
    assert list(dict.fromkeys(p.view for p in cells)) == views
    assert len(cells) == 4 * len(views) and all((p.rows, p.cols) == (2, 2) for p in cells)
    tiled = rows * cols > 1
    assert (m.labels.count("<IMG_COL>"), m.labels.count("<IMG_ROW>")) == ((rows * (cols - 1), rows - 1) if tiled else (0, 0))


def test_video_llama_3_vision_rotary_rows_and_columns_are_part_of_the_recomputation(monkeypatch):
    """VideoLLaMA 3's vision blocks turn q and k by each patch's row and column: recomputed with the two swapped,
    they no longer match its outputs; as they are, they do."""
    from headscope.probe import qwen_vision
    from headscope.probe.verify import verify

    lm = _tiny("video_llama_3")
    picture = [_picture(8, (40, 52, 3))]
    assert all(c.passed for c in verify(lm, "What is here?", images=picture).layers if c.kind == "vision")
    real = qwen_vision.vision_angles
    monkeypatch.setattr(qwen_vision, "vision_angles", lambda visual, positions: real(visual, positions.flip(-1)))
    assert not any(c.passed for c in verify(lm, "What is here?", images=picture).layers if c.kind == "vision")
