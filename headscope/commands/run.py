"""`headscope run`: the main job — verify, score every head, probe coreference, write a report.

For each `--model`, `headscope.analyse_model` verifies the attention, scores every head over the
corpus, runs the coreference probe and extracts the report sentences; `model_section` turns that
into the model's report section. Then one report for all models, side by side:
`DIR/index.html`, `DIR/figures/*.png`, `DIR/*.csv` and `DIR/run.json`.

Writing is atomic: everything goes into a temporary folder beside DIR, which is renamed to DIR
at the end, so an interrupted run leaves no half report. An existing DIR is replaced only with
`--force`, and only when headscope wrote it (its run.json lists every file it holds) or it is
empty: the old one is moved aside, the new one moved in, then the old one deleted. The working
directory and its ancestors are never replaced. The writer holds a lock beside its temporary
folders; temporaries whose lock is free were left by a killed run and are removed by the next one.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import click

from ..api import REPORT_SENTENCES, RunSettings, analyse_model, versions
from filelock import FileLock, Timeout

from ..common import (Interrupts, attention_options, device_options, echo_json, fail, join_run, json_option, load_or_fail,
                      models_option, parsed, quiet_option, say, too_long_or_fail, writable_or_fail)

__all__ = ["cli", "model_section", "write_atomic", "not_a_report", "check_out"]

_COREF_SETS = ("agreement", "winograd")
_SYNTAX_SETTINGS = ("conllu", "select_on")  # recorded only when given


# ---------------------------------------------------------------- inputs


def _read_inputs(corpus_path: str | None, coref_path: str | None, limit: int | None):
    """Corpus texts and probe sets, read (and checked) before any model is loaded."""
    from headscope.analyses.corpus import CorpusError, builtin_corpus, iter_corpus_lines
    from headscope.analyses.relations import BUILTIN_SETS, ProbeDataError, builtin_set, read_probe_file

    lines = ()  # a file's texts with their line numbers, to name a text too long for a model
    try:
        if corpus_path is None:
            texts = builtin_corpus()
        else:
            lines = tuple(iter_corpus_lines(corpus_path))[:limit]
            if not lines:
                fail(f"--corpus {corpus_path}: the file holds no texts (only empty lines); give one text per line")
            texts = [line.text for line in lines]
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
    return texts, sets, lines


def _read_treebanks(conllu_path: str | None, select_path: str | None) -> dict:
    """The treebanks of --conllu / --select-on, read and checked before any model is loaded."""
    from .syntax import treebank_or_fail

    if select_path is not None and conllu_path is None:
        fail("--select-on needs --conllu (the treebank the syntax heads are scored on)")
    if conllu_path is None:
        return {}
    return {"conllu": treebank_or_fail(conllu_path, "--conllu"),
            "select_on": treebank_or_fail(select_path, "--select-on") if select_path else None}


def _check_formats(ctx, param, value: str) -> tuple[str, ...]:
    from headscope.reports.figures import FORMATS

    formats = tuple(dict.fromkeys(f.strip().lower() for f in value.split(",") if f.strip()))
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        fail(f"--format {value}: choose one or more of {', '.join(FORMATS)}, comma-separated (such as png,pdf)")
    return formats


def _parse_width(value: str) -> float:
    from headscope.reports.figures import parse_width  # imported when the option is given: matplotlib is slow to load

    return parse_width(value)


def check_out(out: Path, force: bool, option: str = "--out") -> None:
    """Refuse, before any work, a report folder (`option`, --out) that must not be replaced or cannot be written."""
    here, target = Path.cwd().resolve(), out.resolve()
    if target == here or target in here.parents:
        fail(f"{option} {out} is the working directory or a folder above it; give a new folder for the report")
    if out.exists() and not out.is_dir():
        fail(f"{option} {out} exists and is not a folder; remove it or choose another name")
    if out.exists() and not force:
        fail(f"{option} {out} already exists; pass --force to replace it, or choose another folder")
    if out.exists():
        problem = not_a_report(out)
        if problem:
            fail(f"{option} {out}: {problem}; --force replaces only a report folder that headscope wrote")
    writable_or_fail(out, option)


def not_a_report(folder: Path) -> str | None:
    """Why `folder` is not a report folder that `--force` may replace, or None (a report, or empty).

    A report is recognised by its run.json, which lists the report's files: anything else in the
    folder (a file the user added, another project) makes it not replaceable.
    """
    folder = Path(folder)
    if not any(folder.iterdir()):
        return None
    try:
        record = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "the folder has no run.json, so headscope did not write it"
    except (OSError, ValueError):
        return "its run.json is not a headscope run record"
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict) or "headscope" not in record:
        return "its run.json is not a headscope run record"
    ours = {"run.json", "figures", str(files.get("report")), *map(str, files.get("figures", ())),
            *map(str, files.get("tables", ()))}
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if name not in ours or (name == "figures") != (path.is_dir() and not path.is_symlink()):
            return f"it holds {name}, which headscope did not write"
    return None


# ---------------------------------------------------------------- one model's report section


def model_section(analysis):
    """The report's view of one model's `headscope.ModelAnalysis`."""
    from headscope.reports.html import ModelSection

    return ModelSection(model=analysis.model, maps=analysis.maps, word_maps=_word_maps(analysis.maps),
                        pairs=analysis.pairs, word_pairs=_word_pairs(analysis.pairs),
                        norm_maps=_word_maps(analysis.norm_maps) or analysis.norm_maps,
                        generations=analysis.generations,
                        verification=analysis.verification, scores=analysis.scores, probes=analysis.probes,
                        corpus=analysis.corpus, info=analysis.info, notes=analysis.notes,
                        syntax=analysis.syntax, syntax_clusters=analysis.syntax_clusters, causal=analysis.causal)


def _word_maps(maps) -> tuple:
    """The report sentences at word level, when every token knows its word (the report draws both levels)."""
    from headscope.probe import to_word_level

    if all(len(m.word_index) == len(m) for m in maps):
        return tuple(to_word_level(m) for m in maps)
    return ()


def _word_pairs(pairs) -> tuple:
    """Encoder–decoder pairs at word level, when both sides' tokens know their words."""
    from headscope.probe import to_word_level

    if pairs and all(_word_maps((p.encoder, p.decoder)) for p in pairs):
        return tuple(to_word_level(p) for p in pairs)
    return ()


