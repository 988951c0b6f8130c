"""The pooled overview and per-row top keys (analyses.pooled), and a source's live text's rows (probe.live)."""

import pytest
import torch

from conftest import in_turn
from headscope.analyses.pooled import Pooler, pool, tile_index, top_keys
from headscope.probe.extract import extract
from headscope.probe.sources import source_for

TEXT = "The cat sat on the mat because it was tired."


def _reference_pool(w: torch.Tensor, tiles: int):
    """Tile by tile, with plain Python loops over the cells (an independent reference)."""
    n_q, n_k = w.shape
    tq, tk = min(tiles, n_q), min(tiles, n_k)
    qe = [i * n_q // tq for i in range(tq + 1)]
    ke = [j * n_k // tk for j in range(tk + 1)]
    mx = [[max(float(w[a, b]) for a in range(qe[i], qe[i + 1]) for b in range(ke[j], ke[j + 1]))
           for j in range(tk)] for i in range(tq)]
    mean = [[sum(float(w[a, b]) for a in range(qe[i], qe[i + 1]) for b in range(ke[j], ke[j + 1]))
             / ((qe[i + 1] - qe[i]) * (ke[j + 1] - ke[j])) for j in range(tk)] for i in range(tq)]
    return qe, ke, torch.tensor(mx), torch.tensor(mean)


@pytest.mark.parametrize("shape, tiles", [((7, 7), 3), ((5, 9), 4), ((3, 3), 8), ((10, 6), 1)])
def test_pool_equals_the_tile_by_tile_reference(shape, tiles):
    w = torch.rand(*shape, generator=torch.Generator().manual_seed(sum(shape)))
    qe, ke, mx, mean = _reference_pool(w, tiles)
    p = pool(w, tiles)
    assert list(p.query_edges) == qe and list(p.key_edges) == ke
    torch.testing.assert_close(p.max, mx)
    torch.testing.assert_close(p.mean, mean)
    assert len(p.to_frame()) == p.shape[0] * p.shape[1]


def test_a_sharp_diagonal_survives_max_pooling():
    p = pool(torch.eye(100), 10)
    assert torch.equal(p.max, torch.eye(10))  # the mean sees only 10 of 100 cells
    torch.testing.assert_close(p.mean.diagonal(), torch.full((10,), 0.1))


def test_blocks_in_any_split_pool_as_the_whole_map():
    w = torch.rand(13, 13, generator=torch.Generator().manual_seed(0))
    p = Pooler(n_queries=13, n_keys=13, tiles=4)
    for start, stop in [(0, 2), (2, 3), (3, 11), (11, 13)]:
        p.add(start, w[start:stop])
    q = pool(w, 4)
    torch.testing.assert_close(p.result().max, q.max)
    torch.testing.assert_close(p.result().mean, q.mean)


def test_missing_rows_and_bad_tiles_are_refused():
    p = Pooler(n_queries=4, n_keys=4, tiles=2)
    p.add(0, torch.rand(3, 4))
    with pytest.raises(ValueError, match="queries \\[3\\]"):
        p.result()
    with pytest.raises(ValueError, match="tiles"):
        tile_index(4, 0)


def test_top_keys_by_hand():
    rows = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.0, 0.4]])
    t = top_keys(rows, 2, query_start=4)
    assert t.keys.tolist() == [[1, 2], [0, 2]]
    torch.testing.assert_close(t.weights, torch.tensor([[0.6, 0.3], [0.5, 0.4]]))
    assert t.to_frame()["query"].tolist() == [4, 4, 5, 5]
    assert top_keys(rows, 9).keys.shape == (2, 3)


@pytest.mark.parametrize("tiny, attention", in_turn("recompute", "eager"), indirect=["tiny"])
def test_live_rows_and_pooled_blocks_equal_the_extracted_map(tiny, attention):
    [m] = extract(tiny, TEXT)
    source = source_for(tiny, attention)
    live = source.live(TEXT)
    assert live.mode == attention and live.labels == m.labels
    n = len(live)
    layer, head = m.layer_ids[-1], tiny.config.num_attention_heads - 1
    full = m.attention[m.layer_ids.index(layer), head]
    torch.testing.assert_close(live.rows(layer, head, 2, n - 1), full[2 : n - 1], atol=1e-6, rtol=0)
    p = Pooler(n_queries=n, n_keys=n, tiles=3, layer=layer, head=head)
    for block in live.blocks(layer, head):
        p.consume(block)
    ref = pool(full, 3)
    torch.testing.assert_close(p.result().max, ref.max, atol=1e-6, rtol=0)
    torch.testing.assert_close(p.result().mean, ref.mean, atol=1e-6, rtol=0)
    if attention == "recompute":
        assert live.check["passed"]


