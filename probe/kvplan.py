"""The per-head KV-cache plan and the needles it is checked with: plain values, no model (the model side is
`probe.longcontext`, the statistics `analyses.longcontext`).

Needles (`make_needles`): a random key of digits stated in one of several phrasings (`PHRASINGS`), each
with the question that asks for it; seeded, spread over a grid of lengths and depths, and split by turns
into a selection half (heads are ranked on it) and a held-out half (every accuracy is measured on it).

The KV plan (`KVPlan`): per (layer, KV head), full (every key kept) or streaming (the first `sink` keys and
the last `recent` keys, DuoAttention's streaming heads); layers a model already windows (Gemma 3's sliding
layers) are not planned. Its bytes are arithmetic: a head keeps min(n, sink + recent) or n keys of n,
times 2 (keys and values) × head size × bytes per number. `pattern_table` is DuoAttention's
`full_attention_heads.tsv` (layers × KV heads, 1 full, 0 streaming) beside `config.json`'s sink and recent
sizes; `gate_table` the same layout with DuoAttention's learned gates in [0, 1], as its training writes it.

>>> plan = KVPlan.from_ranking(np.array([[0.9, 0.1], [0.2, 0.5]]), 0.5, sink=2, recent=4)
>>> plan.full.astype(int).tolist(), plan.n_full
([[1, 0], [0, 1]], 2)
>>> plan.kv_bytes(100, head_dim=8, bytes_per_value=2)  # 2 heads × 100 keys + 2 heads × 6 keys, × 2 × 8 × 2
6784
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np
import pandas as pd

__all__ = ["Phrasing", "PHRASINGS", "Needle", "make_needles", "typed_needle", "KVPlan", "pool_kv", "default_window",
           "gate_table"]


@dataclass(frozen=True)
class Phrasing:
    """How a needle states its key, and the question whose answer begins where the key is copied."""

    statement: str  # with {key}
    question: str  # ends where the key is to be generated


PHRASINGS: tuple[Phrasing, ...] = (
    Phrasing("The pass key is {key}. Remember it. {key} is the pass key.",
             "What is the pass key? The pass key is"),
    Phrasing("The secret number for the vault is {key}. Keep the number {key} in mind.",
             "What is the secret number for the vault? The secret number is"),
    Phrasing("Note this code carefully: the access code is {key}.",
             "What is the access code? The access code is"),
    Phrasing("My favourite number is {key}, and I will ask you about it later.",
             "What is my favourite number? My favourite number is"),
)

Split = Literal["selection", "held_out"]


@dataclass(frozen=True)
class Needle:
    """One needle-in-a-haystack prompt to build: its key, phrasing, target length (tokens), depth (0: the
    haystack's start, 1: its end), where its haystack starts in the text, and its half."""

    index: int
    key: str
    phrasing: int
    length: int
    depth: float
    offset: int
    split: Split
    statement: str  # the needle sentence, key in place
    question: str

    def to_dict(self) -> dict:
        return {"needle": self.index, "key": self.key, "phrasing": self.phrasing, "length": self.length,
                "depth": self.depth, "split": self.split}


def make_needles(n: int, *, lengths: Sequence[int], depths: Sequence[float], seed: int = 0, digits: int = 5,
                 n_lines: int = 1, phrasings: Sequence[Phrasing] = PHRASINGS,
                 n_selection: int | None = None) -> list[Needle]:
    """`n` needles over the grid `lengths` × `depths` (cycled in order), each with a fresh random key of
    `digits` digits (no leading 0, no two needles alike), a phrasing and a haystack start among `n_lines`
    lines drawn from `seed`'s generator; needle i goes to the selection half when i is even, else held out —
    with `n_selection`, the first `n_selection` even needles are the selection and every other is held out.

    >>> ns = make_needles(4, lengths=[100], depths=[0.0, 1.0], seed=1)
    >>> [n.split for n in ns], [n.depth for n in ns], len({n.key for n in ns})
    (['selection', 'held_out', 'selection', 'held_out'], [0.0, 1.0, 0.0, 1.0], 4)
    """
    if n < 2:
        raise ValueError(f"needs at least 2 needles (one to select heads on, one held out), got {n}")
    if not lengths or not depths:
        raise ValueError("give at least one length and one depth")
    if any(not 0 <= d <= 1 for d in depths):
        raise ValueError(f"depths are fractions of the haystack in [0, 1], got {list(depths)}")
    if not phrasings or any("{key}" not in p.statement for p in phrasings):
        raise ValueError("every phrasing's statement must hold {key}")
    if digits < 2:
        raise ValueError(f"a key needs at least 2 digits, got {digits}")
    n_sel = (n + 1) // 2 if n_selection is None else int(n_selection)
    if n_selection is not None and not 1 <= n_sel <= n // 2:
        raise ValueError(f"n_selection is 1 to {n // 2} of {n} needles (at least as many stay held out), "
                         f"got {n_selection}")
    rng = np.random.default_rng(seed)
    grid = [(int(l), float(d)) for l in lengths for d in depths]
    seen: set[str] = set()
    out = []
    for i in range(n):
        while True:
            key = str(int(rng.integers(10 ** (digits - 1), 10 ** digits)))
            if key not in seen or len(seen) >= 9 * 10 ** (digits - 1):
                break
        seen.add(key)
        length, depth = grid[i % len(grid)]
        which = int(rng.integers(len(phrasings)))
        out.append(Needle(index=i, key=key, phrasing=which, length=length, depth=depth,
                          offset=int(rng.integers(max(n_lines, 1))), split="selection" if i % 2 == 0 and i // 2 < n_sel else "held_out",
                          statement=phrasings[which].statement.format(key=key), question=phrasings[which].question))
    return out


def typed_needle(statement: str, question: str, *, length: int, depth: float, key: str | None = None,
                 offset: int = 0) -> Needle:
    """A needle a user types: the sentence, the question the answer follows and optionally the key the answer
    should hold (it must occur in the sentence; without one, `key` is "" and nothing says retrieved or not).
    `phrasing` is -1 (none of `PHRASINGS`).

    >>> typed_needle("The code is 4711.", "The code is", length=100, depth=0.5, key="4711").to_dict()["phrasing"]
    -1
    """
    for name, text in (("needle sentence", statement), ("question", question)):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"the {name} is empty; type one (e.g. 'The code is 4711.' and 'The code is')")
    if key is not None and (not isinstance(key, str) or not key.strip() or key.strip() not in statement):
        raise ValueError(f"the key {key!r} is not in the needle sentence; give a key the sentence holds, or none")
    if not 0 <= depth <= 1:
        raise ValueError(f"depth is where the needle sits, a fraction of the haystack in [0, 1], got {depth}")
    return Needle(index=0, key="" if key is None else key.strip(), phrasing=-1, length=int(length), depth=float(depth),
                  offset=int(offset), split="selection", statement=" ".join(statement.split()),
                  question=" ".join(question.split()))


