"""Attention rollout and attention flow (Abnar & Zuidema 2020): which input tokens reach which outputs.

Both take one text's attention `[layer, head, query, key]` and return a token-to-token map
`[query, key]`: how much of output token `query` (after the last layer) comes from input token
`key` (before the first). The residual connection is modelled as in the paper: each layer's
head-averaged attention Ā_l becomes

    A_l = 0.5 · Ā_l + 0.5 · I,   rows renormalised to sum to 1.

- rollout: Ã = A_L · … · A_2 · A_1 (matrix product; rows still sum to 1).
- flow: the layered graph with a node per (layer boundary, token) and an edge from (l, i) to
  (l-1, j) of capacity A_l[i, j]; flow[i, j] is the max-flow from output node (L, i) to input
  node (0, j), each row then normalised to sum to 1 (as the authors' code does). Max-flow is
  scipy's (Dinic); its cost grows with the edges (layers × tokens²) times the tokens² flows, so maps
  with more than `FLOW_MAX_EDGES` edges are refused, and a flow may be bounded in time as well
  (`max_seconds`; the report gives each `FLOW_MAX_SECONDS`).
"""

from __future__ import annotations

from typing import Callable, Literal, Mapping

import torch

__all__ = ["FLOW_MAX_EDGES", "FLOW_MAX_SECONDS", "TOKEN_MAPS", "TokenMap", "flow_fits", "residual_attention", "rollout", "flow"]

TokenMap = Literal["rollout", "flow"]

FLOW_MAX_EDGES = 12_000  # layers × tokens²: e.g. 30 layers × 20 tokens, 12 layers × 31 tokens
FLOW_MAX_SECONDS = 60.0  # what the report gives one flow before it draws a note instead
_UNIT = 2**30  # max-flow capacities are integers: attention weights (at most 1) in units of 2⁻³⁰


def _check(attention: torch.Tensor) -> None:
    if attention.dim() != 4 or attention.shape[-1] != attention.shape[-2]:
        raise ValueError(f"attention must be one text's [layer, head, query, key], got shape {tuple(attention.shape)}")


def residual_attention(attention: torch.Tensor) -> torch.Tensor:
    """`[layer, query, key]`: heads averaged, half identity added for the residual, rows renormalised.

    >>> residual_attention(torch.tensor([[[[0.0, 1.0], [1.0, 0.0]]]]))
    tensor([[[0.5000, 0.5000],
             [0.5000, 0.5000]]], dtype=torch.float64)
    """
    _check(attention)
    a = attention.double().mean(1)  # (L, T, T) heads averaged
    a = 0.5 * a + 0.5 * torch.eye(a.shape[-1], dtype=a.dtype)
    return a / a.sum(-1, keepdim=True)


def rollout(attention: torch.Tensor) -> torch.Tensor:
    """Attention rollout `[query, key]` of one text's `[layer, head, query, key]` attention (float64).

    >>> a = torch.tensor([[[[1.0, 0.0], [1.0, 0.0]]], [[[1.0, 0.0], [1.0, 0.0]]]])  # 2 layers, all to key 0
    >>> rollout(a)
    tensor([[1.0000, 0.0000],
            [0.7500, 0.2500]], dtype=torch.float64)
    """
    layers = residual_attention(attention)
    out = torch.eye(layers.shape[-1], dtype=layers.dtype)
    for a in layers:  # Ã_l = A_l · Ã_{l-1}
        out = a @ out
    return out


def flow_fits(attention: torch.Tensor, *, max_edges: int = FLOW_MAX_EDGES) -> bool:
    """Whether `flow` accepts this `[layer, head, query, key]` attention (layers × tokens² ≤ `max_edges`)."""
    L, _, T, _ = attention.shape
    return L * T * T <= max_edges


def flow(attention: torch.Tensor, *, max_edges: int = FLOW_MAX_EDGES, max_seconds: float | None = None,
         progress: bool | None = False) -> torch.Tensor:
    """Attention flow `[query, key]` of one text's `[layer, head, query, key]` attention (float64).

    Max-flow is scipy's (`scipy.sparse.csgraph.maximum_flow`, Dinic) on capacities in units of 2⁻³⁰
    (integers, as it requires: each flow within about 1e-8 of the exact one). `max_seconds` bounds
    the time: a `TimeoutError` (saying how far it got) once it is spent. `progress`: a progress bar
    on stderr (None: only on a terminal, and only once the flow takes more than a second).

    >>> a = torch.tensor([[[[1.0, 0.0], [1.0, 0.0]]], [[[1.0, 0.0], [1.0, 0.0]]]])
    >>> flow(a)
    tensor([[1.0000, 0.0000],
            [0.6667, 0.3333]], dtype=torch.float64)
    """
    import time

    import numpy as np
    import scipy.sparse as sp
    from scipy.sparse.csgraph import maximum_flow
    from headscope.probe.progress import progress as progress_bar

    layers = residual_attention(attention).numpy()
    L, T, _ = layers.shape
    if L * T * T > max_edges:
        raise ValueError(f"attention flow on {L} layers × {T} tokens needs {L * T * T} edges and {T * T} max-flows; "
                         f"the limit is {max_edges} edges (layers × tokens²) — use a shorter text, fewer layers, "
                         "or rollout(), which has no limit")
    started = time.perf_counter()
    rows, cols, caps = [], [], []
    for l in range(L):  # edges of layer l+1: from node (l+1, query i) down to node (l, key j); node (l, t) = l·T + t
        i, j = np.nonzero(layers[l] > 0)
        rows.append((l + 1) * T + i)
        cols.append(l * T + j)
        caps.append(np.rint(layers[l][i, j] * _UNIT))
    n = (L + 1) * T
    graph = sp.csr_matrix((np.concatenate(caps).astype(np.int32), (np.concatenate(rows), np.concatenate(cols))),
                          shape=(n, n))
    out = np.zeros((T, T))
    for i in progress_bar(range(T), desc="attention flow", unit="row", enabled=progress, delay=1.0,
                          leave=False):
        for j in range(T):
            out[i, j] = maximum_flow(graph, L * T + i, j, method="dinic").flow_value
        if max_seconds is not None and time.perf_counter() - started > max_seconds:
            raise TimeoutError(f"attention flow on {L} layers × {T} tokens took more than {max_seconds:g} s "
                               f"({i + 1} of {T} rows done)")
    flows = torch.from_numpy(out / _UNIT)
    return flows / flows.sum(-1, keepdim=True).clamp_min(1e-300)


TOKEN_MAPS: Mapping[str, Callable[[torch.Tensor], torch.Tensor]] = {"rollout": rollout, "flow": flow}
