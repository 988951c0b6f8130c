"""The HTML report: one offline file, escaped text, a strict CSP, explorer data that matches the maps."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from html import unescape

import pandas as pd
import pytest

import report_samples as R
from headscope.reports.analysis import ModelAnalysis
from headscope.reports.html import build_report, explorer_data
from headscope.reports.panels import slug
from headscope.reports.sections import report_tables


@pytest.fixture(scope="module")
def sections():
    return R.two_model_report()[0]


@pytest.fixture(scope="module")
def report():
    return R.two_model_report()[1]


def _scripts(html: str) -> list[tuple[str, str]]:
    return re.findall(r"<script([^>]*)>(.*?)</script>", html, flags=re.S)


def test_no_network_reference_of_any_kind(report):
    html = report.html
    for attr, url in re.findall(r"""\b(src|href|action|poster|data)\s*=\s*["']([^"']*)""", html):
        assert url.startswith(("data:", "#")), f"{attr}={url[:60]} would load something"
    assert not re.search(r"url\(\s*['\"]?(?!data:)", html), "a CSS url() outside data:"
    assert "@import" not in html
    # The only http(s) string is the SVG namespace, which is a name, not a request.
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) <= {"http://www.w3.org/2000/svg"}


def test_content_security_policy_forbids_requests_and_allows_only_our_script(report):
    html = report.html
    csp = unescape(re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)"', html).group(1))
    rules = dict(part.strip().split(" ", 1) for part in csp.split(";"))
    assert rules["default-src"] == "'none'" and rules["connect-src"] == "'none'"
    assert rules["img-src"] == "data:"
    assert "unsafe-inline" not in csp
    executable = [body for attrs, body in _scripts(html) if "application/json" not in attrs]
    assert len(executable) == 1
    digest = base64.b64encode(hashlib.sha256(executable[0].encode()).digest()).decode()
    assert rules["script-src"] == f"'sha256-{digest}'"
    style = re.search(r"<style>(.*?)</style>", html, flags=re.S).group(1)
    assert rules["style-src"] == "'sha256-" + base64.b64encode(hashlib.sha256(style.encode()).digest()).decode() + "'"
    assert " style=" not in html.replace(executable[0], "")  # inline style attributes would break the CSP


def test_user_and_model_text_is_escaped(report):
    html = report.html
    markup_free = html.replace(_scripts(html)[-1][1], "")  # leave the (trusted) explorer script out
    assert "<script>alert(1)</script>" not in markup_free
    assert "<img src=x" not in markup_free
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&#34;&gt;&lt;img src=x onerror=" in html
    # Inside the JSON block the same sentence cannot close the script element either.
    data = [body for attrs, body in _scripts(html) if "application/json" in attrs][0]
    assert "</script" not in data and "<" not in data and "\\u003cscript\\u003e" in data


def test_explorer_data_is_strict_json_matching_the_maps(report, sections):
    html = report.html
    body = [b for a, b in _scripts(html) if 'id="hs-data"' in a][0]

    def no_nan(token):
        raise AssertionError(f"{token} in the explorer JSON")

    data = json.loads(body, parse_constant=no_nan)
    assert [m["name"] for m in data["models"]] == ["toy-enc", "toy-dec"]
    first = data["models"][0]
    amap = sections[0].maps[0]
    token = first["sentences"][0]["views"]["self"]["attention"]["token"]
    assert token["labels"] == list(amap.labels)
    n = len(amap)
    layer, head = 2, 3
    att = token["att"][layer * R.N_HEADS + head]
    expected = (amap.attention[layer, head] * 1000).round().int().flatten().tolist()
    assert att == expected
    word = first["sentences"][0]["views"]["self"]["attention"]["word"]
    assert "didn't" in word["labels"] and len(word["labels"]) < n
    # The explorer opens on the probe's selected head and grid.
    assert (first["start"]["layer"], first["start"]["head"]) == R.PROBE_HEAD
    assert first["start"]["metric"] == "probe:coref-toy"
    assert data["models"][1]["causal"] is True
    grid = first["grids"]["previous_token"]["values"]
    assert grid[R.PREV_HEAD[0]][R.PREV_HEAD[1]] == 1.0