def pool_kv(per_head: np.ndarray, n_kv_heads: int) -> np.ndarray:
    """[layer, query head] scores → [layer, KV head]: the largest over the query heads that read each KV head
    (query head h reads KV head h // (n_heads / n_kv_heads), as grouped-query attention repeats them).

    >>> pool_kv(np.array([[0.1, 0.7, 0.2, 0.0]]), 2).tolist()
    [[0.7, 0.2]]
    """
    L, H = per_head.shape
    if H % n_kv_heads:
        raise ValueError(f"{H} query heads do not split into {n_kv_heads} KV heads")
    return per_head.reshape(L, n_kv_heads, H // n_kv_heads).max(-1)


@dataclass(frozen=True, eq=False)
class KVPlan:
    """Which KV heads keep the full cache. `full[layer, kv_head]` True: every key; False: the first `sink` and
    the last `recent` keys. `planned[layer]` False: a layer the model windows itself (not planned; its heads
    keep its own window of `own_window[layer]` keys and `full` is True there, meaning "as the model does")."""

    full: np.ndarray  # [layer, kv_head] bool
    sink: int
    recent: int
    planned: np.ndarray = None  # [layer] bool; default every layer
    own_window: tuple = ()  # per layer: None, or the layer's own sliding window
    name: str = ""

    def __post_init__(self) -> None:
        full = np.asarray(self.full, dtype=bool)
        if full.ndim != 2:
            raise ValueError(f"a plan is [layer, kv_head]; got shape {full.shape}")
        if self.sink < 0 or self.recent < 1:
            raise ValueError(f"a streaming head keeps sink >= 0 and recent >= 1 keys; got sink {self.sink}, "
                             f"recent {self.recent}")
        planned = np.ones(full.shape[0], bool) if self.planned is None else np.asarray(self.planned, bool)
        if planned.shape != (full.shape[0],):
            raise ValueError(f"planned has {planned.shape} entries for {full.shape[0]} layers")
        full = full | ~planned[:, None]  # an unplanned layer runs as the model runs it
        object.__setattr__(self, "full", full)
        object.__setattr__(self, "planned", planned)
        own = tuple(self.own_window) or (None,) * full.shape[0]
        object.__setattr__(self, "own_window", own)

    @classmethod
    def all_full(cls, shape: tuple[int, int], *, sink: int, recent: int, **kw) -> "KVPlan":
        return cls(np.ones(shape, bool), sink, recent, name="all full", **kw)

    @classmethod
    def all_streaming(cls, shape: tuple[int, int], *, sink: int, recent: int, **kw) -> "KVPlan":
        return cls(np.zeros(shape, bool), sink, recent, name="all streaming", **kw)

    @classmethod
    def from_ranking(cls, scores: np.ndarray, fraction: float, *, sink: int, recent: int, planned=None,
                     name: str = "", **kw) -> "KVPlan":
        """The round(fraction × planned heads) planned KV heads with the highest `scores` keep the full cache;
        ties go to the later layer (DuoAttention's and the issue's observation: retrieval sits late), then the
        lower head. `scores` [layer, kv_head]; NaN ranks last."""
        scores = np.asarray(scores, dtype=float)
        if not 0 <= fraction <= 1:
            raise ValueError(f"the fraction of full KV heads is in [0, 1], got {fraction}")
        planned = np.ones(scores.shape[0], bool) if planned is None else np.asarray(planned, bool)
        cells = [(l, h) for l in range(scores.shape[0]) if planned[l] for h in range(scores.shape[1])]
        k = int(round(fraction * len(cells)))
        key = lambda c: (-(scores[c] if np.isfinite(scores[c]) else -np.inf), -c[0], c[1])  # noqa: E731
        full = np.zeros(scores.shape, bool)
        for c in sorted(cells, key=key)[:k]:
            full[c] = True
        return cls(full, sink, recent, planned=planned, name=name or f"top {fraction:.0%}", **kw)

    @classmethod
    def random(cls, shape: tuple[int, int], n_full: int, *, sink: int, recent: int, seed: int, planned=None,
               **kw) -> "KVPlan":
        """`n_full` planned KV heads drawn uniformly (a private generator seeded by `seed`) keep the full cache."""
        planned = np.ones(shape[0], bool) if planned is None else np.asarray(planned, bool)
        cells = [(l, h) for l in range(shape[0]) if planned[l] for h in range(shape[1])]
        if not 0 <= n_full <= len(cells):
            raise ValueError(f"cannot make {n_full} of {len(cells)} planned KV heads full")
        full = np.zeros(shape, bool)
        for i in np.random.default_rng(seed).choice(len(cells), size=n_full, replace=False):
            full[cells[i]] = True
        return cls(full, sink, recent, planned=planned, name=f"random {seed}", **kw)

    @property
    def n_planned(self) -> int:
        return int(self.planned.sum()) * self.full.shape[1]

    @property
    def n_full(self) -> int:
        """Planned KV heads that keep the full cache."""
        return int(self.full[self.planned].sum())

    @property
    def fraction_full(self) -> float:
        return self.n_full / self.n_planned if self.n_planned else math.nan

    def streaming_heads(self) -> list[tuple[int, int]]:
        """(layer, KV head) of every streaming head, in order."""
        return [(int(l), int(h)) for l, h in zip(*np.nonzero(~self.full))]

    def kept_keys(self, n_tokens: int) -> np.ndarray:
        """[layer, kv_head]: the keys each head's cache holds after `n_tokens` tokens."""
        kept = np.full(self.full.shape, n_tokens, dtype=np.int64)
        kept[~self.full] = min(n_tokens, self.sink + self.recent)
        for l, w in enumerate(self.own_window):
            if w is not None:
                kept[l] = np.minimum(kept[l], w)
        return kept

    def kv_bytes(self, n_tokens: int, *, head_dim: int, bytes_per_value: int) -> int:
        """The cache's bytes after `n_tokens` tokens: kept keys × 2 (keys and values) × head size × bytes."""
        return int(self.kept_keys(n_tokens).sum()) * 2 * head_dim * bytes_per_value

    def pattern_table(self) -> str:
        """DuoAttention's `full_attention_heads.tsv`: one line per layer, one tab-separated 1/0 per KV head."""
        return "".join("\t".join("1" if f else "0" for f in row) + "\n" for row in self.full)

    def pattern_config(self) -> dict:
        """DuoAttention's `config.json` beside the table."""
        return {"sink_size": self.sink, "recent_size": self.recent}

    def to_frame(self) -> pd.DataFrame:
        rows = [{"layer": l, "kv_head": h, "planned": bool(self.planned[l]), "full": bool(self.full[l, h])}
                for l in range(self.full.shape[0]) for h in range(self.full.shape[1])]
        return pd.DataFrame(rows)


def default_window(context: int) -> tuple[int, int]:
    """DuoAttention's sink 128 and recent 256 keys: the window it keeps on every model it serves, Llama-3-8B's
    8k-token context the shortest; a model with a shorter context gets them scaled down by context / 8192 (at
    least 4 and 16 keys), a longer one keeps them.

    >>> default_window(32768), default_window(8192), default_window(2048)
    ((128, 256), (128, 256), (32, 64))
    """
    scale = min(1.0, context / 8192)
    return max(4, round(128 * scale)), max(16, round(256 * scale))


def gate_table(gates: np.ndarray) -> str:
    r"""Learned gates [layer, KV head] as DuoAttention's training writes `full_attention_heads.tsv` (its loader
    clips to [0, 1] and keeps the heads above a threshold or a sparsity): one line per layer, tab-separated; a
    layer not planned (NaN) is 1, run as the model runs it.

    >>> gate_table(np.array([[0.25, 1.0], [np.nan, np.nan]]))
    '0.25\t1\n1\t1\n'
    """
    g = np.where(np.isfinite(gates), gates, 1.0)
    return "".join("\t".join(f"{v:.6g}" for v in row) + "\n" for row in g)
