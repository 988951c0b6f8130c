"""Attention rollout and flow (Abnar & Zuidema 2020) on hand-built attention with hand-computed answers."""

import pytest
import torch

from headscope.analyses.flow import FLOW_MAX_EDGES, flow, residual_attention, rollout

# 2 layers × 2 heads × 2 tokens. Layer 0: head 0 all to key 0, head 1 all to key 1 -> Ā_0 = all 0.5.
# Layer 1: both heads: query 0 -> key 0; query 1 -> 0.2 key 0, 0.8 key 1.
A = torch.tensor([
    [[[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [0.0, 1.0]]],
    [[[1.0, 0.0], [0.2, 0.8]], [[1.0, 0.0], [0.2, 0.8]]],
])


def test_residual_attention_by_hand():
    # layer 0: 0.5·[[.5,.5],[.5,.5]] + 0.5·I = [[.75,.25],[.25,.75]]; layer 1: [[1,0],[.1,.9]]
    expected = torch.tensor([[[0.75, 0.25], [0.25, 0.75]], [[1.0, 0.0], [0.1, 0.9]]], dtype=torch.float64)
    torch.testing.assert_close(residual_attention(A), expected)


def test_rollout_by_hand():
    # Ã = A_1 · A_0 = [[1,0],[.1,.9]] · [[.75,.25],[.25,.75]] = [[.75,.25],[.1·.75+.9·.25, .1·.25+.9·.75]]
    expected = torch.tensor([[0.75, 0.25], [0.3, 0.7]], dtype=torch.float64)
    torch.testing.assert_close(rollout(A), expected)


def test_flow_by_hand():
    # Paths from output i through middle token k to input j carry min(A_1[i,k], A_0[k,j]); paths are disjoint.
    # i=0: only k=0 (cap 1): to j=0 min(1,.75)=.75, to j=1 min(1,.25)=.25 -> [.75, .25]
    # i=1: to j=0: min(.1,.75)+min(.9,.25)=.35; to j=1: min(.1,.25)+min(.9,.75)=.85 -> /1.2
    expected = torch.tensor([[0.75, 0.25], [0.35 / 1.2, 0.85 / 1.2]], dtype=torch.float64)
    torch.testing.assert_close(flow(A), expected)


def test_one_layer_flow_and_rollout_are_the_residual_attention():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(1, 3, 4, 4, generator=g).tril()
    a = a / a.sum(-1, keepdim=True)
    torch.testing.assert_close(rollout(a), residual_attention(a)[0])
    torch.testing.assert_close(flow(a), residual_attention(a)[0])


def test_rollout_rows_sum_to_one_and_respect_causality():
    g = torch.Generator().manual_seed(1)
    a = torch.rand(3, 2, 5, 5, generator=g).tril()
    a = a / a.sum(-1, keepdim=True)
    r = rollout(a)
    torch.testing.assert_close(r.sum(-1), torch.ones(5, dtype=torch.float64))
    assert (r.triu(1) == 0).all()  # a causal model's token never reaches an earlier output
    f = flow(a)
    assert (f.triu(1) == 0).all()


def test_flow_refuses_above_its_limit_with_the_numbers():
    big = torch.full((2, 1, 80, 80), 1 / 80)
    assert 2 * 80 * 80 > FLOW_MAX_EDGES
    with pytest.raises(ValueError, match=r"2 layers × 80 tokens needs 12800 edges .* limit is 12000"):
        flow(big)
    with pytest.raises(ValueError, match=r"\[layer, head, query, key\]"):
        rollout(torch.ones(2, 3, 3))
