"""Architecture families, one file each, found by looking in this package.

A family is everything headscope knows about one kind of transformer attention, in one `Family`
object: the model types it covers, where its attention and output projection live (addressed by
transformers' own module names), how one layer's weights fill the from-scratch `LayerSpec`, the
config features it refuses because it does not reproduce them, and its tiny random test model.

Each module `probe/families/<name>.py` exposes `FAMILY`; every such module is registered, so
adding a family is adding one file.

An encoder–decoder family has three kinds of attention, each a `Stack` of layers in `stacks`:
"encoder" (bidirectional self-attention over the source), "decoder" (causal self-attention over
the target) and "cross" (target queries over the encoder's output). Its top-level `layer_spec`,
`attention` and `out_proj` are those of the encoder stack.

>>> FAMILIES["llama"].kind, family_of_type("mistral").name
('decoder', 'llama')
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable, Literal

import torch

from ..errors import UnsupportedArchitecture, UnsupportedFeature
from ..scratch import LayerSpec

__all__ = [
    "Family", "Refusal", "Kind", "Modality", "Stack", "StackKind", "TokenizerKind", "UnsupportedArchitecture", "UnsupportedFeature",
    "FAMILIES", "SUPPORTED_TYPES", "family_for", "family_of_type", "family_table", "coverage_markdown",
]

Kind = Literal["encoder", "decoder", "encoder-decoder"]
TokenizerKind = Literal["wordpiece", "bytebpe", "sentencepiece"]
AutoClass = Literal["AutoModel", "AutoModelForCausalLM", "AutoModelForSeq2SeqLM"]
Modality = Literal["text", "image"]
StackKind = Literal["encoder", "decoder", "cross"]


@dataclass(frozen=True)
class Refusal:
    """A config feature the family does not reproduce: `reason(config)` says why it is refused, or None."""

    feature: str
    reason: Callable[[Any], str | None]


@dataclass(frozen=True)
class Stack:
    """One kind of attention of an encoder–decoder model, addressed as a family addresses its layers."""

    kind: StackKind
    layer_spec: Callable[[torch.nn.Module, int, Any], LayerSpec]  # (base_model, i, config) -> LayerSpec
    attention: Callable[[torch.nn.Module, int], torch.nn.Module]  # (base_model, i) -> module whose first input is x
    out_proj: Callable[[torch.nn.Module, int], torch.nn.Module]  # (base_model, i) -> W_O
    n_layers: Callable[[Any], int]  # config -> number of layers of this stack
    keys: Literal["self", "encoder"] = "self"  # keys and values from the layer's own input, or the encoder's output


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # transformers' `config.model_type` values this family covers
    kind: Kind
    features: tuple[str, ...]  # what the from-scratch attention reproduces, for the docs and the CLI
    layer_spec: Callable[[torch.nn.Module, int, Any], LayerSpec]  # (base_model, i, config) -> LayerSpec
    attention: Callable[[torch.nn.Module, int], torch.nn.Module]  # (base_model, i) -> module whose first input is x
    out_proj: Callable[[torch.nn.Module, int], torch.nn.Module]  # (base_model, i) -> W_O; its input is the heads' concat
    refuses: tuple[Refusal, ...]  # checked in order; the first that applies is raised
    tiny_config: Callable[[int, str], Any]  # (vocab size, model type) -> config of that type's tiny random test model
    tokenizer: TokenizerKind | None  # the tiny tokenizer kind the tiny model is built with (None: an image model)
    auto_class: AutoClass  # the transformers Auto class that builds the tiny model
    position_embedding: Callable[[torch.nn.Module], torch.nn.Module] | None = None  # absolute positions, if any
    stacks: tuple[Stack, ...] = ()  # encoder-decoder only: the encoder, decoder and cross stacks, in that order
    # Vision transformers: the input is an image, cut into patches by the model's own embedding.
    modality: Modality = "text"
    # image models: the labels of the tokens before the patches (CLS, DeiT's distillation token, registers)
    prefix_tokens: Callable[[Any], tuple[str, ...]] = lambda cfg: ()
    tiny_processor: Callable[[Any], Any] | None = None  # image models: config -> the tiny model's image processor
    tiny_std: float = 0.2  # the spread of the tiny model's random weights (wider: attention far from uniform)

    def n_layers(self, config) -> int:
        return config.num_hidden_layers

    def stack(self, kind: StackKind) -> Stack:
        """The stack of attention `kind` of an encoder–decoder family."""
        for s in self.stacks:
            if s.kind == kind:
                return s
        raise KeyError(f"family {self.name!r} has no {kind!r} stack (it is a {self.kind})")

    def check(self, config) -> None:
        """Raise `UnsupportedFeature` when `config` uses a feature this family does not reproduce."""
        for refusal in self.refuses:
            reason = refusal.reason(config)
            if reason is not None:
                raise UnsupportedFeature(reason)


def linear_weights(m: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) of an nn.Linear, detached; bias None where the layer has none."""
    return m.weight.detach(), None if m.bias is None else m.bias.detach()


def _discover() -> dict[str, Family]:
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        family = importlib.import_module(f"{__name__}.{info.name}").FAMILY
        if family.name != info.name:
            raise ValueError(f"probe/families/{info.name}.py declares family {family.name!r}; name the file after it")
        found[family.name] = family
    return dict(sorted(found.items()))


FAMILIES: dict[str, Family] = _discover()
SUPPORTED_TYPES: dict[str, Family] = {t: f for f in FAMILIES.values() for t in f.model_types}


def family_of_type(model_type: str | None) -> Family:
    """The family that covers `model_type`; `UnsupportedArchitecture` when none does."""
    family = SUPPORTED_TYPES.get(model_type)
    if family is None:
        supported = ", ".join(f"{f.name} ({'/'.join(f.model_types)})" for f in FAMILIES.values())
        raise UnsupportedArchitecture(
            f"no from-scratch attention adapter for model type {model_type!r}; supported families: {supported}"
        )
    return family


def family_for(config) -> Family:
    """The family of `config.model_type`, after checking its attention features are all reproduced."""
    family = family_of_type(getattr(config, "model_type", None))
    family.check(config)
    return family


def family_table() -> list[dict]:
    """One row per supported model type: model_type, family, file, kind, features."""
    return [
        {"model_type": t, "family": f.name, "file": f"probe/families/{f.name}.py", "kind": f.kind,
         "features": list(f.features)}
        for f in FAMILIES.values()
        for t in f.model_types
    ]


def coverage_markdown() -> str:
    """The coverage table of docs/families.md (between its families markers), one row per family."""
    lines = ["| family | model types | kind | what the from-scratch attention reproduces |", "|---|---|---|---|"]
    for f in FAMILIES.values():
        lines.append(f"| {f.name} | {', '.join(f.model_types)} | {f.kind} | {'; '.join(f.features)} |")
    return "\n".join(lines) + "\n"
