"""`headscope run`: the main job — verify, score every head, probe coreference, write a report.

For each `--model`: verification (`probe.verify`), head scores over the corpus
(`headscope.commands.heads.run_heads`), the coreference probe (`headscope.commands.coref`), and the
attention of the report sentences. Then one report for all models, side by side:
`DIR/index.html`, `DIR/figures/*.png`, `DIR/*.csv` and `DIR/run.json`.

Writing is atomic: everything goes into a temporary folder beside DIR, which is renamed to DIR
at the end, so an interrupted run leaves no half report. An existing DIR is replaced only with
`--force` (the old one is moved aside, the new one moved in, then the old one deleted).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import click

from ..common import fail, load_or_fail, model_options

__all__ = ["cli", "REPORT_SENTENCES", "RunSettings", "analyse_model", "corpus_stats", "write_atomic"]

# The sentences of the explorer and the attention figures: the it -> animal sentence, its "too
# wide" twin (where "it" is the street), and the textbook 我爱北京天安门.
REPORT_SENTENCES = (
    "The animal didn't cross the street because it was too tired.",
    "The animal didn't cross the street because it was too wide.",
    "我爱北京天安门",
)
_COREF_SETS = ("agreement", "winograd")


@dataclass(frozen=True)
class RunSettings:
    """What a run did, as recorded in run.json and the report."""

    corpus: str  # "built-in" or a path
    coref: str  # "built-in (agreement, winograd)" or a path
    texts: tuple[str, ...]
    level: str = "word"
    include_special: bool = True
    limit: int | None = None
    induction_sequences: int = 20
    permutations: int = 10_000
    folds: int = 5
    seed: int = 0
    batch_size: int = 8
    device: str = "cpu"
    dtype: str = "float32"
    truncate: bool = False


@dataclass
class _Stage:
    """Timing of one model's stages, in seconds."""

    seconds: dict = field(default_factory=dict)

    def run(self, name: str, fn, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.seconds[name] = round(time.perf_counter() - t0, 3)


def _say(message: str, quiet: bool) -> None:
    if not quiet:
        click.echo(message, err=True)


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


def _check_out(out: Path, force: bool) -> None:
    if out.exists() and not force:
        fail(f"--out {out} already exists; pass --force to replace it, or choose another folder")
    if out.exists() and not out.is_dir():
        fail(f"--out {out} exists and is not a folder; remove it or choose another name")


# ---------------------------------------------------------------- one model


def analyse_model(lm, texts: Sequence[str], probe_sets: Sequence[tuple[str, list]], settings: RunSettings,
                  *, load_seconds: float = 0.0, quiet: bool = True):
    """Verification, head scores, coreference probe and report maps for one loaded model.

    Returns `(ModelSection, record)`: the report's view and the run.json entry.
    """
    from headscope.probe import extract
    from headscope.probe.adapters import UnsupportedArchitecture, UnsupportedFeature
    from headscope.probe.verify import verify
    from headscope.reports.html import ModelSection

    from .heads import run_heads

    stage = _Stage()
    stage.seconds["load"] = round(load_seconds, 3)
    notes: list[str] = []
    try:
        verification = stage.run("verify", verify, lm, truncate=settings.truncate)
        _say(f"{lm.name}: {verification.summary()} ({stage.seconds['verify']:.1f} s)", quiet)
    except (UnsupportedArchitecture, UnsupportedFeature) as exc:
        verification = None
        notes.append(f"verification could not run: {exc}")
        _say(f"{lm.name}: verification could not run: {exc}", quiet)

    scores = stage.run("heads", run_heads, lm, texts, level=settings.level, include_special=settings.include_special,
                       batch_size=settings.batch_size, induction_sequences=settings.induction_sequences,
                       seed=settings.seed, truncate=settings.truncate, progress=not quiet, total=len(texts))
    scores.meta["corpus"] = settings.corpus
    _say(f"{lm.name}: head scores over {scores.n_texts} texts, {len(scores.roles)} roles "
         f"({stage.seconds['heads']:.1f} s)", quiet)

    probes = stage.run("coref", _run_probes, lm, probe_sets, settings)
    _say(f"{lm.name}: coreference probe ({stage.seconds['coref']:.1f} s)", quiet)
    for p in probes:
        _say(f"  {p.task}: {p.verdict}", quiet)

    maps = stage.run("sentences", extract, lm, list(settings.texts), level="token", truncate=settings.truncate)
    corpus = corpus_stats(lm.tokenizer, [("heads corpus", settings.corpus, texts),
                                          *[(f"probe: {task}", settings.coref, [e.text for e in exs])
                                            for task, exs in probe_sets],
                                          ("report sentences", "--text" if settings.texts != REPORT_SENTENCES
                                           else "built-in", list(settings.texts))])
    info = _model_info(lm, verification, stage.seconds)
    section = ModelSection(model=lm.name, maps=tuple(maps), word_maps=_word_maps(maps), verification=verification,
                           scores=scores, probes=tuple(probes), corpus=corpus, info=info, notes=tuple(notes))
    record = {
        "model": lm.name, "info": info,
        "verification": None if verification is None else verification.to_dict(),
        "verified": verification is not None and verification.passed,
        "heads": scores.to_dict(table=False),
        "probes": [{k: v for k, v in p.to_dict().items() if k != "heads"} for p in probes],
        "notes": notes, "seconds": dict(stage.seconds),
    }
    return section, record


def _word_maps(maps) -> tuple:
    """The report sentences at word level, when every token knows its word (the report draws both levels)."""
    from headscope.probe import to_word_level

    if all(len(m.word_index) == len(m) for m in maps):
        return tuple(to_word_level(m) for m in maps)
    return ()


def _run_probes(lm, probe_sets, settings: RunSettings) -> list:
    """One result per set, and — with several sets — one for all of them together (shown first)."""
    from headscope.analyses.coref import concat_scores, score_probe

    from .coref import extract_scores

    kw = dict(folds=settings.folds, n_perm=settings.permutations, seed=settings.seed, noun="pronouns")
    data = [extract_scores(lm, exs, level=settings.level, batch_size=settings.batch_size) for _, exs in probe_sets]
    parts = [score_probe(d, task=task, **kw) for d, (task, _) in zip(data, probe_sets, strict=True)]
    if len(parts) < 2:
        return parts
    return [score_probe(concat_scores(data), task="coref-builtin", **kw), *parts]


def corpus_stats(tokenizer, corpora: Sequence[tuple[str, str, Sequence[str]]]):
    """One row per corpus: texts, words, tokens (with special tokens), tokens per word, longest text.

    `tokenizer` is any Hugging Face tokenizer (callable on a list of texts).
    """
    import pandas as pd

    from headscope.probe.words import word_spans

    rows = []
    for name, source, texts in corpora:
        texts = list(texts)
        tokens = [len(ids) for ids in tokenizer(texts)["input_ids"]] if texts else []
        words = [len(word_spans(t)) for t in texts]
        rows.append({
            "corpus": name, "source": source, "texts": len(texts), "words": sum(words), "tokens": sum(tokens),
            "tokens_per_word": sum(tokens) / max(sum(words), 1),
            "mean_tokens": sum(tokens) / max(len(texts), 1), "max_tokens": max(tokens, default=0),
        })
    return pd.DataFrame(rows)


def _model_info(lm, verification, seconds: dict) -> dict:
    cfg = lm.config
    n_params = sum(p.numel() for p in lm.model.parameters())
    return {
        "source": lm.source, "architecture": getattr(cfg, "model_type", "unknown"),
        "family": getattr(verification, "family", None), "causal": lm.is_causal,
        "layers": getattr(cfg, "num_hidden_layers", None), "heads": getattr(cfg, "num_attention_heads", None),
        "kv_heads": getattr(cfg, "num_key_value_heads", None) or getattr(cfg, "num_attention_heads", None),
        "parameters": n_params, "context": lm.max_length, "dtype": str(lm.dtype).replace("torch.", ""),
        "device": str(lm.device), "seconds": dict(seconds),
    }


# ---------------------------------------------------------------- versions, writing


def versions() -> dict:
    """Versions of everything that shapes the numbers."""
    from importlib import metadata

    from .. import __version__

    out = {"headscope": __version__, "python": platform.python_version(), "platform": platform.platform()}
    for dist in ("torch", "transformers", "numpy", "pandas", "matplotlib", "seaborn", "jinja2", "gguf"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


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
@click.option("--model", "models", multiple=True, default=("minilm",), show_default=True,
              help="Packaged name, folder or hub id; repeat (or separate with commas) to compare models side by side.")
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
@click.option("--quiet", is_flag=True, help="No progress on stderr.")
@model_options
def cli(models, corpus_path, coref_path, texts, out_dir, force, level, limit, induction_seqs, permutations, seed,
        batch_size, truncate, quiet, device, dtype) -> None:
    """Verify, score every head, probe coreference and write DIR/index.html with figures, tables, run.json.

    Exits 1 when a model's attention is not verified (the report is still written and says so).
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
        _say(f"{lm.name}: loaded from {lm.source} ({load_seconds:.1f} s)", quiet)
        try:
            section, record = analyse_model(lm, corpus, probe_sets, settings, load_seconds=load_seconds, quiet=quiet)
        except (TypeError, ValueError) as exc:
            fail(f"{name}: {exc}")
        sections.append(section)
        records.append(record)
        del lm  # one model in memory at a time

    from headscope.probe.types import json_safe
    from headscope.reports.html import build_report

    t0 = time.perf_counter()
    the_versions = versions()
    settings_dict = {k: v for k, v in asdict(settings).items() if k != "texts"}
    report = build_report(sections, settings=settings_dict, versions=the_versions)
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
        "files": {"report": "index.html", "figures": [f"figures/{f.name}" for f in report.figures],
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
    click.echo(f"wrote {out_dir / 'index.html'} ({size / 1e6:.1f} MB), {len(report.figures)} figures, "
               f"{len(report.tables)} tables, run.json in {time.perf_counter() - t_start:.0f} s")
    if not passed:
        bad = ", ".join(r["model"] for r in records if not r["verified"])
        click.echo(f"headscope: attention NOT verified for {bad}; see the report's verification section", err=True)
        sys.exit(1)
