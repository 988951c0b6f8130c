"""Weight-based circuits: Q-, K- and V-composition scores between every pair of heads (Elhage et al. 2021).

For heads A (layer a) and B (layer b > a), in the row-vector convention x ↦ x W:

    W_OV(A) = W_V,Aᵀ W_O,Aᵀ   (D × D)     what A reads and writes
    W_QK(B) = W_Q,Bᵀ W_K,B    (D × D)     the bilinear form of B's score (grouped-query heads: their shared KV head)

    Q-composition  ‖W_OV(A) W_QK(B)‖_F  / (‖W_OV(A)‖_F ‖W_QK(B)‖_F)
    K-composition  ‖W_OV(A) W_QK(B)ᵀ‖_F / (‖W_OV(A)‖_F ‖W_QK(B)‖_F)
    V-composition  ‖W_OV(A) W_OV(B)‖_F  / (‖W_OV(A)‖_F ‖W_OV(B)‖_F)

(TransformerLens's `all_composition_scores` formula.) Weights as headscope reads them (`LayerSpec`),
with each layer's pre-attention norm weight folded into the weights that read the stream (Gemma:
1 + w), and the post-attention norm weight, where there is one, into W_O; no centring and no biases.
Each score is computed through hs × hs matrices (a Frobenius norm of a product of factors is a trace
of small Gram matrices), never through a D × D product. The baseline is the mean score of random
Gaussian factors of the same shapes.

OV copying scores (Elhage et al. 2021): per head, the eigenvalues λ of its full OV circuit
W_E W_OV W_U (vocab × vocab; W_U with the final norm's weight folded in, Gemma: 1 + w) summarised
as Σλ / Σ|λ| — 1 when every eigenvalue is positive (the head copies the tokens it attends to),
−1 when every one is negative. The nonzero eigenvalues of E V O U are those of the hs × hs product
O (U E) V, so the score covers the **whole vocabulary** exactly (no token subset), through one D × D
matrix U E summed in chunks of the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .attribution import require_lm_head, trace
from .errors import UnsupportedFeature
from .model import LoadedModel
from .results import CompositionScores, CopyingScores
from .progress import progress as progress_bar
from .types import seed_value, whole_number

__all__ = ["Factors", "head_factors", "composition_score", "composition_scores", "copying_scores"]


@dataclass(frozen=True, eq=False)
class Factors:
    """Per layer, per head, the factors of W_OV = V O and W_QK = Q K: each (nh, D, hs) or (nh, hs, D), float64."""

    v: list[torch.Tensor]  # (nh, D, hs)  W_V,hᵀ
    o: list[torch.Tensor]  # (nh, hs, D)  W_O,hᵀ
    q: list[torch.Tensor]  # (nh, D, hs)  W_Q,hᵀ
    k: list[torch.Tensor]  # (nh, hs, D)  W_K,g for the head's KV head g


def head_factors(lm: LoadedModel) -> Factors:
    """The folded factors of every head (one short forward pass finds the norms; no weight is changed)."""
    tr = trace(lm, "The")
    v, o, q, k = [], [], [], []
    for l, spec in enumerate(tr.specs):
        if spec.latent is not None:
            raise UnsupportedFeature(f"{lm.name} has multi-head latent attention (DeepSeek): its keys and values are "
                                     "read through a normed low-rank latent, not one matrix of the residual stream; "
                                     "composition scores do not cover it yet")
        if spec.kv_layer is not None:
            raise UnsupportedFeature(f"layer {l} of {lm.name} reuses layer {spec.kv_layer}'s keys and values (shared KV, "
                                     "Gemma 4): its K and V read another layer's stream; composition scores do not "
                                     "cover it yet")
        nh, hs, group = spec.n_heads, spec.head_dim, spec.n_heads // spec.n_kv_heads
        D = spec.wq.shape[1]
        pre = tr.pre_attn[l]
        w_in = torch.ones(D, dtype=torch.float64) if pre is None else pre.weight
        post = tr.post_attn[l]
        w_out = torch.ones(D, dtype=torch.float64) if post is None else post.weight
        wq = spec.wq.double().cpu() * w_in  # (nh*hs, D): the norm's weight folded into the columns that read x
        wk = spec.wk.double().cpu() * w_in
        wv = spec.wv.double().cpu() * w_in
        wo = spec.wo.double().cpu() * w_out[:, None]  # (D, nh*hs)
        kv = torch.arange(nh) // group
        q.append(wq.view(nh, hs, D).transpose(1, 2))
        k.append(wk.view(spec.n_kv_heads, hs, D)[kv])
        v.append(wv.view(spec.n_kv_heads, hs, D)[kv].transpose(1, 2))
        o.append(wo.view(D, nh, hs).permute(1, 2, 0))
    return Factors(v, o, q, k)


def _norm2(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """‖L R‖_F² for (..., D, r) L and (..., r, D) R: trace(Lᵀ L · R Rᵀ)."""
    g = left.transpose(-1, -2) @ left
    h = right @ right.transpose(-1, -2)
    return (g * h.transpose(-1, -2)).sum((-1, -2))


def composition_score(l1: torch.Tensor, r1: torch.Tensor, l2: torch.Tensor, r2: torch.Tensor) -> torch.Tensor:
    """‖(L1 R1)(L2 R2)‖_F / (‖L1 R1‖_F ‖L2 R2‖_F), broadcast: (A, D, r) etc. against (1, B, ...) gives (A, B).

    >>> e = torch.eye(3, dtype=torch.float64)
    >>> x, y = e[:, :1], e[:1]          # x y = e0 e0ᵀ, a rank-1 map of e0 onto itself
    >>> float(composition_score(x, y, x, y)), float(composition_score(x, y, e[:, 1:2], e[1:2]))
    (1.0, 0.0)
    """
    c = r1 @ l2  # (..., r1, r2): the only product through D
    num = _trace_norm(l1, c, r2)
    return torch.sqrt(num / (_norm2(l1, r1) * _norm2(l2, r2)))


def _trace_norm(l1: torch.Tensor, c: torch.Tensor, r2: torch.Tensor) -> torch.Tensor:
    """‖L1 C R2‖_F² = trace(Cᵀ (L1ᵀ L1) C (R2 R2ᵀ))."""
    g = l1.transpose(-1, -2) @ l1  # (..., r1, r1)
    h = r2 @ r2.transpose(-1, -2)  # (..., r2, r2)
    return ((c.transpose(-1, -2) @ g @ c) * h.transpose(-1, -2)).sum((-1, -2))


def composition_scores(lm: LoadedModel, *, n_random: int = 20, seed: int = 0,
                       layers: int | None = None, progress: bool = False) -> CompositionScores:
    """Q-, K- and V-composition scores between every pair of heads in different layers, with the mean
    score of `n_random` random Gaussian factor sets of the same shapes as the baseline. `layers`: only
    the first that many layers (the cost grows with the square of the number of heads). `progress`: a bar on
    stderr, one step per pair of layers.

    >>> from headscope.probe.tiny import tiny_model
    >>> c = composition_scores(tiny_model("llama"))
    >>> c.scores["q"].shape, sorted(c.baseline)
    ((2, 4, 2, 4), ['k', 'q', 'v'])
    """
    n_random = whole_number(n_random, "n_random", minimum=1)  # 0: a baseline of nan and every ratio nan
    seed = seed_value(seed)
    f = head_factors(lm)
    L, nh = len(f.q), f.q[0].shape[0]
    if layers is not None:
        layers = whole_number(layers, "layers", minimum=None)
        if not 1 <= layers <= L:
            raise ValueError(f"layers must be between 1 and {L} for {lm.name}, got {layers}")
        L = layers
    out = {kind: np.full((L, nh, L, nh), np.nan) for kind in ("q", "k", "v")}
    with progress_bar(total=L * (L - 1) // 2, enabled=progress, desc=f"{lm.name} composition", unit="layer pair") as bar:
        for a in range(L):
            l1, r1 = f.v[a][:, None], f.o[a][:, None]  # (nh, 1, D, hs), (nh, 1, hs, D)
            for b in range(a + 1, L):
                qk_l, qk_r = f.q[b][None], f.k[b][None]  # (1, nh, D, hs), (1, nh, hs, D)
                out["q"][a, :, b] = composition_score(l1, r1, qk_l, qk_r).numpy()
                out["k"][a, :, b] = composition_score(l1, r1, qk_r.transpose(-1, -2), qk_l.transpose(-1, -2)).numpy()
                out["v"][a, :, b] = composition_score(l1, r1, f.v[b][None], f.o[b][None]).numpy()
                bar.update()
    g = torch.Generator().manual_seed(seed)
    D, hs = f.q[0].shape[1], f.q[0].shape[2]

    def rnd(*shape):
        return torch.randn(n_random, *shape, generator=g, dtype=torch.float64)

    base = {kind: float(composition_score(rnd(D, hs), rnd(hs, D), rnd(D, hs), rnd(hs, D)).mean())
            for kind in ("q", "k", "v")}
    return CompositionScores(model=lm.name, scores=out, baseline=base)


def _ov_eigenvalues(f: Factors, g: torch.Tensor) -> torch.Tensor:
    """Eigenvalues (L, nh, hs) of each head's O (U E) V — the nonzero eigenvalues of E V O U."""
    return torch.stack([torch.linalg.eigvals(f.o[l] @ g @ f.v[l]) for l in range(len(f.v))])  # (L, nh, hs)


