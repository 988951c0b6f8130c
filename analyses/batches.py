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
from typing import Any, Sequence

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

    `pool_q` `[text, unit, token]` / `pool_k` `[text, token, unit]`: the units as rows of the tokens (a word's
    pieces averaged as queries, summed as keys; a kept token itself), zero for padding and removed special
    units; both None where the units are the tokens themselves. `renormalise`: rows are divided by their sum
    (special units removed). `targets` / `queries` `[text, unit, set]`, `weights` `[text, unit, weight]` and
    `pairs` (per pairwise metric `[text, unit, unit]` or None) as `UnitColumns`, zero past each text's last
    unit; `lengths`: each text's units; `counts`: the batch's rows behind each corpus metric (float64)."""

    pool_q: torch.Tensor | None
    pool_k: torch.Tensor | None
    renormalise: bool
    targets: torch.Tensor
    queries: torch.Tensor
    weights: torch.Tensor
    pairs: tuple[torch.Tensor | None, ...]
    lengths: tuple[int, ...]
    counts: torch.Tensor

    @classmethod
    def of(cls, units: Sequence[Units], plan: Any, *, causal: bool, level: Level, include_special: bool,
           n_tokens: int) -> "BatchRows":
        """The rows of a batch of texts given by their token-level `units`, right-padded to `n_tokens`."""
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
        identity = all(s == list(range(len(s))) and len(s) == n for s, n in zip(scored, lengths))
        pool_q = pool_k = None
        if not identity:
            index = torch.tensor([s + [n_units] * (n_tokens - len(s)) for s in scored])  # (B, T); n_units: dropped
            index[index < 0] = n_units
            pool_k = torch.nn.functional.one_hot(index, n_units + 1)[..., :n_units].float()  # [text, token, unit]
            pool_q = (pool_k / pool_k.sum(1, keepdim=True).clamp_min(1)).transpose(1, 2)  # [text, unit, token]
        n_sets = len(plan.key_shares)
        sets = torch.tensor([[[*(m[i] for m in c.members), *(q[i] for q in c.queries)] if i < n else [False] * (2 * n_sets)
                              for i in range(n_units)] for c, n in zip(columns, lengths)],
                            dtype=torch.float32).reshape(b, n_units, 2 * n_sets)
        weights = torch.zeros(b, n_units, len(plan.weights))
        for i, (c, n) in enumerate(zip(columns, lengths)):
            weights[i, :n] = c.weights
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
        return cls(pool_q, pool_k, not include_special, sets[..., :n_sets], sets[..., n_sets:], weights, tuple(pairs),
                   lengths, counts)

    def to(self, device: torch.device) -> "BatchRows":
        """These rows on `device` (where the batch's attention is)."""
        def move(x):
            return None if x is None else x.to(device)
        return replace(self, pool_q=move(self.pool_q), pool_k=move(self.pool_k), targets=move(self.targets),
                       queries=move(self.queries), weights=move(self.weights), pairs=tuple(map(move, self.pairs)))

    def scored(self, attention: Sequence[torch.Tensor]) -> torch.Tensor:
        """The batch's scored units, `[text, layer, head, unit, unit]` float32, from some of its layers' token
        tensors `(text, head, token, token)`: the tokens stacked (one copy, as cutting each text out would
        make), pooled where the units are not the tokens (`pool_q @ A @ pool_k`, two batched matmuls), rows
        renormalised where special units were removed."""
        a = torch.stack(attention, 1).float()  # [text, layer, head, token, token]
        if self.pool_q is None:
            return a
        b, n_layers, h, t, _ = a.shape
        n = self.pool_q.shape[1]
        keys = torch.bmm(a.view(b, n_layers * h * t, t), self.pool_k)  # keys pooled: [text, (layer, head, token), unit]
        keys = keys.view(b, n_layers * h, t, n).transpose(1, 2).reshape(b, t, n_layers * h * n)
        u = torch.bmm(self.pool_q, keys).view(b, n, n_layers, h, n).permute(0, 2, 3, 1, 4).contiguous()
        if self.renormalise:  # as `HeadScoreAccumulator.update`: each row over the kept keys
            u.div_(u.sum(-1, keepdim=True).clamp_min_(torch.finfo(u.dtype).tiny))
        return u


def batch_sums(u: torch.Tensor, rows: BatchRows, plan: Any) -> torch.Tensor:
    """Sums of each corpus metric of `plan` over every query row of a batch's texts, `[layer, head, metric]`
    float64 in the plan's `corpus` order, from their scored units `u[text, layer, head, query, key]`
    (`BatchRows.scored`: exact zeros past each text's units): the batch's counterpart of `analyses.heads`'
    `_row_sums` of each text's map, added over the texts. Each text's sums are taken in float32, then
    added in float64. A few batched matmuls and reductions per batch, none per text."""
    b, n = u.shape[0], u.shape[-1]
    if not plan.corpus:
        return u.new_zeros(*u.shape[1:-2], 0, dtype=torch.float64)
    grid = (b, *[1] * (u.dim() - 3))  # a per-text table broadcast over the layers and heads
    sums: dict[str, torch.Tensor] = {}
    for name, offset in plan.diagonals:  # a padded row or key is zero: the diagonal adds the text's own only
        sums[name] = u.diagonal(offset, -2, -1).sum(-1)
    if plan.key_shares:  # one batched matmul for every key set: [text, (layer, head, query), set]
        shares = torch.bmm(u.view(b, -1, n), rows.targets).view(*u.shape[:-1], -1)
        shares = (shares * rows.queries.view(*grid, n, -1)).sum(-2)  # [text, layer, head, set]
        sums.update({name: shares[..., i] for i, (name, _) in enumerate(plan.key_shares)})
    for group in plan.statistics:
        weights = rows.weights[..., group.columns]  # [text, unit, metric]
        if group.zeros_free:  # a zero row weighs 0 and zero keys do not change a row's statistic
            stat = group.statistic(u)  # [text, layer, head, unit]
            weighted = torch.bmm(stat.reshape(b, -1, n), weights).view(*u.shape[:-2], -1)
        else:  # a statistic that reads every key gets each text's own keys only
            weighted = torch.stack([group.statistic(u[i, ..., :k, :k]) @ weights[i, :k]
                                    for i, k in enumerate(rows.lengths)])
        sums.update({name: weighted[..., i] for i, name in enumerate(group.names)})
    for (name, _), w in zip(plan.pairwise, rows.pairs):  # Σ_q Σ_k A[q, k] W[q, k]
        sums[name] = u.new_zeros(u.shape[:-2]) if w is None else (u * w.view(*grid, n, n)).sum((-2, -1))
    return torch.stack([sums[m] for m in plan.corpus], -1).double().sum(0)


def pattern_batch_sums(a: torch.Tensor, patterns: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """`(Σ A⊙P, Σ A)` in float64 of each sequence and head of one layer's padded batch `a[text, head, query,
    key]` (zeros past each sequence), for each `[text, query, key]` float64 pattern (`analyses.induction`'s
    `pattern_sums` of each sequence's map): `[pattern, text, head]` and `[text, head]`, one batched matmul
    per pattern."""
    b, h, n, _ = a.shape
    flat = a.double().reshape(b, h, n * n)
    matched = torch.stack([torch.bmm(flat, p.to(flat.device).reshape(b, n * n, 1))[..., 0] for p in patterns]) \
        if patterns else flat.new_zeros(0, b, h)
    return matched, flat.sum(-1)
