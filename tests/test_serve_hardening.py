"""`headscope serve` under the inputs of issue 45: a port in use, models and images the explorer cannot serve,
bodies nested too deeply, a redirect to another server, clients that trickle their bodies.

Every request goes to 127.0.0.1 (a TestClient, or a server of this test's own on a free loopback port); every
loop is bounded in count and time.
"""

from __future__ import annotations

import json
import socket
import time

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import _tiny, served
from headscope import guard as guards
from headscope.guard import Guard

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
from starlette.testclient import TestClient  # noqa: E402

from headscope.serve import app  # noqa: E402
from headscope.workflows.explore import Explorer  # noqa: E402

BODY = {"model": "m", "text": "The cat sat on the mat.", "layer": 0, "head": 0}


@pytest.fixture(scope="module")
def lm():
    return _tiny("gpt2")


def _serve(args, monkeypatch):
    """`headscope serve ARGS`, with loading a model an error: every refusal here comes before any model loads."""
    from headscope.cli import cli
    from headscope.commands import serve

    def no_load(*a, **kw):
        raise AssertionError("a model was loaded before the refusal")

    monkeypatch.setattr(serve, "load_or_fail", no_load)
    return CliRunner().invoke(cli, ["serve", *args])


def _one_line(r, code: int = 2) -> str:
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert r.exit_code == code and len(lines) == 1 and lines[0].startswith("headscope: "), r.output
    assert "Errno" not in lines[0] and "unexpected" not in lines[0]
    return lines[0]


# ---------------------------------------------------------------- refused at start, before any model loads

def test_a_port_in_use_is_one_line_before_loading(monkeypatch):
    with socket.socket() as other:  # another server, listening on the port asked for
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        line = _one_line(_serve(["--model", "tiny:llama", "--port", str(port)], monkeypatch))
    assert f"--port {port}" in line and "in use" in line and "http://" not in line


def test_a_host_that_is_not_this_machine_s_is_one_line_before_loading(monkeypatch):
    r = _serve(["--model", "tiny:llama", "--host", "192.0.2.1", "--allow-remote"], monkeypatch)
    lines = r.output.splitlines()  # the warning that it would serve remotely, then the refusal
    assert r.exit_code == 2 and lines[-1].startswith("headscope: --host 192.0.2.1") and "Errno" not in r.output


@pytest.mark.parametrize("models, words", [
    ("tiny:mllama", "cross-attention"),  # every request would be refused: its layers are not one map each
    ("tiny:vit", "image model"),
    ("tiny:clip", "two-tower"),
    ("tiny:llama,tiny:siglip", "two-tower"),  # the second of two
])
def test_a_model_the_explorer_cannot_serve_is_refused_before_loading(models, words, monkeypatch):
    line = _one_line(_serve(["--model", models], monkeypatch))
    assert words in line


@pytest.mark.parametrize("models", ["tiny:llama", "tiny:llama,tiny:t5"])
def test_images_for_models_that_read_none_are_refused_before_loading(models, picture_file, monkeypatch):
    line = _one_line(_serve(["--model", models, "--image", str(picture_file)], monkeypatch))
    assert "no model served here reads images" in line


def test_an_unreadable_image_is_refused_before_loading(tmp_path, monkeypatch):
    bad = tmp_path / "not.png"
    bad.write_text("not a picture")
    line = _one_line(_serve(["--model", "tiny:llava", "--image", str(bad)], monkeypatch))
    assert "not.png" in line


def test_the_explorer_itself_refuses_what_it_cannot_serve(lm, picture_file):
    """The same rules on loaded models (the API, and a model whose type only loading tells)."""
    with pytest.raises(ValueError, match="cross-attention"):
        Explorer({"m": _tiny("mllama")})
    with pytest.raises(ValueError, match="reads images"):
        Explorer({"m": lm}, images=[str(picture_file)])


def test_port_0_prints_the_port_it_got(lm, monkeypatch):
    """The socket is bound before loading and served as it is: the printed address is the one answered."""
    from headscope.cli import cli
    from headscope.commands import serve

    seen = {}

    def fake_serve(explorer, *, host, port, guard, sock):
        seen.update(port=port, bound=sock.getsockname()[1])
        return type("S", (), {"started": True, "stopped_by": None})()

    monkeypatch.setattr(serve, "load_or_fail", lambda *a, **kw: lm)
    monkeypatch.setattr("headscope.serve.serve", fake_serve)
    r = CliRunner().invoke(cli, ["serve", "--model", "tiny:gpt2", "--port", "0", "--quiet"])
    assert r.exit_code == 0, r.output
    assert seen["port"] == seen["bound"] > 0 and f"127.0.0.1:{seen['port']}/" in r.output


# ---------------------------------------------------------------- bodies and redirects

