"""`headscope heads`: what every head does over a corpus, as one tidy table (`headscope.heads`)."""

from __future__ import annotations

import click

from ..common.corpus import corpus_or_fail, too_long_or_fail
from ..common.exits import fail, refusals
from ..common.loading import inputs_or_fail, load_or_fail
from ..common.options import options, top
from ..common.outputs import attention_note, echo_json, write_table
from ..common.runs import join_run
from ..common.verification import finish, verify_step
from headscope.probe.wording import counted

__all__ = ["cli"]


@click.command()
@options("model", "corpus", "level", "special", "batching", top(3), "induction")
@click.option("--induction-length", type=click.IntRange(min=2), default=50, show_default=True,
              help="Random tokens per half of each repeated sequence.")
@options("seed", "out", "truncate", "image", "quiet", "json", "verify", "attention",
         "device")
def cli(model_name, corpus_path, level, include_special, limit, batch_size, k, induction_seqs, induction_length,
        seed, out_path, truncate, images, quiet, as_json, placement, no_verify, attention, memory_budget) -> None:
    """Score every head over a corpus: previous/next token, self, sinks, punctuation, entropy, induction.

    With --json: settings, top heads and roles; the full table goes to --out.
    """
    from itertools import islice

    from headscope import heads
    from headscope.analyses.corpus import iter_corpus_lines
    from headscope.probe.images import for_input

    corpus = corpus_or_fail(corpus_path, limit, stream=True)
    texts, total, source = corpus.texts, corpus.total, corpus.source
    world = join_run(placement.device)
    if images:
        inputs_or_fail([model_name], images=True)
    lm = load_or_fail(model_name, placement)
    with refusals(model_name):  # a two-tower model (CLIP, SigLIP): the tower that reads the input, named by tower
        lm = for_input(lm, images=bool(images))
    if images or getattr(lm, "is_image", False):  # a vision transformer scores its heads on the images (with the vision metrics)
        scores, source = _image_scores(lm, model_name, list(images), level, include_special, batch_size), "--image"
        verification = _image_verification(lm, images, no_verify)
        _report(scores, k, source, out_path, as_json, verification)
        return
    if corpus.path is not None:  # a text too long for the model is named by its file and line
        too_long_or_fail(lm, islice(iter_corpus_lines(corpus.path), limit), truncate=truncate)
    verification = verify_step(lm, enabled=not no_verify)
    try:
        scores = heads(lm, texts, level=level, include_special=include_special, batch_size=batch_size,
                       induction_sequences=induction_seqs, induction_length=induction_length, seed=seed,
                       truncate=truncate, progress=not quiet, total=total, source=source, attention=attention,
                       budget=memory_budget, world=world)
    except (TypeError, ValueError, RuntimeError) as exc:
        fail(str(exc))
    if not world.is_main:  # every process of a torchrun run holds the merged scores; rank 0 writes them
        return
    _report(scores, k, source, out_path, as_json, verification)


def _image_scores(lm, model_name: str, images: list[str], level, include_special: bool, batch_size: int):
    from headscope.analyses.heads import score_corpus
    from headscope.probe.extract import extract
    from headscope.probe.images import require_modality

    with refusals(model_name):
        require_modality(lm, images=bool(images))
        maps = extract(lm, images=images, level=level, batch_size=batch_size)
    return score_corpus(maps, model=lm.name, level=level, include_special=include_special,
                        meta={"corpus": "--image", "causal": lm.is_causal, "induction": None})


def _image_verification(lm, images, no_verify: bool) -> dict:
    from headscope.probe.verify import verify

    if no_verify:
        return verify_step(lm, enabled=False)
    v = verify(lm, images=list(images))
    return {"passed": v.passed, "summary": v.summary(), "max_abs_err": v.max_abs_err}


def _report(scores, k, source, out_path, as_json, verification) -> None:
    if out_path:
        write_table(scores.table, out_path)
    if as_json:
        echo_json(scores.to_dict(k=k, table=False) | {"out": None if out_path is None else str(out_path),
                                                      "verification": verification})
    else:
        click.echo(verification["summary"])
        if note := attention_note(scores.meta):
            click.echo(note)
        _print(scores, k, source, out_path)
    finish(verification)


def _print(scores, k: int, source: str, out_path) -> None:
    from headscope.analyses.metrics import METRICS
    from headscope.probe.types import head_name

    what = counted(scores.n_texts, "image" if scores.images else "text")
    click.echo(f"{scores.model}: {counted(scores.n_layers, 'layer')} × {counted(scores.n_heads, 'head')}, {what} from {source}")
    click.echo(f"setting: {scores.setting}")
    ind = scores.meta.get("induction")
    if ind:
        prefix = " ".join(ind["prefix_tokens"]) or "no BOS (the tokenizer adds none)"
        click.echo(f"induction: {ind['sequences']} sequences of prefix [{prefix}] + {ind['length']} random tokens "
                   f"× 2, seed {ind['seed']}; score Σ A⊙P / Σ A (TransformerLens head_detector, 'mul'), token level")
    elif scores.meta.get("causal") and source == "--image":
        click.echo("induction / duplicate-token: not scored on images (they read repeated random token sequences; "
                   "run heads on a text corpus for them)")
    elif scores.meta.get("causal"):
        click.echo("induction / duplicate-token: skipped (--induction-seqs 0)")
    else:
        click.echo("induction / duplicate-token: not applicable to an encoder (bidirectional attention)")
    click.echo(f"{'metric':<19} {'n':>7}  top {k} heads (head value)")
    for m in METRICS:
        top = scores.top(m, k)
        n = int(scores.table.loc[scores.table["metric"] == m, "n"].iloc[0])
        cells = "   ".join(f"{head_name(r.layer, r.head)} {r.value:.3f}" for r in top.itertuples()) or "n/a"
        click.echo(f"{m:<19} {n:>7}  {cells}")
    click.echo(f"roles (a head's score >= the threshold; {len(scores.roles)} in all):" if len(scores.roles)
               else "roles: no head reaches a threshold")
    for (role, metric), rows in scores.roles.groupby(["role", "metric"], sort=False):
        shown = ", ".join(f"{head_name(r.layer, r.head)} {r.value:.3f}" for r in rows.head(5).itertuples())
        more = f" (+{len(rows) - 5} more)" if len(rows) > 5 else ""
        click.echo(f"  {role} ({metric} >= {rows['threshold'].iloc[0]:g}): {len(rows)} — {shown}{more}")
    if out_path:
        click.echo(f"wrote {counted(len(scores.table), 'row')} to {out_path}")
