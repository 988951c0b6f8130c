"""What a sink is made of, read off the model: attention and value norms per head, the residual stream,
and forward passes under a sliding-window mask (the StreamingLLM test). The statistics are in
`analyses.sinks`; `headscope.sinks` composes both.

    head_internals(lm, texts)      per text: attention P [layer, head, query, key], the norm of each key's
                                   value vector ‖v_j‖ [layer, head, key] and Kobayashi's norm-based weights
                                   α_ij ‖f(x_j)‖ [layer, head, query, key] — the from-scratch attention
                                   (`scratch.attention_from_scratch`) on each layer's input caught from one
                                   real forward pass, as `probe.norms` does
    residual_stream(lm, ids)       the residual stream after every block, (B, L, T, D), by forward hooks
    window_mask(T, window, keep)   which keys a query sees: the last `window` keys (itself included)
                                   plus the first `keep` tokens, causal
    token_nll(lm, ids, window=, keep=)  per-position next-token loss under that mask, the mask given to the
                                   model's own attention as a 4-D additive mask (eager or SDPA); positions
                                   stay the model's own 0..T-1 (StreamingLLM re-numbers positions inside its
                                   rolling cache; here only the keys are masked)

Nothing here changes the model: hooks are removed on exit, also after an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F

from .encoding import ModelBatch, token_labels
from .families import family_for
from .forward import base_model, forward_one_stream
from .hooks import catch, first_output
from .model import LoadedModel
from .norms import norm_weights, scratch_batches

__all__ = ["HeadInternals", "head_internals", "residual_stream", "block_modules",
           "window_mask", "token_nll", "special_frame"]


@dataclass(frozen=True, eq=False)
class HeadInternals:
    """One text's attention, value norms and norm-based weights, padding removed."""

    text: str
    labels: tuple[str, ...]
    probs: torch.Tensor  # [layer, head, query, key]
    value_norms: torch.Tensor  # [layer, head, key]: ‖v_j‖ of the value vector query head h reads at key j
    norm_weights: torch.Tensor  # [layer, head, query, key]: α_ij ‖f(x_j)‖, f = W_O^h v_j (Kobayashi et al. 2020)


@torch.inference_mode()
def head_internals(lm: LoadedModel, texts: str | Sequence[str], *, batch_size: int = 8,
                   truncate: bool = False) -> Iterator[HeadInternals]:
    """Per text, in input order: its `HeadInternals` (float32, CPU)."""
    for batch, computed in scratch_batches(lm, texts, batch_size=batch_size, truncate=truncate):
        probs, vnorms, nweights = [], [], []
        for spec, r in computed:
            per_head, _ = norm_weights(r, spec.wo)
            probs.append(r.probs.float().cpu())  # (B, nh, T, T)
            vnorms.append(r.values.norm(dim=-1).float().cpu())  # (B, nh, T)
            nweights.append(per_head.float().cpu())
        P, V, N = torch.stack(probs, 1), torch.stack(vnorms, 1), torch.stack(nweights, 1)  # (B, L, nh, ...)
        for b, e in enumerate(batch):
            n = len(e.ids)
            yield HeadInternals(text=e.text, labels=token_labels(lm, e), probs=P[b, :, :, :n, :n].clone(),
                                value_norms=V[b, :, :, :n].clone(), norm_weights=N[b, :, :, :n, :n].clone())


@torch.inference_mode()
def block_modules(lm: LoadedModel) -> list[torch.nn.Module]:
    """The transformer blocks of the base model, one per layer: the items of the module list that holds
    each layer's attention module (`Family.attention`)."""
    family = family_for(lm.config)
    family.require_attention_everywhere(lm.config, "the residual stream by block")
    base = base_model(lm)
    family.require_own_modules(base, lm.config, "the residual stream by block")
    n = family.n_layers(lm.config)
    first = family.attention(base, 0)
    for module in base.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n and any(m is first for m in module[0].modules()):
            if all(any(m is family.attention(base, i) for m in module[i].modules()) for i in range(n)):
                return list(module)
    raise RuntimeError(f"{lm.name}: no list of {n} transformer blocks holds the attention modules")


