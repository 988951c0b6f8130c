"""The one door from the commands to the rooms below the façade: what a command prints with, reads an input by
or checks before any model loads, and that is not (or not yet) public API.

A command imports `headscope` (the façade: every computation) and `headscope.common` (this package: options,
outputs, exits, and the names below) and nothing else; `tests/test_option_homes.py` scans for it. Each name is
looked up in its home on first use, as the façade does, so `headscope --help` imports no torch:

    from ..common import internals as hs_
    hs_.head_name(2, 3)      # -> "L2H3", from headscope.probe.types
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> (home module, name there)
_HOMES: dict[str, tuple[str, str]] = {
    # the choices of an option (`probe.names`, which imports no torch: read when a command module is imported)
    "choices": ("headscope.probe.names", "choices"),
    "PatchWhat": ("headscope.probe.names", "PatchWhat"),
    "PatchDirection": ("headscope.probe.names", "PatchDirection"),
    "PatchPositions": ("headscope.probe.names", "PatchPositions"),
    "DEFAULT_ATTENTION": ("headscope.probe.names", "DEFAULT_ATTENTION"),
    # printing
    "head_name": ("headscope.probe.types", "head_name"),
    "counted": ("headscope.probe.wording", "counted"),
    "patch_label": ("headscope.probe.vision_language", "patch_label"),
    "METRICS": ("headscope.analyses.metrics", "METRICS"),
    "IMPORTANCE_LOSSES": ("headscope.probe.importance", "IMPORTANCE_LOSSES"),
    "TOWER_NAMES": ("headscope.probe.images", "TOWER_NAMES"),
    # reading and checking inputs before a model loads
    "BUILTIN_SETS": ("headscope.analyses.relations", "BUILTIN_SETS"),
    "ProbeDataError": ("headscope.analyses.relations", "ProbeDataError"),
    "read_conllu": ("headscope.analyses.treebank", "read_conllu"),
    "TreebankError": ("headscope.analyses.treebank", "TreebankError"),
    "FIGURE_FORMATS": ("headscope.reports.canvas", "FORMATS"),
    "parse_width": ("headscope.reports.canvas", "parse_width"),
    "check_width": ("headscope.reports.canvas", "check_width"),
    "load_image": ("headscope.probe.images", "load_image"),
    "model_type_of": ("headscope.probe.loading", "model_type_of"),
    "family_table": ("headscope.probe.families", "family_table"),
    "model_table": ("headscope.probe.registry", "model_table"),
    "parse_heads_by": ("headscope.workflows.ablation", "parse_heads_by"),
    # what a model is given: the tower of a two-tower model that reads the input, a chat turned into a prompt
    "for_input": ("headscope.probe.images", "for_input"),
    "chat_prompt": ("headscope.probe.generate", "chat_prompt"),
    "copying_scores": ("headscope.probe.composition", "copying_scores"),
    "permutation_check": ("headscope.probe.explain", "permutation_check"),
    "scale_effect": ("headscope.probe.explain", "scale_effect"),
    # writing
    "write_folder": ("headscope.probe.folders", "write_folder"),
    "ReportFolderError": ("headscope.reports.folder", "ReportFolderError"),
    "DrawingPool": ("headscope.reports.drawing", "DrawingPool"),
    "settings_display": ("headscope.workflows.run", "settings_display"),
    "cluster_plot": ("headscope.reports.syntax", "cluster_plot"),
    # the live explorer
    "Explorer": ("headscope.workflows.explore", "Explorer"),
    "unserved": ("headscope.workflows.explore", "unserved"),
    "reads_images": ("headscope.workflows.explore", "reads_images"),
    "no_image_reader": ("headscope.workflows.explore", "no_image_reader"),
}

__all__ = [*sorted(_HOMES), "template"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, there = _HOMES[name]
    return getattr(importlib.import_module(module), there)


def __dir__() -> list[str]:
    return __all__


def template(name: str) -> str:
    """A continuation prompt of `analyses.relations` by its name (`COREF_TEMPLATE`, `RELATION_TEMPLATE`)."""
    return getattr(importlib.import_module("headscope.analyses.relations"), name)
