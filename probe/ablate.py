"""Knock heads out and see what the model then prefers: the causal check behind a head probe.

Attention weight is not importance: a head can look at the right word and not matter. Here a
head is *zero-ablated* — its slice of the input to the attention output projection (the
concatenated head outputs; each family in `probe/families/` names that module) is set to zero
at every position — and a decoder's preference between continuations is measured before and after,
against ablating random heads of the same number.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch

from .extract import base_model
from .families import UnsupportedArchitecture, family_of_type
from .loading import LoadedModel
from .types import head_name

__all__ = ["output_projections", "ablate_heads", "option_logprobs", "CausalCheck", "causal_check"]


def output_projections(lm: LoadedModel) -> dict[int, torch.nn.Module]:
    """Layer index -> the module that mixes that layer's heads (its input is `[..., head * head_dim]`)."""
    try:
        family = family_of_type(lm.model_type)
    except UnsupportedArchitecture as exc:
        raise ValueError(f"{lm.name}: cannot find the attention output projections for head ablation; {exc}") from None
    base = base_model(lm)
    return {i: family.out_proj(base, i) for i in range(family.n_layers(lm.config))}


def _head_dim(lm: LoadedModel) -> int:
    cfg = lm.config
    return int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)


@contextmanager
def ablate_heads(lm: LoadedModel, heads: Iterable[tuple[int, int]]) -> Iterator[None]:
    """Within the block, the output of each (layer, head) is zero at every position.

    Hooks are removed on exit, also after an error. The caller's inputs are never modified (the
    hook works on a copy).
    """
    heads = sorted(set((int(l), int(h)) for l, h in heads))
    n_layers, n_heads = lm.config.num_hidden_layers, lm.config.num_attention_heads
    bad = [(l, h) for l, h in heads if not (0 <= l < n_layers and 0 <= h < n_heads)]
    if bad:
        raise ValueError(f"heads {bad} out of range: {lm.name} has layers 0..{n_layers - 1} and heads 0..{n_heads - 1}")
    proj = output_projections(lm)
    hd = _head_dim(lm)
    by_layer: dict[int, list[int]] = {}
    for l, h in heads:
        by_layer.setdefault(l, []).append(h)

    def make_hook(cols: list[int]):
        def hook(module, args):
            x = args[0].clone()  # (B, T, n_heads * head_dim)
            for h in cols:
                x[..., h * hd : (h + 1) * hd] = 0
            return (x, *args[1:])

        return hook

    handles = [proj[l].register_forward_pre_hook(make_hook(cols)) for l, cols in by_layer.items()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _require_lm_head(lm: LoadedModel) -> None:
    get = getattr(lm.model, "get_output_embeddings", None)
    if not lm.is_causal or get is None or get() is None:
        raise ValueError(f"{lm.name} does not predict the next word (no language-model head); the causal check "
                         "needs a decoder such as smollm2")


@torch.inference_mode()
def option_logprobs(lm: LoadedModel, prompts: Sequence[str], options: Sequence[Sequence[str]], *,
                    batch_size: int = 8) -> list[list[float]]:
    """log P(option | prompt), summed over the option's tokens, for each prompt and each of its options.

    Only the tokens that condition a prediction are run: the prompt plus all but the last token of
    an option. Options that share those (single-token options, or a shared first word such as
    " the") share one forward pass.
    """
    _require_lm_head(lm)
    tok = lm.tokenizer
    special = set(getattr(tok, "all_special_ids", []))
    wanted: list[list[tuple[tuple[int, ...], list[int]]]] = []  # per prompt, per option: (context, option ids)
    for i, (prompt, opts) in enumerate(zip(prompts, options, strict=True)):
        p_ids = list(tok(prompt)["input_ids"])
        while p_ids and p_ids[-1] in special and len(p_ids) > 1:  # an appended EOS/SEP is no context
            p_ids.pop()
        row = []
        for opt in opts:
            o_ids = list(tok(opt, add_special_tokens=False)["input_ids"])
            if not o_ids:
                raise ValueError(f"option {opt!r} of prompt {i} is empty after tokenisation")
            if len(p_ids) + len(o_ids) > lm.max_length:
                raise ValueError(f"prompt {i} and option {opt!r} exceed {lm.name}'s {lm.max_length} tokens")
            row.append((tuple(p_ids + o_ids[:-1]), o_ids))
        wanted.append(row)
    # For each context, the (position, token) log-probabilities the options need.
    needed: dict[tuple[int, ...], set[tuple[int, int]]] = {}
    for row in wanted:
        for ctx, o_ids in row:
            start = len(ctx) - len(o_ids)  # position whose prediction is the option's first token
            needed.setdefault(ctx, set()).update((start + j, t) for j, t in enumerate(o_ids))
    contexts = sorted(needed, key=len)
    value: dict[tuple[tuple[int, ...], int, int], float] = {}
    for first in range(0, len(contexts), batch_size):
        chunk = contexts[first : first + batch_size]
        t_max = max(len(c) for c in chunk)
        ids = torch.zeros(len(chunk), t_max, dtype=torch.long)
        mask = torch.zeros(len(chunk), t_max, dtype=torch.long)
        for b, c in enumerate(chunk):
            ids[b, : len(c)] = torch.tensor(c)
            mask[b, : len(c)] = 1
        logits = lm.model(input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device), use_cache=False).logits
        lp = torch.log_softmax(logits.float(), dim=-1)  # (B, T, vocab)
        for b, c in enumerate(chunk):
            for pos, t in needed[c]:
                value[(c, pos, t)] = float(lp[b, pos, t])
    out = []
    for row in wanted:
        vals = []
        for ctx, o_ids in row:
            start = len(ctx) - len(o_ids)
            vals.append(sum(value[(ctx, start + j, t)] for j, t in enumerate(o_ids)))
        out.append(vals)
    return out


