"""extract(..., weight="norm"): Kobayashi et al.'s ‖α_ij f(x_j)‖ per query row normalised, and the report's
attention/norm toggle."""

from __future__ import annotations

import functools

import pytest
import torch

import headscope as hs
from headscope.probe.norms import NormAttention, norm_weighted
from headscope.probe.tiny import tiny_model
from headscope.probe.types import AttentionMap
from headscope.reports.analysis import ModelAnalysis
from headscope.reports.html import build_report, explorer_data

TEXTS = ["The cat sat on the mat.", "A dog ran home quickly."]


def test_norm_weighted_by_hand():
    att = torch.full((1, 2, 2, 2), 0.5)  # [layer, head, query, key]
    amap = AttentionMap(text="a b", level="token", labels=("a", "b"), spans=((0, 1), (2, 3)),
                        special=(False, False), attention=att, causal=False, token_ids=(5, 6))
    # head 0: α‖f‖ rows (1, 3) and (2, 2); head 1: (0, 4) and (1, 1)
    per_head = torch.tensor([[[[1.0, 3.0], [2.0, 2.0]], [[0.0, 4.0], [1.0, 1.0]]]])
    norm = NormAttention(text="a b", labels=("a", "b"), token_ids=(5, 6), per_head=per_head,
                         per_layer=per_head.sum(1), meta={})
    out = norm_weighted(amap, norm)
    expected = torch.tensor([[[[0.25, 0.75], [0.5, 0.5]], [[0.0, 1.0], [0.5, 0.5]]]])
    torch.testing.assert_close(out.attention, expected)
    assert out.weight == "norm" and amap.weight == "attention"
    assert torch.equal(amap.attention, torch.full((1, 2, 2, 2), 0.5))  # the caller's map is untouched


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_norm_maps_are_attention_times_a_per_key_size(family):
    lm = tiny_model(family)
    att = hs.extract(lm, TEXTS)
    norm = hs.extract(lm, TEXTS, weight="norm")
    for a, n in zip(att, norm):
        assert n.weight == "norm" and n.labels == a.labels
        torch.testing.assert_close(n.attention.sum(-1), torch.ones(n.attention.shape[:-1]))
        # n_ij = α_ij ‖f(x_j)‖ / Z_i, so n_ij / α_ij = ‖f(x_j)‖ / Z_i: each row a multiple of every other
        # (where a key is visible: a decoder's future keys have α = 0 and weight 0).
        ratio = n.attention / a.attention  # [layer, head, query, key]
        last = ratio[:, :, -1:, :]  # the last query sees every key
        scale = ratio[..., :1] / last[..., :1]  # per row: Z_last / Z_i
        visible = a.attention > 1e-6
        torch.testing.assert_close((ratio / scale)[visible], last.expand_as(ratio)[visible], rtol=1e-3, atol=1e-4)
    words = hs.extract(lm, TEXTS, weight="norm", level="word")
    for w in words:
        assert w.weight == "norm"
        torch.testing.assert_close(w.attention.sum(-1), torch.ones(w.attention.shape[:-1]))


def test_the_default_weight_is_attention_and_unchanged():
    lm = tiny_model("bert")
    [a] = hs.extract(lm, TEXTS[0])
    [b] = hs.extract(lm, TEXTS[0], weight="attention")
    assert torch.equal(a.attention, b.attention) and a.weight == "attention" and "weight" not in a.meta


def test_bad_weights_are_refused():
    with pytest.raises(ValueError, match="weight must be 'attention' or 'norm'"):
        hs.extract(tiny_model("bert"), TEXTS, weight="value")
    with pytest.raises(ValueError, match="weight='norm' is for self-attention"):
        hs.extract(tiny_model("t5"), TEXTS, target=TEXTS, weight="norm")


def test_heads_with_norm_weighting():
    lm = tiny_model("llama")
    att = hs.heads(lm, TEXTS, induction_sequences=2, induction_length=5)
    norm = hs.heads(lm, TEXTS, weight="norm", induction_sequences=2, induction_length=5)
    assert norm.meta["weight"] == "norm" and "weight" not in att.meta
    assert norm.meta["induction"] is None and att.meta["induction"] is not None
    a, n = att.grid("previous_token"), norm.grid("previous_token")
    assert a.shape == n.shape and not a.equals(n)


@functools.lru_cache(maxsize=1)
def _bert():
    return tiny_model("bert")


def _section() -> ModelAnalysis:
    lm = _bert()
    maps = tuple(hs.extract(lm, TEXTS))
    return ModelAnalysis(model="b", maps=maps, norm_maps=tuple(hs.extract(lm, TEXTS, weight="norm")))


def test_explorer_data_carries_norm_weights_at_word_level():
    section = _section()
    word_norms = tuple(hs.extract(_bert(), TEXTS, level="word", weight="norm"))
    for shown, direct in zip(section.shown_norm_maps, word_norms):  # the page's word level is extract's
        torch.testing.assert_close(shown.attention, direct.attention, atol=1e-6, rtol=0)
    [model] = explorer_data([section])["models"]
    view = model["sentences"][1]["views"]["self"]
    assert set(view) == {"attention", "norm"} and list(view["norm"]) == ["word"]
    norm = view["norm"]["word"]
    expected = (section.shown_norm_maps[1].attention * 100).round().int().reshape(len(norm["att"]), -1).tolist()
    assert norm["scale"] == 100 and norm["att"] == expected
    assert "scale" not in view["attention"]["word"]


@pytest.mark.browser
def test_the_weight_toggle_switches_the_heatmap(browser, tmp_path):
    build_report([_section()]).write(tmp_path)
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((tmp_path / "index.html").as_uri())
    page.wait_for_selector("#hs-explorer[data-ready='1']")

    def fills():
        return page.eval_on_selector_all("#hs-heatmap rect.hs-cell", "els => els.map(e => e.getAttribute('fill'))")

    assert page.is_visible("#hs-weight-box")
    before = fills()
    page.check("input[name='hs-weight'][value='norm']")
    assert page.locator("#hs-heatmap").get_attribute("data-weight") == "norm"
    assert fills() != before and len(fills()) == len(before)
    assert "norm-weighted" in page.inner_text("#hs-caption")
    page.check("input[name='hs-level'][value='token']")  # norm weights only at word level here
    assert not page.is_visible("#hs-weight-box")
    assert page.locator("#hs-heatmap").get_attribute("data-weight") == "attention"
    page.check("input[name='hs-level'][value='word']")
    page.check("input[name='hs-weight'][value='attention']")
    assert fills() == before and errors == []
    page.close()
