"""Gradient head importance (Michel et al. 2019, "Are sixteen heads really better than one?").

Every head's output is multiplied by a gate ξ_h = 1 (`interventions.head_mask`), and

    I_h = E_x | ∂L(x) / ∂ξ_h |

is the expected first-order change of the loss if the head were removed. The gate is per example,
so the absolute value is taken per example, as Michel et al. do, within a batch. Scores are then
normalised per layer by their L2 norm over the heads of the layer (Michel et al.'s code does the
same), so they compare heads within a layer and rank heads across layers on a common scale.

The loss L:
- decoders: the mean next-token cross-entropy of the text (Michel et al.'s language-model loss);
- encoders: there is no pretraining head to score (minilm ships without its MLM head), and the
  sentence embedding's similarity to itself has zero gradient at ξ = 1; so L is the L2 norm of the
  sentence embedding (mean of the final hidden states over the tokens). I_h is then how much the
  embedding's length moves per unit of gate — a first-order sensitivity, not a task loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch
import torch.nn.functional as F

from .encoding import check_texts, encode_many, pad_batch
from .forward import attention_layers, base_model
from .images import for_input
from .interventions import head_mask, refuse_seq2seq
from .model import LoadedModel
from .progress import progress as progress_bar

__all__ = ["HeadImportance", "ImportanceLoss", "IMPORTANCE_LOSSES", "gradient_importance", "normalise_per_layer"]

ImportanceLoss = Literal["next_token_loss", "embedding_norm"]
IMPORTANCE_LOSSES: dict[str, str] = {
    "next_token_loss": "mean next-token cross-entropy of each text (nats)",
    "embedding_norm": "L2 norm of the mean-pooled sentence embedding (no MLM head to score an encoder)",
}


@dataclass(frozen=True, eq=False)
class HeadImportance:
    """`raw[layer, head]` = E|∂L/∂ξ| and `importance` = raw normalised per layer, over `n` texts; `layers`: the
    layers that have heads (None: all), the rows of the others NaN (a hybrid stack's Mamba layers, Mllama's
    cross-attention layers: no head mask reaches them)."""

    model: str
    loss: ImportanceLoss
    raw: torch.Tensor  # [layer, head]
    importance: torch.Tensor  # [layer, head]
    n: int
    layers: tuple[int, ...] | None = None

    def to_frame(self):
        """Tidy rows `(model, layer, head, importance, n)` of the layers with heads, strongest first."""
        import pandas as pd

        L, H = self.importance.shape
        rows = [{"model": self.model, "layer": l, "head": h, "importance": float(self.importance[l, h]), "n": self.n}
                for l in (range(L) if self.layers is None else self.layers) for h in range(H)]
        frame = pd.DataFrame(rows, columns=["model", "layer", "head", "importance", "n"])
        return frame.sort_values(["importance", "layer", "head"], ascending=[False, True, True]).reset_index(drop=True)


def normalise_per_layer(scores: torch.Tensor) -> torch.Tensor:
    """Divide each layer's row `[layer, head]` by its L2 norm (a zero row stays zero).

    >>> normalise_per_layer(torch.tensor([[3.0, 4.0], [0.0, 0.0]]))
    tensor([[0.6000, 0.8000],
            [0.0000, 0.0000]])
    """
    norm = scores.pow(2).sum(-1, keepdim=True).sqrt()
    return scores / norm.clamp_min(1e-20)


def gradient_importance(lm: LoadedModel, texts: Sequence[str], *, batch_size: int = 8, truncate: bool = False,
                        loss: ImportanceLoss | None = None, progress: bool = False) -> HeadImportance:
    """Michel et al.'s head importance of every head of `lm` over `texts`.

    The model's weights get no gradient (they are not leaves we ask for) and are never changed.
    `progress`: a bar on stderr, one step per text.
    """
    lm = for_input(lm, images=False)  # a two-tower model's text tower; an image model: one line
    refuse_seq2seq(lm, "head importance")
    get = getattr(lm.model, "get_output_embeddings", None)
    head = lm.is_causal and get is not None and get() is not None  # CLIP's causal text tower has no LM head
    loss = loss or ("next_token_loss" if head else "embedding_norm")
    if loss not in IMPORTANCE_LOSSES:
        raise ValueError(f"loss must be one of {', '.join(IMPORTANCE_LOSSES)}, got {loss!r}")
    if loss == "next_token_loss" and not head:
        raise ValueError(f"{lm.name} has no language-model head{'' if lm.is_causal else ' (an encoder)'}: it has no "
                         "next-token loss; use loss='embedding_norm'")
    items = encode_many(lm, check_texts(texts), truncate=truncate)
    L, H = lm.config.num_hidden_layers, lm.config.num_attention_heads
    total = torch.zeros(L, H, dtype=torch.float64)
    bar = progress_bar(total=len(items), enabled=progress, desc=f"{lm.name} importance", unit="text")
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        ids, mask = pad_batch(chunk, lm.device)
        xi = torch.ones(len(chunk), L, H, device=lm.device, dtype=torch.float32, requires_grad=True)  # (B, L, H)
        with torch.enable_grad(), head_mask(lm, xi):
            per_text = _LOSSES[loss](lm, ids, mask)  # (B,)
            (grad,) = torch.autograd.grad(per_text.sum(), xi)  # (B, L, H): each example's own gradient
        total += grad.abs().sum(0).double().cpu()
        bar.update(len(chunk))
    bar.close()
    raw = (total / len(items)).float()
    have = attention_layers(lm)
    raw[[l for l in range(L) if l not in have]] = float("nan")  # a layer without heads: no gradient, no score
    return HeadImportance(model=lm.name, loss=loss, raw=raw, importance=normalise_per_layer(raw), n=len(items),
                          layers=None if len(have) == L else tuple(have))


def _next_token_loss(lm: LoadedModel, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    logits = lm.model(input_ids=ids, attention_mask=mask, use_cache=False).logits  # (B, T, V)
    nll = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none")  # (B, T-1)
    real = mask[:, 1:].to(nll.dtype)
    return (nll * real).sum(1) / real.sum(1).clamp_min(1)


def _embedding_norm(lm: LoadedModel, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    h = base_model(lm)(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state  # (B, T, D)
    m = mask[..., None].to(h.dtype)
    return ((h * m).sum(1) / m.sum(1)).float().norm(dim=-1)


_LOSSES = {"next_token_loss": _next_token_loss, "embedding_norm": _embedding_norm}
