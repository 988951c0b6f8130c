"""Which heads let a source word (a pronoun) look at the word it refers to — and how sure we can be.

The pipeline, each step a plain function:

1. `candidate_attention(amap, example)` -> `[layer, head, candidate]`: attention from the source
   unit(s) to each candidate's units (a multi-unit name sums over its units — or only its last
   word with `head_word=True`; a source of several units averages over them, as Clark et al. 2019
   do for word-level attention).
2. `ProbeScores`: those tensors stacked to `[example, layer, head, candidate]`.
3. `head_picks` / `head_correct`: each head picks the candidate with the most attention (an exact
   tie is no pick and counts as wrong) -> correctness `[example, layer, head]`.
4. `score_probe`: per-head accuracy with Wilson intervals, baselines (nearest preceding candidate,
   first candidate, chance), honest selection and permutation tests, a verdict in words.

What is tested (see `score_probe`; the method is `analyses.selection`'s). Selection: the head
with the most correct examples on k-1 folds (k-fold by `group`, so a Winograd pair never straddles
the split; ties by a fixed seeded order of heads) is scored on the held-out fold; pooled over
folds, every example is scored once by a head chosen without it (`heldout_accuracy`). `p_value` is
a one-sided permutation test of that whole procedure against the best baseline on the same
examples (nearest or first candidate: a paired sign flip; chance: the answer redrawn among the
candidates), re-running the k-fold choice in every permutation; `p_value_max` corroborates with
max-T over all heads on all examples. With a separate held-out set (`heldout=`), the head is
chosen on `data` alone, so `p_value` is the plain test of its held-out outcomes.

Decoders are causal: a pronoun only sees earlier words, so examples with a candidate after the
source are excluded for them (and counted in `excluded`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Iterable, Literal, Mapping, Sequence

import pandas as pd
import torch

from headscope.probe.blocks import Block
from headscope.probe.types import AttentionMap, Units, Viewable, head_name, position
from headscope.probe.words import to_word_level

from .relations import RelationExample, first_choice, nearest_choice
from .selection import (
    Chance,
    Paired,
    Selection,
    beats_baseline,
    chosen_head,
    choose,
    head_rank,
    heldout_score,
    no_head_beats,
    p_value,
    p_value_max,
    select_head,
    too_few,
)
from .stats import format_p, wilson

__all__ = [
    "ProbeResult",
    "ProbeScores",
    "Excluded",
    "MIN_HELDOUT",
    "CAUSAL_REASON",
    "concat_scores",
    "candidate_attention",
    "collect_scores",
    "head_picks",
    "head_correct",
    "candidate_units",
    "QueryRows",
    "query_rows",
    "score_probe",
    "drill_down",
    "blind_pairs",
]

MIN_HELDOUT = 20  # below this many held-out examples no head is crowned
CAUSAL_REASON = "a candidate is not before the source (a decoder sees only earlier words)"
Baseline = Literal["nearest", "first", "chance"]
_BASELINE_WORDS = {"nearest": "nearest-candidate", "first": "first-candidate", "chance": "chance"}


class Excluded(ValueError):
    """An example that cannot be scored on this map; `reason` is short and shared by similar cases."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


# --------------------------------------------------------------------------------------------
# 1. From an AttentionMap to attention per candidate


def _units(amap: AttentionMap, span: tuple[int, int]) -> list[int]:
    """Non-special units whose character span overlaps `span`."""
    s, e = span
    return [i for i, (a, b) in enumerate(amap.spans) if not amap.special[i] and a < e and s < b]


def _last_word(amap: AttentionMap, units: list[int]) -> list[int]:
    if amap.level == "word" or len(amap.word_index) != len(amap):
        return units[-1:]
    last = amap.word_index[units[-1]]
    return [u for u in units if amap.word_index[u] == last]


