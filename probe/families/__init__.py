"""The family registry: one file per architecture family, found by its file name and loaded only when asked for.

Each module `probe/families/<name>.py` declares `FAMILY`, a `Family` (`probe.family`): adding a family is adding one
file. Importing this package imports no family file. The model types each file covers are read from the file's
source without running it (the literal `model_types=(...)` of its `FAMILY = ...` call, and the keys of a
literal `towers={...}`: the two-tower composites whose image tower it verifies); looking a type up imports that
one file (and the files it names as a base), and checks that the family it declares covers what its source said.

>>> FAMILIES["llama"].kind, family_of_type("mistral").name
('decoder', 'llama')
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import sys
from collections.abc import Iterator, Mapping
from functools import lru_cache
from pathlib import Path

from ..family import (AutoClass, Family, Kind, Modality, NO_SOFTMAX_LAYER_TYPES, Refusal, Stack, StackKind,
                      TokenizerKind, Towers, UnsupportedArchitecture, UnsupportedFeature, VisionLanguage,
                      linear_weights, norm_eps, softmax_layers)

__all__ = [
    "Family", "Refusal", "Kind", "Modality", "Stack", "StackKind", "VisionLanguage", "Towers", "TokenizerKind",
    "AutoClass", "UnsupportedArchitecture", "UnsupportedFeature", "FAMILIES", "SUPPORTED_TYPES", "TOWERS",
    "NO_SOFTMAX_LAYER_TYPES", "softmax_layers", "linear_weights", "norm_eps", "family_for", "family_of_type",
    "family_table", "coverage_markdown", "FamilyIndex", "family_index", "load_family", "loaded_families",
]


class FamilyIndex:
    """What the family files declare, read from their source: family name -> the model types (`types`) and two-tower
    composites (`towers`) its file covers, and the other way round (`owner`: model type -> family name, `composite`:
    composite type -> family name). Built from the package's folders (`__path__`), so a family file dropped into
    any of them is found; a type two files declare is refused."""

    def __init__(self, files: dict[str, Path]):
        self.files = dict(sorted(files.items()))
        self.types: dict[str, tuple[str, ...]] = {}
        self.towers: dict[str, tuple[str, ...]] = {}
        self.owner: dict[str, str] = {}
        self.composite: dict[str, str] = {}
        for name, path in self.files.items():
            self.types[name], self.towers[name] = _declared(path)
            for model_type, owner in [*((t, self.owner) for t in self.types[name]),
                                      *((t, self.composite) for t in self.towers[name])]:
                if model_type in self.owner or model_type in self.composite:
                    first = self.owner.get(model_type) or self.composite[model_type]
                    raise ValueError(f"model type {model_type!r} is declared by both {self.files[first]} and {path}; "
                                     "one family covers a type: remove it from one of them")
                owner[model_type] = name


def _declared(path: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(model_types, two-tower composite types) of a family file: the literal `model_types=` and the literal keys of
    `towers=` in the call its `FAMILY = ...` statement makes (a `Family(...)`, a `dataclasses.replace(...)` of a base
    family, or a factory)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "FAMILY" for t in node.targets):
            if isinstance(node.value, ast.Call):
                words = {k.arg: k.value for k in node.value.keywords if k.arg}
                if "model_types" in words:
                    try:
                        types = ast.literal_eval(words["model_types"])
                    except ValueError:
                        types = None
                    if isinstance(types, tuple) and types and all(isinstance(t, str) for t in types):
                        towers = words.get("towers")
                        keys = () if not isinstance(towers, ast.Dict) else tuple(ast.literal_eval(k) for k in towers.keys)
                        return types, keys
    raise ValueError(f"{path}: a family file declares FAMILY = ...(model_types=(\"type\", ...), ...) with its model "
                     "types written out, so the registry can find it without importing every family")


def family_index() -> FamilyIndex:
    """The index of the family files of this package's folders (read once per set of folders)."""
    return _index_of(tuple(str(p) for p in __path__))


@lru_cache(maxsize=4)
def _index_of(paths: tuple[str, ...]) -> FamilyIndex:
    files = {}
    for info in pkgutil.iter_modules(list(paths)):
        if not info.name.startswith("_") and not info.ispkg:
            files.setdefault(info.name, Path(info.module_finder.path) / f"{info.name}.py")
    return FamilyIndex(files)


def load_family(name: str) -> Family:
    """The `FAMILY` of `probe/families/<name>.py`, imported now if it was not, checked against what its source
    declares; KeyError for a name no file has."""
    index = family_index()
    if name not in index.files:
        raise KeyError(name)
    family = importlib.import_module(f"{__name__}.{name}").FAMILY
    if family.name != name:
        raise ValueError(f"probe/families/{name}.py declares family {family.name!r}; name the file after it")
    if tuple(family.model_types) != index.types[name] or tuple(family.towers) != index.towers[name]:
        raise ValueError(f"probe/families/{name}.py: its FAMILY covers {family.model_types} (towers "
                         f"{tuple(family.towers)}), but its source declares {index.types[name]} (towers "
                         f"{index.towers[name]}); write them out in the FAMILY call")
    return family


class _Families(Mapping):
    """family name -> `Family`, each file imported on first access."""

    def __getitem__(self, name: str) -> Family:
        return load_family(name)

    def __iter__(self) -> Iterator[str]:
        return iter(family_index().files)

    def __len__(self) -> int:
        return len(family_index().files)

    def __contains__(self, name: object) -> bool:
        return name in family_index().files


class _ByType(Mapping):
    """model type -> what the family file that declares it gives for it (`owner`: the index's table of declared
    types; `value(family, type)`), only that family's file imported."""

    def __init__(self, owner: str, value):
        self._owner, self._value = owner, value

    def _table(self) -> dict[str, str]:
        return getattr(family_index(), self._owner)

    def __getitem__(self, model_type: str):
        name = self._table().get(model_type)
        if name is None:
            raise KeyError(model_type)
        return self._value(load_family(name), model_type)

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __contains__(self, model_type: object) -> bool:
        return model_type in self._table()


FAMILIES: Mapping[str, Family] = _Families()
# model type -> the `Family` that covers it
SUPPORTED_TYPES: Mapping[str, Family] = _ByType("owner", lambda family, model_type: family)
# two-tower composite model type (CLIP, SigLIP) -> its `Towers`, declared by the family of its image tower
TOWERS: Mapping[str, Towers] = _ByType("composite", lambda family, model_type: family.towers[model_type])


def loaded_families() -> tuple[str, ...]:
    """The family files imported so far in this process (what a lookup has cost)."""
    prefix = f"{__name__}."
    return tuple(sorted(m[len(prefix):] for m in sys.modules if m.startswith(prefix) and not m[len(prefix):].startswith("_")))


def family_of_type(model_type: str | None) -> Family:
    """The family that covers `model_type`; `UnsupportedArchitecture` when none does."""
    family = SUPPORTED_TYPES.get(model_type)
    if family is None:
        supported = ", ".join(f"{name} ({'/'.join(types)})" for name, types in family_index().types.items())
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
