"""`headscope retrieval`: retrieval heads (Wu et al. 2024) on needle-in-a-haystack prompts, the causal check
against random heads, and a per-KV-head cache plan in DuoAttention's pattern format."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..common import internals as hs_
from ..common.corpus import corpus_or_fail
from ..common.exits import fail
from ..common.loading import load_or_fail
from ..common.options import options, random_sets
from ..common.outputs import claim_output, emit, say, writable_or_fail

__all__ = ["cli"]


def _pattern_folder(ctx, param, value: Path | None) -> Path | None:
    """--pattern DIR: a new folder, checked before any compute (an existing one is never replaced)."""
    if value is None:
        return None
    if value.exists() or value.is_symlink():
        fail(f"--pattern {value} exists; give a new folder name (headscope writes full_attention_heads.tsv and "
             "config.json into a folder of its own)")
    writable_or_fail(value, "--pattern")
    claim_output(value, "--pattern", folder=True)
    return value


def _phrasing(text: str):
    from headscope import Phrasing

    statement, bar, question = text.partition("|")
    if not bar or "{key}" not in statement or not question.strip() or "|" in question:
        fail(f"--phrasing {text!r}: give the statement with {{key}}, one '|', then the question, e.g. "
             "'The code is {key}.|The code is'")
    try:
        statement.format(key="1")
    except (KeyError, IndexError, ValueError):
        fail(f"--phrasing {text!r}: the statement may hold only {{key}} in braces")
    return Phrasing(statement.strip(), question.strip())


def _write_pattern(result, folder: Path) -> None:

    def fill(tmp: Path) -> None:
        (tmp / "full_attention_heads.tsv").write_text(result.plan.pattern_table(), encoding="utf-8")
        (tmp / "config.json").write_text(json.dumps(result.plan.pattern_config(), indent=2) + "\n", encoding="utf-8")
        if result.gates is not None:  # the learned gates as DuoAttention's training writes them, 1 where not planned
            (tmp / "gates.tsv").write_text(result.gate_table(), encoding="utf-8")

    try:
        hs_.write_folder(folder, fill)
    except (OSError, FileExistsError) as exc:
        fail(f"could not write --pattern {folder}: {exc}")


@click.command()
@options("model", "corpus")
@click.option("--needles", "n_needles", type=click.IntRange(min=2), default=16, show_default=True,
              help="Needle prompts; even ones select heads, odd ones are held out.")
@click.option("--length", "lengths", type=click.IntRange(min=16), multiple=True, default=(1200,), show_default=True,
              help="Prompt length in tokens (repeat for a grid).")
@click.option("--depth", "depths", type=click.FloatRange(0, 1), multiple=True,
              default=(0.1, 0.3, 0.5, 0.7, 0.9), show_default=True,
              help="Where the needle sits, as a fraction of the haystack (repeat for a grid).")
@click.option("--phrasing", "phrasings", multiple=True, metavar="'STATEMENT|QUESTION'",
              help="A needle phrasing of your own (repeat for several): the statement with {key} where the key "
                   "goes, '|', and the question the answer follows, e.g. 'The code is {key}.|The code is'. "
                   "Default: four built-in passkey phrasings.")
@click.option("--top-share", "top", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.05,
              show_default=True, help="Share of the heads, best by retrieval score, masked in the causal check.")
@options(random_sets(10))
@click.option("--check/--no-check", default=True, show_default=True, help="Run the causal check.")
@click.option("--sensitivity", is_flag=True, help="Also stream each KV head alone over the held-out text.")
@click.option("--gates", "gate_steps", type=click.IntRange(min=0), default=0, show_default=True, metavar="STEPS",
              help="Also learn DuoAttention's gate per KV head: STEPS steps of its gate optimisation on the "
                   "selection needles (0: none).")
@click.option("--rank-by", "ranking", type=click.Choice(["retrieval", "sensitivity", "combined", "gate"]),
              default="retrieval", show_default=True,
              help="What orders the KV heads of the plan (combined: the mean of the retrieval and sensitivity "
                   "ranks; gate: needs --gates).")
@click.option("--scope", type=click.Choice(["prompt", "question"]), default="prompt", show_default=True,
              help="Where masks apply on a needle prompt: every token, or from the question on (each needle's "
                   "context run once by the full model and shared: much faster).")
@click.option("--curve", "curve", type=click.FloatRange(0, 1), multiple=True,
              help="Cost the plans at this fraction of full KV heads (repeat): each ranking, --random random "
                   "plans, all streaming and all full.")
@click.option("--fraction", type=click.FloatRange(0, 1), default=0.5, show_default=True,
              help="Share of the planned KV heads that keep the full cache.")
@click.option("--sink", type=click.IntRange(min=0), default=None,
              help="Streaming heads' first keys (default: DuoAttention's 128, scaled down for a context under 8k).")
@click.option("--recent", type=click.IntRange(min=1), default=None,
              help="Streaming heads' last keys (default: DuoAttention's 256, scaled down for a context under 8k).")
@click.option("--pattern", "pattern", type=click.Path(file_okay=False, path_type=Path), default=None,
              callback=_pattern_folder,
              help="Write the plan as DuoAttention reads it: a new folder with full_attention_heads.tsv "
                   "(layers × KV heads, 1 full) and config.json (sink_size, recent_size).")
@options("seed", "out", "quiet", "json", "device")
def cli(model_name, corpus_path, limit, n_needles, lengths, depths, phrasings, top, n_random, check, sensitivity,
        gate_steps, ranking, scope, curve, fraction, sink, recent, pattern, seed, out_path, quiet, as_json,
        placement) -> None:
    """Retrieval heads of a decoder on needle prompts, the causal check, and a per-head KV-cache plan.

    --corpus: the first half of its texts makes the haystacks, the second half the held-out text. --random: the
    random head sets masked for comparison in the causal check.

    --out writes the per-head table (retrieval score with counts and interval, the KV head's pooled score,
    streaming sensitivity, learned gate, full or streaming)."""
    from headscope import retrieval

    if ranking == "gate" and not gate_steps:
        fail("--rank-by gate needs --gates STEPS (the steps of DuoAttention's gate optimisation, e.g. --gates 20)")
    own = [_phrasing(p) for p in phrasings]
    texts = corpus_or_fail(corpus_path, limit).texts if corpus_path is not None else None
    lm = load_or_fail(model_name, placement)
    say(f"{lm.name}: {n_needles} needles at {', '.join(map(str, lengths))} tokens", quiet=quiet)
    try:
        result = retrieval(lm, n_needles=n_needles, lengths=lengths, depths=depths, corpus=texts, seed=seed, top=top,
                           n_random=n_random, check=check, sensitivity=sensitivity, sink=sink, recent=recent,
                           fraction=fraction, ranking=ranking, scope=scope, curve=curve, n_random_plans=n_random,
                           gate_steps=gate_steps, progress=not quiet, **({"phrasings": own} if own else {}))
    except ValueError as exc:
        fail(str(exc))
    if pattern is not None:
        _write_pattern(result, pattern)
    d = result.to_dict()
    if not emit(result, out_path, as_json=as_json, payload=d, summary=None):
        return
    sel = result.selection_correct
    click.echo(f"{lm.name}: selection needles retrieved {sum(sel)} of {len(sel)}; {d['copy_steps']} copy steps")
    if d["retrieval_note"]:
        click.echo(d["retrieval_note"])
    for row in d["top_heads"][:5]:
        lo, hi = row["interval"]
        click.echo(f"  {row['head']:<8} retrieval score {row['score']:.2f} ({row['hits']} hits, 95% CI {lo:.2f}–{hi:.2f})")
    if result.check is not None:
        click.echo(result.check.verdict)
    for line in d["curve_verdicts"]:
        click.echo(line)
    p = d["plan"]
    if d["settings"].get("gates"):
        g = d["settings"]["gates"]
        click.echo(f"gates: {g['steps']} steps, {g['tokens']:,} tokens, λ {g['l1']:g}; loss {g['loss_first']:.3g} → "
                   f"{g['loss_last']:.3g}")
    click.echo(f"plan by {p['ranking']}: {p['n_full']} of {p['n_planned']} KV heads full, the rest sink {p['sink_size']} "
               f"+ recent {p['recent_size']}")
