"""What each attention head does, measured over a corpus: one number per (layer, head) and metric.

Scores stream: `HeadScoreAccumulator.update(amap)` folds one `AttentionMap` (`[layer, head, query,
key]`) into float64 sums and counts per (layer, head), so memory does not grow with the corpus.
`update_blocks` folds a text given as blocks of query rows (`probe.blocks.Block`, recompute mode)
into the same sums. `score_corpus(maps)` does the whole loop. Nothing here touches a model: feed it maps from
`probe.iter_extract` (texts) and `probe.extract_ids` (repeated random tokens, for induction).

The built-in metrics (each a mean over query rows; `n` counts those rows; no row -> NaN with n = 0):

- previous_token / next_token: `A[q, q-1]` / `A[q, q+1]`, over the queries that have that neighbour.
  next_token is not applicable to causal (decoder) attention: NaN, n = 0.
- self: `A[q, q]`, over all queries.
- first_token, cls, sep, punctuation: attention to a set of keys, `Σ_{k∈S} A[q, k]`. The sets:
  first_token = position 0 whatever it is; cls = the run of special units at the start ([CLS],
  <bos>); sep = the run of special units at the end ([SEP], </s>, <eos>); punctuation = units whose
  label is made only of Unicode punctuation (category P*: . , ! ? " 。 …; not $ + %). Queries inside
  the set are left out (a sink attending to itself is `self`), and so are queries that cannot see
  the set (causal queries before it). A text without such a unit adds nothing: a model without a
  BOS (SmolLM2) gets cls = NaN with n = 0, not 0.
- entropy: `-Σ_k A[q, k] ln A[q, k]` in nats; normalized_entropy divides it by `ln(visible keys)`
  (q + 1 keys for a causal row, all keys otherwise), so 1 means uniform over what the row can see;
  max_weight: `max_k A[q, k]` ("confidence", Voita et al. 2019). These three skip rows that see a
  single key (the first causal row has no choice to make).
- duplicate_token, induction: decoders only, on repeated random token sequences, with
  TransformerLens's `head_detector` "mul" score `Σ A⊙P / Σ A` (see `analyses.induction`), averaged
  over sequences; always on tokens with every key (TransformerLens's defaults). NaN for encoders.

Settings. `level="word"` aggregates tokens to words first (Clark et al. 2019: sum over key pieces,
mean over query pieces, `probe.to_word_level`); `level="token"` scores sub-word tokens.
`include_special=True` keeps [CLS]/[SEP]/<bos> as ordinary units. The default, word level with
special tokens included, is Clark et al.'s. With `include_special=False` special units are removed
as queries and as keys, and every remaining row is renormalised to sum to 1 over the remaining
keys — the head's attention among the text's own units; cls and sep are then NaN (n = 0) and
first_token means the first non-special unit.

Every metric, what computes it, its role and the role's threshold are defined once, in
`analyses.metrics.METRICS`: the accumulator loops over the registry it is given (`metrics=`, METRICS
by default), so a registry of one's own (`{**METRICS, "name": Metric(...)}`) is scored, tabled and
given roles with nothing here changed. A head gets a role when its score reaches the threshold, and
the roles table keeps the score beside the label.

>>> import torch
>>> from headscope.probe.types import AttentionMap
>>> a = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])[None, None]  # prev-token
>>> m = AttentionMap(text="a b c", level="token", labels=("a", "b", "c"), spans=((0, 1), (2, 3), (4, 5)),
...                  special=(False,) * 3, attention=a, causal=True, meta={"model": "toy"})
>>> s = score_corpus([m], level="token")
>>> float(s.grid("previous_token").iloc[0, 0]), float(s.grid("next_token").iloc[0, 0])
(1.0, nan)
>>> list(s.roles["role"])
['previous-token head', 'first-token sink', 'confident head']
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

from headscope.probe.names import DEFAULT_INCLUDE_SPECIAL, DEFAULT_LEVEL, Level
from headscope.probe.blocks import Block
from headscope.probe.types import AttentionBatch, AttentionMap, Units, Viewable
from headscope.probe.words import to_word_level

from .batches import BatchRows, batch_sums, pattern_batch_sums, unit_columns

if TYPE_CHECKING:  # annotations only: torch and pandas are imported by the functions that compute with them
    import pandas as pd
    import torch

    from headscope.probe.reading import Reading  # what an attention source yields; only its fields are read here
from .blocks import word_blocks
from .induction import pattern_sums
from .metrics import (METRICS, ROLE_LABELS, THRESHOLDS, Diagonal, KeyShare, Metric, Pairwise, Pattern, RowStatistic,
                      is_punctuation, role_labels_of, thresholds_of)

__all__ = [
    "METRICS",
    "ROLE_LABELS",
    "THRESHOLDS",
    "DEFAULT_LEVEL",
    "DEFAULT_INCLUDE_SPECIAL",
    "HeadScores",
    "HeadScoreAccumulator",
    "BatchFold",
    "score_corpus",
    "assign_roles",
    "is_punctuation",
    "settings_note",
]

# Clark et al. 2019 aggregate to words and keep [CLS]/[SEP]: `probe.names.DEFAULT_LEVEL`, `DEFAULT_INCLUDE_SPECIAL`.

# A batch's small layers are scored together (one set of reductions for several, float32 sums in another order:
# within 1e-6): up to this many bytes of them are held, a larger layer alone, so a fold holds at most a few MB
# more than the one layer the forward pass gives it.
_FOLD_BYTES = 4 * 2**20
_TABLE_COLUMNS = ["model", "layer", "head", "metric", "value", "n"]
_ROLE_COLUMNS = ["model", "layer", "head", "role", "metric", "value", "threshold"]


def settings_note(level: str, include_special: bool, *, images: bool = False) -> str:
    """One line naming the setting, and whether it is Clark et al.'s default; `images`: the units were an
    image's patches, which are the same units at either level (nothing was aggregated).

    >>> settings_note("word", True, images=True)
    'image patches (the same units at token and word level); special tokens kept as units'
    """
    if images:
        units = "image patches (the same units at token and word level)"
    else:
        units = "words (tokens aggregated as in Clark et al. 2019)" if level == "word" else "sub-word tokens"
    special = ("special tokens kept as units" if include_special
               else "special tokens removed and rows renormalised")
    default = level == DEFAULT_LEVEL and include_special == DEFAULT_INCLUDE_SPECIAL and not images
    return f"{units}; {special}" + (" — the default, as Clark et al. 2019" if default else "")


@dataclass(frozen=True, eq=False)
class HeadScores(Viewable):
    """Per-head scores over a corpus: a tidy `table` (`model, layer, head, metric, value, n`) and `roles`.

    `n` is the number of query rows a value averages over (NaN with n = 0: not applicable, e.g.
    next_token for a decoder). `level`/`include_special` state how the numbers were computed.
    `registry` is the metrics they were computed with (`analyses.metrics.METRICS` unless the
    accumulator was given others): their order, roles and thresholds.
    """

    model: str
    n_layers: int
    n_heads: int
    level: str
    include_special: bool
    table: pd.DataFrame
    roles: pd.DataFrame
    n_texts: int = 0
    n_sequences: int = 0  # repeated random sequences behind duplicate_token / induction
    meta: dict = field(default_factory=dict)  # e.g. how the induction sequences were drawn
    registry: Mapping[str, Metric] = field(default_factory=lambda: dict(METRICS), repr=False)
    # A hybrid stack's layers without softmax attention (the model's own numbers): no rows in `table`, drawn as
    # labelled "no softmax attention" rows in the layer grids, never as zeros.
    no_attention: tuple[int, ...] = ()
    images: bool = False  # scored on images: the units were patches, at either level

    @property
    def metrics(self) -> list[str]:
        return [m for m in self.registry if m in set(self.table["metric"])]

    @property
    def setting(self) -> str:
        return settings_note(self.level, self.include_special, images=self.images)

    def _rows(self, metric: str) -> pd.DataFrame:
        if metric not in self.registry:
            raise KeyError(f"unknown metric {metric!r}; choose one of {', '.join(self.registry)}")
        return self.table[self.table["metric"] == metric]

    def grid(self, metric: str) -> pd.DataFrame:
        """Values of `metric` as a layer × head frame (index = layer, columns = head)."""
        return self._rows(metric).pivot(index="layer", columns="head", values="value")

    def top(self, metric: str, k: int = 3) -> pd.DataFrame:
        """The `k` heads with the highest `metric` (NaN left out), best first."""
        rows = self._rows(metric).dropna(subset=["value"])
        return rows.sort_values(["value", "layer", "head"], ascending=[False, True, True]).head(k).reset_index(drop=True)

    def to_frame(self) -> pd.DataFrame:
        return self.table

    def save(self, path: str | Path) -> Path:
        """Write the full table to .csv or .parquet (by the file's suffix)."""
        path = Path(path)
        if path.suffix == ".csv":
            self.table.to_csv(path, index=False)
        elif path.suffix == ".parquet":
            self.table.to_parquet(path, index=False)
        else:
            raise ValueError(f"cannot write {path.name}: use a .csv or .parquet file name")
        return path

    def to_dict(self, *, k: int = 3, table: bool = True) -> dict:
        """JSON-ready: settings, the top `k` heads per metric, the roles and (with `table`) every value."""
        out = {
            "model": self.model, "n_layers": self.n_layers, "n_heads": self.n_heads, "level": self.level,
            "no_softmax_attention_layers": list(self.no_attention),
            "include_special": self.include_special, "setting": self.setting, "n_texts": self.n_texts,
            "n_sequences": self.n_sequences, "meta": dict(self.meta), "thresholds": thresholds_of(self.registry),
            "top": {m: _records(self.top(m, k)[["layer", "head", "value", "n"]]) for m in self.metrics},
            "roles": _records(self.roles),
        }
        if table:
            out["table"] = _records(self.table)
        return out


def _records(df: pd.DataFrame) -> list[dict]:
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in df.to_dict(orient="records")]


