"""The report and the notebook views as a first reader meets them: one number format, no empty settings, a
head's evidence said once, a view whose plain repr is one line."""

from __future__ import annotations

import re

import pandas as pd
import pytest
import torch

import headscope as hs
from headscope.analyses.evidence import AblationEvidence
from headscope.reports.sections import table_view

_NOTATIONS = {"e": re.compile(r"^[+-]?\d\.\d+e[+-]\d+$"), "plain": re.compile(r"^[+-]?[\d,]+(\.\d+)?$")}


def _notation(cell: str) -> str:
    return next(name for name, pattern in _NOTATIONS.items() if pattern.match(cell))


def test_a_column_is_written_in_one_notation_to_significant_digits():
    # Was: 9.78e-04 and 0.003 in one column (decimals, with e-notation below 1e-3) and 0.0009777 in the sentence.
    frame = pd.DataFrame({"head": ["L0H1", "L2H3", "L1H0"], "harm": [0.0009777, 0.00297, 0.0123],
                          "tiny": [2e-9, 0.5, float("nan")]})
    view = table_view(frame)
    harm = [row[1] for row in view.rows]
    assert harm == ["0.000978", "0.00297", "0.0123"]  # three significant digits each, by hand
    tiny = [row[2] for row in view.rows]
    assert tiny == ["2.00e-09", "5.00e-01", "n/a"] and {_notation(c) for c in tiny[:2]} == {"e"}


def _evidence():
    return AblationEvidence(model="m", method="zero", effect_metric="next_token_loss", description="d",
                            stronger="higher", n_texts=3, single=torch.tensor([[0.0009777, 0.1], [0.2, 0.3]]),
                            n_random=3, seed=2)


def test_a_head_that_tops_two_roles_is_said_once_with_both_roles():
    roles = pd.DataFrame({"model": "m", "layer": [0, 0, 1], "head": [0, 0, 1], "role": ["sink", "self", "broad"],
                          "metric": ["a", "b", "c"], "value": [0.9, 0.8, 0.7], "threshold": 0.5})
    verdicts = _evidence().role_verdicts(roles)
    assert [r for r, _ in verdicts] == ["sink and self", "broad"]
    assert len({s for _, s in verdicts}) == len(verdicts)  # no sentence twice
    assert "by +0.000978 nats" in verdicts[0][1]  # the sentence's numbers in the table's notation


def test_the_settings_list_has_no_empty_row():
    # Was: limit, memory_budget and ablation shown as empty rows (None) on the page of a default run.
    from headscope.commands.run import shown_settings
    from headscope.workflows.run import RunSettings, settings_display

    shown = settings_display(shown_settings(RunSettings(corpus="built-in", coref="built-in", texts=("a",))))
    blank = [k for k, v in shown.items() if v is None or v == ""]
    assert not blank and "every text" in shown["limit"] and "RAM" in shown["memory_budget"]
    assert shown["seed"] == 0  # what was given stays as it was


def test_show_in_a_plain_repl_prints_one_line_and_the_notebook_gets_the_view():
    # Was: the dataclass repr printed the whole HTML fragment (kilobytes) in a terminal's REPL.
    lm = hs.load("tiny:llama")
    view = hs.show(hs.extract(lm, ["The cat sat.", "A dog."]))
    line = repr(view)
    assert "\n" not in line and len(line) < 200 and "<script" not in line and "2 texts, 2 layers × 4 heads" in line
    assert "<script" in view._repr_html_() and len(view._repr_html_()) > 1000


def test_a_flow_map_is_drawn_on_its_own_scale_and_says_so():
    # Was: every flow on 0–1, so a short sentence's rows (shares near 1/T) were drawn near-uniformly pale.
    from headscope.analyses.flow import flow
    from headscope.reports.figures import token_map

    [m] = hs.extract(hs.load("tiny:bert"), "The cat sat on the mat.", level="token")
    shares = flow(m.attention.float())
    assert shares.max() < 1
    fig = token_map(m, "flow")
    low, high = fig.axes[0].collections[0].get_clim()
    assert (low, high) == (pytest.approx(float(shares.min())), pytest.approx(float(shares.max())))
    assert "its range" in fig.axes[1].get_ylabel()
    from headscope.reports.panels import FIGURES

    assert "smallest to its largest share" in FIGURES["flow"].caption


def test_the_attention_section_says_which_head_it_shows_and_why(draw_only):
    # Was: nothing said why the attention figures showed the head they show.
    draw_only()
    from headscope.reports.analysis import ModelAnalysis
    from headscope.reports.html import build_report

    [m] = hs.extract(hs.load("tiny:bert"), "The cat sat on the mat.", level="word")
    scores = hs.heads(hs.load("tiny:bert"), ["The cat sat on the mat.", "A dog barked."])
    page = build_report([ModelAnalysis(model="tiny", maps=(m,), scores=scores)], workers=1)
    layer, head = (int(v) for v in scores.top("previous_token", 1)[["layer", "head"]].iloc[0])
    section = page.html.split('<section id="attention">')[1].split("</section>")[0]
    assert f"The figures show L{layer}H{head}, the top previous-token head" in section
