"""The live explorer (`headscope serve`) in a real headless browser, against a server on a free port.

Type a text, see a heatmap with one cell per weight, hover, click a cell for its explain terms, zoom into
a long text from its overview, find a token, step through a generation — with every request recorded:
any request not to the server itself fails the test, and so does any console error (a CSP violation
is one). Hostile text stays text.
"""

from __future__ import annotations

import re
import threading

import pytest

from conftest import _tiny, served

pytestmark = pytest.mark.browser
uvicorn = pytest.importorskip("uvicorn")
expect = pytest.importorskip("playwright.sync_api").expect

SHORT = "The cat sat on the mat."
LONG = "The quick brown fox jumps over the lazy dog while the cat sleeps on a warm mat by the door today."


@pytest.fixture(scope="module")
def server():
    from headscope.serve import app
    from headscope.workflows.explore import Explorer

    lm = _tiny("gpt2")
    with served(app(Explorer({"tiny": lm, "llama": _tiny("llama")}, attention="recompute"))) as (base, _):
        yield base, lm


@pytest.fixture
def page(browser, server):
    base, _ = server
    context = browser.new_context(viewport={"width": 1600, "height": 1200})
    page = context.new_page()
    page.events = {"console": [], "errors": [], "requests": [], "dialogs": []}
    page.on("console", lambda m: page.events["console"].append((m.type, m.text)))
    page.on("pageerror", lambda e: page.events["errors"].append(str(e)))
    page.on("request", lambda r: page.events["requests"].append(r.url))
    page.on("dialog", lambda d: (page.events["dialogs"].append(d.message), d.dismiss()))
    page.goto(base + "/")
    page.wait_for_selector("body[data-ready='1']", timeout=10_000)
    yield page
    others = [u for u in page.events["requests"] if not u.startswith(base + "/")]
    assert others == [], f"the page asked for {others}"
    errors = [text for kind, text in page.events["console"] if kind == "error"]
    assert errors == [] and page.events["errors"] == [] and page.events["dialogs"] == []
    context.close()


def _n_tokens(lm, text: str) -> int:
    from headscope.probe.encoding import encode

    return len(encode(lm, text).ids)


def test_type_a_text_see_its_heatmap_hover_and_explain_a_cell(page, server):
    n = _n_tokens(server[1], SHORT)
    assert "verified" in page.locator("#banner").inner_text()
    page.fill("#text", SHORT)
    page.fill("#layer", "1")
    page.click("#show")
    expect(page.locator("#heatmap rect.cell")).to_have_count(n * n)
    page.hover("#heatmap rect.cell[data-q='3'][data-k='1']")
    assert "→" in page.locator("#hover").inner_text()
    page.click("#heatmap rect.cell[data-q='3'][data-k='1']")
    page.wait_for_selector("#explain table.terms")
    assert page.locator("#explain table.terms tr").count() == n + 1  # a header and one row per key


def test_a_long_text_shows_tiles_then_zooms_into_rows_and_finds_a_token(page, server):
    n = _n_tokens(server[1], LONG)
    assert n > 64
    page.fill("#text", LONG)
    page.click("#show")
    expect(page.locator("#heatmap rect.tile")).to_have_count(64 * 64)
    page.click("#heatmap rect.tile[data-q='63'][data-k='0']")  # the last tile row: zoom to the last token
    page.wait_for_selector("#zoom-map rect.cell")
    assert page.locator("#zoom-map rect.cell").count() == 64 * 64
    assert page.locator("#zoom ol.topk li").count() == 64
    assert f"of {n}" in page.locator("#zoom p").first.inner_text()
    from headscope.probe.encoding import encode, token_labels

    labels = [s.strip().lower() for s in token_labels(server[1], encode(server[1], LONG))]
    i = next(i for i, s in enumerate(labels) if s and labels.count(s) == 1)  # a token found once
    page.fill("#search", labels[i])
    page.click("#find")
    start = min(i, n - 64)
    expect(page.locator("#zoom p").first).to_have_text(re.compile(f"^rows {start}–{start + 63},"))


def test_step_through_a_generation(page, server):
    n = _n_tokens(server[1], SHORT)
    page.fill("#text", SHORT)
    page.fill("#new-tokens", "3")
    page.click("#generate")
    expect(page.locator("#generation .tok")).to_have_count(n + 1)
    page.click("#next")
    expect(page.locator("#generation .tok")).to_have_count(n + 2)
    assert page.locator("#step").inner_text().startswith("step 2 of 3")