class HeadScoreAccumulator:
    """Streaming sums per (layer, head): `update(amap)` for corpus texts, `update_repeated(amap)` for
    repeated random token sequences, then `result()`. Keeps only `[layer, head, metric]` float64 sums.

    `metrics` is the registry scored (`analyses.metrics.METRICS` by default), in its order: every
    update loops over its entries' computations. Maps are not modified. Token-level maps are
    aggregated to words when `level="word"`.
    """

    def __init__(self, *, model: str | None = None, level: Level = DEFAULT_LEVEL,
                 include_special: bool = DEFAULT_INCLUDE_SPECIAL, metrics: Mapping[str, Metric] = METRICS) -> None:
        import torch
        if level not in ("token", "word"):
            raise ValueError(f"level must be 'token' or 'word', got {level!r}")
        self.model = model
        self.level = level
        self.include_special = bool(include_special)
        self.metrics: Mapping[str, Metric] = MappingProxyType(dict(metrics))  # a copy: later edits don't reach it
        self._plan = _Plan.of(self.metrics)
        self._layers: tuple[int, ...] | None = None
        self._heads: tuple[int, ...] | None = None
        self._sums: torch.Tensor | None = None  # [layer, head, metric] float64
        self._counts = torch.zeros(len(self.metrics), dtype=torch.float64)  # query rows behind each metric
        self._n_texts = 0
        self._n_sequences = 0
        self.no_attention: tuple[int, ...] = ()  # a hybrid stack's layers without softmax attention
        self.images = False  # a map of an image was folded in (its units are patches at either level)

    def update(self, amap: AttentionMap) -> None:
        """Fold in one text's attention (`[layer, head, query, key]`)."""
        amap = self._prepare(amap)
        plan = self._plan
        rows = _TextRows.of(Units.of(amap), plan, causal=amap.causal, include_special=self.include_special)
        self._sums[..., plan.corpus_columns] += rows.sums(amap.attention.float(), 0)  # float32 sums into float64 totals
        self._counts[plan.corpus_columns] += rows.counts
        self._n_texts += 1

    def update_batch(self, batch: AttentionBatch) -> None:
        """Fold in a whole padded batch of texts' eager attention at once (`probe.AttentionBatch`): the sums
        `update` gives each text's map, taken over the batch with masked reductions (`analyses.batches`),
        equal up to the order of float32 additions, one layer at a time (`batch_fold`, as `hs.heads` scores
        each layer as its forward pass gives it). Word pooling and special units as `update`."""
        fold = self.batch_fold(batch)
        for i, a in enumerate(batch.attention):
            fold(i, a)
        fold.commit()

    def update_blocks(self, units: Units, blocks: Iterable[Block], *, causal: bool, layers: Sequence[int],
                      heads: Sequence[int]) -> None:
        """Fold in one text given as token-level blocks of query rows (`probe.recompute.iter_blocks`).

        The same sums as `update` of the text's whole map, row by row: `[layer, head, T, T]` never
        exists. `units` are the text's tokens (with their `word_index`); `layers`/`heads` are the model
        indices the blocks cover, and each layer's blocks come in row order.
        """
        if units.level != "token":
            raise ValueError("update_blocks takes token-level units and blocks; words are formed here")
        self._start(tuple(layers), tuple(heads))
        if self.level == "word":
            blocks, units = word_blocks(blocks, units.word_index), to_word_level(units)
        plan = self._plan
        rows = _TextRows.of(units, plan, causal=causal, include_special=self.include_special)
        for block in blocks:
            layer, heads_at = self._place(block)
            band, where = _banded(block)
            self._sums[layer][heads_at[:, None], plan.corpus_columns] += rows.sums(band, block.query_start, where)
        self._counts[plan.corpus_columns] += rows.counts
        self._n_texts += 1

    def update_repeated(self, amap: AttentionMap) -> None:
        """Fold in one repeated random sequence (token level, decoders) for duplicate_token/induction."""
        if amap.level != "token" or len(amap.token_ids) != len(amap):
            raise ValueError("induction scores need a token-level map with its token_ids; use probe.extract_ids")
        _check_causal(amap.causal)
        self._check_shape(amap)
        plan = self._plan
        for column, pattern in zip(plan.pattern_columns.tolist(), plan.patterns(amap.token_ids)):
            matched, total = pattern_sums(amap.attention, pattern)
            self._sums[..., column] += matched / total
            self._counts[column] += len(amap)
        self._n_sequences += 1

    def update_repeated_batch(self, batch: AttentionBatch) -> None:
        """`update_repeated` of every sequence of a padded batch (`probe.AttentionBatch`, token-level units with
        their token ids) at once: per layer, `Σ A⊙P` and `Σ A` of each sequence in float64 by one batched
        matmul per pattern (`analyses.batches.pattern_batch_sums`), then divided, as each map would give them."""
        fold = self.batch_fold(batch, repeated=True)
        for i, a in enumerate(batch.attention):
            fold(i, a)
        fold.commit()

    def batch_fold(self, batch: AttentionBatch | Reading, *, repeated: bool = False) -> "BatchFold":
        """A padded batch folded in one layer at a time: call the fold with each layer's place in `batch.layers`
        and its `(text, head, query, key)` weights, padding zero (a "layers" `probe.reading.Reading`'s `run(fold)`
        does, as the forward pass gives them, so one layer of the batch is alive at a time), then `fold.commit()`,
        which adds the
        batch to the sums (a fold never committed adds nothing). `update_batch` (`repeated`:
        `update_repeated_batch`) of the whole batch is this fold fed every layer in turn."""
        if repeated:
            _check_causal(batch.causal)
        if self.model is None:
            self.model = str(batch.meta.get("model", ""))
        self.no_attention = self.no_attention or batch.no_attention
        self._start(tuple(batch.layers), tuple(batch.heads))
        return BatchFold(self, batch, repeated=repeated)

    def update_repeated_blocks(self, token_ids: Sequence[int], blocks: Iterable[Block], *, causal: bool,
                               layers: Sequence[int], heads: Sequence[int]) -> None:
        """`update_repeated` from blocks of query rows: `Σ A⊙P` and `Σ A` are summed over a sequence's
        blocks, then divided, as the whole map would give them."""
        import torch
        _check_causal(causal)
        self._start(tuple(layers), tuple(heads))
        plan = self._plan
        patterns = plan.patterns(token_ids)
        parts = torch.zeros(2, len(patterns), len(self._layers), len(self._heads), dtype=torch.float64)
        for block in blocks:
            layer, heads_at = self._place(block)
            for j, pattern in enumerate(patterns):
                matched, total = pattern_sums(block.probs, pattern[block.query_start : block.query_stop])
                parts[0, j, layer, heads_at] += matched
                parts[1, j, layer, heads_at] += total
        for j, column in enumerate(plan.pattern_columns.tolist()):
            self._sums[..., column] += parts[0, j] / parts[1, j]
            self._counts[column] += len(token_ids)
        self._n_sequences += 1

    @property
    def units(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """(layer ids, head ids) of the maps so far; None before the first map."""
        return None if self._sums is None else (self._layers, self._heads)

    def merged(self, add: Callable[..., tuple[torch.Tensor, ...]], *,
               units: tuple[tuple[int, ...], tuple[int, ...]] | None = None) -> "HeadScoreAccumulator":
        """A new accumulator whose totals are `add(sums, counts, [texts, sequences])` of this one's.

        For a data-parallel run `add` sums each total over the processes (`headscope.distributed`),
        so the merged sums are the sums one process would have: sums of sums, never means of means.
        `units` (layer ids, head ids) sizes the zero totals of an accumulator that saw no map.
        """
        import torch
        units = self.units or units
        if units is None:
            raise ValueError("no attention maps were given; pass at least one text")
        if self.units not in (None, units):
            raise ValueError(f"this accumulator scores layers and heads {self.units}, not {units}")
        sums = self._sums if self._sums is not None else torch.zeros(
            len(units[0]), len(units[1]), len(self.metrics), dtype=torch.float64)
        n = torch.tensor([self._n_texts, self._n_sequences], dtype=torch.float64)
        sums, counts, n = add(sums, self._counts, n)
        out = HeadScoreAccumulator(model=self.model, level=self.level, include_special=self.include_special,
                                   metrics=self.metrics)
        out._layers, out._heads = units
        out._sums, out._counts = sums.clone(), counts.clone()
        out._n_texts, out._n_sequences = int(n[0]), int(n[1])
        out.no_attention, out.images = self.no_attention, self.images
        return out

    def result(self, *, thresholds: Mapping[str, float] | None = None, meta: Mapping | None = None) -> HeadScores:
        """The scores so far as a `HeadScores` (the accumulator can keep going afterwards)."""
        if self._sums is None:
            raise ValueError("no attention maps were given; pass at least one text")
        plan = self._plan
        values = self._sums.clone()
        counts = self._counts[plan.corpus_columns]
        values[..., plan.corpus_columns] /= counts  # 0/0 -> NaN: not applicable
        # a metric no row counts is not applicable whatever its sums hold: NaN, never x/0 = inf in a table
        values[..., plan.corpus_columns] = values[..., plan.corpus_columns].masked_fill(counts == 0, float("nan"))
        values[..., plan.pattern_columns] /= self._n_sequences if self._n_sequences else float("nan")
        table = _tidy(self.model or "", self._layers, self._heads, plan.names, values, self._counts)
        return HeadScores(
            model=self.model or "", n_layers=len(self._layers), n_heads=len(self._heads), level=self.level,
            include_special=self.include_special, table=table,
            roles=assign_roles(table, thresholds, metrics=self.metrics), n_texts=self._n_texts,
            n_sequences=self._n_sequences, meta=dict(meta or {}), registry=dict(self.metrics),
            no_attention=self.no_attention, images=self.images,
        )

    def _prepare(self, amap: AttentionMap) -> AttentionMap:
        if self.level == "word" and amap.level == "token":
            amap = to_word_level(amap)
        elif self.level == "token" and amap.level == "word":
            raise ValueError("level='token' was asked for but this map is already word level; "
                             "extract with level='token'")
        self._check_shape(amap)
        return amap

    def _check_shape(self, amap: AttentionMap) -> None:
        if self.model is None:
            self.model = str(amap.meta.get("model", ""))
        self.no_attention = self.no_attention or amap.no_attention  # a hybrid stack's layers without attention
        self.images = self.images or amap.is_image
        self._start(amap.layer_ids, amap.head_ids)

    def _start(self, layers: tuple[int, ...], heads: tuple[int, ...]) -> None:
        import torch
        if self._sums is None:
            self._layers, self._heads = layers, heads
            self._sums = torch.zeros(len(layers), len(heads), len(self.metrics), dtype=torch.float64)
        elif (layers, heads) != (self._layers, self._heads):
            raise ValueError(f"this map has layers {layers} and heads {heads}, the earlier ones "
                             f"{self._layers} and {self._heads}; extract every text with the same layers/heads")

    def _place(self, block: Block) -> tuple[int, torch.Tensor]:
        """Where a block's rows go in the sums: its layer's row and its heads' columns."""
        import torch
        try:
            return self._layers.index(block.layer), torch.tensor([self._heads.index(h) for h in block.heads])
        except ValueError:
            raise ValueError(f"a block of layer {block.layer}, heads {block.heads} is outside the layers "
                             f"{self._layers} and heads {self._heads} being scored") from None


class BatchFold:
    """One padded batch's sums, layer by layer (`HeadScoreAccumulator.batch_fold`): `[layer, head, metric]`
    float64 of its own, added to the accumulator's by `commit()`."""

    def __init__(self, acc: HeadScoreAccumulator, batch: AttentionBatch | Reading, *, repeated: bool) -> None:
        import torch
        self._acc, self._repeated, self._n = acc, repeated, len(batch)
        plan = acc._plan
        self._sums = torch.zeros_like(acc._sums)
        self._rows: dict[torch.device, BatchRows] = {}  # the batch's rows where its layers are (texts)
        self._pending: list[tuple[int, torch.Tensor]] = []  # layers caught, not yet scored (texts)
        self._pending_bytes = 0
        if repeated:
            n = batch.n_tokens
            self._patterns = [torch.zeros(len(batch), n, n, dtype=torch.float64) for _ in plan.pattern]
            for i, u in enumerate(batch.units):
                t = len(u.token_ids)
                if u.level != "token" or t != len(u.special):
                    raise ValueError("induction scores need token-level units with their token_ids")
                for j, pattern in enumerate(plan.patterns(u.token_ids)):
                    self._patterns[j][i, :t, :t] = pattern
            self._counts = float(sum(len(u.token_ids) for u in batch.units))
        else:
            rows = BatchRows.of(batch.units, plan, causal=batch.causal, level=acc.level,
                                include_special=acc.include_special, n_tokens=batch.n_tokens)
            self._rows[rows.counts.device] = rows
            self._counts = rows.counts

    def __call__(self, i: int, a: torch.Tensor) -> None:
        """Score layer `i` (its place in the batch's layers): `a` its `(text, head, query, key)` weights."""
        plan = self._acc._plan
        if self._repeated:
            matched, total = pattern_batch_sums(a, self._patterns)  # [pattern, text, head], [text, head]
            self._sums[i, :, plan.pattern_columns.tolist()] = (matched / total).sum(1).T.cpu()
            return
        if self._pending and (a.device != self._pending[0][1].device
                              or self._pending_bytes + a.numel() * 4 > _FOLD_BYTES):
            self._score()
        self._pending.append((i, a))  # held until scored: layers come in order, so the held ones are consecutive
        self._pending_bytes += a.numel() * 4

    def _score(self) -> None:
        """Score the layers held, stacked (one set of reductions for several small layers)."""
        if not self._pending:
            return
        plan, first, device = self._acc._plan, self._pending[0][0], self._pending[0][1].device
        if device not in self._rows:  # a model placed over devices: each layer where it ran
            self._rows[device] = next(iter(self._rows.values())).to(device)
        rows = self._rows[device]
        u = rows.scored([a for _, a in self._pending])  # [text, unit, layer, head, column]
        self._sums[first : first + len(self._pending), :, plan.corpus_columns] = batch_sums(u, rows, plan).cpu()
        self._pending, self._pending_bytes = [], 0

    def commit(self) -> None:
        """Add the batch's sums, rows and texts (or sequences) to the accumulator's."""
        self._score()
        acc, plan = self._acc, self._acc._plan
        acc._sums += self._sums
        if self._repeated:
            acc._counts[plan.pattern_columns] += self._counts
            acc._n_sequences += self._n
        else:
            acc._counts[plan.corpus_columns] += self._counts
            acc._n_texts += self._n


def _check_causal(causal: bool) -> None:
    if not causal:
        raise ValueError("duplicate-token and induction scores are defined for decoders (causal attention), "
                         "as in TransformerLens; this map is bidirectional")


def score_corpus(
    maps: Iterable[AttentionMap],
    *,
    repeated: Iterable[AttentionMap] = (),
    model: str | None = None,
    level: Level = DEFAULT_LEVEL,
    include_special: bool = DEFAULT_INCLUDE_SPECIAL,
    thresholds: Mapping[str, float] | None = None,
    progress: bool = False,
    total: int | None = None,
    metrics: Mapping[str, Metric] = METRICS,
    meta: Mapping | None = None,
) -> HeadScores:
    """Scores of every head over `maps` (one per text), plus induction scores over `repeated` maps,
    for each metric of the registry `metrics`; `meta` is the result's (how the maps were read).

    Maps are consumed one at a time, so a generator such as `probe.iter_extract` keeps memory flat.
    """
    acc = HeadScoreAccumulator(model=model, level=level, include_special=include_special, metrics=metrics)
    if progress:
        from headscope.probe.progress import progress as progress_bar

        maps = progress_bar(maps, total=total, desc="heads", unit="text")
    for amap in maps:
        acc.update(amap)
    for amap in repeated:
        acc.update_repeated(amap)
    return acc.result(thresholds=thresholds, meta=meta)


def assign_roles(table: pd.DataFrame, thresholds: Mapping[str, float] | None = None, *,
                 metrics: Mapping[str, Metric] = METRICS) -> pd.DataFrame:
    """One row per (head, role) whose score reaches its threshold, roles and thresholds those of the
    registry `metrics` (default thresholds: its entries', `THRESHOLDS` for `METRICS`)."""
    labels = role_labels_of(metrics)
    chosen = dict(thresholds_of(metrics) if thresholds is None else thresholds)
    unknown = sorted(set(chosen) - set(labels))
    if unknown:
        raise ValueError(f"no role is defined for {unknown}; thresholds can be set for {sorted(labels)}")
    limit = table["metric"].map(chosen)
    hit = table[limit.notna() & (table["value"] >= limit)].copy()
    hit["role"] = hit["metric"].map(labels)
    hit["threshold"] = hit["metric"].map(chosen).astype(float)
    order = {m: i for i, m in enumerate(metrics)}
    hit = hit.sort_values(["metric", "value"], key=lambda c: c.map(order) if c.name == "metric" else -c)
    return hit[_ROLE_COLUMNS].reset_index(drop=True)


# --- per-map sums -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _StatisticGroup:
    """The registry's row statistics that share one `statistic`: computed once per block, weighted for
    all of them by one matmul with their row-weight columns (`columns`, a slice where they are adjacent)."""

    statistic: Callable[[torch.Tensor], torch.Tensor]
    names: tuple[str, ...]
    columns: slice | torch.Tensor
    zeros_free: bool = False  # every member's `RowStatistic.zeros_free`: it may read a block's band only


@dataclass(frozen=True, eq=False)
class _Plan:
    """What the accumulator computes for one registry, worked out once from its entries.

    `names`: every metric, in table order (the columns of the sums). `corpus` / `pattern`: the names of
    each kind in that order, at `corpus_columns` / `pattern_columns`; `_row_sums` gives the corpus
    metrics' sums in `corpus` order. `diagonals` (name, offset), `key_shares` (name, entry) and
    `weights` (one `RowStatistic` per distinct row weight, the table's last columns) say how.
    """

    metrics: Mapping[str, Metric]
    names: tuple[str, ...]
    corpus: tuple[str, ...]
    pattern: tuple[str, ...]
    corpus_columns: torch.Tensor
    pattern_columns: torch.Tensor
    diagonals: tuple[tuple[str, int], ...]
    key_shares: tuple[tuple[str, KeyShare], ...]
    weights: tuple[RowStatistic, ...]
    statistics: tuple[_StatisticGroup, ...]
    pairwise: tuple[tuple[str, Pairwise], ...] = ()
    _row_weights: dict = field(default_factory=dict, repr=False)  # (units, causal) -> `row_weights`, filled as met

    @classmethod
    def of(cls, metrics: Mapping[str, Metric]) -> "_Plan":
        import torch
        kinds = (Diagonal, KeyShare, RowStatistic, Pattern, Pairwise)
        for name, m in metrics.items():
            if not isinstance(m, Metric) or m.name != name:
                raise ValueError(f"metrics[{name!r}] must be a Metric named {name!r}, got {m!r}")
            if not isinstance(m.computation, kinds):
                raise ValueError(f"metric {name!r}: its computation must be one of "
                                 f"{', '.join(k.__name__ for k in kinds)}, got {m.computation!r}")
        names = tuple(metrics)
        corpus = tuple(n for n in names if metrics[n].kind == "corpus")
        pattern = tuple(n for n in names if metrics[n].kind == "pattern")
        stats = [(n, metrics[n].computation) for n in corpus if isinstance(metrics[n].computation, RowStatistic)]
        weight_of: dict[tuple, int] = {}  # (scale, min_keys) -> its column among the weights
        weights: list[RowStatistic] = []
        groups: dict[Callable, list[tuple[str, int]]] = {}
        zeros_free: dict[Callable, bool] = {}
        for n, c in stats:
            key = (c.scale, c.min_keys)
            if key not in weight_of:
                weight_of[key] = len(weights)
                weights.append(c)
            groups.setdefault(c.statistic, []).append((n, weight_of[key]))
            zeros_free[c.statistic] = zeros_free.get(c.statistic, True) and c.zeros_free
        return cls(
            metrics=metrics, names=names, corpus=corpus, pattern=pattern,
            corpus_columns=torch.tensor([names.index(n) for n in corpus], dtype=torch.long),
            pattern_columns=torch.tensor([names.index(n) for n in pattern], dtype=torch.long),
            diagonals=tuple((n, metrics[n].computation.offset) for n in corpus
                            if isinstance(metrics[n].computation, Diagonal)),
            key_shares=tuple((n, metrics[n].computation) for n in corpus
                             if isinstance(metrics[n].computation, KeyShare)),
            weights=tuple(weights),
            statistics=tuple(_StatisticGroup(f, tuple(n for n, _ in members), _columns([j for _, j in members]),
                                             zeros_free[f])
                             for f, members in groups.items()),
            pairwise=tuple((n, metrics[n].computation) for n in corpus if isinstance(metrics[n].computation, Pairwise)),
        )

    def row_weights(self, t: int, causal: bool) -> tuple[torch.Tensor, Callable[[int], int]]:
        """The row weights of a text of `t` units, `[unit, weight]` float32 (each `RowStatistic.weight` of
        the keys the row sees: q + 1 for a causal row, t otherwise), and how many rows see at least a given
        number of keys. They depend on `t` and `causal` only: worked out once per length, not per text."""
        import torch
        key = (t, causal)
        if key not in self._row_weights:
            visible = [i + 1 if causal else t for i in range(t)]  # the keys each row can see
            weights = torch.tensor([[w.weight(v) for w in self.weights] for v in visible],
                                   dtype=torch.float32).reshape(t, len(self.weights))
            seeing = (lambda least: min(t, max(t - least + 1, 0))) if causal else (lambda least: t if t >= least else 0)
            self._row_weights[key] = weights, seeing
        return self._row_weights[key]

    def patterns(self, token_ids: Sequence[int]) -> list[torch.Tensor]:
        """The 0/1 `[query, key]` pattern of each pattern metric (in `pattern` order) for `token_ids`."""
        import torch
        ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1)
        return [self.metrics[n].computation.pattern(ids) for n in self.pattern]


