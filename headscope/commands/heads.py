"""`headscope heads`: what every head does over a corpus, as one tidy table (`headscope.heads`)."""

from __future__ import annotations

import click

from ..common import internals as hs_
from ..common.corpus import corpus_or_fail, too_long_or_fail
from ..common.exits import refusals
from ..common.loading import inputs_or_fail, load_or_fail
from ..common.options import options, top
from ..common.outputs import attention_note, echo_json, write_table
from ..common.runs import join_run
from ..common.verification import finish, verify_step

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
    from headscope import checked_heads

    corpus = corpus_or_fail(corpus_path, limit, stream=True)
    texts, total, source = corpus.texts, corpus.total, corpus.source
    world = join_run(placement.device)
    if images:
        inputs_or_fail([model_name], images=True)
        texts, source = None, "--image"  # a vision model scores its heads on the images (with the vision metrics)
    lm = load_or_fail(model_name, placement)

    def check(reader) -> dict:  # on the model that reads the input: a two-tower model's tower
        if corpus.path is not None and not images:  # a text too long for the model is named by its file and line
            too_long_or_fail(reader, corpus.numbered(), truncate=truncate)
        return verify_step(reader, enabled=not no_verify, images=list(images) or None)

    with refusals(model_name, RuntimeError):
        scores, verification = checked_heads(
            lm, texts, images=list(images) or None, check=check, level=level, include_special=include_special,
            batch_size=batch_size, induction_sequences=induction_seqs, induction_length=induction_length, seed=seed,
            truncate=truncate, progress=not quiet, total=total, source=source, attention=attention,
            budget=memory_budget, world=world)
    if not world.is_main:  # every process of a torchrun run holds the merged scores; rank 0 writes them
        return
    _report(scores, k, source, out_path, as_json, verification)


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
    what = hs_.counted(scores.n_texts, "image" if scores.images else "text")
    click.echo(f"{scores.model}: {hs_.counted(scores.n_layers, 'layer')} × {hs_.counted(scores.n_heads, 'head')}, "
               f"{what} from {source}")
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
    for m in hs_.METRICS:
        top = scores.top(m, k)
        n = int(scores.table.loc[scores.table["metric"] == m, "n"].iloc[0])
        cells = "   ".join(f"{hs_.head_name(r.layer, r.head)} {r.value:.3f}" for r in top.itertuples()) or "n/a"
        click.echo(f"{m:<19} {n:>7}  {cells}")
    if cross := scores.meta.get("cross_attention"):  # a cross-attention reader's cross layers, over the image keys
        rows = sorted(cross, key=lambda r: r["image_entropy"])[:k]
        click.echo(f"cross-attention heads over the image keys ({hs_.counted(rows[0]['n'], 'text row')} that read an "
                   f"image; lowest image entropy first): " + "   ".join(
                       f"{r['head_name']} entropy {r['image_entropy']:.3f} max {r['max_weight']:.3f}" for r in rows))
    click.echo(f"roles (a head's score >= the threshold; {len(scores.roles)} in all):" if len(scores.roles)
               else "roles: no head reaches a threshold")
    for (role, metric), rows in scores.roles.groupby(["role", "metric"], sort=False):
        shown = ", ".join(f"{hs_.head_name(r.layer, r.head)} {r.value:.3f}" for r in rows.head(5).itertuples())
        more = f" (+{len(rows) - 5} more)" if len(rows) > 5 else ""
        click.echo(f"  {role} ({metric} >= {rows['threshold'].iloc[0]:g}): {len(rows)} — {shown}{more}")
    if out_path:
        click.echo(f"wrote {hs_.counted(len(scores.table), 'row')} to {out_path}")
