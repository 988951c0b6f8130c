"""The report in a real headless browser (Debian's chromium driven by Playwright).

The page must load from disk with no console error and no network request, the explorer must
redraw when another head is picked, and injected markup must stay text. Skipped only when no
chromium is installed (`apt-get install -y chromium`; .ci/run installs it).
"""

from __future__ import annotations

import pytest

import report_samples as R

pytestmark = pytest.mark.browser



@pytest.fixture(scope="module")
def report_path(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    R.two_model_report()[1].write(folder)
    return folder / "index.html"


@pytest.fixture
def page(browser, report_path):
    """The report, opened from disk, with every console message, request and dialog recorded."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.events = {"console": [], "errors": [], "requests": [], "dialogs": []}
    page.on("console", lambda m: page.events["console"].append((m.type, m.text)))
    page.on("pageerror", lambda e: page.events["errors"].append(str(e)))
    page.on("request", lambda r: page.events["requests"].append(r.url))
    page.on("dialog", lambda d: (page.events["dialogs"].append(d.message), d.dismiss()))
    page.goto(report_path.as_uri())
    page.wait_for_selector("#hs-explorer[data-ready='1']", timeout=10_000)
    yield page
    context.close()


def _heatmap(page) -> tuple[str, str, str]:
    svg = page.locator("#hs-heatmap")
    return svg.get_attribute("data-layer"), svg.get_attribute("data-head"), svg.inner_html()


def test_loads_offline_without_errors_or_requests(page, report_path):
    page.wait_for_timeout(300)
    errors = [text for kind, text in page.events["console"] if kind in ("error", "warning")]
    assert errors == [] and page.events["errors"] == []
    others = [u for u in page.events["requests"] if not u.startswith(("data:", report_path.as_uri()))]
    assert others == [], f"the page asked for {others}"
    assert page.locator("#hs-heatmap rect.hs-cell").count() > 0


def test_picking_another_head_redraws_the_heatmap(page):
    layer, head, before = _heatmap(page)
    assert (int(layer), int(head)) == R.PROBE_HEAD  # opens on the probe's selected head
    page.select_option("#hs-head", "0")
    layer2, head2, after = _heatmap(page)
    assert (layer2, head2) == (layer, "0") and after != before
    page.select_option("#hs-layer", "0")
    page.select_option("#hs-head", str(R.PREV_HEAD[1]))
    # The previous-token head: every row's darkest cell is the one left of the diagonal.
    fills = page.eval_on_selector_all(
        "#hs-heatmap rect.hs-cell", "els => els.map(e => [+e.dataset.q, +e.dataset.k, e.getAttribute('fill')])")
    darkest = {}
    for q, k, fill in fills:
        rgb = sum(int(x) for x in fill[4:-1].split(","))
        if q not in darkest or rgb < darkest[q][1]:
            darkest[q] = (k, rgb)
    assert all(darkest[q][0] == q - 1 for q in darkest if q > 0)


def test_clicking_a_grid_cell_selects_that_head(page):
    page.select_option("#hs-metric", "previous_token")
    page.click("#hs-grid td[data-layer='2'][data-head='3']")
    assert _heatmap(page)[:2] == ("2", "3")
    assert page.input_value("#hs-layer") == "2" and page.input_value("#hs-head") == "3"
    assert page.locator("#hs-grid td.hs-selected").get_attribute("data-head") == "3"


def test_hover_shows_where_a_token_attends(page):
    page.select_option("#hs-layer", "0")
    page.select_option("#hs-head", str(R.PREV_HEAD[1]))
    page.check("input[name='hs-level'][value='token']")
    page.hover("#hs-heatmap text.hs-label[data-q='3']")
    note = page.inner_text("#hs-strip-note")
    labels = R.token_map(R.SENTENCES[0]).labels
    assert note.startswith(f"“{labels[3]}” attends most to: “{labels[2]}” 1.00")
    assert page.locator("#hs-strip .hs-query").inner_text() == labels[3]


def test_word_and_token_levels_toggle(page):
    page.check("input[name='hs-level'][value='token']")
    tokens = page.locator("#hs-heatmap text.hs-label[data-q]").count()
    page.check("input[name='hs-level'][value='word']")
    words = page.locator("#hs-heatmap text.hs-label[data-q]").count()
    amap = R.token_map(R.SENTENCES[0])
    assert tokens == len(amap) and words == max(amap.word_index) + 1
    assert page.locator("#hs-heatmap").get_attribute("data-level") == "word"


def test_switching_model_shows_the_decoders_masked_heatmap(page):
    page.select_option("#hs-model", "1")
    masked = page.locator("#hs-heatmap rect.hs-cell[fill='#eeeeee']").count()
    n = page.locator("#hs-heatmap text.hs-label[data-q]").count()
    assert masked == n * (n - 1) // 2


def test_injected_markup_stays_text(page):
    index = R.SENTENCES.index(R.INJECTED)
    page.select_option("#hs-sentence", str(index))
    page.check("input[name='hs-level'][value='token']")
    labels = page.eval_on_selector_all("#hs-heatmap text.hs-label[data-q]", "els => els.map(e => e.textContent)")
    assert labels == list(R.token_map(R.INJECTED).labels)  # "<", "scr", "##ipt", ">", ... as text
    page.wait_for_timeout(200)
    assert page.events["dialogs"] == []
    assert page.evaluate("window.__xss === undefined")
    assert page.locator("img[src='x']").count() == 0
    assert page.locator("body script").count() == 2  # the JSON block and the explorer, nothing injected
    assert R.INJECTED in page.inner_text("#attention")  # the sentence list shows it verbatim
    assert R.INJECTED in page.inner_text("#settings")  # and the model info (a "file" entry)


def test_arrow_keys_step_through_heads_once_the_heatmap_has_focus(page):
    layer, head, _ = _heatmap(page)
    page.keyboard.press("ArrowRight")  # the page has focus, not the heatmap: nothing changes
    assert _heatmap(page)[:2] == (layer, head)
    page.click("#hs-heatmap")
    page.keyboard.press("ArrowRight")
    assert _heatmap(page)[:2] == (layer, str((int(head) + 1) % R.N_HEADS))
    page.keyboard.press("ArrowDown")
    assert _heatmap(page)[0] == str((int(layer) + 1) % R.N_LAYERS)


def test_a_word_level_only_map_ignores_the_token_toggle(browser, tmp_path):
    from headscope.probe.words import to_word_level
    from headscope.reports.analysis import ModelAnalysis
    from headscope.reports.html import build_report

    words = to_word_level(R.token_map("The animal didn't cross"))
    build_report([ModelAnalysis(model="w", maps=(words,))]).write(tmp_path)
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((tmp_path / "index.html").as_uri())
    page.wait_for_selector("#hs-explorer[data-ready='1']")
    page.check("input[name='hs-level'][value='token']")
    assert page.locator("#hs-heatmap text.hs-label[data-q]").count() == len(words) and errors == []
    page.close()
