"""The results probe's engines return, as plain data: the verification, the direct logit and QK
attributions, composition and copying scores, a generation's attention, an explanation of one head.

The engines that compute them (`probe.verify`, `probe.attribution`, `probe.composition`,
`probe.generate`, `probe.explain`) run models; this module runs none (torch, numpy and pandas only),
so `analyses` and `reports` read these types without loading a model's code. Their methods compute
only from the values they hold; their notebook views are drawn in `reports.views`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np
import pandas as pd
import torch

from .types import AttentionMap, Viewable, head_name, position

__all__ = ["LayerCheck", "Verification", "DLAResult", "QKAttribution", "CompositionScores", "CopyingScores",
           "GenerationAttention", "Stop", "Explanation", "PermutationCheck"]

Stop = Literal["max_new_tokens", "eos"]  # why a generation ended


# --------------------------------------------------------------------------------------------
# Verification: the from-scratch attention against the model's own


@dataclass(frozen=True)
class LayerCheck:
    layer: int
    max_abs_err: float  # attention probabilities
    max_rel_err: float
    max_abs_err_output: float  # attention block output after W_O
    max_rel_err_output: float
    passed: bool
    kind: str | None = None  # encoder-decoder models: "encoder", "decoder" or "cross"; None for one stack

    def row(self) -> dict:
        """The table row; the kind only where there is one (single-stack rows are unchanged)."""
        row = asdict(self)
        if self.kind is None:
            del row["kind"]
        return row


@dataclass(frozen=True)
class Verification(Viewable):
    """How well the from-scratch attention reproduced the model, layer by layer."""

    model: str
    family: str
    dtype: str
    tolerance: float
    tolerance_output: float
    n_heads: int
    n_texts: int
    n_tokens: int
    layers: tuple[LayerCheck, ...]
    seconds_forward: float
    seconds_recompute: float
    no_attention: tuple[int, ...] = ()  # hybrid stacks: the model's layers without softmax attention (none checked)
    # a two-tower model (CLIP, SigLIP): each tower's own verification, by name ("image tower", "text tower");
    # `layers` then holds both towers' rows, each row's kind naming its tower
    towers: tuple[tuple[str, "Verification"], ...] = ()

    @property
    def passed(self) -> bool:
        return bool(self.layers) and all(c.passed for c in self.layers)

    @property
    def max_abs_err(self) -> float:
        """The largest probability |Δ| over the rows that have probabilities (a vision encoder whose attention
        returns no weights, Qwen-VL's, is checked on outputs alone: its rows hold nan)."""
        return max((c.max_abs_err for c in self.layers if not math.isnan(c.max_abs_err)), default=math.nan)

    @property
    def max_abs_err_output(self) -> float:
        return max(c.max_abs_err_output for c in self.layers)

    @property
    def max_rel_err_output(self) -> float:
        return max(c.max_rel_err_output for c in self.layers)

    @property
    def overhead(self) -> float:
        """Recomputation time as a fraction of the forward pass."""
        return self.seconds_recompute / max(self.seconds_forward, 1e-9)

    def summary(self) -> str:
        """One line for every result and report: what was verified and how closely.

        >>> v = Verification("m", "bert", "float32", 1e-5, 1e-5, 12, 1, 9,
        ...     (LayerCheck(0, 3e-7, 1e-6, 1e-6, 2e-7, True),), 0.1, 0.05)
        >>> v.summary()
        'attention verified: max |Δ| = 3.0e-07 over 1 layers × 12 heads (tolerance 1e-05, float32)'
        """
        verdict = "verified" if self.passed else "NOT verified"
        if self.towers:
            parts = "; ".join(f"{name} ({v.family}) max |Δ| = {v.max_abs_err:.1e} over {len(v.layers)} layers × "
                              f"{v.n_heads} heads" for name, v in self.towers)
            return f"attention {verdict}: {parts} (tolerance {self.tolerance:g}, {self.dtype})"
        hybrid = (f"; no softmax attention in layers {', '.join(map(str, self.no_attention))} (hybrid stack)"
                  if self.no_attention else "")
        blind = list(dict.fromkeys(c.kind or "all" for c in self.layers if math.isnan(c.max_abs_err)))
        outputs = (f"; {' and '.join(blind)} layers checked on their outputs only (their attention returns no weights)"
                   if blind else "")
        return (
            f"attention {verdict}: max |Δ| = {self.max_abs_err:.1e} over {self._layer_count()} layers × {self.n_heads} heads"
            f" (tolerance {self.tolerance:g}, {self.dtype}){hybrid}{outputs}"
        )

    def _layer_count(self) -> str:
        kinds = [c.kind for c in self.layers]
        if None in kinds:
            return str(len(self.layers))
        return " + ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds))  # e.g. "2 encoder + 2 decoder + 2 cross"

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "family": self.family,
            "dtype": self.dtype,
            "tolerance": self.tolerance,
            "tolerance_output_relative": self.tolerance_output,
            "passed": self.passed,
            "max_abs_err": self.max_abs_err,
            "max_abs_err_output": self.max_abs_err_output,
            "max_rel_err_output": self.max_rel_err_output,
            "n_layers": len(self.layers),
            "no_softmax_attention_layers": list(self.no_attention),
            "n_heads": self.n_heads,
            "n_texts": self.n_texts,
            "n_tokens": self.n_tokens,
            "seconds_forward": self.seconds_forward,
            "seconds_recompute": self.seconds_recompute,
            "overhead": self.overhead,
            "summary": self.summary(),
            # a row with no probability to compare (Qwen-VL's vision layers, checked on outputs): null, not NaN
            "layers": [{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in c.row().items()}
                       for c in self.layers],
            **({"towers": {name: v.to_dict() for name, v in self.towers}} if self.towers else {}),
        }

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([c.row() for c in self.layers])