def test_every_figure_is_inlined_and_written(report, tmp_path):
    names = [f.name for f in report.figures]
    assert len(names) == len(set(names))
    for f in report.figures:
        assert f.png.startswith(b"\x89PNG\r\n\x1a\n")
        assert f.data_uri in report.html
        assert f.inline.startswith(b"\x89PNG") and len(f.inline) <= len(f.png)
    assert sum(len(f.inline) for f in report.figures) < 0.7 * sum(len(f.png) for f in report.figures)
    import io

    import numpy as np
    from PIL import Image

    for f in report.figures[:4]:  # the page's copy looks like the file's
        full, page = (np.asarray(Image.open(io.BytesIO(b)).convert("RGB"), dtype=float) for b in (f.png, f.inline))
        assert full.shape == page.shape and np.abs(full - page).mean() < 2.0
    for kind in ("verification", "heads-previous_token", "probe-coref-toy-grid", "probe-coref-toy-drilldown",
                 "attention-0-L1H2", "model-view"):
        assert f"toy-enc-{kind}.png" in names
    written = report.write(tmp_path)
    assert (tmp_path / "index.html").read_text(encoding="utf-8") == report.html
    assert {p.name for p in (tmp_path / "figures").iterdir()} == set(names)
    assert all(p.exists() for p in written)


def test_tables_stack_models_and_are_written_as_csv(report, tmp_path):
    tables = report.tables
    assert set(tables) >= {"verification", "head_scores", "head_roles", "probe_summary", "probe_heads",
                           "probe_examples", "corpus"}
    assert list(tables["head_scores"].columns) == ["model", "layer", "head", "metric", "value", "n"]
    assert set(tables["head_scores"]["model"]) == {"toy-enc", "toy-dec"}
    summary = tables["probe_summary"]
    assert summary.loc[0, "best_layer"] == R.PROBE_HEAD[0] and summary.loc[0, "heldout_accuracy"] == 0.9
    report.write(tmp_path)
    back = pd.read_csv(tmp_path / "verification.csv")
    assert list(back.columns[:2]) == ["model", "layer"] and len(back) == 2 * R.N_LAYERS


def test_sections_show_models_side_by_side(report):
    html = report.html
    for section in ("verification", "heads", "probe", "attention", "corpus", "settings"):
        body = html.split(f'<section id="{section}">', 1)[1].split("</section>", 1)[0]
        assert body.count('<div class="model-name">toy-enc</div>') == 1, section
        assert body.count('<div class="model-name">toy-dec</div>') == 1, section
    assert "L1H2 (chosen in all 5 folds) resolves 36/40" in html  # the verdict
    assert "90.0% (36/40)" in html and "76.9% – 96.0%" in html  # held-out accuracy and its Wilson interval
    assert "baseline: nearest" in html


def test_a_failed_verification_is_shown_first_and_loud():
    sec = ModelAnalysis(model="bad", maps=(R.token_map("a b"),), verification=R.verification("bad", passed=False))
    html = build_report([sec]).html
    banner = html.index('id="verification-failed"')
    assert banner < html.index('<section id="explorer">')
    assert "Verification FAILED for bad" in html
    assert "attention NOT verified" in html


def test_missing_parts_are_said_not_hidden():
    sec = ModelAnalysis(model="bare", maps=(R.token_map("just a map"),))
    html = build_report([sec]).html
    assert "not verified in this run" in html
    assert html.count("not run") >= 3
    assert json.loads(re.search(r'id="hs-data">(.*?)</script>', html, flags=re.S).group(1))["models"][0]["grids"] == {}


def test_notes_are_escaped_banners():
    sec = ModelAnalysis(model="m", maps=(R.token_map("x y"),), notes=("<b>verification could not run</b>",))
    html = build_report([sec]).html
    assert "m: &lt;b&gt;verification could not run&lt;/b&gt;" in html


