"""Head clusters (Clark et al. 2019, Fig. 6): the mean Jensen-Shannon distance between every pair of heads'
attention rows over a corpus, embedded in 2-D by metric MDS (scikit-learn), labelled by each head's top role.
Maps only, no model.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from headscope.probe.types import AttentionMap, head_name

__all__ = ["head_distances", "embed_heads", "head_clusters"]


def _js_rows(p: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon distance (base 2, in [0, 1]) between every pair of heads, summed over rows.

    `p[head, row, key]` -> `[head, head]`.
    """
    p = p.double()
    plogp = torch.special.xlogy(p, p).sum(-1)  # [head, row]: -entropy
    out = torch.zeros(p.shape[0], p.shape[0], dtype=torch.float64)
    for i in range(p.shape[0]):
        m = (p[i : i + 1] + p) / 2  # [head, row, key]
        js = (0.5 * (plogp[i : i + 1] + plogp) - torch.special.xlogy(m, m).sum(-1)) / math.log(2)  # [head, row]
        out[i] = js.clamp_min(0).sqrt().sum(-1)
    return out


def head_distances(maps: Sequence[Sequence[AttentionMap]]) -> tuple[np.ndarray, pd.DataFrame]:
    """Mean Jensen-Shannon distance between the attention rows of every pair of heads, over a corpus.

    `maps[model][text]`: one list of maps per model, the same texts in the same order. Heads of several
    models are compared row by row, so their units must match text by text (same labels).
    Returns `(distance [head, head], heads)` where `heads` lists `model, layer, head, name` per row.
    """
    if not maps or not maps[0]:
        raise ValueError("head_distances needs at least one model with at least one map")
    n_texts = len(maps[0])
    if any(len(m) != n_texts for m in maps):
        raise ValueError("every model needs a map of each text, in the same order")
    total, rows = None, 0
    for t in range(n_texts):
        group = [m[t] for m in maps]
        if any(g.labels != group[0].labels for g in group[1:]):
            raise ValueError(f"text {t}: the models' units differ ({list(group[0].labels)[:8]} ... vs "
                             f"{list(group[1].labels)[:8]} ...); heads can be compared only on the same units")
        p = torch.cat([g.attention.reshape(-1, len(g), len(g)) for g in group])  # [all heads, query, key]
        d = _js_rows(p)
        total = d if total is None else total + d
        rows += len(group[0])
    meta = [{"model": g.meta.get("model", f"model{k}"), "layer": layer, "head": head, "name": head_name(layer, head)}
            for k, g in enumerate(m[0] for m in maps) for layer in g.layer_ids for head in g.head_ids]
    dist = (total / rows).numpy()
    np.fill_diagonal(dist, 0.0)
    return (dist + dist.T) / 2, pd.DataFrame(meta, columns=["model", "layer", "head", "name"])


def embed_heads(distance: np.ndarray, *, seed: int = 0) -> np.ndarray:
    """2-D coordinates whose distances approximate `distance` (scikit-learn's metric MDS, seeded)."""
    from sklearn.manifold import MDS

    mds = MDS(n_components=2, metric="precomputed", init="random", n_init=4, random_state=seed,
              normalized_stress="auto")
    return mds.fit_transform(np.asarray(distance, dtype=np.float64))


def _top_roles(roles: pd.DataFrame | Mapping[str, str] | None) -> dict[tuple[str | None, str], str]:
    """(model or None, head name) -> role: the first role listed for each head (analyses.heads.assign_roles order)."""
    if roles is None:
        return {}
    if isinstance(roles, Mapping):
        return {(None, k): v for k, v in roles.items()}
    out: dict = {}
    for row in roles.itertuples():
        key = (getattr(row, "model", None), head_name(row.layer, row.head))
        out.setdefault(key, row.role)
    return out


def head_clusters(distance: np.ndarray, heads: pd.DataFrame, *, roles=None, seed: int = 0) -> pd.DataFrame:
    """`heads` with 2-D MDS coordinates `x, y` and each head's top `role` ("" where it has none).

    `roles`: a roles table (columns `layer, head, role`, optionally `model`; e.g. from
    `analyses.heads.assign_roles`) or a mapping head name -> role; computed elsewhere, never here.
    """
    xy = embed_heads(distance, seed=seed)
    top = _top_roles(roles)
    role = [top.get((m, n), top.get((None, n), "")) for m, n in zip(heads["model"], heads["name"])]
    return heads.assign(x=xy[:, 0], y=xy[:, 1], role=role)