# --------------------------------------------------------------------------------------------
# Attribution: the logit and one head's score split into parts


@dataclass(frozen=True, eq=False)
class DLAResult(Viewable):
    """The next-token logit (or logit difference) at a prompt's last token split into the stream's parts.

    `table`: one row per part (component, kind, layer, head, value); `total` the model's own logit
    (difference) before any final softcap; the parts sum to it within `identity_abs_err`.
    """

    model: str
    prompt: str
    answer: str
    wrong: str | None
    answer_id: int
    wrong_id: int | None
    total: float
    table: pd.DataFrame
    identity_abs_err: float
    attention_abs_err: float  # each layer's heads + bias against W_O's own output (max |Δ| over layers)
    final_norm_abs_err: float  # the frozen final norm against the model's own
    softcap: float | None = None  # Gemma 2's final logit softcap: applied after the decomposition
    capped_total: float | None = None
    n_layers: int = 0
    n_heads: int = 0
    labels: tuple[str, ...] = field(default=())

    @property
    def identity_rel_err(self) -> float:
        return self.identity_abs_err / max(abs(self.total), 1e-12)

    answer_token: str | None = None  # the token scored (a string answer's first token), where it differs
    wrong_token: str | None = None

    @property
    def what(self) -> str:
        def shown(given: str, token: str | None) -> str:  # 'logit(' Mar' (first token of ' Mary'))': what was scored
            return repr(given) if token is None or token == given else f"{token!r} (first token of {given!r})"

        return (f"logit({shown(self.answer, self.answer_token)}) − logit({shown(self.wrong, self.wrong_token)})"
                if self.wrong is not None else f"logit({shown(self.answer, self.answer_token)})")

    def grid(self) -> pd.DataFrame:
        """Head values as a layer × head frame (index: layer, columns: head)."""
        heads = self.table[self.table["kind"] == "head"]
        return heads.pivot(index="layer", columns="head", values="value").astype(float)

    def top(self, k: int = 5) -> pd.DataFrame:
        """The k parts with the largest |value|."""
        return self.table.reindex(self.table["value"].abs().sort_values(ascending=False).index).head(k)

    def identity(self) -> str:
        return (f"parts sum to {self.table['value'].sum():.6g}, the model's {self.total:.6g} "
                f"(|Δ| = {self.identity_abs_err:.1e}, relative {self.identity_rel_err:.1e})")

    def summary(self) -> str:
        top = ", ".join(f"{r.component} {r.value:+.3f}" for r in self.top(3).itertuples())
        cap = ("" if self.softcap is None else
               f"; the model caps logits at {self.softcap:g} after this (capped: {self.capped_total:.4f})")
        return (f"{self.model}: {self.what} after {self.prompt!r} = {self.total:.4f}; largest parts {top}; "
                f"{self.identity()}{cap}")

    def to_frame(self) -> pd.DataFrame:
        return self.table

    def to_dict(self) -> dict:
        return {"model": self.model, "prompt": self.prompt, "answer": self.answer, "wrong": self.wrong,
                "answer_id": self.answer_id, "wrong_id": self.wrong_id, "answer_token": self.answer_token,
                "wrong_token": self.wrong_token, "total": self.total,
                "sum_of_components": float(self.table["value"].sum()),
                "identity_abs_err": self.identity_abs_err, "identity_rel_err": self.identity_rel_err,
                "attention_abs_err": self.attention_abs_err, "final_norm_abs_err": self.final_norm_abs_err,
                "softcap": self.softcap, "capped_total": self.capped_total,
                "components": [{"component": r.component, "value": float(r.value)} for r in self.table.itertuples()]}


