"""The live explorer's JSON API (headscope.serve over workflows.explore) and `headscope serve`'s arguments."""

import pytest
import torch
from click.testing import CliRunner

from conftest import _tiny, in_turn
from headscope.analyses.pooled import pool
from headscope.probe.extract import extract
from headscope.workflows.explore import Explorer, Limits

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from starlette.testclient import TestClient  # noqa: E402

from headscope.serve import app  # noqa: E402

TEXT = "The cat sat on the mat because it was tired."


def _client(lm, **kwargs) -> TestClient:
    return TestClient(app(Explorer({"m": lm}, **kwargs)), base_url="http://127.0.0.1:8765")


@pytest.mark.parametrize("tiny, attention", in_turn("recompute", "eager"), indirect=["tiny"])
def test_api_weights_tiles_and_zoomed_rows_equal_extract(tiny, attention):
    [m] = extract(tiny, TEXT)
    layer, head = m.layer_ids[-1], tiny.config.num_attention_heads - 1
    full = m.attention[m.layer_ids.index(layer), head]  # (query, key)
    n = full.shape[0]
    c = _client(tiny, attention=attention)
    ask = {"model": "m", "text": TEXT, "layer": layer, "head": head}
    whole = c.post("/api/attention", json={**ask, "rows": None}).json()
    assert whole["labels"] == list(m.labels) and whole["rows"] == [0, n] and whole["mode"] == attention
    torch.testing.assert_close(torch.tensor(whole["weights"]), full, atol=1e-6, rtol=0)
    zoom = c.post("/api/attention", json={**ask, "rows": [1, n - 2], "keys": [2, n], "top_k": 2}).json()
    torch.testing.assert_close(torch.tensor(zoom["weights"]), full[1 : n - 2, 2:], atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.tensor(zoom["top"]["weights"]), full[1 : n - 2].topk(2).values, atol=1e-6,
                               rtol=0)  # of the whole row, not only the keys sent
    tiles = c.post("/api/overview", json={**ask, "tiles": 4}).json()["tiles"]
    ref = pool(full, 4)
    assert tiles["query_edges"] == list(ref.query_edges)
    torch.testing.assert_close(torch.tensor(tiles["max"]), ref.max, atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.tensor(tiles["mean"]), ref.mean, atol=1e-6, rtol=0)
    assert whole["verified"] is True


def test_models_explain_heads_and_generate():
    lm = _tiny("llama")
    c = _client(lm)
    [info] = c.get("/api/models").json()["models"]
    assert (info["name"], info["layers"], info["heads"], info["verified"]) == ("m", 2, 4, True)
    e = c.post("/api/explain", json={"model": "m", "text": TEXT, "layer": 1, "head": 2, "query": 3}).json()
    [m] = extract(lm, TEXT)
    assert [k["weight"] for k in e["keys"]] == pytest.approx(m.attention[1, 2, 3].tolist(), abs=1e-6)
    h = c.post("/api/heads", json={"model": "m", "text": TEXT}).json()
    assert len(h["metrics"]["previous_token"]) == 2 and len(h["metrics"]["previous_token"][0]) == 4
    g = c.post("/api/generate", json={"model": "m", "prompt": "The cat", "layer": 1, "head": 0,
                                      "max_new_tokens": 3}).json()
    n_prompt = len(g["prompt_labels"])
    assert [len(r) for r in g["rows"]] == [n_prompt + t + 1 for t in range(len(g["tokens"]))]
    assert all(abs(sum(r) - 1) < 1e-5 for r in g["rows"])