def candidate_attention(amap: "AttentionMap | QueryRows", ex: RelationExample, *, head_word: bool = False) -> torch.Tensor:
    """Attention from the source to each candidate, `[layer, head, candidate]`.

    Raises `Excluded` when a word has no unit in the map (e.g. cut by truncation), when candidates
    share a unit, or when the map is causal and a candidate is not before the source. Takes a whole
    map or the `QueryRows` of a text (only its sources' rows, from blocks of recomputed attention).

    >>> import torch
    >>> from headscope.analyses.relations import parse_example
    >>> ex = parse_example({"text": "Mary met John and she", "pronoun": "she", "candidates": ["Mary", "John"],
    ...                     "answer": "Mary"})
    >>> att = torch.zeros(1, 1, 5, 5); att[0, 0, 4] = torch.tensor([0.6, 0.1, 0.2, 0.0, 0.1])
    >>> m = AttentionMap(text=ex.text, level="word", labels=("Mary", "met", "John", "and", "she"),
    ...                  spans=((0, 4), (5, 8), (9, 13), (14, 17), (18, 21)), special=(False,) * 5,
    ...                  attention=att, causal=True)
    >>> candidate_attention(m, ex)
    tensor([[[0.6000, 0.2000]]])
    """
    src, cands = candidate_units(amap, ex, causal=amap.causal, head_word=head_word)
    if isinstance(amap, QueryRows):
        source_rows = torch.stack([amap.rows[u] for u in src], dim=2)  # [layer, head, source unit, key]
    else:
        source_rows = amap.attention[:, :, src, :]
    rows = source_rows.float().mean(dim=2)  # [layer, head, key]: mean over the source's units
    return torch.stack([rows[:, :, c].sum(dim=-1) for c in cands], dim=-1)  # [layer, head, candidate]


def candidate_units(units, ex: RelationExample, *, causal: bool, head_word: bool = False) -> tuple[list[int], list[list[int]]]:
    """The source's units and each candidate's, in a map's (or `Units`') units; `Excluded` as above."""
    src = _units(units, ex.source_span)
    if not src:
        raise Excluded("source not in the map (truncated?)", ex.origin)
    cands = []
    for j, span in enumerate(ex.candidate_spans):
        found = _units(units, span)
        if not found:
            raise Excluded("candidate not in the map (truncated?)", f"{ex.origin} {ex.candidates[j]!r}")
        cands.append(_last_word(units, found) if head_word else found)
    flat = [u for c in cands for u in c]
    if len(set(flat)) != len(flat) or set(flat) & set(src):
        raise Excluded("candidates or source share a unit", ex.origin)
    if causal and max(flat) >= min(src):
        raise Excluded(CAUSAL_REASON, ex.origin)
    return src, cands


@dataclass(frozen=True, eq=False)
class QueryRows:
    """Some query rows of one text's attention, `rows[unit] = [layer, head, key]`, with the text's units:
    what `candidate_attention` reads of a map, without the rows no probe asks for."""

    units: Units
    rows: Mapping[int, torch.Tensor]
    causal: bool
    layer_ids: tuple[int, ...]
    head_ids: tuple[int, ...]
    meta: dict = field(default_factory=dict)

    @property
    def level(self) -> str:
        return self.units.level

    @property
    def spans(self) -> tuple[tuple[int, int], ...]:
        return self.units.spans

    @property
    def special(self) -> tuple[bool, ...]:
        return self.units.special

    @property
    def word_index(self) -> tuple[int, ...]:
        return self.units.word_index

    def __len__(self) -> int:
        return len(self.units)


def query_rows(units: Units, blocks: Iterable[Block], wanted: Iterable[int], *, level: str, causal: bool,
               layers: Sequence[int], heads: Sequence[int], meta: Mapping | None = None) -> QueryRows:
    """Keep the `wanted` query units' rows of a text from its token-level blocks (every other row is
    dropped as its block passes); at word level each word row is its pieces' rows, keys summed over a
    word's pieces and queries averaged (as `probe.to_word_level`)."""
    wanted = sorted(set(wanted))
    words = units.word_index if level == "word" else tuple(range(len(units)))
    tokens = {t for t, u in enumerate(words) if u in set(wanted)}
    picked: dict[int, torch.Tensor] = {t: torch.zeros(len(layers), len(heads), len(units)) for t in tokens}
    for block in blocks:
        li = position(layers, block.layer, where="the layers asked for")
        for t in tokens & set(range(block.query_start, block.query_stop)):
            picked[t][li] = block.probs[:, t - block.query_start].float()  # [head, key]
    if level == "word":
        member = torch.zeros(len(units), max(words) + 1)  # [token, word]
        member[torch.arange(len(units)), torch.tensor(words)] = 1
        rows = {u: torch.stack([picked[t] @ member for t in sorted(tokens) if words[t] == u]).mean(0) for u in wanted}
        units = to_word_level(units)
    else:
        rows = {u: picked[u] for u in wanted}
    return QueryRows(units=units, rows=rows, causal=causal, layer_ids=tuple(layers), head_ids=tuple(heads),
                     meta=dict(meta or {}))


