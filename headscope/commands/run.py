"""`headscope run`: the main job — verify, score every head, probe coreference, write a report.

For each `--model`, `headscope.analyse_model` verifies the attention, scores every head over the
corpus, runs the coreference probe and extracts the report sentences; `model_section` turns that
into the model's report section. Then one report for all models, side by side:
`DIR/index.html`, `DIR/figures/*.png`, `DIR/*.csv` and `DIR/run.json`.

Writing is atomic: everything goes into a temporary folder beside DIR, which is renamed to DIR
at the end, so an interrupted run leaves no half report. An existing DIR is replaced only with
`--force` (the old one is moved aside, the new one moved in, then the old one deleted).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import click

from ..api import REPORT_SENTENCES, RunSettings, analyse_model, versions
from ..common import device_options, echo_json, fail, json_option, load_or_fail, models_option, quiet_option, say

__all__ = ["cli", "model_section", "write_atomic"]

_COREF_SETS = ("agreement", "winograd")


# ---------------------------------------------------------------- inputs


def _read_inputs(corpus_path: str | None, coref_path: str | None, limit: int | None):
    """Corpus texts and probe sets, read (and checked) before any model is loaded."""
    from headscope.analyses.corpus import CorpusError, builtin_corpus, read_corpus
    from headscope.analyses.relations import BUILTIN_SETS, ProbeDataError, builtin_set, read_probe_file

    try:
        texts = builtin_corpus() if corpus_path is None else read_corpus(corpus_path)
    except FileNotFoundError:
        fail(f"--corpus {corpus_path}: no such file; give a text file with one text per line (or JSONL with a "
             "'text' field), or leave --corpus out for the built-in corpus")
    except (CorpusError, OSError, UnicodeError, ValueError) as exc:
        fail(f"--corpus {corpus_path}: {exc}")
    texts = texts[:limit] if limit else texts
    try:
        if coref_path is None:
            sets = [(BUILTIN_SETS[name][1], builtin_set(name)) for name in _COREF_SETS]
        else:
            if not Path(coref_path).is_file():
                fail(f"--coref {coref_path}: no such file; give a probe JSONL or a GAP .tsv, or leave --coref out "
                     "for the built-in sets")
            sets = [(Path(coref_path).stem.replace("_", "-"), read_probe_file(coref_path))]
    except (ProbeDataError, OSError, UnicodeError, ValueError) as exc:
        fail(f"--coref {coref_path}: {exc}")
    return texts, sets


def _check_formats(ctx, param, value: str) -> tuple[str, ...]:
    from headscope.reports.figures import FORMATS

    formats = tuple(dict.fromkeys(f.strip().lower() for f in value.split(",") if f.strip()))
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        fail(f"--format {value}: choose one or more of {', '.join(FORMATS)}, comma-separated (such as png,pdf)")
    return formats


def _check_width(ctx, param, value: str | None) -> float | None:
    from headscope.reports.figures import parse_width

    if value is None:
        return None
    try:
        return parse_width(value)
    except ValueError as exc:
        fail(f"--width {exc}")


def _check_out(out: Path, force: bool) -> None:
    if out.exists() and not force:
        fail(f"--out {out} already exists; pass --force to replace it, or choose another folder")
    if out.exists() and not out.is_dir():
        fail(f"--out {out} exists and is not a folder; remove it or choose another name")


# ---------------------------------------------------------------- one model's report section


def model_section(analysis):
    """The report's view of one model's `headscope.ModelAnalysis`."""
    from headscope.reports.html import ModelSection

    return ModelSection(model=analysis.model, maps=analysis.maps, word_maps=_word_maps(analysis.maps),
                        verification=analysis.verification, scores=analysis.scores, probes=analysis.probes,
                        corpus=analysis.corpus, info=analysis.info, notes=analysis.notes)


def _word_maps(maps) -> tuple:
    """The report sentences at word level, when every token knows its word (the report draws both levels)."""
    from headscope.probe import to_word_level

    if all(len(m.word_index) == len(m) for m in maps):
        return tuple(to_word_level(m) for m in maps)
    return ()


# ---------------------------------------------------------------- writing


def write_atomic(out: Path, fill, *, force: bool) -> None:
    """Call `fill(tmp)` on a fresh temporary folder beside `out`, then move it to `out`.

    An exception or interrupt removes the temporary folder and leaves `out` as it was. With
    `force` an existing `out` is moved aside first and deleted only after the new one is in place.
    """
    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    old: Path | None = None
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; a report folder is an ordinary one
        fill(tmp)
        if out.exists():
            if not force:
                raise FileExistsError(f"{out} appeared while the report was being written; nothing was replaced")
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, old / "report")
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not out.exists():
            os.replace(old / "report", out)  # put the previous report back
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


@click.command()
@models_option
@click.option("--corpus", "corpus_path", type=click.Path(dir_okay=False), default=None,
              help="Texts for the head scores: one per line, or JSONL with a 'text' field. "
                   "Default: the built-in corpus.")
@click.option("--coref", "coref_path", type=click.Path(dir_okay=False), default=None,
              help="Coreference probe data (JSONL or GAP .tsv). Default: the built-in agreement and Winograd sets.")
@click.option("--text", "texts", multiple=True,
              help="A sentence for the explorer and the attention figures (repeatable); replaces the defaults "
                   "(the it→animal sentence, its 'too wide' twin, 我爱北京天安门).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder to write the report into (created; must not exist unless --force).")
@click.option("--force", is_flag=True, help="Replace an existing --out folder.")
@click.option("--level", type=click.Choice(["word", "token"]), default="word", show_default=True,
              help="Units for head scores and the probe: words (Clark et al. 2019) or sub-word tokens.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Use only the first N corpus texts.")
@click.option("--induction-seqs", type=click.IntRange(min=0), default=20, show_default=True,
              help="Repeated random sequences for induction scores (decoders; 0 skips).")
@click.option("--permutations", type=click.IntRange(min=100), default=10_000, show_default=True,
              help="Monte Carlo permutations per probe test.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--truncate", is_flag=True, help="Cut texts longer than a model's context instead of failing.")
@click.option("--format", "formats", default="png", show_default=True, callback=_check_formats,
              help="Figure files to write, comma-separated: png, svg, pdf (fonts embedded). The page inlines PNG.")
@click.option("--dpi", type=click.IntRange(min=10, max=1200), default=100, show_default=True,
              help="Resolution of PNG figures (and of images inside vector ones).")
@click.option("--width", default=None, callback=_check_width,
              help="Scale every figure file to this width, keeping its aspect: 3.5in, 8.9cm, 89mm or 252pt.")
@quiet_option
@json_option
@device_options
def cli(models, corpus_path, coref_path, texts, out_dir, force, level, limit, induction_seqs, permutations, seed,
        batch_size, truncate, formats, dpi, width, quiet, as_json, device, dtype) -> None:
    """Verify, score every head, probe coreference and write DIR/index.html with figures, tables, run.json.

    --json prints the run.json record. Exits 1 when a model's attention is not verified (the report
    is still written and says so).
    """
    import matplotlib

    matplotlib.use("Agg")  # the CLI never shows a window; notebooks keep their own backend
    t_start = time.perf_counter()
    names = [n.strip() for m in models for n in m.split(",") if n.strip()]
    if not names:
        fail("--model: give at least one model name")
    if len(set(names)) != len(names):
        fail(f"--model: a model is named twice in {names}")
    for i, t in enumerate(texts):
        if not t.strip():
            fail(f"--text {i + 1} is empty; give a sentence")
    _check_out(out_dir, force)
    corpus, probe_sets = _read_inputs(corpus_path, coref_path, limit)
    settings = RunSettings(
        corpus="built-in" if corpus_path is None else str(corpus_path),
        coref=f"built-in ({', '.join(_COREF_SETS)})" if coref_path is None else str(coref_path),
        texts=tuple(texts) or REPORT_SENTENCES, level=level, limit=limit, induction_sequences=induction_seqs,
        permutations=permutations, seed=seed, batch_size=batch_size, device=device, dtype=dtype, truncate=truncate)

    sections, records = [], []
    for name in names:
        t0 = time.perf_counter()
        lm = load_or_fail(name, device, dtype)
        load_seconds = time.perf_counter() - t0
        say(f"{lm.name}: loaded from {lm.source} ({load_seconds:.1f} s)", quiet=quiet)
        try:
            analysis = analyse_model(lm, corpus, probe_sets, settings, load_seconds=load_seconds, progress=not quiet,
                                     log=None if quiet else lambda line: click.echo(line, err=True))
        except (TypeError, ValueError) as exc:
            fail(f"{name}: {exc}")
        sections.append(model_section(analysis))
        records.append(analysis.to_dict())
        del lm  # one model in memory at a time

    from headscope.probe.types import json_safe
    from headscope.reports.html import build_report

    t0 = time.perf_counter()
    the_versions = versions()
    settings_dict = {k: v for k, v in asdict(settings).items() if k != "texts"}
    report = build_report(sections, settings=settings_dict, versions=the_versions, dpi=dpi, formats=formats,
                          width=width)
    seconds_report = time.perf_counter() - t0
    passed = all(r["verified"] for r in records)
    run_record = {
        "headscope": the_versions["headscope"],
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "out": str(out_dir),
        "passed": passed,
        "settings": {**settings_dict, "texts": list(settings.texts)},
        "versions": the_versions,
        "models": records,
        "files": {"report": "index.html", "figures": [f"figures/{n}" for f in report.figures for n in f.written],
                  "tables": [f"{t}.csv" for t in sorted(report.tables)]},
    }

    def fill(folder: Path) -> None:
        report.write(folder)
        run_record["seconds"] = {"report": round(seconds_report, 3),
                                 "total": round(time.perf_counter() - t_start, 3)}
        (folder / "run.json").write_text(json.dumps(json_safe(run_record), indent=2, ensure_ascii=False) + "\n",
                                         encoding="utf-8")

    try:
        write_atomic(out_dir, fill, force=force)
    except OSError as exc:
        fail(f"could not write the report to {out_dir}: {exc}")
    size = (out_dir / "index.html").stat().st_size
    wrote = (f"wrote {out_dir / 'index.html'} ({size / 1e6:.1f} MB), {len(report.figures)} figures, "
             f"{len(report.tables)} tables, run.json in {time.perf_counter() - t_start:.0f} s")
    if as_json:
        say(wrote, quiet=quiet)
        echo_json(run_record)
    else:
        click.echo(wrote)
    if not passed:
        bad = ", ".join(r["model"] for r in records if not r["verified"])
        click.echo(f"headscope: attention NOT verified for {bad}; see the report's verification section", err=True)
        sys.exit(1)