def test_a_head_s_retrieval_hits_on_a_needle_prompt(page):
    """Tiny-llama on a generated needle (120 tokens, at the end, seed 2) copies a needle token at two steps and
    L1H0's top key holds it at one of them (`test_serve_needle` checks those numbers against the copy-paste test by
    hand): the needle's tokens and the hit are marked in the prompt, a click on another head's cell shows that head."""
    from headscope.workflows.retrieval import needle_hits

    found = needle_hits(_tiny("llama"), length=120, depth=1.0, seed=2)
    copies, hits = int(found.copied.sum()), found.hits.sum(0)
    page.select_option("#model", "llama")
    page.fill("#layer", "1")
    page.fill("#head", "0")
    page.fill("#needle-length", "120")
    page.fill("#needle-depth", "1")
    page.fill("#needle-seed", "2")
    page.click("#run-needle")
    expect(page.locator("#needle-summary")).to_contain_text(
        f"L1H0 on this prompt: hits at {hits[1, 0]} of {copies} copy steps (retrieval score {hits[1, 0] / copies:.2f})")
    expect(page.locator("#needle-prompt .tok")).to_have_count(len(found.labels))
    assert page.locator("#needle-prompt .tok.needle").count() == found.span[1] - found.span[0]
    landed = {int(k) for k, c in zip(found.top_keys[:, 1, 0], found.copied) if c}
    assert page.locator("#needle-prompt .tok.top").count() == len(landed)
    assert page.locator("#needle-prompt .tok.top.hit").count() == hits[1, 0] >= 1  # the hit, inside the needle
    assert page.locator("#needle-prompt .tok.needle.top.hit").count() == hits[1, 0]
    assert page.locator("#needle-table tr").count() == len(found.tokens) + 1
    assert page.locator("#needle-table tr.copied").count() == copies
    page.click("#needle-scores td[data-layer='0'][data-head='3']")  # another head: the same answer, its keys
    expect(page.locator("#needle-summary")).to_contain_text(f"L0H3 on this prompt: hits at {hits[0, 3]} of {copies}")
    assert page.locator("#layer").input_value() == "0" and page.locator("#head").input_value() == "3"
    page.fill("#needle", '<img src=x onerror=alert(1)> 4711.')  # a typed needle stays text
    page.fill("#question", "Q:")
    page.fill("#needle-depth", "0")
    page.click("#run-needle")
    expect(page.locator("#needle-prompt .tok.needle").first).to_contain_text("<")
    assert page.locator("img").count() == 0 and page.locator("#error").inner_text() == ""


def test_a_text_file_is_read_in_the_page(page, tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("A text from a file.", encoding="utf-8")
    page.set_input_files("#file", str(path))
    expect(page.locator("#text")).to_have_value("A text from a file.")


def test_hostile_text_stays_text(page):
    hostile = '<script>alert(1)</script> "><img src=x onerror=alert(2)> {{7*7}}'
    page.fill("#text", hostile)
    page.click("#show")
    page.wait_for_selector("#heatmap rect")
    assert page.locator("img").count() == 0 and page.locator("body script").count() == 1  # the page's own
    shown = page.locator("#heatmap").text_content()
    assert "<" in shown and "{" in shown and "49" not in shown  # the text's own characters, as text
    page.fill("#search", "<img")
    page.click("#find")
    assert page.locator("img").count() == 0


_EVIL = """<!doctype html><title>evil</title><script>
const target = "http://127.0.0.1:%d", body = JSON.stringify({model: "tiny", text: "stolen", layer: 0, head: 0});
Promise.allSettled([
  fetch(target + "/api/attention", {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body}),
  fetch(target + "/api/generate", {method: "POST", mode: "no-cors", body}),
  fetch(target + "/api/attention", {method: "POST", headers: {"Content-Type": "application/json"}, body}),
  fetch(target + "/api/models").then(r => r.json()),
]).then(r => { document.title = "done " + r.map(x => x.status).join(","); });
</script>"""


def test_a_page_on_another_origin_cannot_make_the_explorer_compute_or_read_it(browser, server, monkeypatch):
    """Issue 35: a cross-site "simple" POST (text/plain, no preflight) was answered. Now a page the user
    visits on another origin — here another loopback port — gets nothing computed and reads nothing."""
    import http.server

    from headscope.workflows.explore import Explorer

    calls = []
    for name in ("attention", "generate", "models"):
        real = getattr(Explorer, name)
        monkeypatch.setattr(Explorer, name, lambda self, *a, _real=real, _name=name, **kw: (calls.append(_name),
                                                                                          _real(self, *a, **kw))[1])
    port = int(server[0].rsplit(":", 1)[1])
    page_html = (_EVIL % port).encode()

    class Evil(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(page_html)

        def log_message(self, *args):
            pass

    evil = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Evil)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"http://127.0.0.1:{evil.server_address[1]}/")
        page.wait_for_function("document.title.startsWith('done')", timeout=10_000)
        title = page.title()
    finally:
        context.close()
        evil.shutdown()
    # The no-cors requests end "fulfilled" with an opaque answer the page cannot read; the others are refused.
    assert title == "done fulfilled,fulfilled,rejected,rejected", title
    assert calls == []  # the server computed nothing for it
