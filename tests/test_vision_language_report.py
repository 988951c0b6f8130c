"""The Vision–language figures, `hs.plot`, the report section and its tables, on the hand-built map of
tests/test_vision_language.py (3 text units, a 2 × 3 grid of image tokens, 2 text units; a 20 × 30 picture)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headscope.probe.types import ImagePatch
from headscope.reports.analysis import ModelAnalysis
from headscope.reports.html import build_report
from headscope.reports.panels import FIGURES, vision_language_head
from headscope.reports.vision_language import image_mosaic, image_overlay, image_rollout_figure
from test_vision_language import T, _text_map, vl_map


def _heat(ax) -> list:
    return ax.get_images()[1:]  # the picture first, then one overlay per view


def test_overlay_puts_the_row_on_the_grid_over_the_picture_with_the_query_cell_outlined():
    m = vl_map()
    before = m.attention.clone()
    fig = image_overlay(m, 0, 1, query="a")  # "a" looks at the image token of row 1, column 1
    ax = fig.axes[0]
    picture, [heat] = ax.get_images()[0], _heat(ax)
    assert picture.get_extent() == [0, 30, 20, 0]  # the whole 30 x 20 picture
    assert heat.get_extent() == [0, 30, 20, 0]  # the base view covers it
    np.testing.assert_allclose(np.ma.filled(heat.get_array(), np.nan), [[0, 0, 0], [0, 1, 0]])
    assert "L0H1" in ax.get_title() and "1.00 on the image" in ax.get_title()
    assert not ax.patches  # "a" is a text token: no cell to outline
    fig = image_overlay(m, 0, 0, query=7)  # from an image token: its cell (row 1, column 1 of 2 x 3) outlined
    [box] = fig.axes[0].patches
    assert (box.get_x(), box.get_y(), box.get_width(), box.get_height()) == pytest.approx((10, 10, 10, 10))
    assert torch.equal(m.attention, before)


def test_tiles_land_on_their_part_of_the_picture_and_a_thumbnail_gets_its_own_panel():
    cells = ((None,) * 3 + (ImagePatch(0, 0, 0, 1, 2, view="tile 0,0", box=(0.0, 0.0, 1.0, 0.25)),
                            ImagePatch(0, 0, 1, 1, 2, view="tile 0,0", box=(0.0, 0.25, 1.0, 0.5)),
                            ImagePatch(0, 0, 0, 1, 2, view="tile 0,1", box=(0.0, 0.5, 1.0, 0.75)),
                            ImagePatch(0, 0, 1, 1, 2, view="tile 0,1", box=(0.0, 0.75, 1.0, 1.0)),
                            ImagePatch(0, 0, 0, 1, 2, view="thumbnail"), ImagePatch(0, 0, 1, 1, 2, view="thumbnail"))
             + (None, None))
    m = vl_map(patches=cells)
    fig = image_overlay(m, 0, 1, query="cat")  # "cat" looks at unit 5: tile 0,1's left cell
    tiles, thumb = [ax for ax in fig.axes if ax.get_images()]
    extents = [im.get_extent() for im in _heat(tiles)]
    assert extents == [[0, 15, 20, 0], [15, 30, 20, 0]]  # left half, right half of the 30-pixel-wide picture
    np.testing.assert_allclose(np.ma.filled(_heat(tiles)[1].get_array(), np.nan), [[1, 0]])
    assert [im.get_extent() for im in _heat(thumb)] == [[0, 30, 20, 0]] and "thumbnail" in thumb.get_title()


def test_mosaic_and_rollout():
    m = vl_map()
    fig = image_mosaic(m, query="cat")
    drawn = [ax for ax in fig.axes if ax.get_images()]
    assert len(drawn) == 4 and [ax.get_title() for ax in drawn] == ["L0H0", "L0H1", "L1H0", "L1H1"]
    np.testing.assert_allclose(np.ma.filled(_heat(drawn[3])[0].get_array(), np.nan), [[0, 0, 1], [0, 0, 0]])
    one = image_mosaic(m, most=1)
    assert len([ax for ax in one.axes if ax.get_images()]) == 1 and "1 of 2 layers" in one._suptitle.get_text()
    a = torch.zeros(1, 1, T, T)
    for q in range(T):
        a[0, 0, q, 5 if q == 10 else 0] = 1.0
    fig = image_rollout_figure(vl_map(a))  # "cat": half on unit 5 (row 0, column 2), half on itself
    np.testing.assert_allclose(np.ma.filled(_heat(fig.axes[0])[0].get_array(), np.nan), [[0, 0, 0.5], [0, 0, 0]])
    assert "0.50 on the image" in fig.axes[0].get_title()


def test_plot_dispatches_a_vision_language_map():
    import headscope as hs

    m = vl_map()
    fig = hs.plot(m, layer=1, head=1, query="a")
    np.testing.assert_allclose(np.ma.filled(_heat(fig.axes[0])[0].get_array(), np.nan), [[0, 0, 0], [0, 1, 0]])
    assert len([ax for ax in hs.plot(m, layer=0).axes if ax.get_images()]) == 2  # every head of the layer
    assert len([ax for ax in hs.plot(m, view="mosaic").axes if ax.get_images()]) == 4
    assert hs.plot(m, view="rollout").axes[0].get_images()
    assert hs.plot(m, layer=0, head=0, view="heatmap").axes  # the query x key heatmap still
    with pytest.raises(ValueError, match="unit index"):
        hs.plot(m, layer=0, head=0, query=99)


def test_the_report_shows_the_section_with_its_figures_and_tables():
    m = vl_map()
    a = ModelAnalysis(model="toy-vl", vision_language=(m, m), vision_language_value_norms=(None, torch.ones(2, 2, T)))
    assert vision_language_head(a) == (0, 1)  # head 1 of layer 0 puts all of "a"'s and "cat"'s attention on the image
    report = build_report([a])
    assert 'id="vision_language"' in report.html and "Vision–language" in report.html
    names = [f.name for f in report.figures if f.group == "vision_language"]
    assert names == ["toy-vl-vision-language-0-L0H1.png", "toy-vl-vision-language-1-L0H1.png",
                     "toy-vl-vision-language-mosaic.png", "toy-vl-vision-language-rollout-0.png",
                     "toy-vl-vision-language-rollout-1.png"]
    heads = report.tables["vision_language_heads"]
    assert list(heads["model"].unique()) == ["toy-vl"] and len(heads) == 4
    sinks = report.tables["visual_sinks"]
    assert set(sinks["i"]) == {0, 1} and sinks[sinks["i"] == 0]["value_norm_ratio"].isna().all()
    assert (sinks[sinks["i"] == 1]["value_norm_ratio"] == 1.0).all()
    assert a.to_dict()["vision_language"] == [{"text": m.text, "images": 1, "image_tokens": 6}] * 2
    plain = build_report([ModelAnalysis(model="text", maps=(_text_map(),))])
    assert 'id="vision_language"' not in plain.html and "visual_sinks" not in plain.tables
    assert all(spec.group != "vision_language" or not list(spec.panels(ModelAnalysis(model="x")))
               for spec in FIGURES.values())


def test_the_analysis_refuses_maps_without_image_tokens_and_mismatched_norms():
    with pytest.raises(ValueError, match="needs image tokens"):
        ModelAnalysis(model="x", vision_language=(_text_map(),))
    with pytest.raises(ValueError, match="one per map"):
        ModelAnalysis(model="x", vision_language=(vl_map(),), vision_language_value_norms=(None, None))
