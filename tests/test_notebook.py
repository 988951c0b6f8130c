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


@pytest.mark.slow
def test_quickstart_notebook_runs_top_to_bottom(tmp_path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 6, "figures did not display as images"
    html = "".join(o.get("data", {}).get("text/html", "") for o in outputs)
    assert "attention verified" in html and "HeadScores" in html and "coref-agreement" in html
    text = "".join(o.get("text", "") for o in outputs)
    assert "index.html" in text and "cdnjs" in text
