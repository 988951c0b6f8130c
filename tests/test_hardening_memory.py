"""Memory and time bounds, third pass (issue 24, items 7-10): figures of long texts, huge lines, eager
attention that cannot fit, attention flow."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headscope.probe.types import AttentionMap


def _map(n: int, *, causal: bool = False, seed: int = 0) -> AttentionMap:
    g = torch.Generator().manual_seed(seed)
    att = torch.softmax(torch.randn(1, 1, n, n, generator=g), -1)
    if causal:
        att = torch.softmax(torch.randn(1, 1, n, n, generator=g).masked_fill(torch.ones(n, n).triu(1).bool(), -torch.inf), -1)
    labels = tuple(f"w{i}" for i in range(n))
    return AttentionMap(text=" ".join(labels), level="token", labels=labels, spans=tuple((i, i + 1) for i in range(n)),
                        special=(False,) * n, attention=att, causal=causal)


# ---------------------------------------------------------------- 7. a token heatmap's size is bounded


@pytest.mark.parametrize("causal", [False, True])
def test_a_long_heatmap_is_drawn_pooled_with_thinned_labels(causal, monkeypatch):
    import headscope.reports.figures as F
    import headscope.reports.heatmaps as H

    monkeypatch.setattr(H, "CELLS_MAX", 8)
    monkeypatch.setattr(H, "LABELS_MAX", 3)
    n, block = 20, 3  # ceil(20 / 8) = 3: 7 × 7 cells, the last ones 2 units wide
    amap = _map(n, causal=causal)
    before = amap.attention.clone()
    fig = F.attention_heatmap(amap, 0, 0)
    ax = fig.axes[0]
    drawn = ax.collections[0].get_array().reshape(7, 7)
    w = amap.attention[0, 0].numpy().astype(float)
    seen = ~np.triu(np.ones((n, n), dtype=bool), 1) if causal else np.ones((n, n), dtype=bool)
    for i in range(7):  # the reference: a plain loop over blocks, only the cells the query can see
        for j in range(7):
            cells = w[i * block:(i + 1) * block, j * block:(j + 1) * block][seen[i * block:(i + 1) * block, j * block:(j + 1) * block]]
            if cells.size:
                assert drawn[i, j] == pytest.approx(cells.mean(), abs=1e-6)
            else:
                assert np.ma.is_masked(drawn[i, j])
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == ["w0", "w9", "w18"]  # every 3rd of the 7 cells, each labelled by its block's first unit
    assert "pooled 3×3" in ax.get_title() and "a label every 9 units" in ax.get_title()
    assert torch.equal(amap.attention, before)


def test_a_very_long_heatmap_stays_small():
    import headscope.reports.figures as F
    import headscope.reports.heatmaps as H

    fig = F.attention_heatmap(_map(700), 0, 0)
    ax = fig.axes[0]
    assert ax.collections[0].get_array().size <= H.CELLS_MAX ** 2
    assert len(ax.get_xticklabels()) <= H.LABELS_MAX and len(ax.get_yticklabels()) <= H.LABELS_MAX
    width, height = fig.get_size_inches()
    assert width <= H.SIDE_MAX + 3 and height <= H.SIDE_MAX + 3


def test_a_short_heatmap_keeps_every_cell_and_label():
    import headscope.reports.figures as F

    fig = F.attention_heatmap(_map(30), 0, 0)
    assert fig.axes[0].collections[0].get_array().size == 30 * 30
    assert len(fig.axes[0].get_xticklabels()) == 30 and "pooled" not in fig.axes[0].get_title()


# ---------------------------------------------------------------- 8. a huge line is never tokenised whole


@pytest.fixture
def longest_seen(monkeypatch):
    """The longest text (characters) that any tokenizer call is given while the test runs."""
    from conftest import _tiny

    tok = _tiny("bert").tokenizer
    seen = [0]
    real = type(tok).__call__

    def spy(self, text=None, *args, **kwargs):
        items = [text] if isinstance(text, str) else list(text or [])
        seen[0] = max([seen[0], *(len(t) for t in items if isinstance(t, str))])
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(type(tok), "__call__", spy)
    return seen


def test_a_huge_text_is_refused_after_tokenising_only_a_prefix(longest_seen):
    from conftest import _tiny

    from headscope.probe.encoding import encode_many

    lm = _tiny("bert")
    huge = "word " * 400_000  # 2 MB, one line
    with pytest.raises(ValueError, match=r"has more than 128 tokens \(2,000,000 characters\)"):
        encode_many(lm, ["a short one", huge])
    assert longest_seen[0] <= 128 * 16
    with pytest.warns(UserWarning, match="truncating"):
        [enc] = encode_many(lm, [huge], truncate=True)
    assert len(enc.ids) == 128 and longest_seen[0] <= 128 * 16
    assert enc.ids == tuple(lm.tokenizer(huge[:5000], truncation=True, max_length=128)["input_ids"])


def test_a_huge_corpus_line_is_one_line_and_exit_2(longest_seen, tmp_path):
    from click.testing import CliRunner

    from headscope.cli import cli

    corpus = tmp_path / "one-line.txt"
    corpus.write_text("a first text\n" + "word " * 400_000 + "\n")
    result = CliRunner().invoke(cli, ["heads", "--model", "tiny:bert", "--corpus", str(corpus), "--quiet"])
    assert result.exit_code == 2
    assert "line 2: the text has more than 128 tokens" in result.stderr and len(result.stderr.splitlines()) == 1
    assert longest_seen[0] <= 128 * 16


# ---------------------------------------------------------------- 9. eager attention that cannot fit


def test_eager_attention_over_the_budget_is_refused_before_the_forward_pass(monkeypatch):
    from conftest import _tiny

    import headscope.probe.extract as extract
    from headscope.probe.sources import eager_bytes, source_for

    lm = _tiny("llama")
    text = "the cat sat on the mat " * 4
    n = len(lm.tokenizer(text)["input_ids"])
    need = eager_bytes(lm, n)
    assert need == lm.config.num_hidden_layers * lm.config.num_attention_heads * n * n * 4  # float32
    calls = []
    real = extract._run_window
    monkeypatch.setattr(extract, "_run_window", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    with pytest.raises(ValueError, match=rf"has {n} tokens: .* more than the memory budget .*--attention auto"):
        list(source_for(lm, "eager", budget=need - 1).texts(["short", text]))
    assert calls == []  # nothing was computed: the check comes before the model
    assert len(list(source_for(lm, "eager", budget=need).texts([text]))) == 1


def test_the_cli_says_the_need_and_the_way_out_in_one_line(tmp_path):
    from click.testing import CliRunner

    from headscope.cli import cli

    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat " * 4 + "\n")
    result = CliRunner().invoke(cli, ["heads", "--model", "tiny:llama", "--corpus", str(corpus), "--attention", "eager",
                                      "--memory-budget", "1000", "--quiet"])
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()
    assert "memory budget of 0.0 GB" in line and "--attention auto" in line


# ---------------------------------------------------------------- 10. attention flow: faster, bounded in time


def test_flow_matches_networkx_max_flow():
    """scipy's integer max-flow against networkx's on the same layered graph (the reference)."""
    import networkx as nx

    from headscope.analyses.flow import flow, residual_attention

    g = torch.Generator().manual_seed(3)
    a = torch.softmax(torch.randn(3, 2, 5, 5, generator=g) * 2, -1)
    layers = residual_attention(a)
    L, T, _ = layers.shape
    graph = nx.DiGraph()
    for l in range(L):
        for i in range(T):
            for j in range(T):
                graph.add_edge((l + 1, i), (l, j), capacity=float(layers[l, i, j]))
    ref = torch.tensor([[nx.maximum_flow_value(graph, (L, i), (0, j)) for j in range(T)] for i in range(T)],
                       dtype=torch.float64)
    torch.testing.assert_close(flow(a), ref / ref.sum(-1, keepdim=True), rtol=0, atol=1e-7)


def test_a_flow_over_its_time_says_how_far_it_got_and_the_figure_says_it_was_skipped(monkeypatch):
    import headscope.reports.figures as F
    from headscope.analyses.flow import flow

    amap = _map(12)
    with pytest.raises(TimeoutError, match=r"took more than 0 s \(1 of 12 rows done\)"):
        flow(amap.attention, max_seconds=0)
    monkeypatch.setattr(F, "FLOW_MAX_SECONDS", 0)
    fig = F.token_map(amap, "flow")
    assert "skipped" in fig.axes[0].get_title()
    assert "took more than 0 s" in " ".join(" ".join(t.get_text().split()) for t in fig.axes[0].texts)
    assert F.token_map(amap, "rollout").axes[0].collections  # the rollout is still drawn


def test_the_report_notes_a_flow_too_large_to_draw():
    from headscope.analyses.flow import FLOW_MAX_EDGES
    from headscope.workflows.run import flow_notes

    from types import SimpleNamespace

    fits = _map(4)
    big = SimpleNamespace(attention=torch.zeros(1, 1, 120, 120))  # 1 layer × 120² = 14,400 edges
    assert 120 * 120 > FLOW_MAX_EDGES >= 16
    [note] = flow_notes([fits, big])
    assert note.startswith("attention flow not drawn for sentence 2 (120 tokens): 1 layers × 120² tokens is 14,400")