# --------------------------------------------------------------------------------------------
# 2. Scores of a whole set


@dataclass(frozen=True, eq=False)
class ProbeScores:
    """Attention to each candidate for a set of examples: `scores[example, layer, head, candidate]`.

    Examples with fewer candidates than the widest are padded with NaN. `layer_ids`/`head_ids` are
    the model's indices of the layer/head axes; `excluded` counts examples left out, by reason.
    """

    examples: tuple[RelationExample, ...]
    scores: torch.Tensor  # [example, layer, head, candidate]
    model: str = ""
    level: str = "word"
    layer_ids: tuple[int, ...] = ()
    head_ids: tuple[int, ...] = ()
    excluded: dict = field(default_factory=dict)
    causal: bool = False  # the maps came from a decoder (the source saw only earlier words)
    check: dict | None = None  # recomputed attention: its check against eager (`probe.recompute.PrefixCheck`)

    def __post_init__(self) -> None:
        if self.scores.dim() != 4 or self.scores.shape[0] != len(self.examples):
            raise ValueError(f"scores must be [example, layer, head, candidate] with {len(self.examples)} examples, "
                             f"got {tuple(self.scores.shape)}")
        if not self.layer_ids:
            object.__setattr__(self, "layer_ids", tuple(range(self.scores.shape[1])))
        if not self.head_ids:
            object.__setattr__(self, "head_ids", tuple(range(self.scores.shape[2])))

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def answers(self) -> torch.Tensor:
        return torch.tensor([e.answer for e in self.examples], dtype=torch.long)

    @property
    def n_candidates(self) -> torch.Tensor:
        return torch.tensor([e.n_candidates for e in self.examples], dtype=torch.long)

    def subset(self, keep: Sequence[bool]) -> "ProbeScores":
        """The examples where `keep` is true (same model, level, heads; exclusions kept as they were)."""
        idx = [i for i, k in enumerate(keep) if k]
        return replace(self, examples=tuple(self.examples[i] for i in idx), scores=self.scores[idx])


def concat_scores(parts: Sequence[ProbeScores]) -> ProbeScores:
    """One `ProbeScores` from several of the same model and heads (exclusion counts added up; the recompute
    check of the first part that made one: in a torchrun run rank 0 may have had no long text)."""
    if not parts:
        raise ValueError("nothing to concatenate")
    first = parts[0]
    for p in parts[1:]:
        if (p.layer_ids, p.head_ids) != (first.layer_ids, first.head_ids):
            raise ValueError("scores to concatenate must cover the same layers and heads")
    width = max(p.scores.shape[-1] for p in parts)
    padded = [torch.nn.functional.pad(p.scores, (0, width - p.scores.shape[-1]), value=float("nan")) for p in parts]
    excluded: Counter = Counter()
    for p in parts:
        excluded.update(p.excluded)
    check = next((p.check for p in parts if p.check is not None), None)  # whichever part recomputed a text
    return replace(first, examples=tuple(e for p in parts for e in p.examples), scores=torch.cat(padded),
                   excluded=dict(excluded), check=check)


def collect_scores(
    pairs: Iterable[tuple[RelationExample, AttentionMap]],
    *,
    head_word: bool = False,
    excluded: dict | None = None,
) -> ProbeScores:
    """Stack `candidate_attention` over (example, map) pairs; unscorable examples are counted, not fatal."""
    kept: list[RelationExample] = []
    rows: list[torch.Tensor] = []
    counts = Counter(excluded or {})
    model, level, layer_ids, head_ids, causal = "", "word", (), (), False
    for ex, amap in pairs:
        try:
            rows.append(candidate_attention(amap, ex, head_word=head_word))
        except Excluded as exc:
            counts[exc.reason] += 1
            continue
        kept.append(ex)
        model, level = amap.meta.get("model", model), amap.level
        layer_ids, head_ids, causal = amap.layer_ids, amap.head_ids, amap.causal
    if not rows:
        return ProbeScores(examples=(), scores=torch.zeros(0, max(len(layer_ids), 1), max(len(head_ids), 1), 2),
                           model=model, level=level, excluded=dict(counts))
    width = max(r.shape[-1] for r in rows)
    scores = torch.full((len(rows), *rows[0].shape[:2], width), float("nan"))
    for i, r in enumerate(rows):
        scores[i, :, :, : r.shape[-1]] = r
    return ProbeScores(examples=tuple(kept), scores=scores, model=model, level=level, layer_ids=tuple(layer_ids),
                       head_ids=tuple(head_ids), excluded=dict(counts), causal=causal)