@dataclass(frozen=True, eq=False)
class QKAttribution(Viewable):
    """One head's pre-softmax score for one (query, key) split over (query part, key part) pairs.

    `terms` (query parts × key parts, a DataFrame) holds scale · q_a · k_b; `extra` the terms that are
    not bilinear (a position bias, the softcap's change); together they sum to `score`, the
    from-scratch attention's score, within `identity_abs_err`. `weight_without` is the softmax weight
    of the key when one part is removed from one side (the others and every other key unchanged).
    """

    model: str
    text: str
    layer: int
    head: int
    query: int
    key: int
    query_label: str
    key_label: str
    score: float
    weight: float
    terms: pd.DataFrame
    extra: dict
    identity_abs_err: float
    input_abs_err: float  # the attention input rebuilt from the parts against the model's own
    weight_without: pd.DataFrame  # side, component, weight, change

    def to_frame(self) -> pd.DataFrame:
        """One row per (query part, key part) pair: query_component, key_component, value."""
        long = self.terms.stack().reset_index()
        long.columns = ["query_component", "key_component", "value"]
        return long

    def top(self, k: int = 5) -> pd.DataFrame:
        f = self.to_frame()
        return f.reindex(f["value"].abs().sort_values(ascending=False).index).head(k)

    def summary(self) -> str:
        best = self.top(1).iloc[0]
        # A term's sign says which way it moves the score; a share of the score (-38%, 140%) reads wrongly when
        # the terms have mixed signs, so the term is given as what it adds.
        effect = "raises" if best["value"] > 0 else "lowers"
        return (f"{head_name(self.layer, self.head)} attends from {self.query_label!r} to {self.key_label!r} with weight "
                f"{self.weight:.3f} (score {self.score:.4g}); the largest term, key-side {best['key_component']} × "
                f"query-side {best['query_component']}, adds {best['value']:+.4g} (it {effect} the score); the terms "
                f"sum to the from-scratch score within {self.identity_abs_err:.1e}")

    def to_dict(self) -> dict:
        return {"model": self.model, "text": self.text, "layer": self.layer, "head": self.head,
                "query": self.query, "key": self.key, "query_label": self.query_label, "key_label": self.key_label,
                "score": self.score, "weight": self.weight, "sum_of_terms": float(self.terms.to_numpy().sum())
                + sum(self.extra.values()), "identity_abs_err": self.identity_abs_err,
                "input_abs_err": self.input_abs_err, "extra": self.extra,
                "top": self.top(20).to_dict(orient="records"),
                "weight_without": self.weight_without.to_dict(orient="records"), "summary": self.summary()}


# --------------------------------------------------------------------------------------------
# Composition and copying between heads


