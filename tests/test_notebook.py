"""The example notebook runs top to bottom, and its figures really come out as images."""

from __future__ import annotations

import pathlib

import pytest


NOTEBOOK = pathlib.Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"


def test_bertviz_views_take_an_extracted_map():
    import report_samples as R
    from headscope.reports.notebook import bertviz_inputs, head_view, model_view

    amap = R.token_map("The cat sat down", layers=2, heads=3)
    attention, tokens = bertviz_inputs(amap)
    assert len(attention) == 2 and tuple(attention[0].shape) == (1, 3, len(amap), len(amap))
    assert tokens == list(amap.labels)
    html = head_view([amap]).data
    assert '"down"' in html and "require" in html  # bertviz's page (it loads require.js from a CDN)
    assert '"down"' in model_view(amap).data


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """The quickstart notebook, executed headless (nbclient), as saved afterwards."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    folder = tmp_path_factory.mktemp("notebook")
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(folder)}}).execute()
    return nb


def _outputs(nb) -> list:
    return [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]


@pytest.mark.slow
def test_quickstart_notebook_runs_top_to_bottom(executed):
    outputs = _outputs(executed)
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 6, "figures did not display as images"
    html = "".join(o.get("data", {}).get("text/html", "") for o in outputs)
    assert "attention verified" in html and "HeadScores" in html and "coref-agreement" in html
    text = "".join(o.get("text", "") for o in outputs)
    assert "index.html" in text and "cdnjs" in text
    assert "cjk-heatmap.pdf previous-token.svg" in text


@pytest.mark.slow
@pytest.mark.browser
def test_the_notebooks_inline_explorer_draws_offline(executed, browser):
    """Every HTML output of the executed notebook on one page, in Chromium with the network off:
    the explorer draws a thumbnail per head and a cell per (query, key), asks for nothing, logs no error."""
    import json
    import re

    from test_inline_view import offline_page

    html = [o["data"]["text/html"] for o in _outputs(executed) if "text/html" in o.get("data", {})]
    views = [h for h in html if 'class="hs-inline"' in h]
    assert len(views) == 1, "hs.show(maps) did not display"
    data = json.loads(re.search(r'type="application/json" id="[^"]+-data">(.*?)</script>', views[0], re.S).group(1))
    first = data["maps"][0]
    page = offline_page(browser, "\n".join(html))
    page.wait_for_selector(".hs-inline[data-ready='1']", timeout=10_000)
    view = page.locator(".hs-inline")
    assert view.locator("canvas.hs-thumb").count() == len(data["layer_ids"]) * len(data["head_ids"]) == 6 * 12
    assert view.locator("rect.hs-cell").count() == len(first["queries"]) * len(first["keys"])
    assert len(data["maps"]) == 2  # both sentences, a selector between them
    view.locator("select.hs-pick").select_option("1")
    labels = view.locator("text.hs-q").all_text_contents()
    assert all(c in labels for c in "我爱北京天安门"), labels  # BERT's tokenizer splits CJK by character
    assert page.events["requests"] == [], f"the notebook's HTML asked for {page.events['requests']}"
    assert page.events["errors"] == [] and [c for c in page.events["console"] if c[0] == "error"] == []