# --------------------------------------------------------------------------------------------
# 3. Picks and correctness ([example, layer, head]); choosing among heads is `analyses.selection`


def head_picks(scores: torch.Tensor) -> torch.Tensor:
    """The candidate each head attends to most, `[example, layer, head]`; -1 on an exact tie.

    >>> head_picks(torch.tensor([[[[0.2, 0.7]], [[0.4, 0.4]]]]))
    tensor([[[ 1],
             [-1]]])
    """
    filled = torch.nan_to_num(scores, nan=-torch.inf)
    top = filled.topk(2, dim=-1)
    pick = top.indices[..., 0]
    return torch.where(top.values[..., 0] > top.values[..., 1], pick, torch.full_like(pick, -1))


def head_correct(scores: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """Whether each head picks the answer, bool `[example, layer, head]`."""
    return head_picks(scores) == answers[:, None, None]


# --------------------------------------------------------------------------------------------
# 4. The result


@dataclass(frozen=True, eq=False)
class ProbeResult(Viewable):
    """Which head follows a word-to-word relation, with held-out accuracy, baselines and a verdict.

    `heads` has one row per head: `layer, head, accuracy, correct, n, ci_low, ci_high` over all
    examples (a plain description; the interval does not account for choosing among heads — the
    held-out numbers do). `examples` is the drill-down for the best head: one row per
    (example, candidate) with `example, text, source, candidate, attention, chosen, correct`, where
    `chosen` marks the candidate the head attends to most and `correct` the right answer.
    """

    model: str
    task: str
    level: str
    n: int
    heads: pd.DataFrame
    best_head: tuple[int, int] | None
    heldout_accuracy: float | None
    heldout_correct: int
    heldout_n: int
    ci95: tuple[float, float] | None
    baselines: dict
    p_value: float | None
    verdict: str
    examples: pd.DataFrame
    best_baseline: str = ""
    beats_baseline: bool = False
    p_value_max: float | None = None
    fold_heads: tuple[tuple[int, int], ...] = ()
    selection: str = ""
    excluded: dict = field(default_factory=dict)
    n_permutations: int = 0
    alpha: float = 0.05
    notes: tuple[str, ...] = ()
    data: ProbeScores | None = field(default=None, repr=False)

    def to_frame(self) -> pd.DataFrame:
        """The per-head table."""
        return self.heads

    def drill_down(self, layer: int, head: int) -> pd.DataFrame:
        """Each example with the attention of head (`layer`, `head`) (model indices) to each candidate."""
        if self.data is None:
            raise ValueError("this result carries no per-example scores (it was rebuilt from a summary)")
        return drill_down(self.data, layer, head)

    def to_dict(self) -> dict:
        """JSON-ready summary (NaN-free except where a value is genuinely missing: None)."""
        return {
            "model": self.model,
            "task": self.task,
            "level": self.level,
            "n": self.n,
            "best_head": None if self.best_head is None else {"layer": self.best_head[0], "head": self.best_head[1]},
            "heldout_accuracy": self.heldout_accuracy,
            "heldout_correct": self.heldout_correct,
            "heldout_n": self.heldout_n,
            "ci95": None if self.ci95 is None else list(self.ci95),
            "baselines": dict(self.baselines),
            "best_baseline": self.best_baseline,
            "beats_baseline": self.beats_baseline,
            "p_value": self.p_value,
            "p_value_max": self.p_value_max,
            "n_permutations": self.n_permutations,
            "alpha": self.alpha,
            "selection": self.selection,
            "fold_heads": [{"layer": l, "head": h} for l, h in self.fold_heads],
            "excluded": dict(self.excluded),
            "notes": list(self.notes),
            "verdict": self.verdict,
            "heads": self.heads.to_dict(orient="records"),
        }


def drill_down(data: ProbeScores, layer: int, head: int) -> pd.DataFrame:
    """One row per (example, candidate) for head (`layer`, `head`) in model indices."""
    li = position(data.layer_ids, layer, "layer", where="these scores")
    hi = position(data.head_ids, head, "head", where="these scores")
    picks = head_picks(data.scores[:, li : li + 1, hi : hi + 1])[:, 0, 0]
    rows = []
    for i, ex in enumerate(data.examples):
        for j, cand in enumerate(ex.candidates):
            rows.append({
                "example": ex.id, "text": ex.text, "source": ex.source, "candidate": cand,
                "attention": float(data.scores[i, li, hi, j]), "chosen": int(picks[i]) == j, "correct": ex.answer == j,
            })
    return pd.DataFrame(rows, columns=["example", "text", "source", "candidate", "attention", "chosen", "correct"])


def _head_table(data: ProbeScores, correct: torch.Tensor) -> pd.DataFrame:
    n = correct.shape[0]
    hits = correct.sum(0)  # [layer, head]
    rows = []
    for li, layer in enumerate(data.layer_ids):
        for hi, head in enumerate(data.head_ids):
            k = int(hits[li, hi])
            lo, up = wilson(k, n) if n else (float("nan"), float("nan"))
            rows.append({"layer": layer, "head": head, "accuracy": k / n if n else float("nan"), "correct": k, "n": n,
                         "ci_low": lo, "ci_high": up})
    return pd.DataFrame(rows, columns=["layer", "head", "accuracy", "correct", "n", "ci_low", "ci_high"])


def _baseline_outcomes(examples: Sequence[RelationExample]) -> dict[str, torch.Tensor]:
    """Per-example outcome of each baseline: 0/1 for nearest and first, the expected 1/k for chance."""
    ans = torch.tensor([e.answer for e in examples], dtype=torch.long)
    return {
        "nearest": (torch.tensor([nearest_choice(e) for e in examples], dtype=torch.long) == ans).float(),
        "first": (torch.tensor([first_choice(e) for e in examples], dtype=torch.long) == ans).float(),
        "chance": torch.tensor([1.0 / e.n_candidates for e in examples]),
    }


def _pick_baseline(outcomes: dict[str, torch.Tensor]) -> str:
    # The strongest comparator on the same examples; on a tie a paired baseline beats chance.
    return max(outcomes, key=lambda k: (float(outcomes[k].sum()), k != "chance"))


def _select(data: ProbeScores, heldout: ProbeScores | None, correct: torch.Tensor, rank: torch.Tensor,
            folds: int, seed: int) -> Selection:
    """The head chosen on `data` and scored on `heldout`, or by k-fold by group on `data`."""
    if heldout is None:
        return choose(correct, groups=[e.group for e in data.examples], rank=rank, folds=folds, seed=seed)
    if (heldout.layer_ids, heldout.head_ids) != (data.layer_ids, data.head_ids):
        raise ValueError("the held-out scores must cover the same layers and heads as the selection data")
    return choose(correct, groups=(), rank=rank, heldout=head_correct(heldout.scores, heldout.answers))


def score_probe(
    data: ProbeScores,
    *,
    task: str,
    heldout: ProbeScores | None = None,
    folds: int = 5,
    n_perm: int = 10_000,
    seed: int = 0,
    alpha: float = 0.05,
    min_heldout: int = MIN_HELDOUT,
    noun: str = "pronouns",
) -> ProbeResult:
    """Per-head accuracy, honest selection, baselines, permutation tests and a verdict.

    Selection: without `heldout`, k-fold by group (`folds`, fewer when there are fewer groups);
    `best_head` is the head chosen on all of `data` and `fold_heads` the choice of each fold. With
    `heldout`, the head is chosen on all of `data` and scored on `heldout` (same model and heads).
    Baselines and tests use the held-out examples (under k-fold: all of them). Fewer than
    `min_heldout` held-out examples: no head is crowned (`best_head` None) and the verdict says so.
    `seed` fixes the folds, the order that breaks ties between equally accurate heads, and the
    permutations.
    """
    correct = head_correct(data.scores, data.answers)  # [example, layer, head]
    rank = head_rank(len(data.layer_ids), len(data.head_ids), seed=seed)
    heads = _head_table(data, correct)
    sel = _select(data, heldout, correct, rank, folds, seed)
    ev = data if heldout is None else heldout  # the examples the chosen head is scored on
    n_eval = len(ev)
    outcomes = _baseline_outcomes(ev.examples) if n_eval else {}
    baselines = {k: float(outcomes[k].mean()) if n_eval else float("nan") for k in ("nearest", "first", "chance")}
    best = None
    if len(data):
        li, hi = select_head(correct, rank)
        best = (data.layer_ids[li], data.head_ids[hi])
    fold_heads = tuple((data.layer_ids[l], data.head_ids[h]) for l, h in sel.choices)
    common = dict(model=data.model or ev.model, task=task, level=data.level, n=len(data), heads=heads,
                  baselines=baselines, selection=sel.description, fold_heads=fold_heads, n_permutations=n_perm,
                  alpha=alpha, excluded=_merge_excluded(data, heldout), notes=_notes(ev), data=data)
    drill = drill_down(data, *(best or (data.layer_ids[0], data.head_ids[0])))
    c = int(sel.heldout_correct.sum())

    if not sel.usable or n_eval < min_heldout:
        where = f", the best head on all data, {head_name(*best)}, gets {int(heads.correct.max())}/{len(data)}" if best else ""
        verdict = too_few(f": {n_eval} held-out example(s), at least {min_heldout} needed{where}")
        return ProbeResult(best_head=None, heldout_accuracy=None, heldout_correct=c if sel.usable else 0,
                           heldout_n=n_eval if sel.usable else 0, ci95=None, p_value=None, verdict=verdict,
                           examples=drill, **common)

    base = _pick_baseline(outcomes)
    null = Chance(head_picks(ev.scores), ev.answers, ev.n_candidates) if base == "chance" else Paired(outcomes[base])
    p = p_value(sel, null, rank=rank, n_perm=n_perm, seed=seed)
    p_max = p_value_max(sel, null, n_perm=n_perm, seed=seed)
    acc, ci = c / n_eval, wilson(c, n_eval)
    beats = beats_baseline(p, acc, baselines[base], alpha=alpha)
    verdict = _verdict(best, fold_heads, c, n_eval, ci, base, float(outcomes[base].sum()), p, p_max,
                       len(data.layer_ids) * len(data.head_ids), beats, noun, heldout is not None)
    return ProbeResult(best_head=best, heldout_accuracy=acc, heldout_correct=c, heldout_n=n_eval, ci95=ci,
                       p_value=p, p_value_max=p_max, best_baseline=base, beats_baseline=beats, verdict=verdict,
                       examples=drill, **common)


def blind_pairs(data: ProbeScores) -> int:
    """How many examples a decoder cannot tell from a partner in their group that has another answer.

    With causal attention the source sees only the text up to itself; when two examples of a group
    share that prefix and the same candidates but differ in their answer (a Winograd pair whose
    deciding word comes after the pronoun), every head picks the same candidate for both.
    """
    if not data.causal:
        return 0
    seen: dict[tuple, set[int]] = {}
    for ex in data.examples:
        key = (ex.group, ex.text[: ex.source_span[1]], ex.candidate_spans)
        seen.setdefault(key, set()).add(ex.answer)
    return sum(len(seen[(e.group, e.text[: e.source_span[1]], e.candidate_spans)]) > 1 for e in data.examples)


def _notes(data: ProbeScores) -> tuple[str, ...]:
    blind = blind_pairs(data)
    if not blind:
        return ()
    return (f"{blind} of {len(data)} examples read the same as a partner with the other answer up to the source: "
            f"a decoder's attention there cannot separate them, so on those no head can do better than half.",)


def _merge_excluded(data: ProbeScores, heldout: ProbeScores | None) -> dict:
    if heldout is None:
        return dict(data.excluded)
    return {**{f"selection: {k}": v for k, v in data.excluded.items()},
            **{f"held-out: {k}": v for k, v in heldout.excluded.items()}}


def _verdict(best, fold_heads, c, n, ci, base, base_correct, p, p_max, n_heads, beats, noun, split) -> str:
    base_word = _BASELINE_WORDS[base]
    base_count = f"{base_correct:.0f}/{n}" if base != "chance" else f"{base_correct:.1f}/{n} expected"
    verb = "resolves" if noun == "pronouns" else "picks the target in"
    claim = f"{chosen_head(best, None if split else fold_heads)} {verb} {heldout_score(c, n, ci, noun)}"
    where = "the held-out set" if split else "all examples"
    tests = f"{format_p(p)}; max-T over all {n_heads} heads on {where}: {format_p(p_max)}"
    if beats:
        return f"{claim}, above the {base_word} baseline ({base_count}) at {tests}."
    return no_head_beats(claim, f"the {base_word} baseline", base_count, tests, against="baselines")