@dataclass(frozen=True)
class CausalCheck:
    """How ablating `heads` moves the model's preference for the right option, against random heads.

    `preference` per example = log P(right option) - max log P(other options); `delta` = mean change
    when `heads` are ablated; `random_deltas` the same for random head sets of the same size;
    `p_value` = (1 + #random sets that lower the preference at least as much) / (1 + n_random).
    """

    model: str
    heads: tuple[tuple[int, int], ...]
    n: int
    preference_before: float
    preference_after: float
    delta: float
    right_before: int  # examples where the right option is preferred
    right_after: int
    random_deltas: tuple[float, ...]
    p_value: float
    verdict: str

    def to_dict(self) -> dict:
        return {
            "model": self.model, "heads": [{"layer": l, "head": h} for l, h in self.heads], "n": self.n,
            "preference_before": self.preference_before, "preference_after": self.preference_after,
            "delta": self.delta, "right_before": self.right_before, "right_after": self.right_after,
            "random_deltas": list(self.random_deltas), "p_value": self.p_value, "verdict": self.verdict,
        }


def _preference(logps: list[list[float]], answers: Sequence[int]) -> np.ndarray:
    out = []
    for vals, a in zip(logps, answers):
        others = [v for j, v in enumerate(vals) if j != a]
        out.append(vals[a] - max(others))
    return np.asarray(out)


def causal_check(lm: LoadedModel, prompts: Sequence[str], options: Sequence[Sequence[str]], answers: Sequence[int],
                 heads: Sequence[tuple[int, int]], *, n_random: int = 19, seed: int = 0,
                 batch_size: int = 8) -> CausalCheck:
    """Ablate `heads`, then `n_random` random sets of as many other heads, and compare the preference shifts.

    With 19 random sets the smallest possible p-value is 0.05.
    """
    _require_lm_head(lm)
    if not heads:
        raise ValueError("no heads to ablate")
    heads = tuple(sorted(set((int(l), int(h)) for l, h in heads)))
    n_layers, n_heads = lm.config.num_hidden_layers, lm.config.num_attention_heads
    before = _preference(option_logprobs(lm, prompts, options, batch_size=batch_size), answers)
    with ablate_heads(lm, heads):
        after = _preference(option_logprobs(lm, prompts, options, batch_size=batch_size), answers)
    others = [(l, h) for l in range(n_layers) for h in range(n_heads) if (l, h) not in heads]
    rng = np.random.default_rng(seed)
    random_deltas = []
    for _ in range(n_random):
        pick = [others[i] for i in rng.choice(len(others), size=len(heads), replace=False)]
        with ablate_heads(lm, pick):
            shifted = _preference(option_logprobs(lm, prompts, options, batch_size=batch_size), answers)
        random_deltas.append(float((shifted - before).mean()))
    delta = float((after - before).mean())
    p = (1 + sum(d <= delta for d in random_deltas)) / (1 + n_random)
    names = "+".join(head_name(l, h) for l, h in heads)
    rd = np.asarray(random_deltas)
    n = len(before)
    verdict = (f"ablating {names} moves the preference for the right option by {delta:+.3f} nats on average "
               f"(right preferred in {int((before > 0).sum())}/{n} -> {int((after > 0).sum())}/{n}); "
               f"{n_random} random sets of {len(heads)} head(s): {rd.mean():+.3f} ± {rd.std(ddof=1) if n_random > 1 else 0:.3f}; "
               + (f"a larger drop than random (p = {p:.2g})." if p < 0.05 and delta < 0 else
                  f"not a larger drop than random heads give (p = {p:.2g})."))
    return CausalCheck(model=lm.name, heads=heads, n=n, preference_before=float(before.mean()),
                       preference_after=float(after.mean()), delta=delta, right_before=int((before > 0).sum()),
                       right_after=int((after > 0).sum()), random_deltas=tuple(random_deltas), p_value=p,
                       verdict=verdict)
