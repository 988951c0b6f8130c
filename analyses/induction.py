"""Duplicate-token and induction heads on repeated random tokens (Olsson et al. 2022).

The score follows TransformerLens's `head_detector` with `error_measure="mul"` exactly:

    S(layer, head) = Σ_{q,k} A[q, k] · P[q, k]  /  Σ_{q,k} A[q, k]

for one sequence, where `A` is the head's attention `[query, key]` and `P` the 0/1 detection
pattern; over several sequences it is the mean of the per-sequence scores (`detect_head` on a list).
The patterns are TransformerLens's, built from the token ids:

- duplicate_token: `P[q, k] = 1` when `ids[k] == ids[q]` and `k < q` (an earlier copy of the token);
- induction: `P[q, k] = 1` when `ids[k - 1] == ids[q]`, `k - 1 < q` and `1 <= k <= q` (the token
  right after an earlier copy) — the duplicate pattern shifted one key to the right, lower triangle;
- previous_token: `P[q, q - 1] = 1`.

No key is masked out (TransformerLens's defaults `exclude_bos=False`, `exclude_current_token=False`).
Because every row of `A` sums to 1, `Σ A` is the number of queries, including the first half of a
repeated sequence, where nothing can match: a perfect induction head scores `k / (2k + p)` on `p`
prefix tokens + `k` random tokens + the same `k` again — 0.5 without a BOS, just under 0.5 with one.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Literal, Mapping, Sequence

if TYPE_CHECKING:  # annotations only: torch is imported by the functions that compute with it
    import torch

__all__ = ["PatternKind", "PATTERNS", "previous_token_pattern", "duplicate_token_pattern", "induction_pattern",
           "detection_pattern", "pattern_score", "pattern_sums", "repeated_random_tokens"]

PatternKind = Literal["previous_token", "duplicate_token", "induction"]


def previous_token_pattern(ids: torch.Tensor) -> torch.Tensor:
    """`P[q, q - 1] = 1`: the key just before the query."""
    import torch
    n = ids.numel()
    return torch.diag(torch.ones(max(n - 1, 0)), -1) if n else torch.zeros(0, 0)


def duplicate_token_pattern(ids: torch.Tensor) -> torch.Tensor:
    """`P[q, k] = 1` when `ids[k] == ids[q]` and `k < q`: an earlier copy of the query's token."""
    import torch
    return torch.tril((ids[:, None] == ids[None, :]).float(), diagonal=-1)  # [query, key], diagonal cleared


def induction_pattern(ids: torch.Tensor) -> torch.Tensor:
    """`P[q, k] = 1` when `ids[k - 1] == ids[q]`, `1 <= k <= q`: the token after an earlier copy."""
    import torch
    dup = duplicate_token_pattern(ids)
    ind = torch.zeros_like(dup)
    ind[:, 1:] = dup[:, :-1]  # key k marks ids[k - 1] == ids[query]
    return torch.tril(ind)


# TransformerLens's detection patterns by its names (`detection_pattern`). The pattern metrics of
# `analyses.metrics` hold their builder themselves (`metrics.Pattern`): a new one needs no name here.
PATTERNS: Mapping[PatternKind, Callable[[torch.Tensor], torch.Tensor]] = MappingProxyType({
    "previous_token": previous_token_pattern,
    "duplicate_token": duplicate_token_pattern,
    "induction": induction_pattern,
})


def detection_pattern(token_ids: Sequence[int] | torch.Tensor, kind: PatternKind) -> torch.Tensor:
    """TransformerLens's 0/1 detection pattern `[query, key]` (lower triangular) for `token_ids`.

    >>> detection_pattern([5, 7, 5, 7], "induction")
    tensor([[0., 0., 0., 0.],
            [0., 0., 0., 0.],
            [0., 1., 0., 0.],
            [0., 0., 1., 0.]])
    >>> detection_pattern([5, 7, 5, 7], "duplicate_token")[3]
    tensor([0., 1., 0., 0.])
    """
    import torch
    if kind not in PATTERNS:
        raise ValueError(f"kind must be one of {', '.join(PATTERNS)}, got {kind!r}")
    return PATTERNS[kind](torch.as_tensor(token_ids, dtype=torch.long).reshape(-1))


def pattern_score(attention: torch.Tensor, pattern: torch.Tensor) -> torch.Tensor:
    """`Σ A⊙P / Σ A` per head: attention `[layer, head, query, key]`, pattern `[query, key]` -> `[layer, head]`.

    >>> import torch
    >>> a = torch.tensor([[[[1.0, 0.0], [1.0, 0.0]]]])   # every query looks at key 0
    >>> pattern_score(a, detection_pattern([3, 4], "previous_token"))
    tensor([[0.5000]], dtype=torch.float64)
    """
    if attention.dim() != 4 or attention.shape[-2:] != pattern.shape:
        raise ValueError(f"attention {tuple(attention.shape)} is not [layer, head, query, key] "
                         f"matching the pattern {tuple(pattern.shape)}")
    matched, total = pattern_sums(attention, pattern)
    return matched / total


def pattern_sums(rows: torch.Tensor, pattern: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(Σ A⊙P, Σ A)` in float64 over some query rows `[..., row, key]` and the same rows of the pattern.

    Sums of row blocks add up to the sums of the whole map, so `pattern_score` can be folded block by
    block: add both parts over every block of a sequence, then divide.
    """
    a = rows.double()
    return (a * pattern.to(a.dtype)).sum((-2, -1)), a.sum((-2, -1))


def repeated_random_tokens(
    candidates: Sequence[int],
    *,
    n_sequences: int = 20,
    length: int = 50,
    seed: int = 0,
    prefix: Sequence[int] = (),
) -> list[tuple[int, ...]]:
    """`n_sequences` of `prefix + r + r`, `r` being `length` ids drawn uniformly from `candidates`.

    The same seed gives the same sequences (a private generator: no global random state is touched).

    >>> repeated_random_tokens(range(100, 200), n_sequences=1, length=3, seed=0, prefix=[1])
    [(1, 144, 139, 133, 144, 139, 133)]
    """
    import torch
    pool = torch.as_tensor(list(candidates), dtype=torch.long)
    if pool.numel() < 2:
        raise ValueError("need at least 2 candidate token ids to draw random sequences from")
    if n_sequences < 1 or length < 1:
        raise ValueError(f"n_sequences and length must be at least 1, got {n_sequences} and {length}")
    gen = torch.Generator().manual_seed(seed)
    draws = pool[torch.randint(pool.numel(), (n_sequences, length), generator=gen)]
    head = tuple(int(t) for t in prefix)
    return [head + tuple(r.tolist()) * 2 for r in draws]
