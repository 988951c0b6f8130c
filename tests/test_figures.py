"""Figures: labels on every row and column, the right head drawn, best heads boxed, glyphs not boxes."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

import report_samples as R
from headscope.probe.types import AttentionMap
from headscope.reports import figures as F
from headscope.reports.canvas import to_png
from headscope.reports.heatmaps import display_label
from headscope.reports.fonts import families_for, font_context, font_families, font_for, missing_glyphs


def _pixels(fig) -> np.ndarray:
    import warnings

    from PIL import Image

    with warnings.catch_warnings():  # the deliberate tofu renderings warn "Glyph ... missing"
        warnings.simplefilter("ignore", UserWarning)
        return np.asarray(Image.open(io.BytesIO(to_png(fig, dpi=80))).convert("L"))


def _text_image(text: str, families: list[str] | None = None) -> np.ndarray:
    """`text` drawn alone at 40 pt, with our fonts (or only `families`)."""
    from matplotlib.figure import Figure

    extra = {} if families is None else {"font.family": families}
    with font_context(text, **extra):
        fig = Figure(figsize=(1.2, 1.2), dpi=80)
        fig.text(0.5, 0.5, text, fontsize=40, ha="center", va="center")
    return _pixels(fig)


# ---------------------------------------------------------------- fonts


def test_cjk_label_really_renders_as_glyphs():
    path = font_for("我")
    assert path is not None, f"no installed font draws 我; install fonts-noto-cjk (families: {font_families()})"
    from matplotlib.ft2font import FT2Font

    assert FT2Font(path).get_char_index(ord("我")) != 0
    # Without a CJK font both characters become the same missing-glyph box ("tofu"): the check
    # below can tell a box from a glyph.
    tofu_wo, tofu_ai = _text_image("我", ["DejaVu Sans"]), _text_image("爱", ["DejaVu Sans"])
    assert np.array_equal(tofu_wo, tofu_ai)
    wo, ai = _text_image("我"), _text_image("爱")
    assert not np.array_equal(wo, ai), "我 and 爱 render identically: both are boxes"
    assert not np.array_equal(wo, tofu_wo)
    assert (wo < 128).sum() > 30  # ink on the page


@pytest.mark.parametrize("text", ["我爱北京天安门", "こんにちは、カタカナ", "مرحبا بالعالم", "Ünïcödé ñ ß"])
def test_every_script_has_a_font(text):
    assert missing_glyphs(text) == []


def test_emoji_where_a_font_allows():
    if not any(f in font_families() for f in ("Symbola", "Noto Emoji", "OpenMoji", "Noto Sans Symbols2")):
        pytest.skip("no monochrome emoji font installed (Debian: fonts-symbola); matplotlib cannot draw colour emoji")
    assert missing_glyphs("😀🚀") == []
    assert not np.array_equal(_text_image("😀"), _text_image("🚀"))


def test_fallback_list_only_names_the_fonts_a_figure_needs():
    assert families_for("layer 0.25") == (font_families()[0],)
    assert any("CJK" in f for f in families_for("天安门")) or "WenQuanYi" in "".join(families_for("天安门"))


def test_figures_leave_the_callers_rcparams_alone_and_ignore_them():
    import matplotlib as mpl

    amap = R.token_map(R.SENTENCES[0])
    before = _pixels(F.attention_heatmap(amap, 0, 1))
    family = list(mpl.rcParams["font.family"])
    with mpl.rc_context({"font.size": 30, "axes.facecolor": "black", "font.family": ["serif"]}):
        during = _pixels(F.attention_heatmap(amap, 0, 1))
    assert np.array_equal(before, during), "a notebook's rcParams changed the figure"
    assert list(mpl.rcParams["font.family"]) == family


# ---------------------------------------------------------------- attention heatmap


def test_heatmap_has_every_label_and_a_colour_bar_for_long_texts():
    text = " ".join(f"w{i}" for i in range(44))
    amap = R.token_map(text)
    assert len(amap) >= 40
    fig = F.attention_heatmap(amap, 0, 1)
    ax, cbar = fig.axes  # the heatmap and its colour bar
    shown = [display_label(t) for t in amap.labels]
    assert [t.get_text() for t in ax.get_xticklabels()] == shown
    assert [t.get_text() for t in ax.get_yticklabels()] == shown
    assert "attention" in cbar.get_ylabel()
    assert min(t.get_fontsize() for t in ax.get_yticklabels()) >= 6


def test_heatmap_draws_the_requested_head_by_model_index():
    base = R.token_map("one two three")
    sub = AttentionMap(**{**base.__dict__, "attention": base.attention[[0, 2]][:, [1, 3]], "layers": (0, 2),
                          "heads": (1, 3)})
    fig = F.attention_heatmap(sub, 2, 3)
    drawn = np.asarray(fig.axes[0].collections[0].get_array()).reshape(len(sub), len(sub))
    assert np.allclose(drawn, base.attention[2, 3].numpy(), atol=1e-6)
    with pytest.raises(ValueError, match="layer 1 is not among the layers of this map"):
        F.attention_heatmap(sub, 1, 3)


def test_causal_heatmap_masks_what_the_query_cannot_see():
    amap = R.token_map("a b c d", causal=True)
    n = len(amap)
    drawn = F.attention_heatmap(amap, 1, 0).axes[0].collections[0].get_array()
    mask = np.ma.getmaskarray(drawn).reshape(n, n)
    assert np.array_equal(mask, np.triu(np.ones((n, n), dtype=bool), 1))
    seen = ~mask
    assert np.allclose(np.ma.getdata(drawn).reshape(n, n)[seen], amap.attention[1, 0].numpy()[seen], atol=1e-6)


def test_labels_are_drawn_as_typed():
    labels = ("$5", "$x$", "\n", " ", "我")
    att = torch.full((1, 1, 5, 5), 0.2)
    amap = AttentionMap(text="x", level="token", labels=labels, spans=((0, 0),) * 5, special=(False,) * 5,
                        attention=att, causal=False)
    fig = F.attention_heatmap(amap, 0, 0)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["$5", "$x$", "↵", "␣", "我"]
    _pixels(fig)  # mathtext would fail or change "$x$"; parse_math is off


def test_attention_mosaic_tiles_every_head():
    amap = R.token_map("a b c", layers=2, heads=3)
    fig = F.attention_mosaic(amap)
    mosaic = fig.axes[0].images[0].get_array()
    n = len(amap)
    tile = n + max(1, n // 8)
    for layer in range(2):
        for head in range(3):
            block = mosaic[layer * tile: layer * tile + n, head * tile: head * tile + n]
            assert np.allclose(block, amap.attention[layer, head].numpy(), atol=1e-6)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["0", "1"]


# ---------------------------------------------------------------- grids


def _boxes(ax):
    from matplotlib.patches import Rectangle

    return [(round(p.get_y() + 0.5), round(p.get_x() + 0.5)) for p in ax.patches
            if isinstance(p, Rectangle) and not p.get_fill()]


def _top_cells(scores, metric, k):
    """The k highest finite cells of a metric, ties to the lower (layer, head): a plain sort of the table."""
    rows = [(float(r.value), int(r.layer), int(r.head)) for r in scores.table.itertuples()
            if r.metric == metric and np.isfinite(r.value)]
    return [(l, h) for _, l, h in sorted(rows, key=lambda t: (-t[0], t[1], t[2]))[:k]]


@pytest.mark.parametrize("metric", ["previous_token", "entropy", "max_weight"])
def test_score_grid_draws_the_scores_and_boxes_exactly_the_top_heads(metric):
    sec = R.section()
    fig = F.score_grid(sec.scores, metric, k=3)
    ax = fig.axes[0]
    assert _boxes(ax) == _top_cells(sec.scores, metric, 3)  # (row = layer, column = head), best first
    grid = np.asarray(ax.images[0].get_array())
    expected = np.full((R.N_LAYERS, R.N_HEADS), np.nan)
    for r in sec.scores.table[sec.scores.table.metric == metric].itertuples():
        expected[r.layer, r.head] = r.value
    assert np.allclose(grid, expected)
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(h) for h in range(R.N_HEADS)]
    assert [t.get_text() for t in ax.get_yticklabels()] == [str(l) for l in range(R.N_LAYERS)]
    norm = ax.images[0].norm
    top = float(np.nanmax(expected)) if metric == "entropy" else 1.0  # entropy has no fixed upper bound
    assert (norm.vmin, norm.vmax) == (0.0, pytest.approx(top))


def test_score_grid_title_names_the_top_heads():
    sec = R.section()
    title = F.score_grid(sec.scores, "previous_token", k=2).axes[0].get_title()
    layer, head = R.PREV_HEAD  # the perfect previous-token head scores 1 on every row
    assert f"L{layer}H{head} 1.00" in title


def test_score_grid_says_when_a_metric_does_not_apply():
    sec = R.section(causal=True)
    fig = F.score_grid(sec.scores, "next_token")
    assert "not applicable" in fig.axes[0].get_title()
    assert np.ma.getmaskarray(fig.axes[0].images[0].get_array()).all()  # every cell grey
    assert _boxes(fig.axes[0]) == []


def test_probe_grid_and_drilldown_show_the_selected_head():
    result = R.probe_result()
    fig = F.probe_grid(result)
    assert _boxes(fig.axes[0]) == [R.PROBE_HEAD]
    assert "L1H2" in fig.axes[0].get_title() and "90%" in fig.axes[0].get_title()
    drill = F.probe_drilldown(result, max_examples=6)
    ax = drill.axes[0]
    assert "wrong ones first" in ax.get_title()
    # The documented order: the head's mistakes first (at most half of the 6), then the rest, in data order.
    ex = result.examples
    right = {e for e, g in ex.groupby("example") if (g["chosen"] & g["correct"]).any()}
    order = list(dict.fromkeys(ex["example"]))
    wrong = [e for e in order if e not in right][:3]
    shown = (wrong + [e for e in order if e not in wrong])[:6]
    rows = [r for e in shown for r in ex[ex["example"] == e].itertuples()]
    names = [t.get_text() for t in ax.get_yticklabels()]
    assert names == [display_label(str(r.candidate)) + (" ✓" if r.correct else "") for r in rows]
    red, blue, pale = (0.839, 0.153, 0.157), (0.122, 0.306, 0.612), (0.788, 0.839, 0.910)
    expected = [(blue if r.correct else red) if r.chosen else pale for r in rows]
    assert [p.get_facecolor()[:3] for p in ax.patches] == [pytest.approx(c, abs=0.01) for c in expected]
    assert [p.get_width() for p in ax.patches] == pytest.approx([float(r.attention) for r in rows])


def test_verification_plot_marks_failing_layers():
    v = R.verification(passed=False)
    fig = F.verification_plot(v)
    ax = fig.axes[0]
    green, red = (0.173, 0.627, 0.173), (0.839, 0.153, 0.157)
    assert [p.get_facecolor()[:3] for p in ax.patches] == [pytest.approx(green if c.passed else red, abs=0.01)
                                                           for c in v.layers]
    assert not all(c.passed for c in v.layers)
    assert [p.get_height() for p in ax.patches] == pytest.approx([max(c.max_abs_err, 1e-12) for c in v.layers])
    assert ax.lines[-1].get_ydata()[0] == v.tolerance  # the tolerance line
    assert "NOT verified" in ax.get_title()
    to_png(fig)  # tick labels are made at draw time
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert "1e-05" in ticks and not any("$" in t for t in ticks)


def test_plot_dispatches_on_the_result_type():
    from headscope.reports import plot

    sec = R.section()
    amap = sec.maps[0]
    drawn = plot(amap, layer=2, head=3).axes[0].collections[0].get_array()
    assert np.allclose(np.asarray(drawn).reshape(len(amap), len(amap)), amap.attention[2, 3].numpy(), atol=1e-6)
    grid = plot(sec.scores, metric="self").axes[0].images[0].get_array()
    assert np.allclose(grid, sec.scores.grid("self").to_numpy())
    assert _boxes(plot(sec.probes[0]).axes[0]) == [R.PROBE_HEAD]
    assert "verified" in plot(sec.verification).axes[0].get_title()
    with pytest.raises(TypeError, match="no figure is defined for a str"):
        plot("not a result")


def test_figures_show_themselves_in_jupyter_as_the_report_png():
    fig = F.attention_heatmap(R.token_map("a b"), 0, 0)
    png = fig._repr_png_()
    assert png.startswith(b"\x89PNG") and len(png) > 1000