@dataclass(frozen=True, eq=False)
class CompositionScores(Viewable):
    """Q-, K- and V-composition of every earlier head A into every later head B, and the random baseline.

    `scores[kind]` is `[layer_a, head_a, layer_b, head_b]` (NaN where layer_b <= layer_a).
    """

    model: str
    scores: dict[str, np.ndarray]
    baseline: dict[str, float]

    def to_frame(self) -> pd.DataFrame:
        """One row per (kind, sender, receiver): score, baseline, score / baseline."""
        rows = []
        for kind, s in self.scores.items():
            idx = np.argwhere(np.isfinite(s))
            for la, ha, lb, hb in idx:
                v = float(s[la, ha, lb, hb])
                rows.append((kind, head_name(la, ha), head_name(lb, hb), int(la), int(ha), int(lb), int(hb), v,
                             self.baseline[kind], v / self.baseline[kind]))
        return pd.DataFrame(rows, columns=["kind", "sender", "receiver", "sender_layer", "sender_head",
                                           "receiver_layer", "receiver_head", "score", "baseline", "ratio"])

    def top(self, k: int = 10, kind: str | None = None) -> pd.DataFrame:
        f = self.to_frame()
        if kind is not None:
            f = f[f["kind"] == kind]
        return f.sort_values("ratio", ascending=False).head(k)

    def summary(self) -> str:
        parts = []
        for kind in self.scores:
            t = self.top(1, kind)
            if len(t):
                r = t.iloc[0]
                parts.append(f"{kind}: {r.sender} → {r.receiver} {r.score:.3f} ({r.ratio:.1f}× random {r.baseline:.3f})")
        return f"{self.model} composition, strongest edge per kind — " + "; ".join(parts)

    def to_dict(self, k: int = 10) -> dict:
        """The baselines and the `k` strongest edges of each kind."""
        return {"model": self.model, "baseline": dict(self.baseline),
                "top": {kind: self.top(k, kind).drop(columns="kind").to_dict(orient="records") for kind in self.scores}}


@dataclass(frozen=True, eq=False)
class CopyingScores(Viewable):
    """OV copying score Σλ / Σ|λ| of every head's full OV circuit W_E W_OV W_U: `scores[layer, head]`."""

    model: str
    scores: np.ndarray  # [layer, head]
    n_tokens: int  # the vocabulary the circuit spans (all of it unless `tokens` was given)

    def to_frame(self) -> pd.DataFrame:
        rows = [(head_name(l, h), l, h, float(self.scores[l, h])) for l in range(self.scores.shape[0])
                for h in range(self.scores.shape[1])]
        return pd.DataFrame(rows, columns=["head", "layer", "head_index", "copying"])

    def grid(self) -> pd.DataFrame:
        return pd.DataFrame(self.scores, index=pd.Index(range(self.scores.shape[0]), name="layer"),
                            columns=pd.Index(range(self.scores.shape[1]), name="head"))

    def top(self, k: int = 10) -> pd.DataFrame:
        return self.to_frame().sort_values("copying", ascending=False).head(k)

    def summary(self) -> str:
        t = self.top(3)
        best = ", ".join(f"{r.head} {r.copying:+.3f}" for r in t.itertuples())
        share = float((self.scores > 0.5).mean())
        return (f"{self.model} OV copying (Σλ/Σ|λ| of W_E W_OV W_U over {self.n_tokens} tokens): highest {best}; "
                f"{share:.0%} of heads above 0.5")


# --------------------------------------------------------------------------------------------
# Generation


@dataclass(frozen=True, eq=False)
class GenerationAttention:
    """A greedy continuation of `prompt.text` and the attention row of every generated token.

    `steps[t]` is `[layer, head, key]` over `key_labels(t)` = the prompt's tokens + generated[:t+1].
    """

    model: str
    prompt: AttentionMap  # token level: the prompt's own [layer, head, query, key]
    generated_ids: tuple[int, ...]
    generated_tokens: tuple[str, ...]  # each id decoded alone, as it reads in the text
    steps: tuple[torch.Tensor, ...]  # [layer, head, key], key = len(prompt) + t + 1
    stopped: Stop
    sampling: dict = dataclasses.field(default_factory=lambda: {"temperature": 0.0})  # how tokens were picked
    prompt_turns: tuple[str, ...] = ()  # chat: each prompt token's turn (system / user / assistant); else empty

    def turns(self, step: int) -> tuple[str, ...]:
        """The turn of each key of `steps[step]` (chat prompts; empty otherwise)."""
        return self.prompt_turns + ("assistant",) * (step + 1) if self.prompt_turns else ()

    def __len__(self) -> int:
        return len(self.generated_ids)

    @property
    def text(self) -> str:
        return "".join(self.generated_tokens)

    def key_labels(self, step: int) -> tuple[str, ...]:
        """Labels of the keys of `steps[step]`: the prompt's tokens, then the generated ones up to `step`."""
        return self.prompt.labels + self.generated_tokens[: step + 1]

    def head_rows(self, layer: int, head: int) -> tuple[torch.Tensor, ...]:
        """Head `layer`.`head` (the model's numbers; a hybrid's layers without attention have none) at every
        step: its row over that step's keys."""
        li = position(self.prompt.layer_ids, layer, "layer", where=self.model, no_attention=self.prompt.no_attention)
        hi = position(self.prompt.head_ids, head, "head", where=self.model)
        return tuple(row[li, hi] for row in self.steps)

    def to_dict(self) -> dict:
        """JSON-ready: prompt and generated tokens, and each step's `[layer, head, key]` row."""
        return {
            "model": self.model, "prompt": self.prompt.text, "prompt_tokens": list(self.prompt.labels),
            "text": self.text, "generated_ids": list(self.generated_ids),
            "generated_tokens": list(self.generated_tokens), "stopped": self.stopped, "sampling": dict(self.sampling),
            **({"prompt_turns": list(self.prompt_turns)} if self.prompt_turns else {}),
            "steps": [{"step": t, "token": tok, "id": i, "attention": row.tolist()}
                      for t, (tok, i, row) in enumerate(zip(self.generated_tokens, self.generated_ids, self.steps))],
        }


