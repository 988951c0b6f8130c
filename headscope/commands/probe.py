"""`headscope probe`: which head lets a source word attend to its target, for any word-to-word relation.

The same machinery as `headscope coref` (see there), on a relation set such as verb -> subject.
"""

from __future__ import annotations

import click

from .coref import probe_options, run_command

__all__ = ["cli"]


@click.command()
@click.option("--data", "data_spec", default=None,
              help="Relation JSONL (`source`/`target` or `pronoun`/`answer` fields) or GAP .tsv, or a built-in set: "
                   "verb-subject, agreement, winograd. Default: verb-subject.")
@probe_options
def cli(data_spec, model_name, heldout_path, level, head_word, folds, n_perm, seed, limit, batch_size, show_head,
        out_path, ablate, n_random, as_json, device, dtype, no_verify) -> None:
    """Which head lets a source word attend to its target — held-out accuracy, baselines, p-value."""
    from analyses.relations import RELATION_TEMPLATE

    run_command(builtin=("verb-subject",), combined_task="verb-subject", noun="examples",
                model_name=model_name, data_spec=data_spec, heldout_path=heldout_path, level=level,
                head_word=head_word, folds=folds, n_perm=n_perm, seed=seed, limit=limit, batch_size=batch_size,
                show_head=show_head, out_path=out_path, as_json=as_json, device=device, dtype=dtype,
                ablate=ablate, n_random=n_random, template=RELATION_TEMPLATE, verify=not no_verify)