@pytest.mark.parametrize("body, status, words", [
    ({"model": "x", "text": TEXT, "layer": 0, "head": 0}, 404, "not served"),
    ({"model": "m", "text": TEXT, "layer": 7, "head": 0}, 400, "layer must be"),
    ({"model": "m", "text": TEXT, "layer": "0", "head": 0}, 400, "layer must be"),
    ({"model": "m", "text": "", "layer": 0, "head": 0}, 400, "non-empty"),
    ({"model": "m", "text": 5, "layer": 0, "head": 0}, 400, "non-empty"),
    ({"model": "m", "text": TEXT, "layer": 0}, 400, "needs head"),
    ({"model": "m", "text": TEXT, "layer": 0, "head": 0, "path": "/etc/passwd"}, 400, "takes no field path"),
    ({"model": "m", "text": TEXT, "layer": 0, "head": 0, "rows": [4, 2]}, 400, "outside the text"),
    ({"model": "m", "text": TEXT, "layer": 0, "head": 0, "rows": "all"}, 400, "rows must be"),
    ({"model": "m", "text": TEXT, "layer": 0, "head": 0, "level": "char"}, 400, "level must be"),
    ({"model": "m", "text": "x" * 101, "layer": 0, "head": 0}, 413, "at most 100"),
    ({"model": "m", "text": TEXT, "layer": 0, "head": 0, "rows": [0, 9]}, 413, "at most 4 per request"),
])
def test_bad_requests_get_a_4xx_and_one_line(body, status, words):
    c = _client(_tiny("gpt2"), limits=Limits(max_chars=100, max_rows=4))
    r = c.post("/api/attention", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in error and "\n" not in error and "Traceback" not in error


def test_malformed_bodies_unknown_routes_and_large_bodies():
    c = _client(_tiny("gpt2"))
    json_type = {"content-type": "application/json"}
    for raw in (b"{nope", b"[1, 2]", b"\xff\xfe"):
        r = c.post("/api/overview", content=raw, headers=json_type)
        assert r.status_code == 400 and r.json()["error"].startswith("the request body must be a JSON object")
    assert c.get("/api/nothing").status_code == 404 and "error" in c.get("/api/nothing").json()
    assert c.get("/api/attention").status_code == 405
    r = c.post("/api/attention", content=b" " * (2 << 20), headers=json_type)
    assert r.status_code == 413


def test_a_long_text_needs_a_row_range_and_is_never_sent_whole():
    c = _client(_tiny("gpt2"), limits=Limits(exact_tokens=8))
    body = {"model": "m", "text": TEXT, "layer": 0, "head": 0, "rows": None}
    r = c.post("/api/attention", json=body)
    assert r.status_code == 413 and "/api/overview" in r.json()["error"]


def test_the_page_is_self_contained_under_the_reports_csp():
    r = _client(_tiny("gpt2")).get("/")
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "unsafe" not in csp
    page = r.text.replace("http://www.w3.org/2000/svg", "")  # the SVG namespace is a name, not a request
    assert "http://" not in page and "https://" not in page and "//cdn" not in page


def test_hostile_text_comes_back_as_data():
    text = '<script>alert(1)</script> "><img src=x onerror=alert(2)> {{7*7}}'
    c = _client(_tiny("bert"))
    r = c.post("/api/overview", json={"model": "m", "text": text, "layer": 0, "head": 0})
    assert r.headers["content-type"] == "application/json" and "49" not in "".join(r.json()["labels"])


@pytest.mark.parametrize("args, words", [
    (["--host", "0.0.0.0"], "--allow-remote"),
    (["--model", "tiny:llama,tiny:llama"], "named twice"),
    (["--port", "70000"], "70000"),
])
def test_serve_refuses_bad_arguments_before_loading(args, words):
    from headscope.cli import cli

    r = CliRunner().invoke(cli, ["serve", "--model", "tiny:llama", *args] if "--model" not in args else ["serve", *args])
    assert r.exit_code == 2 and words in r.output


def test_requests_to_one_model_are_queued(monkeypatch):
    import threading
    import time

    ex = Explorer({"m": _tiny("gpt2")})
    active, most = [0], [0]
    real = ex._live

    def slow(*a, **kw):
        active[0] += 1
        most[0] = max(most[0], active[0])
        time.sleep(0.05)
        active[0] -= 1
        return real(*a, **kw)

    monkeypatch.setattr(ex, "_live", slow)
    threads = [threading.Thread(target=ex.overview, args=("m", TEXT, 0, 0)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1
