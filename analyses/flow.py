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
  networkx's; its cost grows with the edges (layers × tokens²) times the tokens² flows, so maps
  with more than `FLOW_MAX_EDGES` edges are refused.
"""

from __future__ import annotations

from typing import Callable, Literal, Mapping

import torch

__all__ = ["FLOW_MAX_EDGES", "TOKEN_MAPS", "TokenMap", "flow_fits", "residual_attention", "rollout", "flow"]

TokenMap = Literal["rollout", "flow"]

FLOW_MAX_EDGES = 12_000  # layers × tokens²: e.g. 30 layers × 20 tokens, 12 layers × 31 tokens


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


def flow(attention: torch.Tensor, *, max_edges: int = FLOW_MAX_EDGES) -> torch.Tensor:
    """Attention flow `[query, key]` of one text's `[layer, head, query, key]` attention (float64).

    >>> a = torch.tensor([[[[1.0, 0.0], [1.0, 0.0]]], [[[1.0, 0.0], [1.0, 0.0]]]])
    >>> flow(a)
    tensor([[1.0000, 0.0000],
            [0.6667, 0.3333]], dtype=torch.float64)
    """
    import networkx as nx

    layers = residual_attention(attention)
    L, T, _ = layers.shape
    if L * T * T > max_edges:
        raise ValueError(f"attention flow on {L} layers × {T} tokens needs {L * T * T} edges and {T * T} max-flows; "
                         f"the limit is {max_edges} edges (layers × tokens²) — use a shorter text, fewer layers, "
                         "or rollout(), which has no limit")
    graph = nx.DiGraph()
    for l in range(L):  # edges of layer l+1: from (l+1, query i) down to (l, key j)
        for i in range(T):
            for j in range(T):
                if layers[l, i, j] > 0:
                    graph.add_edge((l + 1, i), (l, j), capacity=float(layers[l, i, j]))
    out = torch.zeros(T, T, dtype=torch.float64)
    for i in range(T):
        for j in range(T):
            if graph.has_node((L, i)) and graph.has_node((0, j)):
                out[i, j] = nx.maximum_flow_value(graph, (L, i), (0, j))
    return out / out.sum(-1, keepdim=True).clamp_min(1e-300)


TOKEN_MAPS: Mapping[str, Callable[[torch.Tensor], torch.Tensor]] = {"rollout": rollout, "flow": flow}
