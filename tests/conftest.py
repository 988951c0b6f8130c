import contextlib
import functools
import os
import pathlib
import shutil

import pytest

from headscope.probe.families import FAMILIES

SHARED = pathlib.Path(__file__).resolve().parents[1].parent / "shared"


@functools.lru_cache(maxsize=None)
def _tiny(family: str):
    from headscope.probe.tiny import tiny_model

    return tiny_model(family)


@functools.lru_cache(maxsize=None)
def _tiny_type(model_type: str):
    """The tiny model of a model type: `_tiny`'s, but for a type that is also another family's name ("gemma3":
    Gemma 3 with vision, beside the `gemma3` text family), the type's own family's."""
    from headscope.probe.families import SUPPORTED_TYPES
    from headscope.probe.tiny import tiny_model

    if FAMILIES.get(model_type, SUPPORTED_TYPES[model_type]) is SUPPORTED_TYPES[model_type]:
        return _tiny(model_type)
    return tiny_model(model_type, as_type=True)


# Families with one stack of self-attention (encoders, decoders) and encoder–decoder families, whose
# extract takes a target and returns three maps (tested in test_seq2seq.py).
# Image families (vision transformers) take images, not texts: the text-parametrised tests leave them out
# (a text on an image model is refused by design) and tests/test_vision.py runs them on images.
ONE_STACK = sorted(name for name, f in FAMILIES.items() if f.kind != "encoder-decoder" and f.modality == "text")
IMAGE = sorted(name for name, f in FAMILIES.items() if f.modality == "image")
SEQ2SEQ = sorted(name for name, f in FAMILIES.items() if f.kind == "encoder-decoder")


def in_turn(*values) -> list:
    """`(family, value)` pairs for `@pytest.mark.parametrize("tiny, NAME", in_turn(...), indirect=["tiny"])`:
    every one-stack family once, each with the next of `values` in turn. Each value still meets
    families of every kind (encoders, decoders, rotary, ALiBi, sinks, ...) and each family one value,
    at 1/len(values) of the full product's cost: with 60+ verified types in 27 families the full
    product of the block-recompute tests alone would take minutes of the suite."""
    return [pytest.param(f, values[i % len(values)], id=f"{f}-{values[i % len(values)]}")
            for i, f in enumerate(ONE_STACK)]


@pytest.fixture(params=ONE_STACK)
def tiny(request):
    """A tiny random LoadedModel of each encoder or decoder family (built once per session)."""
    return _tiny(request.param)


@pytest.fixture(params=SEQ2SEQ)
def tiny_seq2seq(request):
    """A tiny random LoadedModel of each encoder–decoder family (built once per session)."""
    return _tiny(request.param)


@functools.lru_cache(maxsize=None)
def _real(name: str):
    from headscope.probe import load_model
    from headscope.probe.registry import KNOWN_MODELS, is_available

    if not is_available(KNOWN_MODELS[name]):
        pytest.fail(f"packaged model {name} is not installed; run scripts/setup.sh")
    return load_model(name)


@pytest.fixture
def minilm():
    return _real("minilm")


@pytest.fixture
def smollm2():
    return _real("smollm2")


@pytest.fixture
def gemma3():
    return _real("gemma3-270m")


@pytest.fixture
def draw_only(monkeypatch):
    """`draw_only(*names)`: reports draw only these `FIGURES` (none when no name is given) for the rest
    of the test; the page, its sections, tables and run.json are built as ever. Drawing is ~95% of a
    tiny `run`: an end-to-end test of one option draws that option's figures, and tests that check
    the record or the page alone draw none (tests/test_run.py's two-model run draws every figure)."""
    from headscope.reports import html

    def only(*names: str) -> None:
        unknown = set(names) - set(html.FIGURES)
        assert not unknown, f"not in FIGURES: {sorted(unknown)}"
        monkeypatch.setattr(html, "FIGURES", {n: spec for n, spec in html.FIGURES.items() if n in names})

    return only


@pytest.fixture
def shared_data() -> pathlib.Path:
    path = SHARED / "data"
    if not path.exists():
        pytest.skip(f"shared data not found at {path}")
    return path


# Headless Chromium for the offline-view tests: Debian's build, started without any network service.
CHROMIUM = os.environ.get("HEADSCOPE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic", "--disable-dev-shm-usage"]


@pytest.fixture(scope="session")
def browser():
    """A headless Chromium (playwright); the test skips, saying what to install, without one."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no chromium at {CHROMIUM}: install Debian's chromium (apt-get install -y chromium) "
                    "or set HEADSCOPE_CHROMIUM")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def one_line(result) -> str:
    """The one line a refused command printed on stderr (it must print exactly one, and no traceback)."""
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    return lines[0]


@contextlib.contextmanager
def served(asgi_app):
    """`asgi_app` served by uvicorn on a free loopback port in a thread: yields (base URL, port)."""
    import socket
    import threading
    import time

    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(asgi_app, host="127.0.0.1", port=port, log_level="critical", lifespan="off"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(200):
        if srv.started:
            break
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", port
    finally:
        srv.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="session")
def picture_file(tmp_path_factory):
    """A 40 × 52 random picture saved as a PNG, for the vision–language decoders' `--image` tests."""
    import numpy as np
    from PIL import Image

    path = tmp_path_factory.mktemp("pictures") / "picture.png"
    Image.fromarray((np.random.default_rng(5).random((40, 52, 3)) * 255).astype(np.uint8)).save(path)
    return str(path)


@pytest.fixture(scope="session")
def hub_folder(tmp_path_factory):
    """`get(model_type, variant)`: the type's hub-fidelity checkpoint (`tests/hub_fixtures.py`) saved as a hub folder
    (`save_tiny`, hub layout), with its fixture. Variant "hub": seed 0; "hidden": another seed and other sizes (the
    decoder's heads halved and their width doubled), the real relations kept."""
    from hub_fixtures import HUB, hidden_sizes
    from headscope.probe.tiny import save_tiny, tiny_model

    made = {}

    def get(model_type: str, variant: str):
        if (model_type, variant) not in made:
            fixture, default = HUB[model_type], _tiny_type(model_type).model.config
            overrides = fixture.overrides(default)
            seed = 0
            if variant == "hidden":
                seed, overrides = 7, hidden_sizes(default, overrides)
            lm = tiny_model(model_type, as_type=True, seed=seed, **overrides)
            made[model_type, variant] = save_tiny(lm, tmp_path_factory.mktemp(f"{model_type}-{variant}")), fixture
        return made[model_type, variant]
    return get