# --------------------------------------------------------------------------------------------
# One head explained


@dataclass(frozen=True, eq=False)
class Explanation(Viewable):
    """Step-by-step attention of one query token in one head, with the model's real numbers."""

    text: str
    query: str
    query_index: int
    layer: int
    head: int
    scale: float
    # One row per key: key, raw_score, [position_bias], [position_scores], scaled_score, weight, value_norm,
    # contribution_norm; scaled_score = raw_score × scale + position_bias + position_scores (see `explain`).
    table: pd.DataFrame
    output_norm: float  # ‖Σ_j w_j v_j‖
    model_weight_max_abs_err: float  # our weights vs the model's own attention for this row
    check: dict | None = None  # recompute mode: the eager check on the text's prefix, which gives the error above
    sink_share: float = 0.0  # the share of the row that went to the head's learned sink (gpt-oss): 1 − Σ weight

    def to_frame(self) -> pd.DataFrame:
        return self.table

    def summary(self) -> str:
        top = self.table.sort_values("weight", ascending=False).head(3)
        parts = ", ".join(f"{k!r} {w:.3f}" for k, w in zip(top["key"], top["weight"]))
        sink = f", the learned sink {self.sink_share:.3f}" if self.sink_share else ""
        return (f"{head_name(self.layer, self.head)}, query {self.query!r}: scores q·k × {self.scale:.4g}, softmax → "
                f"largest weights {parts}{sink}; output norm {self.output_norm:.3f} "
                f"(matches the model's weights to {self.model_weight_max_abs_err:.1e})")


@dataclass(frozen=True)
class PermutationCheck:
    """Does permuting the tokens permute layer `layer`'s attention? (max |P(πx) − πP(x)π|)

    `exact` compares the deviation without positions with the model's dtype tolerance (the one
    `verify` uses); the summary's verdict follows it.
    """

    layer: int
    n_tokens: int
    permutation: tuple[int, ...]
    max_dev_without_positions: float  # ~1e-7: attention itself is permutation-equivariant
    max_dev_with_positions: float  # large: positions are what tell the model the order
    tolerance: float = 1e-5  # `verify.tolerances(dtype)`: below it, "permuted exactly"

    @property
    def exact(self) -> bool:
        """Without positions, is the attention the permuted original (within `tolerance`)?"""
        return self.max_dev_without_positions <= self.tolerance

    def to_dict(self) -> dict:
        return {"layer": self.layer, "n_tokens": self.n_tokens, "permutation": list(self.permutation),
                "max_dev_without_positions": self.max_dev_without_positions,
                "max_dev_with_positions": self.max_dev_with_positions, "tolerance": self.tolerance,
                "exact": self.exact}

    def summary(self) -> str:
        dev = f"max |Δ| = {self.max_dev_without_positions:.1e}, tolerance {self.tolerance:g}"
        if self.exact:
            verdict = f"without position information the attention is permuted exactly ({dev})"
        else:
            verdict = (f"without position information the attention is NOT permuted exactly ({dev}): "
                       "some order information was not removed")
        return (f"layer {self.layer}, {self.n_tokens} tokens shuffled: {verdict}; with positions it changes "
                f"(max |Δ| = {self.max_dev_with_positions:.2f})")