def copying_scores(lm: LoadedModel, *, tokens=None, chunk: int = 8192) -> CopyingScores:
    """OV copying score of every head (decoders): Σλ / Σ|λ| over the eigenvalues λ of W_E W_OV W_U,
    the pre-attention norm's weight folded into W_V and the final norm's weight into W_U, over the
    whole vocabulary (or the token ids `tokens`).

    >>> from headscope.probe.tiny import tiny_model
    >>> c = copying_scores(tiny_model("llama"))
    >>> c.scores.shape, bool(abs(c.scores).max() <= 1)
    ((2, 4), True)
    """
    head = require_lm_head(lm, "OV copying scores")
    f = head_factors(lm)
    tr = trace(lm, "The")
    emb = lm.model.get_input_embeddings().weight.detach()
    unemb = head.weight.detach()
    w_final = torch.ones(emb.shape[1], dtype=torch.float64) if tr.final_norm is None else tr.final_norm.weight
    ids = torch.arange(emb.shape[0]) if tokens is None else torch.as_tensor(list(tokens), dtype=torch.long)
    if not len(ids) or int(ids.min()) < 0 or int(ids.max()) >= min(emb.shape[0], unemb.shape[0]):
        raise ValueError(f"tokens must be ids of {lm.name}'s vocabulary (0 .. {min(emb.shape[0], unemb.shape[0]) - 1})")
    D = emb.shape[1]
    g = torch.zeros(D, D, dtype=torch.float64)  # U E = Σ_t w ⊙ u_t e_tᵀ over the tokens
    for start in range(0, len(ids), chunk):
        part = ids[start : start + chunk]
        e = emb[part.to(emb.device)].double().cpu()  # (n, D)
        u = unemb[part.to(unemb.device)].double().cpu() * w_final  # (n, D)
        g += u.T @ e
    lam = _ov_eigenvalues(f, g)  # (L, nh, hs) complex
    scores = (lam.sum(-1).real / lam.abs().sum(-1).clamp_min(1e-300)).numpy()
    return CopyingScores(model=lm.name, scores=scores, n_tokens=len(ids))