@pytest.mark.parametrize("body", [b"[" * 50_000, b'{"a":' * 50_000, b"[" * 50_000 + b"]" * 50_000])
def test_a_body_nested_too_deeply_is_400(lm, body):
    c = TestClient(app(Explorer({"m": lm})), base_url="http://127.0.0.1:8765")
    r = c.post("/api/attention", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and set(r.json()) == {"error"} and "nested too deeply" in r.json()["error"]
    assert c.post("/api/attention", json=BODY).status_code == 200  # and the next request is served


@pytest.mark.parametrize("path", ["//evil.com", "/%5Cevil.com", "/%5C%5Cevil.com", "///evil.com", "/%2F%2Fevil.com",
                                  "/%09/evil.com", "/%0D%0ALocation:%20//evil.com", "/\\evil.com"])
def test_the_token_redirect_stays_on_this_server(lm, path):
    c = TestClient(app(Explorer({"m": lm}), guard=Guard(bound="0.0.0.0", token="tok")), base_url="http://127.0.0.1:8765")
    r = c.get(f"{path}?token=tok", follow_redirects=False)
    location = r.headers["location"]
    assert r.status_code == 303 and location.startswith("/") and location[1:2] not in ("/", "\\"), location
    assert location.isascii() and location.isprintable() and " " not in location
    assert len(r.headers.get_list("location")) == 1


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_local_location_is_one_path_of_this_server_for_any_path(path):
    location = guards.local_location(path)
    assert location.startswith("/") and location[1:2] not in ("/", "\\")
    assert location.isascii() and all(33 <= ord(c) < 127 for c in location)  # no blank a browser would drop


# ---------------------------------------------------------------- clients that trickle their bodies

def _trickler(port: int) -> socket.socket:
    """A client that sends its headers and the first byte of a 100-byte body, then nothing."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall((f"POST /api/attention HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
               "Content-Length: 100\r\n\r\n{").encode())
    return s


def test_clients_trickling_their_bodies_hold_no_slot_and_are_timed_out(lm):
    """20 clients trickle their bodies (on the page's own address, 127.0.0.1): the page's requests are answered
    meanwhile, and each trickler gets 408 once `body_seconds` has passed, its connection closed."""
    with served(app(Explorer({"m": lm}), guard=Guard(max_in_flight=2, body_seconds=2.0))) as (base, port):
        started = time.monotonic()
        slow = [_trickler(port) for _ in range(20)]
        try:
            time.sleep(0.3)  # every trickler's headers are in: each is now reading its body
            with httpx.Client(base_url=base, timeout=30) as c:
                codes = [c.post("/api/attention", json=BODY).status_code for _ in range(3)]
            assert codes == [200] * 3 and time.monotonic() - started < 2.0  # answered before any timeout
            answers = []
            for s in slow:
                data = b""
                while b"\r\n\r\n" not in data or not data.endswith(b"}"):
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                answers.append(data)
            assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers[0][:200]
            assert json.loads(answers[0].split(b"\r\n\r\n", 1)[1])["error"].startswith("the request body did not")
            assert time.monotonic() - started < 10
        finally:
            for s in slow:
                s.close()
        with httpx.Client(base_url=base, timeout=30) as c:
            assert c.post("/api/attention", json=BODY).status_code == 200


# ---------------------------------------------------------------- found by a hostile pass

@pytest.mark.parametrize("route, field, value", [
    ("attention", "weight", ["norm"]), ("attention", "level", {"a": 1}), ("overview", "weight", [1]),
    ("generate", "temperature", [1.0]), ("generate", "top_p", {"p": 1}), ("generate", "seed", [0]),
])
def test_a_value_of_the_wrong_json_type_is_refused_by_name_not_as_a_cache_key(lm, route, field, value):
    """A list where a choice or a number belongs reached the explorer's cache key first: "unhashable type"."""
    c = TestClient(app(Explorer({"m": lm})), base_url="http://127.0.0.1:8765")
    body = {"model": "m", "layer": 0, "head": 0, **({"prompt": "The cat"} if route == "generate" else
                                                    {"text": "The cat sat."}), field: value}
    r = c.post(f"/api/{route}", json=body)
    assert r.status_code == 400 and field in r.json()["error"] and "unhashable" not in r.json()["error"], r.json()


def test_a_number_too_long_for_python_is_a_400_that_says_so(lm):
    c = TestClient(app(Explorer({"m": lm})), base_url="http://127.0.0.1:8765")
    r = c.post("/api/attention", content=b'{"model": "m", "text": "x", "layer": ' + b"9" * 5000 + b', "head": 0}',
               headers={"content-type": "application/json"})
    assert r.status_code == 400 and "digits" in r.json()["error"]


def test_no_redirect_but_the_guard_s(lm):
    """Starlette's own redirect of /api/x/ to /api/x is off: the guard's token redirect is the only one."""
    c = TestClient(app(Explorer({"m": lm})), base_url="http://127.0.0.1:8765")
    r = c.post("/api/attention/", json=BODY, follow_redirects=False)
    assert r.status_code == 404 and set(r.json()) == {"error"} and "location" not in r.headers


@pytest.mark.parametrize("host", ["", " ", "local host", "a/b", "user@127.0.0.1"])
def test_a_host_that_is_no_address_is_named_as_given(host, monkeypatch):
    line = _one_line(_serve(["--model", "tiny:llama", "--host", host], monkeypatch))
    assert line.startswith(f"headscope: --host {host!r}: give an address")


@pytest.mark.parametrize("host", ["127.0.0.1:99999", "[::1", "localhost:abc", "localhost:-1", "127.0.0.1/x",
                                  "127.0.0.1?x", "u@localhost"])
def test_a_host_header_no_browser_sends_is_refused(host):
    """A malformed Host whose name part is loopback was read generously and served."""
    assert Guard().refusal(method="GET", path="/", headers={"host": host}).status == 403
    assert Guard().refusal(method="GET", path="/", headers={"host": "localhost.:8765"}) is None
