"""Issue 36: the live explorer reads a text with images on a vision–language decoder; a request picks the images the
server was started with by index and never names a file."""

import pytest
import torch

from conftest import _tiny
from headscope.probe.extract import extract
from headscope.probe.generate import generate_attention
from headscope.workflows.explore import Explorer

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from starlette.testclient import TestClient  # noqa: E402

from headscope.serve import app  # noqa: E402

TEXT = "Where is the cat?"



def _client(picture_file=None) -> TestClient:
    explorer = Explorer({"m": _tiny("llava")}, images=[picture_file] if picture_file else [])
    return TestClient(app(explorer), base_url="http://127.0.0.1:8765")


def test_a_text_with_a_startup_image_carries_its_cells_and_equals_extract(picture_file):
    client = _client(picture_file)
    assert client.get("/api/models").json()["images"] == ["picture.png"]  # the file's name, never its folder
    [m] = extract(_tiny("llava"), TEXT, images=[picture_file])
    body = {"model": "m", "text": TEXT, "layer": 1, "head": 0, "images": [0]}
    r = client.post("/api/attention", json=body).json()
    assert r["labels"] == list(m.labels) and torch.allclose(torch.tensor(r["weights"]), m.attention[1, 0].float())
    overview = client.post("/api/overview", json={**body, "tiles": 8}).json()
    for answer in (r, overview):
        cells = answer["images"]["cells"]
        assert len(cells) == len(m) and len(answer["images"]["pictures"]) == 1
        # tiny:llava's 4 × 4 grid: img0:r1c2 covers rows 1/4..2/4 and columns 2/4..3/4 of picture 0
        assert cells[m.labels.index("img0:r1c2")] == [0, 0, 0.25, 0.5, 0.5, 0.75]
        assert all(c is None for c, p in zip(cells, m.patches) if p is None)
    e = client.post("/api/explain", json={**body, "query": m.labels.index("img0:r1c2")}).json()
    assert e["query"] == "img0:r1c2"
    g = client.post("/api/generate", json={"model": "m", "prompt": TEXT, "layer": 1, "head": 0, "max_new_tokens": 2,
                                           "images": [0]}).json()
    own = generate_attention(_tiny("llava"), TEXT, images=[picture_file], max_new_tokens=2)
    assert g["tokens"] == list(own.generated_tokens) and len(g["images"]["cells"]) == len(own.prompt)
    plain = client.post("/api/attention", json={k: v for k, v in body.items() if k != "images"}).json()
    assert "images" not in plain and "img0:r0c0" not in plain["labels"]


def test_a_request_never_names_a_file_and_picks_only_startup_images(picture_file):
    body = {"model": "m", "text": TEXT, "layer": 1, "head": 0}
    client = _client(picture_file)
    for images, says in (([picture_file], "never names a file"), ([1], "not among the 1 image"),
                         ("0", "never names a file")):
        r = client.post("/api/attention", json={**body, "images": images})
        assert r.status_code == 400 and says in r.json()["error"], r.json()
    r = client.post("/api/heads", json={"model": "m", "text": TEXT, "images": [0]})
    assert r.status_code == 400 and "headscope heads" in r.json()["error"]
    r = _client().post("/api/overview", json={**body, "images": [0]})
    assert r.status_code == 400 and "started without images" in r.json()["error"]
    r = client.post("/api/attention", json={**body, "images": [0] * 17})  # the vision tower 17 times: refused first
    assert r.status_code == 413 and "at most 16 images" in r.json()["error"], r.json()


def test_serve_refuses_a_missing_image_file_in_one_line(tmp_path):
    from click.testing import CliRunner

    from headscope.cli import cli

    result = CliRunner().invoke(cli, ["serve", "--model", "tiny:llava", "--image", str(tmp_path / "no.png"), "--quiet"])
    assert result.exit_code == 2 and "no file" in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.browser
def test_the_page_ticks_a_startup_image_and_draws_the_row_over_the_picture(browser, picture_file):
    from conftest import served

    pytest.importorskip("uvicorn")
    explorer = Explorer({"m": _tiny("llava")}, images=[picture_file])
    with served(app(explorer)) as (base, _):
        page = browser.new_page(viewport={"width": 1600, "height": 1200})
        errors, requests = [], []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("request", lambda r: requests.append(r.url))
        page.goto(base + "/")
        page.wait_for_selector("body[data-ready='1']", timeout=10_000)
        assert page.inner_text("#image-picks").strip() == "picture.png"
        page.check("#image-picks input[data-index='0']")
        page.fill("#text", TEXT)
        page.click("#show")
        page.wait_for_selector("#pictures canvas.hs-heat", timeout=20_000)
        assert page.inner_text("#picture-note").endswith("over the picture")
        page.click("#generate")
        page.wait_for_selector("#generation .tok", timeout=20_000)
        assert page.inner_text("#picture-note").endswith("over the picture") and page.is_visible("#pictures canvas")
        page.close()
    assert errors == [] and all(u.startswith(base + "/") for u in requests)
