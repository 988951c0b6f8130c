"""The pictures under image units: what the pages embed (`reports.payload.image_payload`) and, in a headless
Chromium where one is installed, the overlay `hs.show` and the report's explorer draw when a text token is picked.

The map is tests/test_vision_language.py's: 3 text units, a 2 × 3 grid of image tokens (units 3..8), "a" (9) and
"cat" (10); head 1 sends "a" wholly to the image token at row 1, column 1 (unit 7), "cat" to row 0, column 2
(unit 5). Its picture is replaced here by a 120 × 180 one, so each cell is 60 × 60 pixels on the page.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import re

import numpy as np
import pytest
import torch

from headscope.probe.types import ImagePatch
from headscope.reports.analysis import ModelAnalysis
from headscope.reports.html import build_report, explorer_data
from headscope.reports.inline import show
from headscope.reports.payload import image_payload, picture_uri
from test_inline_view import offline_page
from test_vision_language import _text_map, vl_map


def big_map(**kw):
    picture = np.zeros((120, 180, 3))
    picture[..., 2] = 1.0  # blue
    return dataclasses.replace(vl_map(**kw), pictures=(picture,))


def _decode(src: str) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))).convert("RGB"))


def test_payload_carries_each_image_units_cell_and_a_small_picture():
    p = image_payload(big_map())
    assert p["cells"][:3] == [None] * 3 and p["cells"][9:] == [None, None]
    # unit 7: image 0, panel 0, row 1 of 2 (top 0.5, bottom 1), column 1 of 3 (left 1/3, right 2/3)
    assert p["cells"][7] == [0, 0, 0.5, pytest.approx(1 / 3, abs=1e-5), 1.0, pytest.approx(2 / 3, abs=1e-5)]
    assert p["panels"] == [1] and p["start"] == 10  # "cat", the last text token
    [pic] = p["pictures"]
    assert (pic["width"], pic["height"]) == (180, 120)  # smaller than PICTURE_SIDE on both sides: kept as it is
    assert np.abs(_decode(pic["src"]).astype(int) - [0, 0, 255]).max() <= 2  # JPEG: within 2 of pure blue
    small = picture_uri(np.ones((400, 100, 3)), side=40)
    assert (small["width"], small["height"]) == (10, 40)
    assert image_payload(_text_map()) is None


def test_an_image_encoders_map_gets_its_patches_cells_and_starts_from_cls():
    from headscope.probe.types import AttentionMap

    m = AttentionMap(text="img", level="token", labels=("[CLS]", "r0c0", "r0c1", "r1c0", "r1c1"), spans=((0, 0),) * 5,
                     special=(True,) + (False,) * 4, attention=torch.full((1, 1, 5, 5), 0.2), causal=False, grid=(2, 2),
                     image=np.ones((40, 60, 3)))
    p = image_payload(m)
    assert p["cells"] == [None, [0, 0, 0, 0, 0.5, 0.5], [0, 0, 0, 0.5, 0.5, 1], [0, 0, 0.5, 0, 1, 0.5],
                          [0, 0, 0.5, 0.5, 1, 1]]
    assert p["start"] == 0 and (p["pictures"][0]["width"], p["pictures"][0]["height"]) == (60, 40)
    assert image_payload(dataclasses.replace(m, image=None)) is None


def test_a_thumbnail_goes_to_its_own_panel_and_a_missing_picture_is_none():
    cells = ((None,) * 3 + (ImagePatch(0, 0, 0, 1, 2, view="tile 0,0", box=(0.0, 0.0, 1.0, 0.25)),
                            ImagePatch(0, 0, 1, 1, 2, view="tile 0,0", box=(0.0, 0.25, 1.0, 0.5)),
                            ImagePatch(0, 0, 0, 1, 2, view="tile 0,1", box=(0.0, 0.5, 1.0, 0.75)),
                            ImagePatch(0, 0, 1, 1, 2, view="tile 0,1", box=(0.0, 0.75, 1.0, 1.0)),
                            ImagePatch(0, 0, 0, 1, 2, view="thumbnail"), ImagePatch(0, 0, 1, 1, 2, view="thumbnail"))
             + (None, None))
    p = image_payload(dataclasses.replace(vl_map(patches=cells), pictures=()))
    assert [c[1] for c in p["cells"][3:9]] == [0, 0, 0, 0, 1, 1] and p["panels"] == [2]
    assert p["pictures"] == [None]  # no picture: the page draws a grey ground


def test_hs_show_and_the_report_explorer_embed_the_pictures():
    m = big_map()
    data = json.loads(re.search(r'<script type="application/json" id="[^"]+-data">(.*?)</script>', show(m).html,
                                re.S).group(1))
    assert data["maps"][0]["images"] == json.loads(json.dumps(image_payload(m)))
    assert "images" not in json.loads(re.search(r'-data">(.*?)</script>', show(_text_map()).html, re.S).group(1))["maps"][0]
    explorer = explorer_data([ModelAnalysis(model="toy-vl", vision_language=(m,))])
    [model] = explorer["models"]
    [sentence] = model["sentences"]
    assert sentence["text"] == "look at a cat (with 1 image)"
    levels = sentence["views"]["self"]["attention"]
    assert set(levels) == {"token", "word"} and all(levels[k]["images"]["cells"][7][:2] == [0, 0] for k in levels)


def test_a_long_map_is_pooled_and_keeps_every_units_cell():
    n_img = 300  # a 15 x 20 grid: past POOL_ABOVE units, the page gets tiles
    cells = (None,) + tuple(ImagePatch(0, k // 20, k % 20, 15, 20) for k in range(n_img)) + (None,)
    t = len(cells)
    a = torch.full((1, 1, t, t), 1.0 / t)
    m = dataclasses.replace(vl_map(), text="x", labels=("<s>",) + ("<image>",) * n_img + ("x",),
                            spans=((0, 0),) * (t - 1) + ((0, 1),), special=(True,) * (t - 1) + (False,),
                            attention=a, causal=False, word_index=(), token_ids=(), patches=cells)
    data = json.loads(re.search(r'-data">(.*?)</script>', show(m).html, re.S).group(1))["maps"][0]
    assert "pooled" in data and len(data["images"]["cells"]) == t


# ---------------------------------------------------------------- in a browser

def _alpha(page, selector: str, x: int, y: int) -> int:
    return page.evaluate("([s, x, y]) => document.querySelector(s).getContext('2d').getImageData(x, y, 1, 1).data[3]",
                         [selector, x, y])


@pytest.mark.browser
def test_clicking_a_text_token_draws_its_row_over_the_picture(browser):
    m = big_map()
    page = offline_page(browser, show(m, layer=0, head=1).html)
    page.wait_for_selector(".hs-inline[data-ready='1']")
    heat = ".hs-pictures canvas.hs-heat"
    assert page.locator(heat).count() == 1 and page.locator(".hs-pictures canvas.hs-pic").count() == 1
    # at first the last text token, "cat": all on row 0, column 2 (x 120..180, y 0..60)
    assert _alpha(page, heat, 150, 30) > 0 and _alpha(page, heat, 90, 90) == 0
    assert page.inner_text(".hs-picture-note").startswith("“cat” over the picture · layer 0 head 1 · 1.00")
    page.click("text.hs-q[data-q='9']")  # "a": all on row 1, column 1 (x 60..120, y 60..120)
    assert _alpha(page, heat, 90, 90) > 0 and _alpha(page, heat, 150, 30) == 0 and _alpha(page, heat, 30, 30) == 0
    page.click("text.hs-q[data-q='7']")  # an image token: half on <s>, half on itself, its own cell outlined
    assert _alpha(page, heat, 90, 90) > 0 and _alpha(page, heat, 61, 61) > 0
    assert page.events["errors"] == [] and page.events["requests"] == []


@pytest.mark.browser
def test_the_report_explorer_draws_the_picture_under_the_image_units(browser, tmp_path):
    m = big_map()
    build_report([ModelAnalysis(model="toy-vl", vision_language=(m,))]).write(tmp_path)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((tmp_path / "index.html").as_uri())
    page.wait_for_selector("#hs-explorer[data-ready='1']")
    page.select_option("#hs-layer", "1")
    page.select_option("#hs-head", "1")
    heat = "#hs-pictures canvas.hs-heat"
    assert _alpha(page, heat, 150, 30) > 0 and _alpha(page, heat, 90, 90) == 0  # "cat" first
    page.click("#hs-heatmap text[data-q='9']")  # "a"
    assert _alpha(page, heat, 90, 90) > 0 and _alpha(page, heat, 150, 30) == 0
    assert "“a” over the picture · layer 1 head 1" in page.inner_text("#hs-picture-note")
    assert errors == []
    context.close()


@pytest.mark.browser
def test_an_image_encoders_patches_show_their_picture_with_cls_row_over_it(browser):
    from headscope.probe.types import AttentionMap

    a = torch.zeros(1, 1, 5, 5)
    a[0, 0, :, 3] = 1.0  # every unit, [CLS] included, looks at patch r1c0 (unit 3): the lower left quarter
    m = AttentionMap(text="img", level="token", labels=("[CLS]", "r0c0", "r0c1", "r1c0", "r1c1"), spans=((0, 0),) * 5,
                     special=(True,) + (False,) * 4, attention=a, causal=False, grid=(2, 2), image=np.ones((100, 100, 3)))
    page = offline_page(browser, show(m).html)
    page.wait_for_selector(".hs-inline[data-ready='1']")
    heat = ".hs-pictures canvas.hs-heat"
    assert _alpha(page, heat, 25, 75) > 0 and _alpha(page, heat, 75, 25) == 0 and _alpha(page, heat, 75, 75) == 0
    assert page.inner_text(".hs-picture-note").startswith("“[CLS]” over the picture")


def _generation():
    """After the hand-built prompt, one generated token " dog" whose every head looks at unit 8 (row 1, column 2)."""
    from headscope.probe.results import GenerationAttention

    row = torch.zeros(2, 2, 12)  # [layer, head, key]: the 11 prompt units and " dog" itself
    row[..., 8] = 1.0
    return GenerationAttention(model="toy-vl", prompt=big_map(), generated_ids=(5,), generated_tokens=(" dog",),
                               steps=(row,), stopped="max_new_tokens")


def test_a_generation_over_an_image_carries_the_pictures_in_every_step():
    from headscope.reports.inline import generation_data

    [step] = generation_data(_generation())["maps"]
    assert len(step["images"]["cells"]) == 12 and step["images"]["cells"][11] is None and step["images"]["start"] == 0
    assert step["images"]["cells"][8][2:] == [0.5, pytest.approx(2 / 3, abs=1e-5), 1.0, 1.0]
    explorer = explorer_data([ModelAnalysis(model="toy-vl", maps=(big_map(),), generations=(_generation(),))])
    gen = explorer["models"][0]["sentences"][-1]
    assert gen["steps"][0]["views"]["self"]["attention"]["token"]["images"]["cells"][11] is None


@pytest.mark.browser
def test_a_generated_tokens_row_is_drawn_over_the_picture(browser):
    page = offline_page(browser, show(_generation()).html)
    page.wait_for_selector(".hs-inline[data-ready='1']")
    heat = ".hs-pictures canvas.hs-heat"
    assert _alpha(page, heat, 150, 90) > 0 and _alpha(page, heat, 90, 90) == 0  # row 1, column 2 only
    assert page.inner_text(".hs-picture-note").startswith("“ dog” over the picture")
