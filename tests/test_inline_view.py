"""The head explorer inline in a notebook output: self-contained, offline, one script per output.

The fast tests read the HTML fragment; the `browser` ones draw it in Chromium with the network
cut off (skipped when no chromium is installed, as in test_browser.py).
"""

from __future__ import annotations

import json
import re

import pytest
import torch

import report_samples as R
from headscope.reports.inline import show

INJECTED_LABEL = "</script><script>window.__xss=1</script>"


def _data(html: str) -> dict:
    block = re.search(r'<script type="application/json" id="([^"]+)-data">(.*?)</script>', html, re.S)
    return json.loads(block.group(2))


def test_one_output_carries_its_script_once_and_asks_for_nothing():
    html = show([R.token_map("The cat sat"), R.token_map("我爱北京天安门")]).html
    assert html.count("<script") == 2  # the JSON block and the view, once for all maps
    assert "require" not in html and "https://" not in html and "cdn" not in html.lower()
    assert re.search(r"""\b(src|href)\s*=""", html) is None  # nothing to load
    root = re.match(r'<div id="(hs-view-[0-9a-f]{12})"', html).group(1)
    assert f'id="{root}-data"' in html and f'("{root}");</script>' in html
    assert len(re.findall(r'\bid="', html)) == 2  # every other element is found by class inside the root


def test_each_output_gets_its_own_ids():
    amap = R.token_map("The cat sat")
    ids = [re.match(r'<div id="([^"]+)"', show(amap).html).group(1) for _ in range(3)]
    assert len(set(ids)) == 3


def test_the_data_is_the_attention_in_thousandths():
    amap = R.token_map("The cat sat down", layers=2, heads=3)
    data = _data(show(amap, layer=1, head=2).html)
    assert data["layer_ids"] == [0, 1] and data["head_ids"] == [0, 1, 2] and data["start"] == {"layer": 1, "head": 2}
    (m,) = data["maps"]
    n = len(amap)
    assert m["queries"] == m["keys"] == list(amap.labels) and m["offset"] == 0
    assert len(m["att"]) == 2 * 3
    for li in range(2):
        for hi in range(3):
            for q in range(n):
                for k in range(n):
                    assert m["att"][li * 3 + hi][q * n + k] == round(float(amap.attention[li, hi, q, k]) * 1000)


def test_cross_attention_keeps_query_and_key_labels_apart():
    att = torch.softmax(torch.randn(2, 2, 3, 5, generator=torch.Generator().manual_seed(1)), -1)
    data = _data(show(att, ["a", "b", "c"], key_labels=list("vwxyz")).html)
    (m,) = data["maps"]
    assert m["queries"] == ["a", "b", "c"] and m["keys"] == list("vwxyz") and len(m["att"][0]) == 15
    assert data["key_name"] == "key (attended to, other sequence)"
    with pytest.raises(ValueError, match=r"3 query and 4 key labels"):
        show(att, ["a", "b", "c"], key_labels=list("vwxy"))
    with pytest.raises(ValueError, match="needs its labels"):
        show(att)


def test_bad_requests_say_what_is_wrong():
    amap = R.token_map("The cat sat", layers=2)
    with pytest.raises(ValueError, match=r"layer 7 is not among the layers of these maps: 0, 1"):
        show(amap, layer=7)
    with pytest.raises(ValueError, match="different layers or heads"):
        show([amap, R.token_map("The cat", layers=3)])
    with pytest.raises(ValueError, match="no attention maps"):
        show([])


def test_labels_cannot_close_the_script():
    att = torch.full((1, 1, 1, 1), 1.0)
    html = show(att, [INJECTED_LABEL]).html
    assert INJECTED_LABEL not in html and html.count("</script>") == 2
    assert _data(html)["maps"][0]["queries"] == [INJECTED_LABEL]  # still the label, as text


def test_hs_show_is_the_same_view():
    import headscope as hs
    from headscope.reports import show as reports_show

    amap = R.token_map("The cat")
    assert _data(hs.show(amap).html) == _data(reports_show(amap).html) == _data(show(amap).html)
    assert hs.show(amap)._repr_html_().startswith('<div id="hs-view-')


def test_a_maps_own_html_is_a_static_table_without_script():
    amap = R.token_map("The cat <b>sat</b>")
    html = amap._repr_html_()
    assert "<script" not in html and "<b>sat" not in html
    assert html.count("<td ") == len(amap) ** 2 and "hs.show(map)" in html


# ---------------------------------------------------------------- in a browser, offline


