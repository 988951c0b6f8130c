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

    monkeypatch.setattr(F, "CELLS_MAX", 8)
    monkeypatch.setattr(F, "LABELS_MAX", 3)
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

    fig = F.attention_heatmap(_map(700), 0, 0)
    ax = fig.axes[0]
    assert ax.collections[0].get_array().size <= F.CELLS_MAX ** 2
    assert len(ax.get_xticklabels()) <= F.LABELS_MAX and len(ax.get_yticklabels()) <= F.LABELS_MAX
    width, height = fig.get_size_inches()
    assert width <= F.SIDE_MAX + 3 and height <= F.SIDE_MAX + 3


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
