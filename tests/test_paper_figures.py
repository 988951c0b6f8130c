"""Figures for papers: PNG, SVG and PDF files with their fonts, scaled to a column width."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch

import report_samples as R
from headscope.probe.types import AttentionMap
from headscope.reports import canvas as C
from headscope.reports import figures as F

CJK = "我爱北京"


def _cjk_map() -> AttentionMap:
    att = torch.softmax(torch.randn(1, 1, 4, 4, generator=torch.Generator().manual_seed(0)), -1)
    return AttentionMap(text=CJK, level="word", labels=tuple(CJK), spans=tuple((i, i + 1) for i in range(4)),
                        special=(False,) * 4, attention=att, causal=False)


def _cjk_text_figure():
    """Only the CJK characters, large: a PDF without their glyphs would be nearly blank."""
    from headscope.reports.fonts import font_context

    with font_context(CJK):
        fig = C.report_figure(3.0, 1.0, layout=None)
        fig.text(0.5, 0.5, CJK, fontsize=40, ha="center", va="center")
    return fig


def _media_box(pdf: bytes) -> tuple[float, float]:
    x0, y0, x1, y1 = map(float, re.search(rb"/MediaBox\s*\[\s*([\d.]+) ([\d.]+) ([\d.]+) ([\d.]+)", pdf).groups())
    return x1 - x0, y1 - y0


def test_each_format_is_a_file_of_that_type():
    fig = F.attention_heatmap(_cjk_map(), 0, 0)
    png, svg, pdf = (C.figure_bytes(fig, fmt) for fmt in ("png", "svg", "pdf"))
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert pdf.startswith(b"%PDF-") and pdf.rstrip().endswith(b"%%EOF")
    assert ET.fromstring(svg).tag == "{http://www.w3.org/2000/svg}svg"
    fresh = F.attention_heatmap(_cjk_map(), 0, 0)
    assert C.to_png(fresh) == C.figure_bytes(F.attention_heatmap(_cjk_map(), 0, 0), "png")  # the report's PNG as before
    with pytest.raises(ValueError, match="unknown figure format 'gif'"):
        C.figure_bytes(fig, "gif")


def test_vector_files_are_reproducible():
    a = F.attention_heatmap(_cjk_map(), 0, 0)
    b = F.attention_heatmap(_cjk_map(), 0, 0)
    assert C.figure_bytes(a, "pdf") == C.figure_bytes(b, "pdf")  # no creation date inside
    assert C.figure_bytes(a, "svg") == C.figure_bytes(b, "svg")


@pytest.mark.parametrize("spec, inches", [("3.5in", 3.5), ("8.89cm", 3.5), ("88.9mm", 3.5), ("252pt", 3.5),
                                          (" 7 IN ", 7.0), (".5in", 0.5)])
def test_widths_with_units(spec, inches):
    assert C.parse_width(spec) == pytest.approx(inches)


@pytest.mark.parametrize("spec", ["3.5", "3.5 furlong", "-1in", "0cm", "in", ""])
def test_a_width_without_a_known_unit_is_refused(spec):
    with pytest.raises(ValueError, match="is not a width"):
        C.parse_width(spec)


def test_width_scales_the_file_keeping_its_aspect_and_leaves_the_figure_alone():
    from matplotlib.text import Text

    fig = F.score_grid(R.section().scores, "previous_token")
    w, h = fig.get_size_inches()
    sizes = [t.get_fontsize() for t in fig.findobj(Text)]
    pdf = C.figure_bytes(fig, "pdf", width=3.5)
    assert _media_box(pdf) == pytest.approx((3.5 * 72, 3.5 * h / w * 72), abs=0.05)  # PDF points
    from PIL import Image

    png = Image.open(io.BytesIO(C.figure_bytes(fig, "png", dpi=200, width=3.5)))
    assert png.size[0] == 700 and png.size[1] == pytest.approx(700 * h / w, abs=1)
    assert tuple(fig.get_size_inches()) == (w, h)
    assert [t.get_fontsize() for t in fig.findobj(Text)] == sizes


def test_svg_draws_cjk_glyphs_as_outlines():
    svg = C.figure_bytes(F.attention_heatmap(_cjk_map(), 0, 0), "svg").decode("utf-8")
    # svg.fonttype "path": each glyph is an outline defined once as <font>-<glyph index>, no <text>
    # left to a reader's fonts. Four characters, four distinct CJK outlines (tofu would be one, index 0).
    glyphs = set(re.findall(r'id="([^"]*CJK[^"]*-[0-9a-f]+)"', svg))
    assert len(glyphs) == len(set(CJK)) and not any(g.endswith("-0") for g in glyphs), glyphs
    assert "<text" not in svg


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed (Debian: apt-get install -y poppler-utils; scripts/setup.sh does)")
    return path


def test_pdf_with_cjk_labels_embeds_a_cjk_font():
    pdf = C.figure_bytes(F.attention_heatmap(_cjk_map(), 0, 0), "pdf")
    listing = subprocess.run([_need("pdffonts"), "-"], input=pdf, capture_output=True, check=True).stdout.decode()
    rows = [line.split() for line in listing.splitlines()[2:]]
    cjk = [r for r in rows if "CJK" in r[0]]
    assert cjk, f"no CJK font in the PDF:\n{listing}"
    assert all(r[-5] == "yes" for r in cjk), f"the CJK font is not embedded:\n{listing}"  # the 'emb' column


def _grow(mask: np.ndarray, r: int) -> np.ndarray:
    """`mask` dilated by r pixels (a square neighbourhood)."""
    padded = np.pad(mask, r)
    h, w = mask.shape
    return np.any([padded[i:i + h, j:j + w] for i in range(2 * r + 1) for j in range(2 * r + 1)], axis=0)


def test_pdf_with_cjk_labels_renders_like_the_png():
    from PIL import Image

    fig = _cjk_text_figure()
    png = np.asarray(Image.open(io.BytesIO(C.figure_bytes(fig, "png", dpi=100))).convert("L"))
    pdf = C.figure_bytes(fig, "pdf")
    ppm = subprocess.run([_need("pdftoppm"), "-r", "100", "-gray", "-"], input=pdf, capture_output=True,
                         check=True).stdout
    raster = np.asarray(Image.open(io.BytesIO(ppm)).convert("L"))
    assert raster.shape == png.shape
    ink_png, ink_pdf = png < 128, raster < 128
    assert ink_png.sum() > 500  # the characters really are on the PNG
    assert 0.8 < ink_pdf.sum() / ink_png.sum() < 1.25
    # The two renderers place text up to a pixel or two apart: ink counts as matching within 2 px.
    near_png = (ink_pdf & _grow(ink_png, 2)).sum() / ink_pdf.sum()
    near_pdf = (ink_png & _grow(ink_pdf, 2)).sum() / ink_png.sum()
    assert min(near_png, near_pdf) > 0.95, f"the PDF's characters are not the PNG's ({near_png:.2f}, {near_pdf:.2f})"
    # tofu boxes instead of glyphs would look alike for every character: not so here
    quarters = np.array_split(ink_pdf[:, ink_pdf.any(axis=0)], 4, axis=1)
    assert len({q.tobytes() for q in quarters}) == 4


def test_save_picks_the_format_by_suffix(tmp_path):
    from headscope.reports import save

    fig = F.attention_heatmap(_cjk_map(), 0, 0)
    assert save(fig, tmp_path / "f.pdf", width="8.89cm").read_bytes().startswith(b"%PDF-")
    assert _media_box((tmp_path / "f.pdf").read_bytes())[0] == pytest.approx(252, abs=0.05)
    assert save(fig, tmp_path / "f.SVG").read_bytes().lstrip().startswith(b"<?xml")
    with pytest.raises(ValueError, match=r"\.png, \.svg, \.pdf"):
        save(fig, tmp_path / "f.jpg")


def _one_of_each_figure():
    """A report section with each kind of figure once: one sentence (one heatmap, model view, rollout,
    flow), one head-score metric (one grid), the verification, the probe's grid and drill-down. Its
    figures are what a full section draws several times over (23 of them), at a third of the cost in
    each of three formats."""
    import dataclasses

    from headscope.analyses.heads import score_corpus
    from headscope.analyses.metrics import METRICS

    full = R.section("toy-enc", texts=R.SENTENCES[:1])
    one = {"previous_token": METRICS["previous_token"]}
    scores = score_corpus(full.maps, level="token", model=full.model, metrics=one)
    return dataclasses.replace(full, scores=scores)


def test_report_writes_each_requested_format_and_inlines_the_same_png(tmp_path):
    from headscope.reports.html import build_report

    section = _one_of_each_figure()
    default = build_report([section])
    kinds = {"verification", "heads-previous_token", "probe-coref-toy-grid", "probe-coref-toy-drilldown",
             "attention-0-L1H2", "model-view", "rollout-0", "flow-0"}
    # each kind a text model's section draws
    assert {f.name[len("toy-enc-"):-len(".png")] for f in default.figures} == kinds
    assert len(default.figures) == len(kinds) and len({f.group for f in default.figures}) == 4
    papers = build_report([section], formats=("png", "svg", "pdf"), width=3.5)
    assert [f.name for f in papers.figures] == [f.name for f in default.figures]
    assert [f.inline for f in papers.figures] == [f.inline for f in default.figures]  # the page is unchanged
    default.write(tmp_path / "a")
    papers.write(tmp_path / "b")
    png_only = sorted(p.name for p in (tmp_path / "a" / "figures").iterdir())
    assert png_only == sorted(f.name for f in default.figures)
    written = sorted(p.name for p in (tmp_path / "b" / "figures").iterdir())
    stems = [f.name[:-4] for f in default.figures]
    assert written == sorted(f"{s}.{ext}" for s in stems for ext in ("png", "svg", "pdf"))
    for f in papers.figures:
        assert _media_box(f.files["pdf"])[0] == pytest.approx(252, abs=0.05)
    unscaled = build_report([section], formats=("svg", "png"))
    assert [f.files["png"] for f in unscaled.figures] == [f.png for f in default.figures]  # as a default run writes
    assert list(unscaled.figures[0].files) == ["svg", "png"]
    with pytest.raises(ValueError, match="choose one or more of png, svg, pdf"):
        build_report([section], formats=("tiff",))


def test_run_refuses_an_unknown_format_or_width_before_loading(tmp_path):
    from click.testing import CliRunner

    from headscope.cli import cli

    for args, message in ((["--format", "png,gif"], "--format png,gif: choose one or more of png, svg, pdf"),
                          (["--width", "3.5furlong"], "--width '3.5furlong' is not a width")):
        result = CliRunner().invoke(cli, ["run", "--model", "no-such-model", "--report", str(tmp_path / "r"), *args])
        assert result.exit_code == 2, result.output
        assert result.output.startswith(f"headscope: {message}") and len(result.output.strip().splitlines()) == 1
        assert not (tmp_path / "r").exists()
