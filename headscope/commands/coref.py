"""`headscope coref`: which heads let a pronoun look at the word it refers to, with honest statistics.

Also home of `probe_command`, the command factory `headscope probe` shares: read the sets, call
`headscope.probe_sets` (and `headscope.ablate_chosen_head` with --ablate), print.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import click

from ..common import internals as hs_
from ..common.exits import fail
from ..common.loading import load_or_fail
from ..common.options import head, options, renamed
from ..common.outputs import emit
from ..common.runs import join_run
from ..common.verification import finish, verify_step

__all__ = ["cli", "probe_command", "probe_options"]


def probe_options(fn):
    """The options `coref` and `probe` share (after `--data`)."""
    return options(
        "model",
        click.option("--heldout", "heldout_path", default=None,
                     help="Also choose the head on all of --data and score it on this file "
                          "(e.g. GAP development -> validation); the k-fold result on --data is kept under 'sets'."),
        "level",
        click.option("--head-word", is_flag=True, help="Score a multi-word name by its last word only (default: sum over it)."),
        click.option("--folds", type=click.IntRange(2, None), default=5, show_default=True, help="k of the group k-fold."),
        "permutations", "seed", "limit", "batching",
        head(name="show_head"),
        "out",
        click.option("--ablate", is_flag=True,
                     help="Ablation check (decoders): ablate the best head and compare how the model's preference "
                          "between the candidates moves, against random heads."),
        "method", "random",
        renamed("--random-sets", "--random", "n_random", value="N", type=click.IntRange(1, None)),
        "quiet", "json", "verify", "attention", "device",
    )(fn)


def _load_set(spec: str, limit: int | None, option: str = "--data"):
    """(task name, examples) for a built-in name or a file path; errors name `option`."""
    from headscope import builtin_set, read_probe_file

    if spec in hs_.BUILTIN_SETS:
        examples, task = builtin_set(spec), hs_.BUILTIN_SETS[spec][1]
    else:
        path = Path(spec)
        if not path.is_file():
            fail(f"{option} {spec}: no such file, and not a built-in set ({', '.join(hs_.BUILTIN_SETS)})")
        try:
            examples = read_probe_file(path)
        except OSError as exc:
            fail(f"{option} {spec}: cannot read it ({exc.strerror or exc})")
        task = path.stem.removeprefix("relation_").replace("_", "-")
    return task, examples[:limit] if limit else examples


def run_command(*, builtin: Sequence[str], combined_task: str, noun: str, template: str, model_name: str,
                data_spec: str | None, heldout_path: str | None, level: str, head_word: bool, folds: int,
                permutations: int, seed: int, limit: int | None, batch_size: int, show_head: tuple[int, int] | None,
                out_path: Path | None, ablate: bool, method: str, n_random: int, quiet: bool, as_json: bool,
                no_verify: bool, placement=None, attention: str,
                memory_budget: int | None = None) -> None:
    """What `headscope coref` and `headscope probe` do, given their built-in default sets.

    `template` is the continuation prompt of the ablation check (`--ablate`).
    """
    from headscope import ablate_chosen_head, probe_sets

    head = show_head  # (layer, head), read by the --head option
    try:
        sets = [_load_set(name, limit) for name in ([data_spec] if data_spec is not None else builtin)]
        held = _load_set(heldout_path, limit, "--heldout") if heldout_path else None
    except hs_.ProbeDataError as exc:
        fail(str(exc))
    if held is not None and len(sets) != 1:
        fail("--heldout needs a single --data file to choose the head on")
    world = join_run(placement.device)
    lm = load_or_fail(model_name, placement)
    verification = verify_step(lm, enabled=not no_verify)
    try:
        main, parts = probe_sets(lm, sets, heldout=held, combined_task=combined_task, level=level,
                                 head_word=head_word, folds=folds, n_perm=permutations, seed=seed, batch_size=batch_size,
                                 noun=noun, progress=not quiet, attention=attention, budget=memory_budget,
                                 world=world)
        if not world.is_main:  # every process of a torchrun run holds the same results; rank 0 goes on alone
            return
        if not main.n:
            _nothing_to_score(main, sets)
        check = ablate_chosen_head(lm, main, template=template, method=method, n_random=n_random, seed=seed,
                       batch_size=batch_size) if ablate else None
    except (ValueError, RuntimeError) as exc:
        fail(f"{model_name}: {exc}")
    _emit(main, parts, head, out_path, as_json, check, verification)
    finish(verification)


def _nothing_to_score(result, sets) -> None:
    """Exit 2: not one example could be scored (a table of nan% would look like a result)."""
    n = sum(len(examples) for _, examples in sets)
    why = "; ".join(f"{v} × {k}" for k, v in result.excluded.items()) or "none was kept"
    fail(f"{result.model}: nothing to score: none of the {n} example(s) of {result.task} could be scored ({why})")


def _emit(main, parts, head, out_path, as_json, ablation=None, verification=None) -> None:
    import pandas as pd

    results = [main, *parts]
    drill = None
    if head is not None:  # a head the model does not have: refused before anything is written
        try:
            drill = main.drill_down(*head)
        except ValueError as exc:
            fail(str(exc))
    table = None
    if out_path is not None:
        table = pd.concat([r.heads.assign(model=r.model, task=r.task) for r in results], ignore_index=True)
        table = table[["model", "task", *[c for c in table.columns if c not in ("model", "task")]]]
    obj = None
    if as_json:
        obj = main.to_dict()
        if parts:
            obj["sets"] = {r.task: r.to_dict() for r in parts}
        if drill is not None:
            obj["drill_down"] = {"layer": head[0], "head": head[1], "examples": drill.to_dict(orient="records")}
        if ablation is not None:
            obj["ablation"] = ablation
        if verification is not None:
            obj["verification"] = verification
        if main.data.check is not None:
            obj["check"] = main.data.check
    if not emit(main, out_path, as_json=as_json, payload=obj, table=table,
                summary=None if verification is None else verification["summary"]):
        return
    if main.data.check is not None:
        click.echo(main.data.check["summary"])
    for r in parts + [main]:
        _print_result(r)
    if drill is not None:
        _print_drill(drill, head)
    if ablation is not None:
        click.echo(f"ablation check ({main.task}): {ablation.get('verdict') or ablation['skipped']}")
        if "flips_verdict" in ablation:
            click.echo(f"ablation check ({main.task}): {ablation['flips_verdict']}")


def _print_result(r) -> None:

    click.echo(f"{r.model} · {r.task} · {r.level} level · {hs_.counted(r.n, 'example')} · selection: {r.selection}")
    click.echo("  baselines: " + "  ".join(f"{k} {v:.1%}" for k, v in r.baselines.items()))
    top = r.heads.sort_values(["accuracy", "layer", "head"], ascending=[False, True, True]).head(5)
    click.echo("  top heads (accuracy over all examples; intervals not corrected for choosing):")
    for row in top.itertuples():
        click.echo(f"    {hs_.head_name(row.layer, row.head):<7} {row.accuracy:6.1%}  {row.correct}/{row.n}  "
                   f"95% CI {row.ci_low:.1%}–{row.ci_high:.1%}")
    if r.excluded:
        click.echo("  excluded: " + "; ".join(f"{v} × {k}" for k, v in r.excluded.items()))
    for note in r.notes:
        click.echo(f"  note: {note}")
    click.echo(f"  verdict: {r.verdict}")
    click.echo("")


def _print_drill(drill, head) -> None:

    click.echo(f"{hs_.head_name(*head)}: attention from the source to each candidate (* = chosen, ✓ = answer)")
    for ex_id, rows in drill.groupby("example", sort=False):
        first = rows.iloc[0]
        marks = "  ".join(f"{'*' if r.chosen else ' '}{r.candidate}{'✓' if r.correct else ''} {r.attention:.3f}"
                          for r in rows.itertuples())
        click.echo(f"  [{ex_id}] {first.source!r}: {marks}   | {first.text[:80]}")


def probe_command(*, builtin: Sequence[str], combined_task: str, noun: str, data_help: str, doc: str,
                  template: str = "COREF_TEMPLATE") -> click.Command:
    """A probe command (`coref`, `probe`): the shared options, run on its own built-in sets.

    `template` names the continuation prompt in `analyses.relations`, looked up only when the
    command runs, so `headscope --help` does not import torch.
    """

    @click.command(help=f"{doc} --head L3H5 also shows that head's attention to each candidate, per example.")
    @click.option("--data", "data_spec", default=None, help=data_help)
    @probe_options
    def command(**options) -> None:
        run_command(builtin=builtin, combined_task=combined_task, noun=noun, template=hs_.template(template),
                    **options)

    return command


cli = probe_command(
    builtin=("agreement", "winograd"), combined_task="coref-builtin", noun="pronouns",
    data_help="Probe JSONL or GAP .tsv (told apart by content), or a built-in set: agreement, winograd. "
              "Default: both built-in sets, each scored and also together.",
    doc="Which head lets a pronoun attend to the word it refers to — held-out accuracy, baselines, p-value.",
)
