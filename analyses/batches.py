"""Scoring a padded batch of eager attention at once: the head metrics of every text of a batch from the
forward pass's own `(text, head, query, key)` tensors, without cutting each text out of them.

`probe.AttentionBatch` keeps the batch as the model gave it, every padded query row and key an exact zero.
A text's metrics are sums over its own rows (`analyses.heads`), and a zero row or key adds nothing to
them, so the padded batch is scored with masked reductions: a batch's units (`BatchRows.of`) give each
text's key sets, counted queries and row weights as `[text, unit, column]` tables, zero past its last
unit; word pooling (Clark et al. 2019: keys summed over a word's pieces, queries averaged) and the removal
of special units are two batched matmuls with `[text, unit, token]` pooling matrices; every metric of the
registry is then a handful of tensor operations per batch (`batch_sums`), none per text.

The values are those of scoring each text's own map (`HeadScoreAccumulator.update`) up to the order of
float32 additions (within 1e-6; tests/test_heads_batched.py compares them with a per-text loop).
Nothing here touches a model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # annotations only: torch is imported by the functions that compute with it
    import torch

from headscope.probe.names import Level
from headscope.probe.types import Units
from headscope.probe.words import to_word_level

from .metrics import Diagonal, KeyShare, Pairwise

__all__ = ["UnitColumns", "unit_columns", "BatchRows", "batch_sums", "pattern_batch_sums"]


@dataclass(frozen=True, eq=False)
class UnitColumns:
    """What a registry's corpus metrics need of one text's units besides its attention, as plain lists:
    `members[set][unit]` (each key set's keys), `queries[set][unit]` (the queries counted for it),
    `pairs` (per pairwise metric `W[query, key] · counted[query]`, None where no row counts), `weights`
    (`[unit, weight]`, the plan's row weights) and `counts` (the rows behind each corpus metric)."""

    members: list[list[bool]]
    queries: list[list[bool]]
    pairs: tuple[torch.Tensor | None, ...]
    weights: torch.Tensor
    counts: list[int]


def unit_columns(labels: Sequence[str], special: Sequence[bool], plan: Any, *, causal: bool,
                 patches: Sequence[Any] | None = None) -> UnitColumns:
    """`UnitColumns` of the units `labels`/`special` (those scored: special units already removed where
    they are) for `plan` (`analyses.heads`' worked-out registry). The one home of what a text's units mean
    to each kind of metric, for one map (`update`), its blocks (`update_blocks`) and a batch (`BatchRows`).
    `patches`: a vision–language text's `ImagePatch` (or None) per unit, for the key sets that read them."""
    import torch
    t = len(special)
    patches = list(patches) if patches else [None] * t
    members = [[bool(x) for x in (share.keys(labels, special, patches=patches) if share.patches
                                  else share.keys(labels, special))] for _, share in plan.key_shares]
    for (name, _), member in zip(plan.key_shares, members):
        if len(member) != t:
            raise ValueError(f"metric {name!r}: its keys() marked {len(member)} units of a text of {t}")
    queries = [[bool(x) for x in share.queries(member, causal=causal)]
               for (_, share), member in zip(plan.key_shares, members)]
    weights, seeing = plan.row_weights(t, causal)  # [unit, weight]; rows that see >= min_keys keys
    counted = dict(zip((n for n, _ in plan.key_shares), queries))
    pairs = []
    for name, pw in plan.pairwise:
        w, rows = pw.weights(labels, special)
        rows = [bool(x) for x in rows]
        if len(rows) != t or (w is not None and tuple(w.shape) != (t, t)):
            raise ValueError(f"metric {name!r}: its weights() gave {len(rows)} rows for a text of {t} units")
        counted[name] = rows
        pairs.append(None if w is None or not any(rows) else w.float() * torch.tensor(rows, dtype=torch.float32)[:, None])
    counts = []
    for name in plan.corpus:
        spec = plan.metrics[name]
        c = spec.computation
        if causal and spec.applies_to == "encoders":  # a metric for encoders counts no row of a decoder
            n = 0
        elif isinstance(c, Diagonal):  # the queries that have the key at that offset
            n = max(t - abs(c.offset), 0)
        elif isinstance(c, (KeyShare, Pairwise)):
            n = sum(counted[name])
        else:  # RowStatistic: the rows that see enough keys
            n = seeing(c.min_keys)
        counts.append(n)
    return UnitColumns(members, queries, tuple(pairs), weights, counts)


@dataclass(frozen=True, eq=False)
class BatchRows:
    """What scoring a padded batch needs besides its attention, built once per batch from its texts' units.

    `index` `(text · token)`: each token's row among the batch's scored units, `text · (units + 1) + unit`,
    a text's last row `units` for padding and removed special units (dropped); None where the units are the
    tokens themselves. `pool_k` `[text, token, column]`: the key columns of a scored unit row: first each
    unit (the sum of its key pieces, a 0/1 one-hot), then `extra` columns: each key set of the plan (its
    keys' sum) and, with `renormalise` (special units removed), every kept key (the row's sum).
    `inverse` `[text, unit]`: 1 / the unit's query pieces (queries are averaged). `targets` / `queries`
    `[text, unit, set]`, `weights` `[text, unit, weight]` and `pairs` (per pairwise metric `[text, unit,
    unit]` or None) as `UnitColumns`, zero past each text's last unit; `lengths`: each text's units; `counts`:
    the batch's rows behind each corpus metric (float64)."""

    index: torch.Tensor | None
    pool_k: torch.Tensor | None
    inverse: torch.Tensor | None
    extra: int
    renormalise: bool
    targets: torch.Tensor
    queries: torch.Tensor
    weights: torch.Tensor
    pairs: tuple[torch.Tensor | None, ...]
    lengths: tuple[int, ...]
    counts: torch.Tensor

    @property
    def n_units(self) -> int:
        """The batch's units per text (the longest text's), the scored tables' width."""
        return self.targets.shape[1]

    @classmethod
    def of(cls, units: Sequence[Units], plan: Any, *, causal: bool, level: Level, include_special: bool,
           n_tokens: int) -> "BatchRows":
        """The rows of a batch of texts given by their token-level `units`, right-padded to `n_tokens`."""
        import torch
        scored, columns = [], []  # per text: the token -> scored unit index (-1: not scored) and its columns
        for u in units:
            words = to_word_level(u) if level == "word" else u
            unit_of_token = list(u.word_index) if level == "word" else list(range(len(u)))
            labels, special = list(words.labels), list(words.special)
            patches = list(words.patches) or [None] * len(labels)  # a vision–language text's image cells
            if not include_special and any(special):  # special units removed, the others renumbered
                new, kept = [], 0
                for sp in special:
                    new.append(-1 if sp else kept)
                    kept += not sp
                unit_of_token = [new[w] for w in unit_of_token]
                patches = [p for p, sp in zip(patches, special) if not sp]
                labels, special = [lab for lab, sp in zip(labels, special) if not sp], [False] * kept
            scored.append(unit_of_token)
            columns.append(unit_columns(labels, special, plan, causal=causal, patches=patches))
        lengths = tuple(len(c.weights) for c in columns)
        n_units, b = max(lengths), len(units)
        n_sets = len(plan.key_shares)
        sets = torch.zeros(b, n_units, 2 * n_sets)
        weights = torch.zeros(b, n_units, len(plan.weights))
        for i, (c, n) in enumerate(zip(columns, lengths)):
            if n and n_sets:
                sets[i, :n] = torch.tensor([*c.members, *c.queries], dtype=torch.float32).reshape(2 * n_sets, n).T
            weights[i, :n] = c.weights
        targets = sets[..., :n_sets]
        identity = all(s == list(range(len(s))) and len(s) == n for s, n in zip(scored, lengths))
        index = pool_k = inverse = None
        extra = 0
        if not identity:
            unit = torch.tensor([s + [-1] * (n_tokens - len(s)) for s in scored])  # (B, T); -1: dropped
            unit[unit < 0] = n_units
            one_hot = torch.nn.functional.one_hot(unit, n_units + 1).float()  # [text, token, unit + dropped]
            pieces = one_hot[..., :n_units]
            blocks = [pieces, pieces @ targets]  # each unit; each key set's keys
            if not include_special:
                blocks.append(pieces.sum(-1, keepdim=True))  # every kept key: the row's sum
            pool_k = torch.cat(blocks, -1)
            extra = pool_k.shape[-1] - n_units
            index = (unit + torch.arange(b)[:, None] * (n_units + 1)).reshape(-1)
            inverse = 1 / pieces.sum(1).clamp_min(1)  # [text, unit]
        pairs = []
        for j in range(len(plan.pairwise)):
            if all(c.pairs[j] is None for c in columns):
                pairs.append(None)
                continue
            w = torch.zeros(b, n_units, n_units)
            for i, (c, n) in enumerate(zip(columns, lengths)):
                if c.pairs[j] is not None:
                    w[i, :n, :n] = c.pairs[j]
            pairs.append(w)
        counts = torch.tensor([sum(col) for col in zip(*(c.counts for c in columns))] or [0] * len(plan.corpus),
                              dtype=torch.float64)
        return cls(index, pool_k, inverse, extra, not include_special, targets, sets[..., n_sets:], weights,
                   tuple(pairs), lengths, counts)

    def to(self, device: torch.device) -> "BatchRows":
        """These rows on `device` (where the batch's attention is)."""
        def move(x):
            return None if x is None else x.to(device)
        return replace(self, index=move(self.index), pool_k=move(self.pool_k), inverse=move(self.inverse),
                       targets=move(self.targets), queries=move(self.queries), weights=move(self.weights),
                       pairs=tuple(map(move, self.pairs)))

    def scored(self, attention: Sequence[torch.Tensor]) -> torch.Tensor:
        """The batch's scored unit rows, `[text, query unit, layer, head, column]` float32 (the key units, then
        `extra` columns, as `pool_k`), from some of its layers' token tensors `(text, head, token, token)`
        (padding exact zeros). The tokens are copied once, query-major (each row stays whole); where the units
        are not the tokens, a word's query rows are summed (`index_add_`, one pass), every key column of those
        rows is one batched matmul (`pool_k`), then the rows are averaged, or renormalised over the kept keys
        where special units were removed (as `HeadScoreAccumulator.update`)."""
        import torch
        b, h, t, _ = attention[0].shape
        x = attention[0].new_empty(b, t, len(attention), h, t, dtype=torch.float32)  # [text, query, layer, head, key]
        for layer, a in enumerate(attention):
            x[:, :, layer].copy_(a.transpose(1, 2))
        if self.index is None:
            return x
        n, width = self.n_units, x[0, 0].numel()
        rows = x.new_zeros(b * (n + 1), width).index_add_(0, self.index, x.view(b * t, width))
        rows = rows.view(b, n + 1, width)[:, :n].reshape(b, n * width // t, t)  # [text, (unit, layer, head), key]
        u = torch.bmm(rows, self.pool_k).view(b, n, len(attention), h, -1)
        if self.renormalise:  # each row over the kept keys (the last column): the mean's factor cancels
            return u.div_(u[..., -1:].clamp_min(torch.finfo(u.dtype).tiny))
        return u.mul_(self.inverse.view(b, n, 1, 1, 1))


def batch_sums(scored: torch.Tensor, rows: BatchRows, plan: Any) -> torch.Tensor:
    """Sums of each corpus metric of `plan` over every query row of a batch's texts, `[layer, head, metric]`
    float64 in the plan's `corpus` order, from their scored unit rows `scored[text, query, layer, head,
    column]` (`BatchRows.scored`: exact zeros past each text's units): the batch's counterpart of
    `analyses.heads`' `_row_sums` of each text's map, added over the texts. Each text's sums are taken in
    float32, then added in float64. A few reductions and small matmuls per batch, none per text."""
    import torch
    b, n = scored.shape[0], rows.n_units
    if not plan.corpus:
        return scored.new_zeros(*scored.shape[2:4], 0, dtype=torch.float64)
    u = scored[..., :n]  # [text, query, layer, head, key]: each row's keys contiguous
    sums: dict[str, torch.Tensor] = {}
    for name, offset in plan.diagonals:  # a padded row or key is zero: the diagonal adds the text's own only
        sums[name] = u.diagonal(offset, 1, 4).sum(-1)
    if plan.key_shares:  # [text, query, layer, head, set]: pooled with the keys (`pool_k`), else one matmul
        s = len(plan.key_shares)
        shares = scored[..., n : n + s] if rows.extra else torch.bmm(u.reshape(b, -1, n), rows.targets).view(
            *u.shape[:-1], s)
        shares = (shares * rows.queries.view(b, n, 1, 1, s)).sum(1)  # [text, layer, head, set]
        sums.update({name: shares[..., i] for i, (name, _) in enumerate(plan.key_shares)})
    for group in plan.statistics:
        weights = rows.weights[..., group.columns]  # [text, unit, metric]
        if group.zeros_free:  # a zero row weighs 0 and zero keys do not change a row's statistic
            stat = group.statistic(u)  # [text, query, layer, head]
            weighted = torch.einsum("bqlh,bqm->blhm", stat, weights)
        else:  # a statistic that reads every key gets each text's own keys only
            weighted = torch.stack([group.statistic(u[i, :k, ..., :k].permute(1, 2, 0, 3)) @ weights[i, :k]
                                    for i, k in enumerate(rows.lengths)])
        sums.update({name: weighted[..., i] for i, name in enumerate(group.names)})
    for (name, _), w in zip(plan.pairwise, rows.pairs):  # Σ_q Σ_k A[q, k] W[q, k]
        sums[name] = (u.new_zeros(b, *u.shape[2:4]) if w is None
                      else (u * w.view(b, n, 1, 1, n)).sum((1, -1)))
    return torch.stack([sums[m] for m in plan.corpus], -1).double().sum(0)


def pattern_batch_sums(a: torch.Tensor, patterns: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """`(Σ A⊙P, Σ A)` in float64 of each sequence and head of one layer's padded batch `a[text, head, query,
    key]` (zeros past each sequence), for each `[text, query, key]` float64 pattern (`analyses.induction`'s
    `pattern_sums` of each sequence's map): `[pattern, text, head]` and `[text, head]`, one batched matmul
    per pattern."""
    import torch
    b, h, n, _ = a.shape
    flat = a.double().reshape(b, h, n * n)
    matched = torch.stack([torch.bmm(flat, p.to(flat.device).reshape(b, n * n, 1))[..., 0] for p in patterns]) \
        if patterns else flat.new_zeros(0, b, h)
    return matched, flat.sum(-1)
