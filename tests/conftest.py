import functools
import pathlib

import pytest

from headscope.probe.families import FAMILIES

SHARED = pathlib.Path(__file__).resolve().parents[1].parent / "shared"


@functools.lru_cache(maxsize=None)
def _tiny(family: str):
    from headscope.probe.tiny import tiny_model

    return tiny_model(family)


@pytest.fixture(params=sorted(FAMILIES))
def tiny(request):
    """A tiny random LoadedModel of each family (built once per session)."""
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
def shared_data() -> pathlib.Path:
    path = SHARED / "data"
    if not path.exists():
        pytest.skip(f"shared data not found at {path}")
    return path