# ---------------------------------------------------------------- writing


def write_atomic(out: Path, fill, *, force: bool, check: Callable[[], None] = lambda: None) -> None:
    """Call `fill(tmp)` on a fresh temporary folder beside `out`, then move it to `out`.

    An exception or interrupt removes the temporary folder and leaves `out` as it was. With
    `force` an existing `out` (a report, `not_a_report`) is moved aside first and deleted only after
    the new one is in place. `check()` runs just before anything is moved (`Interrupts.check`).
    While it works the writer holds `.<name>.partial-<id>.lock`; temporaries of writers killed
    earlier (their lock is free) are removed first.
    """
    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    reclaim_stale(out)
    token = f"{os.getpid()}-{os.urandom(4).hex()}"
    tmp, old = out.with_name(f".{out.name}.partial-{token}"), out.with_name(f".{out.name}.old-{token}")
    lock = FileLock(_lock_of(tmp))
    try:
        with lock:  # taken before the folders exist, so a cleaner never sees them unlocked
            try:
                tmp.mkdir()
                fill(tmp)
                check()
                if out.exists():
                    problem = "it appeared while the report was being written" if not force else not_a_report(out)
                    if problem:
                        raise FileExistsError(f"{out}: {problem}; nothing was replaced")
                    os.replace(out, old)
                os.replace(tmp, out)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                if old.exists() and not out.exists():
                    os.replace(old, out)  # put the previous report back
                raise
            finally:
                shutil.rmtree(old, ignore_errors=True)
    finally:
        _lock_of(tmp).unlink(missing_ok=True)


def _lock_of(tmp: Path) -> Path:
    return tmp.with_name(tmp.name + ".lock")


def reclaim_stale(out: Path) -> None:
    """Remove the temporaries that killed writers of `out` left beside it (their lock is free).

    A killed writer's moved-aside previous report (`.old-`) goes back to `out` when `out` is
    missing (it was killed between the two renames); otherwise it is deleted.
    """
    for lock in sorted(out.parent.glob(f".{out.name}.partial-*.lock")):
        tmp = lock.with_suffix("")
        old = out.with_name(tmp.name.replace(".partial-", ".old-", 1))
        try:
            with FileLock(lock, timeout=0):
                shutil.rmtree(tmp, ignore_errors=True)
                if old.exists() and not out.exists():
                    os.replace(old, out)
                shutil.rmtree(old, ignore_errors=True)
        except Timeout:
            continue  # a writer is working there right now
        lock.unlink(missing_ok=True)


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
@click.option("--target", "targets", multiple=True,
              help="Encoder-decoder models: the decoder's text for each --text (repeatable, paired in order). "
                   "Default: each sentence is its own target. Other models ignore it.")
@click.option("--generate", "generate", type=click.IntRange(min=0), default=0, show_default=True,
              help="Decoders: generate N tokens (greedy) after each --text; the explorer steps through them.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder to write the report into (created; must not exist unless --force).")
@click.option("--force", is_flag=True,
              help="Replace an existing --out folder that headscope wrote (its run.json lists every file in it).")
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
@click.option("--conllu", "conllu_path", default=None,
              help="A CoNLL-U treebank: adds a Syntax section (heads that follow dependency relations, trees, "
                   "head clusters), scored on this file.")
