"""The report's Long context section (`run --long-context`): shown only when asked for, its grid, curve and
verdicts from the result, its CSV tables (the KV-head table is DuoAttention's 1/0 plan), an encoder's note, and
the flag recorded only when given."""

from __future__ import annotations

import json

import numpy as np
import pytest

from headscope.reports.analysis import ModelAnalysis
from headscope.reports.html import build_report

from conftest import _tiny


@pytest.fixture(scope="module")
def found():
    from headscope.probe.kvplan import Phrasing
    from headscope.workflows.retrieval import retrieval

    # run_section's settings, smaller (its 16 needles and 10 random plans take 20 s on a loaded CPU), in a phrasing
    # tiny-llama copies a token of (with no copy step no head has a score, and nothing ranks the plans)
    return retrieval(_tiny("llama"), n_needles=6, n_selection=2, lengths=[96], n_random=2, sensitivity=True,
                     sensitivity_queries=64, scope="question", curve=(0.25, 0.5, 0.75), n_random_plans=3,
                     random_fractions=(0.5,), phrasings=[Phrasing("Key {key}. Remember it.", "Key:")])


def test_section_shows_the_grid_the_curve_and_the_verdicts(found):
    rep = build_report([ModelAnalysis(model="tiny-llama", long_context=found)])
    html = rep.html.replace("&#39;", "'")
    assert '<section id="long_context">' in html and '<a href="#long_context">Long context</a>' in html
    assert found.check.verdict.split(" — ")[0][:40] in html
    verdicts = found.to_dict()["curve_verdicts"]
    assert len(verdicts) == 3 and all(v.split(" (")[0] in html for v in verdicts)  # retrieval, sensitivity, combined
    t = rep.tables
    curve = t["long_context_curve"]
    # 3 rankings at 3 fractions, 3 random plans at 50%, all streaming, all full
    assert len(curve) == 9 + 3 + 2 and (curve[curve["plan"].str.startswith("random")]["fraction_full"] == 0.5).all()
    kv = t["long_context_kv_heads"]
    assert kv["full"].sum() == found.plan.n_full
    pattern = np.loadtxt(found.plan.pattern_table().splitlines(), delimiter="\t", ndmin=2)
    assert pattern.astype(bool).tolist() == kv.pivot(index="layer", columns="kv_head", values="full").to_numpy().tolist()
    assert len(t["long_context_heads"]) == 2 * 4 and json.dumps(ModelAnalysis(model="m", long_context=found).to_dict())
    grid = t["long_context_heads"]
    assert (grid["copy_steps"] == found.scores.copies).all() and len(found.needles) == 6


def test_a_report_without_it_has_no_section_and_settings_record_it_only_when_given():
    from dataclasses import replace

    from headscope.commands.run import shown_settings
    from headscope.workflows.run import RunSettings

    rep = build_report([ModelAnalysis(model="toy")])
    assert 'id="long_context"' not in rep.html and not {n for n in rep.tables if n.startswith("long_context")}
    assert "long_context" not in ModelAnalysis(model="toy").to_dict()
    plain = RunSettings(corpus="c", coref="p", texts=("The cat sat.",))
    assert "long_context" not in shown_settings(plain)
    assert shown_settings(replace(plain, long_context=True))["long_context"] is True


def test_an_encoder_or_a_short_context_gets_a_note_not_a_section():
    from headscope.workflows.run import RunSettings, _long_context, _Stages

    settings = RunSettings(corpus="c", coref="p", texts=("The cat sat.",), long_context=True)
    for name, says in (("bert", "not a decoder"), ("llama", "a needle and its question take")):
        notes: list = []
        assert _long_context(_tiny(name), _Stages(), settings, notes, lambda m: None, False) is None
        assert len(notes) == 1 and says in notes[0] and "\n" not in notes[0]


def test_the_page_reads_the_curve_as_counts_percent_and_megabytes(found):
    from headscope.reports.longcontext import curve_view

    costs = found.costs
    view = curve_view(costs)
    row = costs.iloc[-1]  # all full: every needle the clean model kept, perplexity change exactly 0
    assert view.iloc[-1]["held-out needles"] == f"{sum(found.check.clean)}/{len(found.check.clean)}"
    assert view.iloc[-1]["change"] == "+0.0%" and view.iloc[-1]["KV cache"].endswith("(100%)")
    assert view.iloc[-1]["KV cache"].startswith(f"{row['kv_bytes'] / 1e6:.1f} MB")
    assert list(view["plan"]) == list(costs["plan"]) and list(view["full KV heads"]) == list(costs["n_full"])
    html = build_report([ModelAnalysis(model="tiny-llama", long_context=found)]).html
    assert "held-out needles" in html and "needle_accuracy" not in html
