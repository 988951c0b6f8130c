"""`headscope relations`: which head lets a source word attend to its target, for any word-to-word relation.

(`headscope probe` before 0.2: "probe" now names only the extraction room `probe/`; the old command
name still works for one release, with a warning.)

The same machinery as `headscope coref` (see there), on a relation set such as verb -> subject.
"""

from __future__ import annotations

from .coref import probe_command

__all__ = ["cli"]


cli = probe_command(
    builtin=("verb-subject",), combined_task="verb-subject", noun="examples", template="RELATION_TEMPLATE",
    data_help="Relation JSONL (`source`/`target` or `pronoun`/`answer` fields) or GAP .tsv, or a built-in set: "
              "verb-subject, agreement, winograd. Default: verb-subject.",
    doc="Which head lets a source word attend to its target — held-out accuracy, baselines, p-value.",
)
