"""Attention sinks, as numbers (no model): shares on the first positions, the sink rate, massive
activations, dormant calls from ablation, and the StreamingLLM perplexities.

**Shares.** `first_k_share(P, k, causal=...)` is a head's attention on the first k positions,
Σ_{j<k} P[q, j], averaged over the queries that count for that key set — those outside it and able to
see it (`analyses.metrics.outside_and_seeing`, the rows of the `first_token` metric; k = 1 is that
metric at token level). The same on Kobayashi et al.'s norm-based weights α_ij‖f(x_j)‖ (rows
normalised) is the *norm share*: how much of what the head adds comes from the sink.

**Sink rate** (Gu et al. 2025, "When attention sink emerges in language models"): over sequences of
`length` tokens, α^{l,h}_k = the mean over sequences and over *all* queries t of Σ_{j<k} P[t, j]; the
rate Sink_k^ε = the share of heads with α > ε (their ε = 0.3, k = 1, length 64). Its 95% interval is a
percentile bootstrap over sequences (heads' α recomputed on each resample).

**Massive activations** (Sun et al. 2024, "Massive activations in large language models"): an
activation of the residual stream (after a block) is massive when |a| > 100 and |a| > 1000 × the
median |a| of that layer's residual stream (their criterion, `MASSIVE_ABS` and `MASSIVE_RATIO`).

**Dormant heads** (Guo et al. 2024; Kobayashi et al. 2020): a sink head (first share > ε) is called
dormant only from ablation — its single-head (mean) ablation is not stronger than random heads
ablated alone (empirical p > α, `analyses.evidence.AblationEvidence.head_effect`) *and* its effect
is no larger than the random heads' median. Attention alone never makes the call.

**StreamingLLM** (Xiao et al. 2024): perplexity = exp(mean next-token loss) under dense causal
attention, a sliding window of W keys, and the window plus the first s tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from headscope.probe.names import Stronger
from headscope.probe.types import head_name

from .ablation import ALPHA
from .evidence import AblationEvidence
from .metrics import outside_and_seeing

__all__ = ["first_k_share", "sequence_mass", "SinkRate", "sink_rate", "massive_activations", "dormant_calls",
           "SinkReport", "StreamingResult", "MASSIVE_ABS", "MASSIVE_RATIO", "SINK_EPSILON", "SINK_LENGTH"]

SINK_EPSILON = 0.3  # Gu et al.'s ε
SINK_LENGTH = 64  # Gu et al.'s sequence length
MASSIVE_ABS = 100.0  # Sun et al.: |a| above 100 ...
MASSIVE_RATIO = 1000.0  # ... and about 1000× the median magnitude of the layer's hidden state


def first_k_share(weights: torch.Tensor, k: int, *, causal: bool) -> torch.Tensor:
    """[layer, head, query, key] weights (rows need not sum to 1: they are normalised) -> [layer, head]: the
    share on keys 0..k-1, averaged over the queries outside that set that can see it (NaN when none).

    >>> P = torch.tensor([[[[1.0, 0, 0], [0.5, 0.5, 0], [0.25, 0.25, 0.5]]]])
    >>> first_k_share(P, 1, causal=True)   # queries 1 and 2: (0.5 + 0.25) / 2
    tensor([[0.3750]])
    """
    T = weights.shape[-1]
    w = weights / weights.sum(-1, keepdim=True).clamp_min(torch.finfo(weights.dtype).tiny)
    member = [j < k for j in range(T)]
    rows = torch.tensor(outside_and_seeing(member, causal=causal))
    if not rows.any():
        return torch.full(weights.shape[:2], float("nan"))
    return w[..., rows, :k].sum(-1).mean(-1)


def sequence_mass(attention: torch.Tensor, k_max: int = 4) -> torch.Tensor:
    """(B, L, H, T, T) attention -> (B, L, H, k_max): for k = 1..k_max, Σ_{j<k} P[t, j] averaged over every query t
    (Gu et al.'s α per sequence)."""
    return attention[..., :k_max].cumsum(-1).mean(-2)


@dataclass(frozen=True)
class SinkRate:
    """Sink_k^ε over `n_sequences` sequences of `length` tokens of `source`, with its bootstrap 95% interval."""

    source: str  # "text", "random", or the replaced first token ("first: another token", ...)
    k: int
    epsilon: float
    length: int
    n_sequences: int
    value: float
    ci95: tuple[float, float]
    mean_mass: float  # α averaged over all heads

    def to_dict(self) -> dict:
        return {"source": self.source, "k": self.k, "epsilon": self.epsilon, "length": self.length,
                "n_sequences": self.n_sequences, "value": self.value, "ci95": list(self.ci95),
                "mean_mass": self.mean_mass}


def sink_rate(mass: torch.Tensor | np.ndarray, *, k: int = 1, epsilon: float = SINK_EPSILON, source: str = "text",
              length: int = SINK_LENGTH, n_boot: int = 1000, seed: int = 0) -> SinkRate:
    """`mass` (N sequences, L, H, k_max) from `sequence_mass` -> Sink_k^ε with a percentile bootstrap over sequences.

    >>> m = np.zeros((4, 1, 2, 1)); m[:, 0, 0, 0] = 0.9   # one head of two sinks on every sequence
    >>> r = sink_rate(m, k=1); r.value, r.ci95
    (0.5, (0.5, 0.5))
    """
    m = np.asarray(mass, dtype=float)[..., k - 1]  # (N, L, H)
    if m.shape[0] == 0:
        raise ValueError("the sink rate needs at least one sequence")
    value = float((m.mean(0) > epsilon).mean())
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, m.shape[0], size=(n_boot, m.shape[0]))
    boot = np.array([(m[d].mean(0) > epsilon).mean() for d in draws])
    low, high = (float(v) for v in np.quantile(boot, [0.025, 0.975]))
    return SinkRate(source=source, k=k, epsilon=epsilon, length=length, n_sequences=int(m.shape[0]), value=value,
                    ci95=(low, high), mean_mass=float(m.mean()))