def offline_page(browser, html: str):
    """`html` in a fresh page that refuses every request; records console messages and requests."""
    context = browser.new_context(offline=True, viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.events = {"console": [], "errors": [], "requests": []}
    page.on("console", lambda m: page.events["console"].append((m.type, m.text)))
    page.on("pageerror", lambda e: page.events["errors"].append(str(e)))
    page.on("request", lambda r: page.events["requests"].append(r.url))
    page.route("**/*", lambda route: route.abort() if not route.request.url.startswith("data:")
               else route.continue_())
    page.set_content(f'<!DOCTYPE html><html><head><meta charset="utf-8"></head><body>{html}</body></html>')
    return page


@pytest.mark.browser
def test_two_views_draw_offline_side_by_side(browser):
    amap = R.token_map("The cat sat down", layers=2, heads=3)
    att = torch.softmax(torch.randn(2, 2, 3, 5, generator=torch.Generator().manual_seed(1)), -1)
    page = offline_page(browser, show(amap).html + show(att, ["a", "b", INJECTED_LABEL], key_labels=list("vwxyz")).html)
    page.wait_for_function("document.querySelectorAll('.hs-inline[data-ready=\"1\"]').length === 2")
    own, cross = page.locator(".hs-inline").nth(0), page.locator(".hs-inline").nth(1)
    assert own.locator("canvas.hs-thumb").count() == 2 * 3 and cross.locator("canvas.hs-thumb").count() == 2 * 2
    assert own.locator("rect.hs-cell").count() == len(amap) ** 2 and cross.locator("rect.hs-cell").count() == 3 * 5
    assert cross.locator("text.hs-q").all_text_contents() == ["a", "b", INJECTED_LABEL]
    assert cross.locator("text.hs-k").all_text_contents() == list("vwxyz")
    assert page.evaluate("window.__xss === undefined")
    assert page.events["errors"] == [] and [c for c in page.events["console"] if c[0] in ("error", "warning")] == []
    assert page.events["requests"] == []


@pytest.mark.browser
def test_a_thumbnail_click_enlarges_that_head_and_hover_shows_where_a_token_attends(browser):
    amap = R.token_map("The cat sat down", layers=3, heads=4)
    page = offline_page(browser, show(amap).html)
    page.wait_for_selector(".hs-inline[data-ready='1']")
    view = page.locator(".hs-head-view")
    assert (view.get_attribute("data-layer"), view.get_attribute("data-head")) == ("0", "0")
    page.click(f"canvas.hs-thumb[data-layer='0'][data-head='{R.PREV_HEAD[1]}']")
    assert (view.get_attribute("data-layer"), view.get_attribute("data-head")) == ("0", str(R.PREV_HEAD[1]))
    assert page.locator("canvas.hs-thumb.hs-on").get_attribute("data-head") == str(R.PREV_HEAD[1])
    page.hover("text.hs-q[data-q='3']")
    # the previous-token head: token 3 attends to token 2 with weight 1
    assert page.inner_text(".hs-strip-note").startswith(f"“{amap.labels[3]}” attends most to: “{amap.labels[2]}” 1.00")


@pytest.mark.browser
def test_a_causal_view_greys_the_future(browser):
    amap = R.token_map("The cat sat down", causal=True, layers=1, heads=2)
    page = offline_page(browser, show(amap).html)
    page.wait_for_selector(".hs-inline[data-ready='1']")
    n = len(amap)
    assert page.locator("rect.hs-cell[fill='#eeeeee']").count() == n * (n - 1) // 2


def _generation():
    """A hand-built generation: a 3-token prompt, then two tokens, each attending as stated."""
    from headscope.probe.results import GenerationAttention

    prompt = R.token_map("The cat", causal=True, layers=2, heads=2)  # [CLS] The cat [SEP]: 4 tokens
    n = len(prompt)
    steps = []
    for t in range(2):
        row = torch.zeros(2, 2, n + t + 1)  # [layer, head, key]
        row[..., t] = 1.0  # every head of step t looks at key t
        steps.append(row)
    return GenerationAttention(model="toy", prompt=prompt, generated_ids=(5, 6), generated_tokens=(" sat", " down"),
                               steps=tuple(steps), stopped="max_new_tokens")


def test_a_generation_steps_through_its_generated_tokens():
    gen = _generation()
    data = _data(show(gen).html)
    assert [m["queries"] for m in data["maps"]] == [[" sat"], [" down"]]
    assert [m["keys"] for m in data["maps"]] == [list(gen.key_labels(0)), list(gen.key_labels(1))]
    for t, m in enumerate(data["maps"]):
        n_keys = len(gen.prompt) + t + 1
        assert m["offset"] == n_keys - 1  # the one query is the last token: it sees every key
        assert all(row == [1000 if k == t else 0 for k in range(n_keys)] for row in m["att"])


@pytest.mark.browser
def test_the_generation_view_steps_with_its_selector(browser):
    gen = _generation()
    page = offline_page(browser, show(gen).html)
    page.wait_for_selector(".hs-inline[data-ready='1']")
    n = len(gen.prompt)
    assert page.locator("rect.hs-cell").count() == n + 1
    assert page.locator("rect.hs-cell[fill='#eeeeee']").count() == 0  # nothing of the past is masked
    page.select_option("select.hs-pick", "1")
    assert page.locator("rect.hs-cell").count() == n + 2
    assert page.locator("text.hs-q").all_text_contents() == [" down"]
    page.hover("text.hs-q[data-q='0']")
    assert f"“ down” attends most to: “{gen.prompt.labels[1]}” 1.00" in page.inner_text(".hs-strip-note")
    assert page.events["errors"] == [] and page.events["requests"] == []