def _columns(js: list[int]) -> slice | torch.Tensor:
    """Columns `js` as a slice where they are adjacent and increasing (a view), else an index."""
    import torch
    if js == list(range(js[0], js[0] + len(js))):
        return slice(js[0], js[0] + len(js))
    return torch.tensor(js, dtype=torch.long)


@dataclass(frozen=True, eq=False)
class _TextRows:
    """What the corpus metrics need of one text besides its attention, built once per text.

    `keep`: the units kept as queries and keys (special units removed, `include_special=False`), None
    for all. `table[unit, column]` (kept units): membership of each key set of the plan, then whether
    the unit is a query counted for each set, then each row weight of the plan's row statistics (0
    for rows they leave out). `counts`: the rows behind each corpus metric, in the plan's `corpus` order.
    """

    keep: torch.Tensor | None
    table: torch.Tensor
    counts: torch.Tensor
    plan: _Plan
    pairs: tuple[torch.Tensor | None, ...] = ()  # per pairwise metric: W[query, key] · counted[query]; None: no row
    active: torch.Tensor | None = None  # the key sets with a counted query (None: all); the others' sums are 0

    @classmethod
    def of(cls, units: Units, plan: _Plan, *, causal: bool, include_special: bool) -> "_TextRows":
        import torch
        labels, special = list(units.labels), list(units.special)
        patches = list(units.patches) or [None] * len(labels)  # a vision–language text's image cells
        keep = None
        if not include_special and any(special):
            kept = [i for i, sp in enumerate(special) if not sp]
            keep, labels, special = torch.tensor(kept, dtype=torch.long), [labels[i] for i in kept], [False] * len(kept)
            patches = [patches[i] for i in kept]
        c = unit_columns(labels, special, plan, causal=causal, patches=patches)
        t, s = len(special), len(c.members)
        sets = torch.tensor([*c.members, *c.queries], dtype=torch.float32).reshape(2 * s, t)  # 0/1 [column, unit]
        table = torch.cat([sets.T, c.weights], 1)  # [unit, 2·set + weight]
        live = [i for i, q in enumerate(c.queries) if any(q)]  # a text scores no row of registers, image_share, ...
        active = None if len(live) == len(c.queries) else torch.tensor(live, dtype=torch.long)
        return cls(keep, table, torch.tensor(c.counts, dtype=torch.float64), plan, c.pairs, active)

    def sums(self, a: torch.Tensor, query_start: int, band: "_Band | None" = None) -> torch.Tensor:
        """Sums of each corpus metric over the query rows `a[..., row, key]` (units `query_start ..` of
        the text, every key): `[..., metric]` in the plan's `corpus` order. With `band`, `a` is only the
        rows' keys `band.start .. band.start + K - 1` (`probe.blocks.Block.band`), every other key an
        exact zero: the linear sums and the zero-free statistics read those keys only."""
        if self.keep is not None:
            if band is not None:  # the kept keys are renumbered: every key, zeros included
                a, band = band.block.probs.float(), None
            a, query_start = _drop_special(a, query_start, self.keep)
        return _row_sums(a, query_start, self.table, self.plan, band, self.pairs, self.active)