def test_report_needs_a_section():
    with pytest.raises(ValueError, match="at least one"):
        build_report([])


def test_slug_keeps_file_names_safe():
    assert slug("../../etc/passwd") == "etc-passwd"
    assert slug("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB-SmolLM2-135M"
    assert slug("<script>") == "script"
    assert slug("???") == "model"


def test_explorer_data_skips_models_without_maps(sections):
    data = explorer_data([ModelAnalysis(model="nothing"), sections[0]])
    assert [m["name"] for m in data["models"]] == ["toy-enc"]
    assert report_tables([ModelAnalysis(model="nothing")]) == {}


def test_models_whose_names_share_a_slug_get_distinct_files():
    a, b = (ModelAnalysis(model=m, verification=R.verification(m)) for m in ("org/model", "org-model"))
    report = build_report([a, b])
    assert [f.name for f in report.figures] == ["org-model-verification.png", "org-model-2-verification.png"]


def test_a_figure_is_one_registry_entry(monkeypatch):
    """A spec added to FIGURES is drawn, written under its stem, captioned, and shown in its group."""
    import headscope.reports.html as H
    from headscope.reports.figures import verification_plot
    from headscope.reports.panels import FIGURES, FigureSpec, Panel

    def panels(section):
        if section.verification is not None:
            for layer in section.verification.layers[:2]:
                yield Panel((section.verification,), {"layer": layer.layer}, section.verification)

    extra = FigureSpec("extra", "verification", "verification", verification_plot, panels,
                       "extra-{layer}", "Extra view of layer {layer}.")
    monkeypatch.setattr(H, "FIGURES", {**FIGURES, "extra": extra})
    sec = ModelAnalysis(model="m", verification=R.verification("m"))
    report = build_report([sec])
    extra_files = [f for f in report.figures if f.name.startswith("m-extra-")]
    assert [(f.name, f.caption, f.group) for f in extra_files] == [
        ("m-extra-0.png", "Extra view of layer 0.", "verification"),
        ("m-extra-1.png", "Extra view of layer 1.", "verification")]
    section = report.html[report.html.index('<section id="verification">'):report.html.index('<section id="heads">')]
    assert all(f.data_uri in section and f.caption in section for f in extra_files)


def test_probe_figures_sit_beside_their_probe():
    first, second = R.probe_result(task="task-a"), R.probe_result(task="task-b")
    report = build_report([ModelAnalysis(model="m", probes=(first, second))])
    probe_part = report.html[report.html.index('<section id="probe">'):report.html.index('<section id="attention">')]
    a, b = probe_part.index("<h3>task-a"), probe_part.index("<h3>task-b")
    for f in report.figures:
        if f.group == "probe":
            where = probe_part.index(f.data_uri)
            assert (a < where < b) == (f.result is first) and (where > b) == (f.result is second)
    assert [f.name for f in report.figures] == ["m-probe-task-a-grid.png", "m-probe-task-a-drilldown.png",
                                                "m-probe-task-b-grid.png", "m-probe-task-b-drilldown.png"]


def test_the_explorer_and_the_inline_view_share_one_copy_of_their_helpers(report):
    from importlib import resources

    from headscope.reports.page import static_script
    from headscope.reports.inline import show

    common = resources.files("headscope.reports").joinpath("static", "common.js").read_text(encoding="utf-8").strip()
    for name in ("explorer.js", "inline.js"):
        own = resources.files("headscope.reports").joinpath("static", name).read_text(encoding="utf-8")
        assert "function el(" not in own and "var BLUES" not in own  # defined once, in common.js
        assert static_script(name).count(common) == 1
    [explorer] = [body for attrs, body in _scripts(report.html) if "application/json" not in attrs]
    assert common in explorer  # inside the one script the CSP hash allows (checked above)
    import torch

    fragment = show(torch.full((1, 1, 2, 2), 0.5), ["a", "b"]).html
    assert fragment.count("function el(") == 1 and fragment.count("var BLUES") == 1
