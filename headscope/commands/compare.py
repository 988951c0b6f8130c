"""`headscope compare A B`: which heads changed between two checkpoints, with intervals over texts.

A thin wrapper over `headscope.compare_models`; the rule for "changed" is in `analyses.compare`.
`--report DIR` also writes an HTML report through `headscope.report` (the Comparison section:
differences with intervals, the changed heads, one layer × head difference grid per metric; both
models' verification), its figures and CSV tables, and run.json, as `headscope run` writes its folder.
"""

from __future__ import annotations

from pathlib import Path

import click

from ..common import internals as hs_
from ..common.corpus import corpus_or_fail
from ..common.exits import fail
from ..common.interrupts import committed
from ..common.loading import load_or_fail
from ..common.options import options
from ..common.outputs import emit, forced
from ..common.verification import verify_step

__all__ = ["cli"]


@click.command()
@click.argument("model_a")
@click.argument("model_b")
@options("corpus", "level", "special")
@click.option("--alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.05,
              show_default=True, help="Family-wise error rate over all (head, metric) pairs (Holm).")
@options("batching", "truncate", "report", "json", "quiet", "verify", "device")
def cli(model_a, model_b, corpus_path, level, include_special, limit, alpha, batch_size, truncate, report_dir,
        as_json, placement, no_verify, quiet) -> None:
    """Compare every head of MODEL_A and MODEL_B (names, folders, GGUF files or hub ids, NAME@REVISION)."""
    from headscope import compare_models

    corpus = corpus_or_fail(corpus_path, limit)
    texts, source = corpus.texts, corpus.source
    if len(texts) < 2:
        fail(f"{source} holds {len(texts)} text; intervals over texts need at least 2")

    lm_a = load_or_fail(model_a, placement)
    # the same name twice: one model, loaded once (its scores against themselves: every difference exactly 0)
    lm_b = lm_a if model_b == model_a else load_or_fail(model_b, placement)
    verified: dict[str, list] = {"a": [], "b": []}  # the Verification of each model, for the report
    checks = {key: verify_step(lm, enabled=not no_verify, keep=verified[key]) for key, lm in (("a", lm_a), ("b", lm_b))}
    try:
        result = compare_models(lm_a, lm_b, texts, level=level, include_special=include_special, alpha=alpha,
                                batch_size=batch_size, truncate=truncate, progress=not quiet)
    except (TypeError, ValueError) as exc:
        fail(str(exc))
    if report_dir is not None:
        _write_report(report_dir, result, (lm_a, lm_b), verified, checks, source, force=forced())
    if emit(result, as_json=as_json, payload=result.to_dict() | {"corpus": source, "verification": checks},
            summary="\n".join(f"{key}: {check['summary']}" for key, check in checks.items())):
        _print(result, source)
    if any(c["passed"] is False for c in checks.values()):
        raise SystemExit(1)


def _write_report(out: Path, result, models, verified: dict, checks: dict, source: str, *, force: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from headscope import comparison_report

    try:
        written = comparison_report(result, models, out, verifications=(next(iter(verified["a"]), None),
                                                                         next(iter(verified["b"]), None)),
                                    checks=checks, source=source, force=force, committed=committed(str(out)))
    except hs_.ReportFolderError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"could not write the report to {out}: {exc}")
    click.echo(f"wrote {out / 'index.html'}, {hs_.counted(written.n_figures, 'figure')}, {hs_.counted(len(written.tables), 'table')}", err=True)


def _print(result, source: str) -> None:
    click.echo(f"A = {result.a}, B = {result.b}: {hs_.counted(result.n_texts, 'text')} from {source}; differences are B - A")
    click.echo(result.rule)
    changed = result.changed()
    heads = result.changed_heads()
    click.echo(f"changed: {len(changed)} (head, metric) pairs in {len(heads)} heads"
               + (f": {', '.join(hs_.head_name(l, h) for l, h in heads)}" if heads else ""))
    for r in changed.head(30).itertuples():
        click.echo(f"  {hs_.head_name(r.layer, r.head):<7} {r.metric:<19} a {r.a:.3f}  b {r.b:.3f}  "
                   f"diff {r.diff:+.3f}  95% CI [{r.ci_low:+.3f}, {r.ci_high:+.3f}]")
    if len(changed) > 30:
        click.echo(f"  (+{len(changed) - 30} more; --json lists every pair)")
    roles = result.roles_changed
    click.echo(f"roles changed: {len(roles)}" if len(roles) else "roles changed: none")
    for r in roles.itertuples():
        click.echo(f"  {hs_.head_name(r.layer, r.head):<7} {r.role}: {'A only' if r.in_a else 'B only'}")
    for metric in dict.fromkeys(changed["metric"]):
        grid = result.grid(metric)
        click.echo(f"{metric} difference (B - A), layer × head:")
        click.echo("  layer " + " ".join(f"{'H' + str(h):>7}" for h in grid.columns))
        for layer, row in grid.iterrows():
            click.echo(f"  {layer:>5} " + " ".join(f"{v:+7.3f}" for v in row))