@torch.inference_mode()
def residual_stream(lm: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    """The residual stream after each block, for token-id sequences `ids` (B, T): (B, L, T, D), float32, CPU.

    Caught by a forward hook on every block (its output's first element), so no final norm is applied."""
    blocks = block_modules(lm)
    ids = ids.to(lm.device)
    with catch(dict(enumerate(blocks)), take=lambda out: first_output(out).detach().float().cpu()) as caught:
        forward_one_stream(lm, ModelBatch(mask=torch.ones_like(ids), ids=ids), output_attentions=False)
    return torch.stack([caught.get(i) for i in range(len(blocks))], dim=1)  # type: ignore[misc]


def window_mask(T: int, window: int | None, keep: int = 0) -> torch.Tensor:
    """(T, T) bool: query i sees key j when j <= i and (j > i - window or j < keep); window None: every j <= i.

    >>> window_mask(5, 2, 1).int().tolist()
    [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 1, 1, 0], [1, 0, 0, 1, 1]]
    """
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    seen = j <= i
    if window is not None:
        if window < 1:
            raise ValueError(f"window must be at least 1 key, got {window}")
        seen = seen & ((j > i - window) | (j < keep))
    return seen


def _additive(allowed: torch.Tensor, dtype: torch.dtype, device) -> torch.Tensor:
    """(1, 1, T, T): 0 where allowed, the dtype's minimum elsewhere — transformers' own eager mask values."""
    mask = torch.zeros((), dtype=dtype, device=device)
    return torch.where(allowed.to(device), mask, torch.finfo(dtype).min)[None, None]


def _model_masks(lm: LoadedModel, T: int, window: int | None, keep: int):
    """The 4-D mask for the model's layers: one tensor, or for a model with several layer types (Gemma 3's
    sliding and full layers) one per type, each sliding layer keeping its own window too."""
    dtype = next(lm.model.parameters()).dtype
    allowed = window_mask(T, window, keep)
    types = list(dict.fromkeys(getattr(lm.config, "layer_types", None) or ()))
    if len(types) <= 1:
        own = getattr(lm.config, "sliding_window", None) if types == ["sliding_attention"] else None
        if own is not None:
            allowed = allowed & window_mask(T, own, 0)
        return _additive(allowed, dtype, lm.device)
    masks = {}
    for t in types:
        a = allowed & window_mask(T, lm.config.sliding_window, 0) if t == "sliding_attention" else allowed
        masks[t] = _additive(a, dtype, lm.device)
    return masks


@torch.inference_mode()
def token_nll(lm: LoadedModel, ids: Sequence[int] | torch.Tensor, *, window: int | None = None,
              keep: int = 0) -> torch.Tensor:
    """Next-token loss (nats) at positions 1..T-1 of one token sequence under `window_mask(T, window, keep)`:
    (T-1,) float64, CPU. `window=None` is dense causal attention, given as the same explicit mask."""
    if not lm.is_causal:
        raise ValueError(f"the StreamingLLM test needs a decoder; {lm.name} is an encoder")
    ids = torch.as_tensor(ids, dtype=torch.long).reshape(1, -1).to(lm.device)
    T = ids.shape[1]
    if T < 2:
        raise ValueError("the text needs at least 2 tokens")
    positions = torch.arange(T, device=lm.device)[None]
    logits = lm.model(input_ids=ids, attention_mask=_model_masks(lm, T, window, keep), position_ids=positions,
                      use_cache=False).logits  # (1, T, V)
    return F.cross_entropy(logits[0, :-1].float(), ids[0, 1:], reduction="none").double().cpu()


def special_frame(lm: LoadedModel) -> tuple[list[int], list[int]]:
    """The special token ids the tokenizer puts before and after a text ([CLS] … [SEP], <bos> …)."""
    tok = lm.tokenizer
    plain = list(tok("a", add_special_tokens=False)["input_ids"])
    full = list(tok("a", add_special_tokens=True)["input_ids"])
    at = next((i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain), 0)
    return full[:at], full[at + len(plain):]