def test_live_refuses_bad_heads_and_rows():
    from conftest import _tiny

    lm = _tiny("gpt2")
    live = source_for(lm, "eager").live(TEXT)
    with pytest.raises(ValueError, match="layer must be"):
        live.rows(9, 0, 0, 1)
    with pytest.raises(ValueError, match="rows must be"):
        live.rows(0, 0, 3, 3)
    with pytest.raises(ValueError, match="token rows"):
        source_for(lm, "recompute").live(TEXT, level="word")


# ---------------------------------------------------------------- the report's and hs.show's long-text view

def _long_map(n: int, heads: int = 2, causal: bool = True):
    """A hand-built [1, heads, n, n] map: head 0 attends to the previous token, head 1 uniformly."""
    from headscope.probe.types import AttentionMap

    att = torch.zeros(1, heads, n, n)
    att[0, 0, 0, 0] = 1
    att[0, 0, torch.arange(1, n), torch.arange(n - 1)] = 1
    att[0, 1] = torch.ones(n, n).tril() / torch.arange(1, n + 1)[:, None]
    labels = tuple(f"t{i}" for i in range(n))
    return AttentionMap(text=" ".join(labels), level="token", labels=labels, spans=((0, 0),) * n,
                        special=(False,) * n, attention=att, causal=causal, meta={"model": "toy"})


def test_a_long_map_is_embedded_pooled_with_each_rows_top_keys():
    from headscope.reports.payload import POOL_ABOVE, attention_payload

    def payload(m):  # the one encoder the report's explorer and hs.show embed
        return attention_payload(m.attention, m.labels, m.labels)

    n = POOL_ABOVE + 44  # 300 tokens
    u = payload(_long_map(n))
    p = u["pooled"]
    assert len(u["keys"]) == 64 and len(u["att"][0]) == 64 * 64 and p["n_queries"] == n
    assert u["att"][0] == (pool(_long_map(n).attention[0, 0], 64).max * 1000).round().int().flatten().tolist()
    assert [row[0] for row in p["top_keys"][0][1:]] == list(range(n - 1))  # previous token, row by row
    assert p["top_weights"][0][5][0] == 1000
    assert u["keys"][0] == "t0\u2026t3" and p["keys"][n - 1] == f"t{n - 1}"  # tile 0 of 300 in 64: 0 .. 300 // 64 - 1
    exact = payload(_long_map(POOL_ABOVE))  # at the threshold: every weight, as before
    assert "pooled" not in exact and len(exact["att"][0]) == POOL_ABOVE**2


def test_a_4000_token_page_stays_under_its_bound():
    from headscope.reports.inline import show

    html = show(_long_map(4000).attention, [f"t{i}" for i in range(4000)], causal=True).html
    # exact: 2 heads × 4,000² weights (~100 MB of JSON); pooled: 2 × 64² tiles + 2 × 4,000 × 3 top keys
    assert "pooled" in html and len(html.encode()) < 600_000, len(html)


def test_one_forward_pass_serves_every_layer_of_a_recomputed_text(monkeypatch):
    import headscope.probe.live as live_mod
    from conftest import _tiny

    lm = _tiny("llama")
    calls = []
    real = live_mod.streamed_inputs
    monkeypatch.setattr(live_mod, "streamed_inputs", lambda *a, **kw: calls.append(a[3]) or real(*a, **kw))
    live = source_for(lm, "recompute").live(TEXT, keep_layers=1)  # one layer in memory, the other on disk
    [m] = extract(lm, TEXT)
    for layer in (1, 0, 1):
        torch.testing.assert_close(live.rows(layer, 2, 0, 3), m.attention[layer, 2, :3], atol=1e-6, rtol=0)
    assert calls == [[0, 1]]  # one pass caught both layers' inputs on its way to layer 1, then reused


def test_an_eager_live_text_over_the_budget_is_refused_before_the_forward_pass():
    from conftest import _tiny

    lm = _tiny("gpt2")  # 2 layers × 4 heads × T² × 4 B for T tokens: well over 100 bytes
    with pytest.raises(ValueError, match="more than the memory budget.*attention='auto'"):
        source_for(lm, "eager", budget=100).live(TEXT)
    assert source_for(lm, "auto", budget=100).live(TEXT).mode == "recompute"  # auto recomputes it instead