@dataclass(frozen=True, eq=False)
class _Band:
    """Where a block's band sits among the keys: `start`, the text's `n_keys`, and the block itself."""

    start: int
    n_keys: int
    block: Block


def _banded(block: Block) -> tuple[torch.Tensor, _Band]:
    """A block's band in float32 and where it sits, for `_TextRows.sums`."""
    return block.band.float(), _Band(block.key_start, block.n_keys, block)


def _drop_special(a: torch.Tensor, query_start: int, keep: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Rows `a[..., row, key]` (units `query_start ..`) with only the `keep` queries and keys, each row
    renormalised to 1, and the first kept row's index among the kept units."""
    import torch
    lo, hi = (int(torch.searchsorted(keep, q)) for q in (query_start, query_start + a.shape[-2]))
    a = a.index_select(-2, keep[lo:hi] - query_start).index_select(-1, keep)
    return a / a.sum(-1, keepdim=True).clamp_min(torch.finfo(a.dtype).tiny), lo


def _row_sums(a: torch.Tensor, query_start: int, table: torch.Tensor, plan: _Plan,
              band: _Band | None = None, pairs: tuple[torch.Tensor | None, ...] = (),
              active: torch.Tensor | None = None) -> torch.Tensor:
    """Sums over the query rows `a[..., row, key]` (units `query_start ..`) of each corpus metric of the
    plan, `[..., metric]` in its `corpus` order. The one place the registry's corpus computations run,
    for a whole map (`query_start` 0, every row) and for blocks of rows alike: the sums of a map's
    blocks add up to the map's. A handful of tensor ops per block, none per head: one matmul for every
    key set, each row statistic once and one matmul for the metrics that share it.
    With `band`, `a` holds only the keys `band.start .. band.start + K - 1` of the rows, the others being
    exact zeros: the sums and the zero-free statistics read those keys only (a causal block: about half
    its keys), and a statistic that is not zero-free gets the whole rows (`band.block.probs`). `active`:
    the key sets that count a query of this text (None: every set); the others sum to exactly 0 unread.
    """
    import torch
    r, k = a.shape[-2:]
    t = k if band is None else band.n_keys
    if r == 0 or t == 0 or not plan.corpus:
        return a.new_zeros(*a.shape[:-2], len(plan.corpus))
    lo, hi = (0, t) if band is None else (band.start, band.start + k)
    seen = a  # the keys that are not exact zeros
    s = len(plan.key_shares)
    table = table.to(a.dtype)
    here = table[query_start : query_start + r]
    targets, queries, weights = table[lo:hi, :s], here[:, s : 2 * s], here[:, 2 * s :]  # [key, set], [row, set], [row, w]
    sums: dict[str, torch.Tensor] = {}
    # row r is query q = query_start + r: A[q, q + d] lies on the diagonal at offset query_start + d (in
    # the band's key numbering, query_start + d - lo); keys outside the band are zeros and add nothing
    for name, offset in plan.diagonals:  # 0 where no row has that key (next_token under a causal mask)
        sums[name] = seen.diagonal(query_start + offset - lo, -2, -1).sum(-1)
    if s:
        # [..., set]: one matmul for every key set, rows first ([set, row] @ [..., row, key]: the block is read
        # once, row after row, where [..., row, key] @ [key, set] is a skinny product at half the speed)
        if active is not None:  # sets no query of this text counts for (a text's registers): zeros, not read
            shares = a.new_zeros(*a.shape[:-2], s)
            if len(active):
                shares[..., active] = (queries[:, active].T @ seen * targets[:, active].T).sum(-1)
        else:
            shares = (queries.T @ seen * targets.T).sum(-1)
        sums.update({name: shares[..., i] for i, (name, _) in enumerate(plan.key_shares)})
    for group in plan.statistics:  # a statistic that is not zero-free gets every key (the block assembles them)
        whole = seen if group.zeros_free or band is None else band.block.probs.to(a.dtype)
        rows = group.statistic(whole)  # [..., row]
        weighted = rows @ weights[:, group.columns]  # [..., row] @ [row, metric] -> [..., metric]
        sums.update({name: weighted[..., i] for i, name in enumerate(group.names)})
    for (name, _), w in zip(plan.pairwise, pairs or (None,) * len(plan.pairwise)):  # Σ_q Σ_k A[q, k] W[q, k]
        sums[name] = (a.new_zeros(a.shape[:-2]) if w is None  # a text: nothing to read
                      else (seen * w[query_start : query_start + r, lo:hi].to(a.dtype)).sum((-2, -1)))
    return torch.stack([sums[m] for m in plan.corpus], -1)


def _tidy(model: str, layers: Sequence[int], heads: Sequence[int], names: Sequence[str], values: torch.Tensor,
          counts: torch.Tensor) -> pd.DataFrame:
    import numpy as np
    import pandas as pd

    n_l, n_h, n_m = values.shape  # [layer, head, metric]
    metric_major = values.permute(2, 0, 1).reshape(-1).numpy()
    return pd.DataFrame({
        "model": model,
        "layer": np.tile(np.repeat(np.asarray(layers, dtype=np.int64), n_h), n_m),
        "head": np.tile(np.asarray(heads, dtype=np.int64), n_l * n_m),
        "metric": np.repeat(np.asarray(list(names), dtype=object), n_l * n_h),
        "value": metric_major.astype(np.float64),
        "n": np.repeat(counts.numpy().astype(np.int64), n_l * n_h),
    })[_TABLE_COLUMNS]
