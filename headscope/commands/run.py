"""`headscope run`: the main job — verify, score every head, probe coreference, write a report.

For each `--model`, `headscope.analyse_model` verifies the attention, scores every head over the
corpus, runs the coreference probe and extracts the report sentences (a `ModelAnalysis`). Then
`headscope.report` writes one report for all models, side by side: `DIR/index.html`,
`DIR/figures/*.png`, `DIR/*.csv` and `DIR/run.json`, atomically (`reports.folder`): an interrupted
run leaves no half report, and an existing DIR is replaced only with `--force`, and only when
headscope wrote it. The working directory and its ancestors are never replaced.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict
from pathlib import Path

import click

from ..common import internals as hs_
from ..common.corpus import corpus_or_fail, too_long_or_fail
from ..common.exits import fail
from ..common.interrupts import Interrupts
from ..common.loading import inputs_or_fail, load_or_fail, models_or_fail
from ..common.options import options, parsed, renamed
from ..common.outputs import check_report_dir, echo_json, forced, say
from ..common.runs import join_run

__all__ = ["cli", "shown_settings"]

_COREF_SETS = ("agreement", "winograd")
_SYNTAX_SETTINGS = ("conllu", "select_on")  # recorded only when given
_SINKS_SETTINGS = ("sinks", "streaming_tokens", "streaming_window")  # recorded only with --sinks
_MECHANISMS_SETTINGS = ("mechanisms", "mechanisms_pairs")  # recorded only with --mechanisms
_LONG_SETTINGS = ("long_context",)  # recorded only with --long-context
_PLACEMENT_SETTINGS = ("max_memory", "offload_folder")  # recorded only when given


def shown_settings(settings) -> dict:
    """The settings the page shows and run.json records. Texts and targets are listed in run.json only;
    generate, conllu, select_on, the sinks, the mechanisms and the placement (--max-memory, --offload-folder) settings
    only when given: a run without them records what it always did."""
    return {k: v for k, v in asdict(settings).items()
            if k not in ("texts", "targets") and not (k == "generate" and not v)
            and not (k in _SYNTAX_SETTINGS + _PLACEMENT_SETTINGS and v is None) and not (k in _SINKS_SETTINGS and not settings.sinks)
            and not (k in _MECHANISMS_SETTINGS and not settings.mechanisms)
            and not (k in _LONG_SETTINGS and not settings.long_context)}


# ---------------------------------------------------------------- inputs


def _read_inputs(corpus_path: str | None, coref_path: str | None, limit: int | None):
    """Corpus texts and probe sets, read (and checked) before any model is loaded."""
    from headscope import builtin_set, read_probe_file

    corpus = corpus_or_fail(corpus_path, limit)
    texts, lines = corpus.texts, corpus.lines
    try:
        if coref_path is None:
            sets = [(hs_.BUILTIN_SETS[name][1], builtin_set(name)) for name in _COREF_SETS]
        else:
            if not Path(coref_path).is_file():
                fail(f"--coref {coref_path}: no such file; give a probe JSONL or a GAP .tsv, or leave --coref out "
                     "for the built-in sets")
            sets = [(Path(coref_path).stem.replace("_", "-"), read_probe_file(coref_path))]
    except (hs_.ProbeDataError, OSError, UnicodeError, ValueError) as exc:
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
    formats = tuple(dict.fromkeys(f.strip().lower() for f in value.split(",") if f.strip()))
    bad = [f for f in formats if f not in hs_.FIGURE_FORMATS]
    if bad or not formats:
        fail(f"--format {value}: choose one or more of {', '.join(hs_.FIGURE_FORMATS)}, comma-separated (such as "
             "png,pdf)")
    return formats


def _parse_width(value: str) -> float:
    return hs_.parse_width(value)  # looked up when the option is given: matplotlib is slow to load


@click.command()
@options("models", "corpus")
@click.option("--coref", "coref_path", type=click.Path(dir_okay=False), default=None,
              help="Coreference probe data (JSONL or GAP .tsv). Default: the built-in agreement and Winograd sets.")
@options("texts")
@click.option("--generate", "generate", type=click.IntRange(min=0), default=0, show_default=True,
              help="Decoders: generate N tokens (greedy) after each --text; the explorer steps through them.")
@options("report")
@renamed("--out", "--report", "report_dir", value="DIR", callback=check_report_dir,
         type=click.Path(file_okay=False, path_type=Path))
@options("level", "induction", "permutations", "seed", "batching", "truncate", "treebank")
@click.option("--ablation/--no-ablation", default=None,
              help="Ablation evidence: ablate every head alone, gradient importance, the induction ablation and the "
                   "probes' cloze checks. Default: on for encoders (seconds), off for decoders (minutes on a CPU).")
@options("ablation_texts")
# The names before 0.2 ("causal" now means only a decoder's mask), accepted for one release with a warning.
@click.option("--causal/--no-causal", "old_ablation", default=None, hidden=True, deprecated="use --ablation/--no-ablation")
@click.option("--causal-texts", "old_ablation_texts", type=click.IntRange(min=1), default=None, hidden=True,
              deprecated="use --ablation-texts")
@click.option("--sinks", "sinks", is_flag=True,
              help="Add a Sinks section: sink rate, sink heads with value norms and dormant calls (mean ablation), "
                   "massive activations, and for decoders the StreamingLLM test on the shared UD English EWT text.")
@click.option("--mechanisms", "mechanisms", is_flag=True,
              help="Add a Mechanisms section: direct logit attribution of each report sentence's next token and "
                   "head-output patching of 8 built-in ioi pairs (decoders), and the heads' composition graph.")
@click.option("--long-context", "long_context", is_flag=True,
              help="Add a Long context section (decoders): retrieval heads on needle prompts, the causal check and "
                   "the KV-cache plans' cost curve (as headscope retrieval --scope question --curve; minutes).")
@click.option("--format", "formats", default="png", show_default=True, callback=_check_formats,
              help="Figure files to write, comma-separated: png, svg, pdf (fonts embedded). The page inlines PNG.")
@click.option("--dpi", type=click.IntRange(min=10, max=1200), default=100, show_default=True,
              help="Resolution of PNG figures (and of images inside vector ones).")
@click.option("--width", default=None, callback=parsed(_parse_width, "--width"),
              help="Scale every figure file to this width, keeping its aspect: 3.5in, 8.9cm, 89mm or 252pt.")
@options("image", "quiet", "json", "attention", "device")
def cli(models, corpus_path, limit, coref_path, texts, targets, generate, report_dir, level, induction_seqs,
        permutations, seed, batch_size, truncate, conllu_path, select_path, ablation, ablation_texts, old_ablation,
        old_ablation_texts, sinks, mechanisms, long_context, formats, dpi, width, images,
        quiet, as_json, placement, attention, memory_budget) -> None:
    """Verify, score every head, probe coreference and write DIR/index.html with figures, tables, run.json.

    --report DIR is the report's folder (`--out DIR` before this release, kept one release); --text gives the
    sentences of the explorer and the attention figures (default: the it→animal sentence, its 'too wide' twin,
    我爱北京天安门); --conllu adds a Syntax section (heads that follow dependency relations, trees, head
    clusters). --json prints the run.json record. Exits 1 when a model's attention is not verified (the report
    is still written and says so).
    """
    import matplotlib

    from headscope import REPORT_SENTENCES, RunSettings, analyse_models, report

    matplotlib.use("Agg")  # the CLI never shows a window; notebooks keep their own backend
    t_start = time.perf_counter()
    names = [n.strip() for m in models for n in m.split(",") if n.strip()]
    if not names:
        fail("--model: give at least one model name")
    if len(set(names)) != len(names):
        fail(f"--model: a model is named twice in {names}")
    models_or_fail(names)
    inputs_or_fail(names, images=bool(images))  # every model, before the first loads
    for i, t in enumerate(texts):
        if not t.strip():
            fail(f"--text {i + 1} is empty; give a sentence")
    for i, t in enumerate(targets):
        if not t.strip():
            fail(f"--target {i + 1} is empty; give the decoder's text")
    if targets and len(targets) != len(texts or REPORT_SENTENCES):
        fail(f"--target: {len(targets)} targets for {len(texts or REPORT_SENTENCES)} sentences; give one --target per "
             "--text, in the same order")
    if width is not None:
        try:
            hs_.check_width(width, dpi)
        except ValueError as exc:
            fail(f"--width: {exc}")
    if report_dir is None:
        fail("give --report DIR: the folder the report is written into")
    out_dir, force = report_dir, forced()
    corpus, probe_sets, corpus_lines = _read_inputs(corpus_path, coref_path, limit)
    treebanks = _read_treebanks(conllu_path, select_path)
    settings = RunSettings(
        corpus="built-in" if corpus_path is None else str(corpus_path),
        coref=f"built-in ({', '.join(_COREF_SETS)})" if coref_path is None else str(coref_path),
        texts=tuple(texts) or REPORT_SENTENCES, level=level, limit=limit, induction_sequences=induction_seqs,
        permutations=permutations, seed=seed, batch_size=batch_size, device=placement.device, dtype=placement.dtype,
        max_memory=placement.max_memory,
        offload_folder=None if placement.offload_folder is None else str(placement.offload_folder), truncate=truncate,
        attention=attention, memory_budget=memory_budget, targets=tuple(targets), generate=generate,
        conllu=conllu_path, select_on=select_path, ablation=old_ablation if ablation is None else ablation,
        ablation_texts=old_ablation_texts if old_ablation_texts is not None else ablation_texts, sinks=sinks,
        mechanisms=mechanisms, long_context=long_context, images=tuple(images))
    world = join_run(placement.device)

    # Ctrl-C stops the run (exit 130, the previous --out untouched) even when it lands in a finaliser. The
    # figures' worker processes start now (on the process that writes the report), their imports beside the
    # model's loading and the analyses, so that the report draws on every core at once.
    with Interrupts() as interrupts, hs_.DrawingPool(None if world.is_main else 1) as pool:
        analyses = []
        for name in names:
            t0 = time.perf_counter()
            say(f"{name}: loading ...", quiet=quiet)
            lm = load_or_fail(name, placement)
            load_seconds = time.perf_counter() - t0
            say(f"{lm.name}: loaded from {lm.source} ({load_seconds:.1f} s)", quiet=quiet)
            try:  # a two-tower model (CLIP, SigLIP): its image tower for --image, its text tower for --text (or no image)
                for analysis in analyse_models(lm, corpus, probe_sets, settings, sentences_given=bool(texts),
                                               check=lambda part: too_long_or_fail(part, corpus_lines, truncate=truncate),
                                               load_seconds=load_seconds, progress=not quiet,
                                               log=None if quiet else lambda line: click.echo(line, err=True),
                                               world=world, **treebanks):
                    analyses.append(analysis)
            except (TypeError, ValueError, RuntimeError) as exc:
                fail(f"{name}: {exc}")
            del lm  # one model in memory at a time
            interrupts.check()
        if not world.is_main:  # every process of a torchrun run holds the same analyses; rank 0 writes the report
            return

        shown = shown_settings(settings)
        recorded = {**shown, "texts": list(settings.texts), **({"targets": list(settings.targets)} if settings.targets else {})}
        say(f"drawing the report's figures into {out_dir} ...", quiet=quiet)
        try:
            written = report(analyses, out_dir, force=force, settings=hs_.settings_display(shown),
                             record={"settings": recorded},
                             formats=formats, dpi=dpi, width=width, check=interrupts.check,
                             committed=lambda: interrupts.commit(str(out_dir)), started=t_start, pool=pool)
        except hs_.ReportFolderError as exc:
            fail(str(exc))
        except OSError as exc:
            fail(f"could not write the report to {out_dir}: {exc}")
    wrote = (f"wrote {out_dir / 'index.html'} ({written.size / 1e6:.1f} MB), {written.n_figures} figures, "
             f"{len(written.tables)} tables, run.json in {time.perf_counter() - t_start:.0f} s")
    if as_json:
        say(wrote, quiet=quiet)
        echo_json(written.record)
    else:
        click.echo(wrote)
    if not written.record["passed"]:
        bad = ", ".join(a.model for a in analyses if not a.verified)
        click.echo(f"headscope: attention NOT verified for {bad}; see the report's verification section", err=True)
        sys.exit(1)
