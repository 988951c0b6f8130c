"""Notebook views of results: one registry in reports (`reports.views.VIEWS`), read by every result's
`_repr_html_` and by `hs.show`. Each result here is built by hand, so what its view must show (its title,
head names, numbers) is known without running the view."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import headscope as hs
from headscope.analyses.coref import ProbeResult, ProbeScores, score_probe
from headscope.analyses.heads import HeadScores, score_corpus
from headscope.analyses.mechanisms import MechanismsReport
from headscope.analyses.patching import AttributionPatching, PatchPair, PatchResult
from headscope.analyses.relations import parse_example
from headscope.probe.results import (CompositionScores, CopyingScores, DLAResult, Explanation, LayerCheck,
                                     QKAttribution, Verification)
from headscope.probe.types import AttentionMap, Viewable
from headscope.reports.inline import InlineView
from headscope.reports.views import VIEWS, html_view, view_for

EVIL = "<script>x</script>"  # in every text a result carries: each view must escape it


def _map() -> AttentionMap:
    a = torch.tensor([[[[1.0, 0.0, 0.0], [0.25, 0.75, 0.0], [0.5, 0.25, 0.25]]]])
    return AttentionMap(text="a b <c>", level="word", labels=("a", "b", "<c>"), spans=((0, 1), (2, 3), (4, 7)),
                        special=(False,) * 3, attention=a, causal=True, layers=(4,))


def _verification(passed: bool = True) -> Verification:
    checks = (LayerCheck(0, 3e-7, 1e-6, 1e-6, 2e-7, True), LayerCheck(1, 2e-3 if not passed else 5e-8, 1e-6, 1e-6,
                                                                        2e-7, passed))
    return Verification(EVIL, "bert", "float32", 1e-5, 1e-5, 12, 1, 9, checks, 0.1, 0.05)


def _dla() -> DLAResult:
    table = pd.DataFrame({"component": ["embed", "L1H3", "L0.mlp"], "kind": ["embed", "head", "mlp"],
                          "layer": [None, 1, 0], "head": [None, 3, None], "value": [0.25, 1.5, -0.75]})
    return DLAResult(model="m", prompt=EVIL, answer=" mat", wrong=None, answer_id=7, wrong_id=None, total=1.0,
                     table=table, identity_abs_err=1e-7, attention_abs_err=1e-7, final_norm_abs_err=1e-7)


def _qk() -> QKAttribution:
    terms = pd.DataFrame([[0.5, -2.25], [0.125, 0.0]], index=["embed", "L0H1"], columns=["embed", "L0.mlp"])
    return QKAttribution(model="m", text=EVIL, layer=2, head=1, query=3, key=1, query_label=EVIL, key_label="cat",
                         score=-1.625, weight=0.2, terms=terms, extra={}, identity_abs_err=1e-7, input_abs_err=1e-7,
                         weight_without=pd.DataFrame())


def _composition() -> CompositionScores:
    s = np.full((2, 2, 2, 2), np.nan)
    s[0, 1, 1, 0] = 0.5
    s[0, 0, 1, 1] = 0.125
    return CompositionScores(model=EVIL, scores={"q": s}, baseline={"q": 0.25})


def _copying() -> CopyingScores:
    return CopyingScores(model=EVIL, scores=np.array([[0.875, -0.5], [0.25, 0.0625]]), n_tokens=10)


def _explanation() -> Explanation:
    table = pd.DataFrame({"key": ["a", EVIL], "raw_score": [1.0, 2.0], "scaled_score": [0.5, 1.0],
                          "weight": [0.375, 0.625], "value_norm": [1.0, 1.0], "contribution_norm": [0.375, 0.625]})
    return Explanation(text="a x", query=EVIL, query_index=1, layer=3, head=2, scale=0.5, table=table,
                       output_norm=0.75, model_weight_max_abs_err=1e-8)


def _heads() -> HeadScores:
    eye = torch.eye(3)[None, None].repeat(2, 2, 1, 1)  # every head attends to itself: `self` is 1
    amap = AttentionMap(text="x y z", level="token", labels=("x", "y", "z"), spans=((0, 1), (2, 3), (4, 5)),
                        special=(False,) * 3, attention=eye, causal=False, meta={"model": EVIL})
    return score_corpus([amap], level="token")


def _probe():
    gen = torch.Generator().manual_seed(0)
    examples, rows = [], []
    for i in range(10):
        for answer in ("Ann", "Bea"):
            examples.append(parse_example({"text": f"Ann met Bea and she was {'tired' if answer == 'Ann' else 'ok'} {i}.",
                                           "pronoun": "she", "candidates": ["Ann", "Bea"], "answer": answer,
                                           "group": f"p{i}", "id": f"{i}{answer}"}))
            s = torch.rand(2, 3, 2, generator=gen)  # [layer, head, candidate]
            s[1, 2] = torch.tensor([0.8, 0.1]) if answer == "Ann" else torch.tensor([0.1, 0.8])
            rows.append(s)
    return score_probe(ProbeScores(examples=tuple(examples), scores=torch.stack(rows), model=EVIL, causal=False),
                       task=EVIL, n_perm=200)


def _patch() -> PatchResult:
    pairs = tuple(PatchPair(f"c{i}", f"x{i}", " a", " b") for i in range(2))
    return PatchResult(model=EVIL, what="head_out", direction="denoise", sites=(("head", 0, 1), ("head", 1, 0)),
                       values=np.array([[1.0, 1.0], [2.5, 3.5]]), clean=np.array([4.0, 4.0]),
                       corrupt=np.array([0.0, 0.0]), pairs=pairs)


def _samples() -> dict[type, Viewable]:
    patch = _patch()
    return {AttentionMap: _map(), Verification: _verification(), DLAResult: _dla(), QKAttribution: _qk(),
            CompositionScores: _composition(), CopyingScores: _copying(), Explanation: _explanation(),
            HeadScores: _heads(), ProbeResult: _probe(), PatchResult: patch,
            AttributionPatching: AttributionPatching(estimate=patch),
            MechanismsReport: MechanismsReport(model="m", composition=_composition(), notes=(f"no DLA: {EVIL}",))}


@pytest.fixture(scope="module")
def samples() -> dict[type, Viewable]:
    return _samples()


def test_every_registered_type_renders_through_its_own_repr_and_show(samples):
    assert set(samples) == set(VIEWS)  # a sample for every view, a view for every sample
    for kind, result in samples.items():
        html = result._repr_html_()
        assert html == html_view(result) == VIEWS[kind](result) and html.startswith(("<p>", "<div>")), kind
        assert "<script" not in html, f"{kind.__name__}: text not escaped"
        if kind is not AttentionMap:  # a map's hs.show is the interactive explorer (tests/test_inline_view.py)
            shown = hs.show(result)
            assert isinstance(shown, InlineView) and shown.html == html
            assert repr(shown).startswith(f"<view: {kind.__name__};")


def test_each_view_shows_its_results_title_heads_and_numbers(samples):
    def has(kind, *parts):
        html = samples[kind]._repr_html_()
        missing = [p for p in parts if p not in html]
        assert not missing, f"{kind.__name__}'s view lacks {missing}"

    has(AttentionMap, "<b>AttentionMap</b>", "word level, 1 layers × 1 heads, 3 units, causal", "&lt;c&gt;",
        "layer 4, mean over heads", "title='0.750'", "title='0.250'")
    has(Verification, "attention verified: max |Δ| = 3.0e-07 over 2 layers × 12 heads", "<td>1</td>")
    assert "NOT verified" in html_view(_verification(passed=False))
    has(DLAResult, "L1H3", "1.5000", "-0.7500", "0.2500", "&lt;script&gt;")  # top parts, 4 places; prompt escaped
    has(QKAttribution, "L2H1 attends from", "-2.2500", "0.5000", "0.1250")
    has(CompositionScores, "L0H1 → L1H0 0.500 (2.0× random 0.250)", "L0H0", "0.5000", "2.0000")
    has(CopyingScores, "highest L0H0 +0.875, L1H0 +0.250", "0.8750", "25% of heads above 0.5")
    has(Explanation, "L3H2, query", "0.6250", "0.3750", "output norm 0.750", "&lt;script&gt;")
    has(HeadScores, "<b>HeadScores</b>", "2 layers × 2 heads", "1 text", "self", "L0H0 1.000")
    has(ProbeResult, "L1H2", "n = 20", "baselines:", "<b>&lt;script&gt;")
    has(PatchResult, "on 2 pairs", "clean 4.000, corrupt 0.000", "L1H0 0.75", "3.0000", "L0H1")
    has(AttributionPatching, "attribution patching of head_out (denoise) on 2 pairs", "L1H0")
    has(MechanismsReport, "composition, strongest edge per kind", "no DLA: &lt;script&gt;")


def test_a_subclass_finds_its_bases_view_and_an_unknown_type_is_one_line():
    class Mine(Verification):
        pass

    v = _verification()
    mine = Mine(**{f: getattr(v, f) for f in v.__dataclass_fields__})
    assert view_for(mine) is VIEWS[Verification] and mine._repr_html_() == v._repr_html_()
    with pytest.raises(TypeError, match=r"no HTML view is defined for a object; views exist for .*Verification"):
        html_view(object())
    with pytest.raises(TypeError, match=r"show takes attention maps .* or a result \(.*HeadScores.*\), not object"):
        hs.show(object())


def test_every_viewable_result_type_has_a_view():
    """Every type that says it is shown as HTML (a `Viewable`: the result types of probe and analyses) is
    registered, or inherits from a type that is."""
    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    found = {t for t in subclasses(Viewable) if t.__module__.startswith("headscope.")}
    assert set(VIEWS) <= found and len(found) >= 12
    assert [t for t in found if not any(b in VIEWS for b in t.__mro__)] == []
