"""`headscope syntax`: which heads follow dependency relations on a CoNLL-U treebank (thin wrapper over
`headscope.syntax.syntax`)."""

from __future__ import annotations

from pathlib import Path

import click

from ..common import internals as hs_
from ..common.exits import fail
from ..common.loading import load_or_fail, models_or_fail
from ..common.options import options, treebank
from ..common.outputs import TABLE_WRITERS, emit, new_file_or_fail, say, write_figure, write_table
from ..common.verification import finish, verify_step

__all__ = ["cli", "treebank_or_fail"]


def treebank_or_fail(path: str, option: str):
    """The treebank at `path`, read and checked, or one clear line naming `option` and a non-zero exit."""
    return _read(_existing(path, option), option)


def _existing(path: str, option: str) -> Path:
    p = Path(path)
    if not p.is_file():
        fail(f"{option} {path}: no such file")
    return p


def _read(path: Path, option: str):
    try:
        tb = hs_.read_conllu(path)
    except hs_.TreebankError as exc:
        fail(f"{option} {exc}")
    if not len(tb):
        fail(f"{option} {path}: no sentence could be read"
             + (f" (skipped: {', '.join(f'{v} × {k}' for k, v in tb.skipped.items())})" if tb.skipped else ""))
    return tb


@click.command(help="Which heads follow which dependency relations on a CoNLL-U treebank: per relation the head "
                    "chosen on --select-on scored on --conllu against the best fixed offset, and trees decoded "
                    "from single heads against right-branching.")
@options("model", treebank(required=True))
@click.option("--subtypes", is_flag=True, help="Keep relation subtypes apart (nmod:poss); default: folded (nmod).")
@click.option("--tree-sample", type=click.IntRange(1, None), default=500, show_default=True,
              help="Selection sentences (seeded sample) on which every head's trees are decoded to choose one.")
@click.option("--no-trees", is_flag=True, help="Skip decoding trees.")
@options("permutations", "seed", "limit", "batching")
@click.option("--clusters", "clusters_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also place every head by the Jensen-Shannon distance between its attention and the others' "
                   "(metric MDS) on the first --cluster-sentences sentences of --conllu, labelled by each head's "
                   "top role over those sentences; write the table (.csv, .parquet, .json) or the figure "
                   "(.png, .svg, .pdf), by the suffix.")
@click.option("--cluster-with", "cluster_with", multiple=True,
              help="Another model whose heads are placed together with --model's (repeatable); its word units "
                   "must match (same special tokens), else it is refused. Needs --clusters.")
@click.option("--cluster-sentences", type=click.IntRange(2, None), default=100, show_default=True,
              help="Sentences the clusters are computed on.")
@options("out", "json", "quiet", "verify", "attention", "device")
def cli(model_name, conllu_path, select_path, subtypes, tree_sample, no_trees, permutations, seed, limit, batch_size,
        clusters_path, cluster_with, cluster_sentences, out_path, as_json, quiet, no_verify, placement, attention,
        memory_budget) -> None:
    from headscope import syntax

    _check_clusters(clusters_path, cluster_with)
    test = _read(_existing(conllu_path, "--conllu"), "--conllu")
    select = _read(_existing(select_path, "--select-on"), "--select-on") if select_path else None
    lm = load_or_fail(model_name, placement)
    verification = verify_step(lm, enabled=not no_verify)
    try:
        result = syntax(lm, test, select_on=select, subtypes=subtypes, trees=not no_trees, tree_sample=tree_sample,
                        n_perm=permutations, seed=seed, batch_size=batch_size, limit=limit,
                        progress=not quiet, attention=attention, budget=memory_budget)
    except (ValueError, RuntimeError) as exc:
        fail(f"{model_name}: {exc}")
    if clusters_path is not None:
        _write_clusters(lm, cluster_with, test, clusters_path, n_sentences=cluster_sentences, seed=seed,
                        batch_size=batch_size, placement=placement)
        say(f"wrote {clusters_path}", quiet=quiet)
    if emit(result, out_path, as_json=as_json, payload={**result.to_dict(), "verification": verification},
            summary=verification["summary"]):
        _print(result)
    finish(verification)


def _cluster_writers() -> dict:
    """File suffix -> how the clusters go there: the table (TABLE_WRITERS) or its figure (figure FORMATS)."""
    return {**{suffix: "table" for suffix in TABLE_WRITERS}, **{f".{fmt}": "figure" for fmt in hs_.FIGURE_FORMATS}}


def _check_clusters(path: Path | None, cluster_with) -> None:
    if cluster_with and path is None:
        fail("--cluster-with needs --clusters FILE (where the clusters of the models together are written)")
    if path is not None and path.suffix not in _cluster_writers():
        fail(f"--clusters {path}: give a file ending in {', '.join(_cluster_writers())}")
    if path is not None:
        new_file_or_fail(path, "--clusters")
    models_or_fail(cluster_with, "--cluster-with")  # loaded only after the syntax scores: checked now


def _write_clusters(lm, others, treebank, path: Path, *, n_sentences: int, seed: int, batch_size: int,
                    placement=None) -> None:
    from headscope import syntax_clusters

    models = [lm, *(load_or_fail(name, placement) for name in others)]
    try:
        table = syntax_clusters(models, treebank, n_sentences=n_sentences, score_roles=True, seed=seed,
                                batch_size=batch_size)
    except ValueError as exc:
        fail(f"--clusters: {' and '.join(m.name for m in models)} cannot be placed together: {exc}")
    if _cluster_writers()[path.suffix] == "table":
        write_table(table, path)
        return
    import matplotlib

    matplotlib.use("Agg")

    write_figure(hs_.cluster_plot(table), path)


def _pct(x) -> str:
    return "    -" if x is None else f"{x:5.1%}"


def _print(r) -> None:

    click.echo(f"{r.model} · {r.treebank} · {r.n_sentences} test sentences ({r.n_skipped} skipped) · {r.selection}")
    click.echo(f"  {'relation':<14} {'direction':<16} {'n':>5}  {'head':<7} {'held-out':>8}  {'95% CI':<13} "
               f"{'offset':>6} {'base':>6}  {'p':>7} {'p_holm':>7}")
    for s in r.relations:
        head = hs_.head_name(*s.best_head) if s.best_head else "-"
        ci = f"{s.ci95[0]:.1%}–{s.ci95[1]:.1%}" if s.ci95 else "-"
        off = f"{s.baseline_offset:+d}" if s.baseline_offset is not None else "-"
        p = f"{s.p_value:.2g}" if s.p_value is not None else "-"
        ph = f"{s.p_holm:.2g}" if s.p_holm is not None else "-"
        mark = " *" if s.beats_baseline else ""
        click.echo(f"  {s.relation:<14} {s.direction:<16} {s.n:>5}  {head:<7} {_pct(s.heldout_accuracy):>8}  {ci:<13} "
                   f"{off:>6} {_pct(s.baseline_accuracy):>6}  {p:>7} {ph:>7}{mark}")
    click.echo("  * = the head beats the offset baseline (Holm-adjusted p < alpha)")
    if r.trees is not None:
        click.echo(f"  trees: {r.trees.verdict}")
    if r.skipped:
        click.echo("  skipped sentences: " + "; ".join(f"{v} × {k}" for k, v in r.skipped.items()))
    if r.excluded:
        click.echo("  excluded arcs: " + "; ".join(f"{v} × {k}" for k, v in r.excluded.items()))
    for note in r.notes:
        click.echo(f"  note: {note}")