def massive_activations(states: torch.Tensor, tokens: Sequence[Sequence[str]], *, top: int = 3,
                        layers: Sequence[int] | None = None) -> pd.DataFrame:
    """The `top` largest |activations| of each layer's residual stream, at distinct (position, dim) pairs (each
    the largest over the sequences), with Sun et al.'s criterion.

    `states` is (N, L, T, D) (`probe.sinks.residual_stream`), `tokens[n][t]` the label of token t of sequence n.
    Rows: layer, sequence, position, token, dim, value (signed), ratio_to_median (|a| over the median |a| of
    the layer over all sequences, positions and dims), massive (|a| > MASSIVE_ABS and ratio > MASSIVE_RATIO).
    """
    N, L, T, D = states.shape
    layers = list(range(L)) if layers is None else list(layers)
    rows = []
    for i, layer in enumerate(layers):
        a = states[:, i]  # (N, T, D)
        mag = a.abs()
        median = float(mag.median())
        peak, seq = mag.max(0)  # (T, D): the largest over sequences, and which one
        vals, flat = peak.reshape(-1).topk(min(top, peak.numel()))
        for v, f in zip(vals.tolist(), flat.tolist()):
            t, d = divmod(f, D)
            n = int(seq[t, d])
            ratio = v / median if median > 0 else math.inf
            rows.append({"layer": layer, "sequence": n, "position": t, "token": tokens[n][t], "dim": d,
                         "value": float(a[n, t, d]), "ratio_to_median": ratio,
                         "massive": bool(v > MASSIVE_ABS and ratio > MASSIVE_RATIO)})
    return pd.DataFrame(rows)


def dormant_calls(first_share: np.ndarray, single: np.ndarray, *, stronger: Stronger, effect_metric: str,
                  description: str = "", epsilon: float = SINK_EPSILON, n_random: int = 19, seed: int = 0,
                  method: str = "mean", n_texts: int = 0, model: str = "") -> pd.DataFrame:
    """Per head: is it a sink (first share > ε), its single-head ablation effect against `n_random` other heads
    ablated alone (`AblationEvidence.head_effect`), and the dormant call for sink heads (None for the others).

    `first_share` and `single` are [layer, head]; `single` the effect of ablating each head alone.
    """
    evidence = AblationEvidence(model=model, method=method, effect_metric=effect_metric, description=description,
                                stronger=stronger, n_texts=n_texts, single=np.asarray(single, dtype=float),
                                n_random=n_random, seed=seed)
    L, H = np.asarray(first_share).shape
    rows = []
    for l in range(L):
        for h in range(H):
            e = evidence.head_effect(l, h)
            sink = bool(first_share[l, h] > epsilon)
            p = e.p_value
            if e.random_effects:
                median = float(np.median(e.random_effects))
                weaker = e.effect <= median if stronger == "higher" else e.effect >= median
            else:
                weaker = False
            dormant = (bool(p is not None and p > ALPHA and weaker)) if sink else None
            rows.append({"layer": l, "head": h, "sink": sink, "ablation_effect": e.effect,
                         "random_median": float(np.median(e.random_effects)) if e.random_effects else math.nan,
                         "ablation_p": p, "dormant": dormant})
    return pd.DataFrame(rows)


