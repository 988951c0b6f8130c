"""`headscope coref`: which heads let a pronoun look at the word it refers to, with honest statistics.

Also home of the thin runner shared with `headscope probe`: the only place where the probe
analyses meet a model (tokenizer for the context limit, `probe.iter_extract` for attention).
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import click

from ..common import echo_json, fail, finish, load_or_fail, model_options, verify_option, verify_step

__all__ = ["cli", "run_probe", "extract_scores", "run_command", "probe_options", "TOO_LONG"]

TOO_LONG = "longer than the model's context"


def extract_scores(lm, examples: Sequence, *, level: str = "word", head_word: bool = False, batch_size: int = 8,
                   crop: bool = True, progress: bool = False):
    """Attention to each candidate for `examples` on model `lm` -> `analyses.coref.ProbeScores`.

    Texts are deduplicated and run shortest first (little padding); an example that cannot be
    scored is counted in `excluded` by reason: longer than the context, a candidate after the
    source for a decoder, a word cut from the map. The result keeps the input order.

    `crop` (decoders only): run each text only up to the end of the source's word. A causal
    model's attention from the source does not depend on anything after it, so this changes no
    number (as long as the tokenizer does not merge a token across that word boundary, which
    byte-level BPE never does) and saves the cost of the rest of a long paragraph.
    """
    import torch

    from headscope.probe import iter_extract

    from headscope.analyses.coref import CAUSAL_REASON, collect_scores

    excluded: Counter = Counter()
    limit = lm.max_length
    keep = []
    for ex in examples:
        if lm.is_causal and not all(ex.preceding()):
            excluded[CAUSAL_REASON] += 1
        else:
            keep.append(ex)
    model_text = {id(ex): _cropped(ex) if crop and lm.is_causal else ex.text for ex in keep}
    texts = list(dict.fromkeys(model_text[id(ex)] for ex in keep))
    length = {t: len(lm.tokenizer(t)["input_ids"]) for t in texts}
    too_long = {t for t in texts if length[t] > limit}
    if too_long:
        reason = f"{TOO_LONG} ({limit} tokens)"
        excluded[reason] = sum(model_text[id(ex)] in too_long for ex in keep)
        keep = [ex for ex in keep if model_text[id(ex)] not in too_long]
        texts = [t for t in texts if t not in too_long]
    texts.sort(key=lambda t: length[t])
    by_text: dict[str, list] = {}
    for ex in keep:
        by_text.setdefault(model_text[id(ex)], []).append(ex)

    def pairs():
        maps = iter_extract(lm, texts, level=level, batch_size=batch_size, window=2)
        if progress:
            from tqdm import tqdm

            maps = tqdm(maps, total=len(texts), desc=f"{lm.name} attention", unit="text", file=sys.stderr)
        for text, amap in zip(texts, maps):
            for ex in by_text[text]:
                yield ex, amap

    data = collect_scores(pairs(), head_word=head_word, excluded=dict(excluded))
    if not len(data):  # nothing scored: keep the model's real heads so tables still name them
        n_layers, n_heads = lm.config.num_hidden_layers, lm.config.num_attention_heads
        return replace(data, scores=torch.zeros(0, n_layers, n_heads, 2), layer_ids=tuple(range(n_layers)),
                       head_ids=tuple(range(n_heads)), model=lm.name, level=level, causal=lm.is_causal)
    position = {id(ex): i for i, ex in enumerate(examples)}
    order = sorted(range(len(data)), key=lambda i: position[id(data.examples[i])])
    return replace(data, examples=tuple(data.examples[i] for i in order), scores=data.scores[order],
                   model=data.model or lm.name, level=level)


def _cropped(ex) -> str:
    """The text up to the end of the word that holds the end of the source."""
    from headscope.probe import word_spans

    end = ex.source_span[1]
    return ex.text[: max([end] + [b for a, b in word_spans(ex.text) if a < end <= b])]


def run_probe(lm, examples: Sequence, *, task: str, level: str = "word", head_word: bool = False,
              heldout: Sequence | None = None, folds: int = 5, n_perm: int = 10_000, seed: int = 0,
              batch_size: int = 8, noun: str = "pronouns", progress: bool = False):
    """Score a probe set on a model: extraction, then `analyses.coref.score_probe`.

    With `heldout` (a second list of examples) the head is chosen on `examples` and scored there.
    """
    from headscope.analyses.coref import score_probe

    data = extract_scores(lm, examples, level=level, head_word=head_word, batch_size=batch_size, progress=progress)
    test = None
    if heldout is not None:
        test = extract_scores(lm, heldout, level=level, head_word=head_word, batch_size=batch_size, progress=progress)
    return score_probe(data, task=task, heldout=test, folds=folds, n_perm=n_perm, seed=seed, noun=noun)


# --------------------------------------------------------------------------------------------
# The commands


def probe_options(fn):
    """The options `coref` and `probe` share (after `--data`, before `--device`/`--dtype`)."""
    fn = verify_option(model_options(fn))
    for opt in reversed([
        click.option("--model", "model_name", default="minilm", show_default=True, help="Packaged name, folder or hub id."),
        click.option("--heldout", "heldout_path", default=None,
                     help="Also choose the head on all of --data and score it on this file "
                          "(e.g. GAP development -> validation); the k-fold result on --data is kept under 'sets'."),
        click.option("--level", type=click.Choice(["word", "token"]), default="word", show_default=True,
                     help="Attention between words (pieces summed/averaged) or raw tokens."),
        click.option("--head-word", is_flag=True, help="Score a multi-word name by its last word only (default: sum over it)."),
        click.option("--folds", type=click.IntRange(2, None), default=5, show_default=True, help="k of the group k-fold."),
        click.option("--permutations", "n_perm", type=click.IntRange(100, None), default=10_000, show_default=True,
                     help="Monte Carlo permutations per test."),
        click.option("--seed", type=int, default=0, show_default=True, help="Seed of the folds and permutations."),
        click.option("--limit", type=click.IntRange(1, None), default=None,
                     help="Use only the first N examples of each file (a subset: say so when you report)."),
        click.option("--batch-size", type=click.IntRange(1, None), default=8, show_default=True),
        click.option("--head", "show_head", default=None, metavar="LAYER,HEAD",
                     help="Also show this head's per-example attention to each candidate (model indices, from 0)."),
        click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Write the per-head table(s) to this CSV."),
        click.option("--ablate", is_flag=True,
                     help="Causal check (decoders): ablate the best head and compare how the model's preference "
                          "between the candidates moves, against random heads."),
        click.option("--random-sets", "n_random", type=click.IntRange(1, None), default=19, show_default=True,
                     help="How many random head sets --ablate compares with (19 allows p = 0.05)."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON object."),
    ]):
        fn = opt(fn)
    return fn


def _load_set(spec: str, limit: int | None):
    """(task name, examples) for a built-in name or a file path."""
    from headscope.analyses.relations import BUILTIN_SETS, builtin_set, read_probe_file

    if spec in BUILTIN_SETS:
        examples, task = builtin_set(spec), BUILTIN_SETS[spec][1]
    else:
        path = Path(spec)
        if not path.exists():
            fail(f"--data {spec}: no such file, and not a built-in set ({', '.join(BUILTIN_SETS)})")
        examples = read_probe_file(path)
        task = path.stem.removeprefix("relation_").replace("_", "-")
    return task, examples[:limit] if limit else examples


def _parse_head(spec: str | None) -> tuple[int, int] | None:
    if spec is None:
        return None
    try:
        layer, head = (int(x) for x in spec.replace(".", ",").split(","))
    except ValueError:
        fail(f"--head {spec!r}: give LAYER,HEAD as two integers, e.g. --head 3,5")
    return layer, head


def run_command(*, builtin: Sequence[str], combined_task: str, noun: str, model_name: str, data_spec: str | None,
                heldout_path: str | None, level: str, head_word: bool, folds: int, n_perm: int, seed: int,
                limit: int | None, batch_size: int, show_head: str | None, out_path: Path | None, as_json: bool,
                device: str, dtype: str, ablate: bool = False, n_random: int = 19,
                template: str | None = None, verify: bool = True) -> None:
    """What `headscope coref` and `headscope probe` do, given their built-in default sets.

    `template` is the continuation prompt of the causal check (`--ablate`).
    """
    from headscope.analyses.coref import concat_scores, score_probe
    from headscope.analyses.relations import COREF_TEMPLATE, ProbeDataError

    template = template or COREF_TEMPLATE
    head = _parse_head(show_head)
    try:
        if data_spec is not None:
            sets = [_load_set(data_spec, limit)]
        else:
            sets = [_load_set(name, limit) for name in builtin]
        held = _load_set(heldout_path, limit) if heldout_path else None
    except ProbeDataError as exc:
        fail(str(exc))
    if held is not None and len(sets) != 1:
        fail("--heldout needs a single --data file to choose the head on")
    lm = load_or_fail(model_name, device, dtype)
    verification = verify_step(lm, enabled=verify)
    progress = not as_json and sys.stderr.isatty()
    try:
        kw = dict(folds=folds, n_perm=n_perm, seed=seed, noun=noun)
        if held is not None:
            # One extraction, two honest answers: k-fold inside the selection set, and the head
            # chosen on all of it scored on the held-out file.
            (task, examples), (h_task, h_examples) = sets[0], held
            data, test = (extract_scores(lm, exs, level=level, head_word=head_word, batch_size=batch_size,
                                         progress=progress) for exs in (examples, h_examples))
            main = score_probe(data, task=f"{task}->{h_task}", heldout=test, **kw)
            parts = [score_probe(data, task=task, **kw)]
        else:
            scores = [extract_scores(lm, exs, level=level, head_word=head_word, batch_size=batch_size,
                                     progress=progress) for _, exs in sets]
            parts = [score_probe(s, task=task, **kw) for s, (task, _) in zip(scores, sets)] if len(sets) > 1 else []
            main = score_probe(concat_scores(scores), task=combined_task if len(sets) > 1 else sets[0][0], **kw)
        causal = _causal(lm, main, n_random, seed, batch_size, template) if ablate else None
    except (ValueError, RuntimeError) as exc:
        fail(f"{model_name}: {exc}")
    _emit(main, parts, head, out_path, as_json, causal, verification)
    finish(verification)


def _causal(lm, result, n_random: int, seed: int, batch_size: int, template: str) -> dict:
    """The causal check on the examples the head was chosen on; a dict for the output."""
    from headscope.analyses.relations import continuation
    from headscope.probe.ablate import causal_check

    if result.best_head is None:
        return {"skipped": "no head was selected, so there is nothing to ablate"}
    if not lm.is_causal:
        return {"skipped": f"{lm.name} is an encoder: it does not predict a continuation to compare"}
    examples = result.data.examples
    prompts, options = zip(*(continuation(ex, template=template) for ex in examples))
    check = causal_check(lm, prompts, options, [ex.answer for ex in examples], [result.best_head],
                         n_random=n_random, seed=seed, batch_size=batch_size)
    return {**check.to_dict(), "prompt_template": template, "task": result.task}


def _emit(main, parts, head, out_path, as_json, causal=None, verification=None) -> None:
    import pandas as pd

    results = [main, *parts]
    if out_path is not None:
        frames = [r.heads.assign(model=r.model, task=r.task) for r in results]
        table = pd.concat(frames, ignore_index=True)
        table = table[["model", "task", *[c for c in table.columns if c not in ("model", "task")]]]
        try:
            table.to_csv(out_path, index=False)
        except OSError as exc:
            fail(f"--out {out_path}: {exc.strerror or exc}")
    drill = None
    if head is not None:
        try:
            drill = main.drill_down(*head)
        except ValueError as exc:
            fail(str(exc))
    if as_json:
        obj = main.to_dict()
        if parts:
            obj["sets"] = {r.task: r.to_dict() for r in parts}
        if drill is not None:
            obj["drill_down"] = {"layer": head[0], "head": head[1], "examples": drill.to_dict(orient="records")}
        if causal is not None:
            obj["causal"] = causal
        if verification is not None:
            obj["verification"] = verification
        echo_json(obj)
        return
    if verification is not None:
        click.echo(verification["summary"])
    for r in parts + [main]:
        _print_result(r)
    if drill is not None:
        _print_drill(drill, head)
    if causal is not None:
        click.echo(f"causal check ({main.task}): {causal.get('verdict') or causal['skipped']}")


def _print_result(r) -> None:
    click.echo(f"{r.model} · {r.task} · {r.level} level · {r.n} examples · selection: {r.selection}")
    click.echo("  baselines: " + "  ".join(f"{k} {v:.1%}" for k, v in r.baselines.items()))
    top = r.heads.sort_values(["accuracy", "layer", "head"], ascending=[False, True, True]).head(5)
    click.echo("  top heads (accuracy over all examples; intervals not corrected for choosing):")
    for row in top.itertuples():
        click.echo(f"    {f'L{row.layer}H{row.head}':<7} {row.accuracy:6.1%}  {row.correct}/{row.n}  "
                   f"95% CI {row.ci_low:.1%}–{row.ci_high:.1%}")
    if r.excluded:
        click.echo("  excluded: " + "; ".join(f"{v} × {k}" for k, v in r.excluded.items()))
    for note in r.notes:
        click.echo(f"  note: {note}")
    click.echo(f"  verdict: {r.verdict}")
    click.echo("")


def _print_drill(drill, head) -> None:
    click.echo(f"L{head[0]}H{head[1]}: attention from the source to each candidate (* = chosen, ✓ = answer)")
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

    @click.command(help=doc)
    @click.option("--data", "data_spec", default=None, help=data_help)
    @probe_options
    def command(data_spec, no_verify, **options) -> None:
        from headscope.analyses import relations

        run_command(builtin=builtin, combined_task=combined_task, noun=noun, data_spec=data_spec,
                    template=getattr(relations, template), verify=not no_verify, **options)

    return command


cli = probe_command(
    builtin=("agreement", "winograd"), combined_task="coref-builtin", noun="pronouns",
    data_help="Probe JSONL or GAP .tsv (told apart by content), or a built-in set: agreement, winograd. "
              "Default: both built-in sets, each scored and also together.",
    doc="Which head lets a pronoun attend to the word it refers to — held-out accuracy, baselines, p-value.",
)
