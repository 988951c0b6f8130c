"""Norm-based attention (Kobayashi et al. 2020, "Attention is not only a weight").

A head's output at query i is Σ_j α_ij f(x_j), with f(x_j) = (x_j W_V^h + b_V^h) W_O^h the value
vector of key j carried through the head's own slice of the output projection. The size of what
key j contributes is

    per head   ‖α_ij f^h(x_j)‖ = α_ij ‖f^h(x_j)‖                      [layer, head, query, key]
    per layer  ‖Σ_h α^h_ij f^h(x_j)‖   (the heads' vectors summed, then the norm: Kobayashi's
                                       layer-level analysis; not the sum of the heads' norms)

W_O's bias is left out (it does not depend on j). α and v are the from-scratch attention's
(`scratch.attention_from_scratch`), run on each layer's input caught from one real forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator, Sequence

import torch

from .encoding import check_texts, encode_many, token_labels
from .families import family_for
from .forward import base_model
from .model import LoadedModel
from .scratch import LayerSpec, ScratchResult, attention_from_scratch
from .types import AttentionMap
from .verify import capture

__all__ = ["NormAttention", "norm_attention", "norm_weights", "norm_weighted"]


@dataclass(frozen=True, eq=False)
class NormAttention:
    """Norm-based attention of one text: per head `[layer, head, query, key]` and per layer `[layer, query, key]`."""

    text: str
    labels: tuple[str, ...]
    token_ids: tuple[int, ...]
    per_head: torch.Tensor  # [layer, head, query, key]
    per_layer: torch.Tensor  # [layer, query, key]
    meta: dict
    layers: tuple[int, ...] = ()  # the model's layer number of each row (a hybrid stack's attention layers); all when empty

    @property
    def layer_ids(self) -> tuple[int, ...]:
        return self.layers or tuple(range(self.per_head.shape[0]))


def norm_weights(result: ScratchResult, wo: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(per head (B, nh, T, T), per layer (B, T, T)) from one layer's from-scratch result and W_O (D, nh*hs)."""
    B, nh, T, hs = result.values.shape
    wo_h = wo.to(result.values.dtype).view(wo.shape[0], nh, hs)  # (D, nh, hs): head h's columns of W_O
    if result.gate is not None:  # gated attention: what key j adds at query i is W_O^h (g_i ⊙ v_j), per pair
        f = torch.einsum("bhis,bhjs,dhs->bhijd", result.gate, result.values, wo_h)  # (B, nh, T, T, D)
        per_head = result.probs * f.norm(dim=-1)  # α_ij ‖f_i(x_j)‖: (B, nh, T, T)
        summed = torch.einsum("bhij,bhijd->bijd", result.probs, f)  # (B, T, T, D)
        return per_head, summed.norm(dim=-1)
    f = torch.einsum("bhjs,dhs->bhjd", result.values, wo_h)  # (B, nh, T, D) value through W_O^h
    per_head = result.probs * f.norm(dim=-1)[:, :, None, :]  # α_ij ‖f(x_j)‖: (B, nh, T, T)
    summed = torch.einsum("bhij,bhjd->bijd", result.probs, f)  # Σ_h α^h_ij f^h(x_j): (B, T, T, D)
    return per_head, summed.norm(dim=-1)


def scratch_batches(lm: LoadedModel, texts: str | Sequence[str], *, batch_size: int = 8, truncate: bool = False
                    ) -> Iterator[tuple[list, Iterator[tuple[LayerSpec, ScratchResult]]]]:
    """The texts in padded batches of `batch_size`, in input order: each batch's encodings and, lazily, each
    attention layer's `LayerSpec` and from-scratch attention over it, computed from the model's own layer
    inputs (caught in one forward pass)."""
    family = family_for(lm.config)
    base = base_model(lm)
    encoded = encode_many(lm, check_texts(texts), truncate=truncate)

    def layers(batch):
        cap = capture(lm, batch, family)
        for i in family.attention_layers(lm.config):  # a hybrid stack's layers without attention have no spec
            spec = family.layer_spec(base, i, lm.config)
            x = cap.inputs[i]
            yield spec, attention_from_scratch(x, spec, cap.key_valid.to(x.device), kv=spec.kv_input(cap.inputs))

    for start in range(0, len(encoded), batch_size):
        batch = encoded[start : start + batch_size]
        yield batch, layers(batch)


@torch.inference_mode()
def norm_attention(lm: LoadedModel, texts: str | Sequence[str], *, batch_size: int = 8,
                   truncate: bool = False) -> list[NormAttention]:
    """Norm-based attention of each text, padding removed, in input order."""
    family = family_for(lm.config)
    out: list[NormAttention] = []
    have = family.attention_layers(lm.config)
    rows = () if len(have) == family.n_layers(lm.config) else have
    for batch, computed in scratch_batches(lm, texts, batch_size=batch_size, truncate=truncate):
        heads, layers = [], []
        for spec, r in computed:
            ph, pl = norm_weights(r, spec.wo)
            heads.append(ph.float().cpu())
            layers.append(pl.float().cpu())
        per_head = torch.stack(heads, dim=1)  # (B, L, nh, T, T)
        per_layer = torch.stack(layers, dim=1)  # (B, L, T, T)
        for b, e in enumerate(batch):
            n = len(e.ids)
            out.append(NormAttention(text=e.text, labels=token_labels(lm, e), token_ids=e.ids,
                                     per_head=per_head[b, :, :, :n, :n].clone(), per_layer=per_layer[b, :, :n, :n].clone(),
                                     meta={"model": lm.name, "weight": "norm"}, layers=rows))
    return out


def norm_weighted(amap: AttentionMap, norm: NormAttention) -> AttentionMap:
    """`amap` (token level) with its values replaced by `norm`'s per-head weights, each query row divided by
    its sum: the share of key j in the size of what the head adds at query i, Σ_j = 1 like attention.

    Only `amap`'s layers and heads are kept; `meta["weight"]` (and `amap.weight`) say "norm".
    """
    if amap.level != "token" or norm.token_ids != amap.token_ids:
        raise ValueError("norm weights go onto the token-level map of the same text")
    row = {layer: r for r, layer in enumerate(norm.layer_ids)}
    w = norm.per_head[[row[layer] for layer in amap.layer_ids]][:, list(amap.head_ids)]  # [layer, head, query, key]
    w = w / w.sum(-1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny)
    return replace(amap, attention=w.to(amap.attention.dtype), meta={**amap.meta, "weight": "norm"})