@click.option("--select-on", "select_path", default=None,
              help="A second CoNLL-U file to choose the syntax heads on (e.g. dev -> test); without it, a seeded "
                   "half of --conllu. Needs --conllu.")
@click.option("--causal/--no-causal", default=None,
              help="Causal evidence: ablate every head alone, gradient importance, the induction ablation and the "
                   "probes' cloze checks. Default: on for encoders (seconds), off for decoders (minutes on a CPU).")
@click.option("--causal-texts", type=click.IntRange(min=1), default=32, show_default=True,
              help="Corpus texts that every single-head ablation and the importance are measured on.")
@click.option("--format", "formats", default="png", show_default=True, callback=_check_formats,
              help="Figure files to write, comma-separated: png, svg, pdf (fonts embedded). The page inlines PNG.")
@click.option("--dpi", type=click.IntRange(min=10, max=1200), default=100, show_default=True,
              help="Resolution of PNG figures (and of images inside vector ones).")
@click.option("--width", default=None, callback=parsed(_parse_width, "--width"),
              help="Scale every figure file to this width, keeping its aspect: 3.5in, 8.9cm, 89mm or 252pt.")
@quiet_option
@json_option
@attention_options
@device_options
def cli(models, corpus_path, coref_path, texts, targets, generate, out_dir, force, level, limit, induction_seqs,
        permutations, seed, batch_size, truncate, conllu_path, select_path, causal, causal_texts, formats, dpi, width,
        quiet, as_json, device, dtype, attention, memory_budget) -> None:
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
    for i, t in enumerate(targets):
        if not t.strip():
            fail(f"--target {i + 1} is empty; give the decoder's text")
    if targets and len(targets) != len(texts or REPORT_SENTENCES):
        fail(f"--target: {len(targets)} targets for {len(texts or REPORT_SENTENCES)} sentences; give one --target per "
             "--text, in the same order")
    check_out(out_dir, force)
    corpus, probe_sets, corpus_lines = _read_inputs(corpus_path, coref_path, limit)
    treebanks = _read_treebanks(conllu_path, select_path)
    settings = RunSettings(
        corpus="built-in" if corpus_path is None else str(corpus_path),
        coref=f"built-in ({', '.join(_COREF_SETS)})" if coref_path is None else str(coref_path),
        texts=tuple(texts) or REPORT_SENTENCES, level=level, limit=limit, induction_sequences=induction_seqs,
        permutations=permutations, seed=seed, batch_size=batch_size, device=device, dtype=dtype, truncate=truncate,
        attention=attention, memory_budget=memory_budget, targets=tuple(targets), generate=generate,
        conllu=conllu_path, select_on=select_path, causal=causal, causal_texts=causal_texts)
    world = join_run(device)

    # Ctrl-C stops the run (exit 130, the previous --out untouched) even when it lands in a finaliser.
    with Interrupts() as interrupts:
        sections, records = [], []
        for name in names:
            t0 = time.perf_counter()
            lm = load_or_fail(name, device, dtype)
            load_seconds = time.perf_counter() - t0
            say(f"{lm.name}: loaded from {lm.source} ({load_seconds:.1f} s)", quiet=quiet)
            too_long_or_fail(lm, corpus_lines, truncate=truncate)
            try:
                analysis = analyse_model(lm, corpus, probe_sets, settings, load_seconds=load_seconds, progress=not quiet,
                                         log=None if quiet else lambda line: click.echo(line, err=True),
                                         world=world, **treebanks)
            except (TypeError, ValueError, RuntimeError) as exc:
                fail(f"{name}: {exc}")
            sections.append(model_section(analysis))
            records.append(analysis.to_dict())
            del lm  # one model in memory at a time
            interrupts.check()
        if not world.is_main:  # every process of a torchrun run holds the same analyses; rank 0 writes the report
            return

        from headscope.probe.types import json_safe
        from headscope.reports.html import build_report

        t0 = time.perf_counter()
        the_versions = versions()
        # texts and targets are listed in run.json only; generate, conllu and select_on are recorded only when
        # given: a run without them records what it always did
        settings_dict = {k: v for k, v in asdict(settings).items()
                         if k not in ("texts", "targets") and not (k == "generate" and not v)
                         and not (k in _SYNTAX_SETTINGS and v is None)}
        report = build_report(sections, settings=settings_dict, versions=the_versions, dpi=dpi, formats=formats,
                              width=width)
        interrupts.check()
        seconds_report = time.perf_counter() - t0
        passed = all(r["verified"] for r in records)
        run_record = {
            "headscope": the_versions["headscope"],
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "out": str(out_dir),
            "passed": passed,
            "settings": {**settings_dict, "texts": list(settings.texts),
                         **({"targets": list(settings.targets)} if settings.targets else {})},
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
            write_atomic(out_dir, fill, force=force, check=interrupts.check)
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