@dataclass(frozen=True, eq=False)
class SinkReport:
    """Everything `headscope.sinks` found about one model's sinks (see the module docstring)."""

    model: str
    heads: pd.DataFrame  # per head: layer, head, first_share_1..4, value_norm_ratio, norm_share, sink, dormant, ...
    rates: tuple[SinkRate, ...]  # the text sequences first, then random tokens, then the replaced first tokens
    massive: pd.DataFrame  # massive_activations rows
    settings: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def sink_rate(self) -> SinkRate:
        """The rate on the texts (Gu et al.'s protocol)."""
        return self.rates[0]

    def rate(self, source: str) -> SinkRate | None:
        return next((r for r in self.rates if r.source == source), None)

    @property
    def first_massive_layer(self) -> int | None:
        """The first layer whose residual stream holds a massive activation (Sun et al.'s criterion)."""
        hits = self.massive[self.massive["massive"]] if len(self.massive) else self.massive
        return None if not len(hits) else int(hits["layer"].min())

    def to_frame(self) -> pd.DataFrame:
        """The per-head table, a `model` and a `head_name` column first."""
        frame = self.heads.copy()
        frame.insert(0, "head_name", [head_name(int(l), int(h)) for l, h in zip(frame["layer"], frame["head"])])
        frame.insert(0, "model", self.model)
        return frame

    def rates_frame(self) -> pd.DataFrame:
        return pd.DataFrame([{**r.to_dict(), "ci95_low": r.ci95[0], "ci95_high": r.ci95[1]} for r in self.rates]
                            ).drop(columns="ci95")

    def to_dict(self) -> dict:
        r = self.sink_rate
        heads = [{"layer": int(x.layer), "head": int(x.head), "first_share": float(x.first_share_1),
                  "first_shares": [float(getattr(x, f"first_share_{k}")) for k in range(1, 5)
                                   if f"first_share_{k}" in self.heads.columns],
                  "value_norm_ratio": float(x.value_norm_ratio), "norm_share": float(x.norm_share),
                  "sink": bool(x.sink),
                  "dormant": None if "dormant" not in self.heads.columns or x.dormant is None or
                  (isinstance(x.dormant, float) and math.isnan(x.dormant)) else bool(x.dormant),
                  "ablation_p": None if "ablation_p" not in self.heads.columns or pd.isna(x.ablation_p)
                  else float(x.ablation_p)}
                 for x in self.heads.itertuples()]
        return {
            "model": self.model,
            "sink_rate": {"k": r.k, "epsilon": r.epsilon, "value": r.value, "ci95": list(r.ci95),
                          "length": r.length, "n_sequences": r.n_sequences},
            "rates": [x.to_dict() for x in self.rates],
            "heads": heads,
            "massive": [{"layer": int(m.layer), "position": int(m.position), "token": str(m.token), "dim": int(m.dim),
                         "value": float(m.value), "ratio_to_median": float(m.ratio_to_median),
                         "massive": bool(m.massive)} for m in self.massive.itertuples()],
            "first_massive_layer": self.first_massive_layer,
            "criterion": f"massive: |a| > {MASSIVE_ABS:g} and |a| > {MASSIVE_RATIO:g} × the layer's median |a| "
                         "(Sun et al. 2024)",
            "settings": dict(self.settings), "notes": list(self.notes),
        }


def _ppl(nll: np.ndarray) -> float:
    return float(math.exp(float(np.mean(nll))))


@dataclass(frozen=True, eq=False)
class StreamingResult:
    """Per-position next-token losses of one text under dense attention, a window of `window` keys, and the
    window plus the first s = 1..`keep` tokens (`sink_window[s]`)."""

    model: str
    n_tokens: int
    window: int
    keep: int
    dense: np.ndarray  # (n_tokens - 1,) nats, the loss of token t+1 at index t
    window_only: np.ndarray
    sink_window: Mapping[int, np.ndarray]  # s -> losses
    source: str = ""

    @property
    def dense_ppl(self) -> float:
        return _ppl(self.dense)

    @property
    def window_ppl(self) -> float:
        return _ppl(self.window_only)

    @property
    def sink_window_ppl(self) -> float:
        """With the first `keep` tokens kept."""
        return _ppl(self.sink_window[self.keep])

    def beyond_window(self, nll: np.ndarray) -> float:
        """Perplexity over the positions whose query sees more than `window` keys (where the masks differ)."""
        part = np.asarray(nll)[self.window:]
        return _ppl(part) if len(part) else math.nan

    def to_frame(self) -> pd.DataFrame:
        """One row per predicted position: position (of the predicted token), dense, window, sink_window_<s>."""
        frame = pd.DataFrame({"position": np.arange(1, self.n_tokens), "dense": self.dense, "window": self.window_only})
        for s, v in self.sink_window.items():
            frame[f"sink_window_{s}"] = v
        return frame

    def to_dict(self) -> dict:
        return {
            "model": self.model, "n_tokens": self.n_tokens, "window": self.window, "keep": self.keep,
            "dense_ppl": self.dense_ppl, "window_ppl": self.window_ppl, "sink_window_ppl": self.sink_window_ppl,
            "sink_window_ppls": {str(s): _ppl(v) for s, v in self.sink_window.items()},
            "beyond_window": {"dense_ppl": self.beyond_window(self.dense),
                              "window_ppl": self.beyond_window(self.window_only),
                              "sink_window_ppl": self.beyond_window(self.sink_window[self.keep])},
            "source": self.source,
            "positions": "the model's own 0..T-1; only keys are masked (StreamingLLM re-numbers positions in its cache)",
        }
