"""Ablation evidence in `headscope run` and the rollout/flow maps, on tiny random models and hand-built numbers.

Expected values come from elsewhere: scipy and the Fisher-z formula for the interval, the
`ablate` workflow for a single-head effect, `random_head_sets` for the random heads, a sort by
hand for importance ranks, `analyses.flow` for the drawn maps.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from scipy import stats

import headscope as hs
from headscope.workflows import ablation
from headscope.analyses.ablation import random_head_sets
from headscope.analyses.evidence import AblationEvidence, spearman_interval
from headscope.analyses.flow import flow, rollout
from headscope import RunSettings, analyse_model
from headscope.probe.tiny import tiny_model

TEXTS = ["The cat sat on the mat.", "A dog ran to the park and back.", "Mary told John that she left.",
         "It was raining again."]
SETS = [("agreement", hs.builtin_set("agreement")[:16])]


def _settings(**kw) -> RunSettings:
    return RunSettings(corpus="c", coref="p", texts=("The cat sat.",), permutations=100, induction_sequences=4,
                       ablation_texts=3, **kw)


@pytest.fixture(scope="module")
def bert_run():
    lm = tiny_model("bert")
    return lm, analyse_model(lm, TEXTS, SETS, _settings(generate=3))  # an encoder: generation is noted, not run


@pytest.fixture(scope="module")
def llama_run():
    lm = tiny_model("llama")
    return lm, analyse_model(lm, TEXTS, SETS, _settings(ablation=True, ablation_examples=6, induction_k=2))


# --- pure numbers ----------------------------------------------------------------------------

def test_spearman_interval_is_scipys_rho_with_the_fisher_z_interval():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=30), rng.normal(size=30)
    y = y + x
    r = spearman_interval(x, y, score="s")
    rho = stats.spearmanr(x, y).statistic
    half = stats.norm.ppf(0.975) * 1.06 / math.sqrt(30 - 3)
    assert r.rho == pytest.approx(rho) and r.n == 30
    assert (r.low, r.high) == pytest.approx((math.tanh(math.atanh(rho) - half), math.tanh(math.atanh(rho) + half)))
    assert math.isnan(spearman_interval([1, 1, 1, 1], [1, 2, 3, 4]).rho)  # a constant has no ranks


def _evidence(single, stronger="higher", importance=None):
    return AblationEvidence(model="m", method="zero", effect_metric="next_token_loss", description="d",
                          stronger=stronger, n_texts=3, single=torch.tensor(single), importance=importance,
                          n_random=5, seed=2)


def test_head_effect_compares_with_the_random_heads_of_the_sweep():
    single = [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    e = _evidence(single).head_effect(1, 2)
    sets = random_head_sets(2, 3, [(1, 2)], 1, 5, seed=2)
    assert e.random_effects == tuple(single[l][h] for ((l, h),) in sets)
    assert e.effect == 5.0 and e.p_value == 1 / 6  # no other head has a larger loss change
    lower = _evidence(single, stronger="lower")  # a cosine: the smallest value is the strongest
    assert lower.head_effect(0, 0).p_value == 1 / 6 and (lower.harm == -np.asarray(single)).all()


def test_importance_rank_and_roles_table():
    import pandas as pd

    imp = torch.tensor([[0.1, 0.9, 0.5], [0.5, 0.2, 0.0]])
    ev = _evidence([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], importance=imp)
    # by hand: 0.9 (L0H1), 0.5 (L0H2, before L1H0 on the tie), 0.5 (L1H0), 0.2, 0.1, 0.0
    assert ev.importance_rank().tolist() == [[5, 1, 2], [3, 4, 6]]
    roles = pd.DataFrame({"model": "m", "layer": [1, 0], "head": [0, 2], "role": "r", "metric": "x",
                          "value": [0.9, 0.7], "threshold": 0.5})
    table = ev.roles_table(roles)
    assert table["importance_rank"].tolist() == [3, 2] and table["ablation_harm"].tolist() == [3.0, 2.0]
    assert table["p_vs_random"].tolist() == [ev.head_effect(1, 0).p_value, ev.head_effect(0, 2).p_value]
    assert list(roles.columns) == ["model", "layer", "head", "role", "metric", "value", "threshold"]  # not mutated
    [(role, sentence)] = ev.role_verdicts(roles)
    assert role == "r" and sentence.startswith("ablating L1H0 changes the next-token loss by +3.00 nats; random")


def test_ablation_harm_has_one_direction_for_encoders_and_decoders():
    # Issue 24 item 17: an encoder's effect is a cosine (higher = less harm), a decoder's a loss rise (higher =
    # more): the roles table, ablation_heads.csv and run.json put both in one column. Now every one shows harm,
    # higher = hurt more and 0 = no change: the loss rise as it is, 1 − cosine for the encoder.
    import pandas as pd

    from headscope.reports.evidence import ablation_heads_table

    cos = [[1.0, 0.5, 0.9], [0.99, 0.8, 0.7]]  # L0H1 moved the embedding most
    enc = AblationEvidence(model="e", method="zero", effect_metric="sentence_cosine", n_texts=3, n_random=5, seed=2,
                           description="cosine of the ablated sentence embedding to the clean one", stronger="lower",
                           single=torch.tensor(cos, dtype=torch.float64))
    dec = _evidence([[0.0, 0.5, 0.1], [0.01, 0.2, 0.3]])  # the same harm, as a loss rise
    by_hand = [[1 - c for c in row] for row in cos]
    assert np.allclose(enc.harm, by_hand) and np.allclose(dec.harm, by_hand) and enc.harm[0, 0] == 0
    roles = pd.DataFrame({"model": "m", "layer": [0, 0, 1], "head": [0, 1, 2], "role": "r", "metric": "x",
                          "value": [0.9, 0.8, 0.7], "threshold": 0.5})
    t_enc, t_dec = enc.roles_table(roles), dec.roles_table(roles)
    assert "ablation_effect" not in t_enc.columns
    for col in ("ablation_harm", "random_mean", "random_sd", "p_vs_random"):
        assert t_enc[col].tolist() == pytest.approx(t_dec[col].tolist())
    assert t_enc["ablation_harm"].tolist() == pytest.approx([0.0, 0.5, 0.3])
    assert t_enc["p_vs_random"][1] == 1 / 6  # the most harmful head: no random head is stronger
    for ev in (enc, dec):
        heads = ev.to_dict()["heads"]
        assert [h["ablation_harm"] for h in heads] == pytest.approx([v for row in by_hand for v in row])
        assert all("single_effect" not in h for h in heads)
        table = ablation_heads_table(type("Section", (), {"evidence": ev})())
        assert table["ablation_harm"].tolist() == pytest.approx([v for row in by_hand for v in row])
    assert enc.to_dict()["harm"].startswith("1 − cosine") and "higher = the ablation hurt more" in enc.to_dict()["harm_direction"]
    [(_, sentence)] = enc.role_verdicts(roles)
    assert "1 − cosine = 0" in sentence and "random 1-head ablations" in sentence


# --- the workflow and analyse_model ------------------------------------------------------------

def test_encoders_get_ablation_evidence_by_default_decoders_do_not(bert_run):
    lm, a = bert_run
    ev = a.evidence
    assert ev is not None and ev.effect_metric == "sentence_cosine" and ev.n_texts == 3 and "ablation" in a.seconds
    assert tuple(ev.single.shape) == (2, 4) and ev.importance is not None
    one = ablation.ablate(lm, [(1, 2)], corpus=TEXTS[:3], n_random=0, method="zero").effect  # the sweep: ablate's
    assert float(ev.single[1, 2]) == pytest.approx(one)
    assert ev.induction is None and ev.choices["agreement"].get("skipped") is not None
    # run --generate 3 on an encoder was silently ignored; it is said in the notes, as the ablation skip is
    assert a.generations == () and any(n.startswith("generation was not run (3 tokens asked for): tiny-bert is not a "
                                                    "decoder") for n in a.notes)
    d = a.to_dict()["ablation"]
    assert len(d["heads"]) == 8 and {c["score"] for c in d["correlations"]} >= {"gradient importance"}
    llama = tiny_model("llama")
    assert analyse_model(llama, TEXTS, SETS, _settings()).evidence is None
    assert analyse_model(lm, TEXTS, SETS, _settings(ablation=False)).evidence is None


def test_decoders_with_ablation_get_induction_and_cloze_flips(llama_run):
    _, a = llama_run
    ev = a.evidence
    assert ev.effect_metric == "next_token_loss" and len(ev.induction.heads) == 2
    assert len(ev.induction.random_effects) == 19
    check = ev.choices["agreement"]
    if "skipped" not in check:  # a tiny random model may select no head
        assert check["n"] == 6 and len(check["random_flips"]) == 19 and 0 <= check["flips"] <= 6
        assert check["flips_verdict"].startswith("ablating L")


# --- the report --------------------------------------------------------------------------------

def test_report_shows_ablation_columns_lines_and_token_maps(bert_run, llama_run, draw_only):
    from headscope.reports.html import build_report

    draw_only("rollout", "flow")  # the token maps; the ablation columns and lines are the page's, not figures
    report = build_report([bert_run[1], llama_run[1]])
    html = report.html
    assert html.count("<h3>Ablation evidence</h3>") == 2 and "Does looking predict mattering?" in html
    assert "<th>importance_rank</th>" in html and "<th>p_vs_random</th>" in html
    assert "is an encoder: it does not predict a continuation" in html or "nothing to ablate" in html
    assert "induction ablation" in html
    assert set(report.tables["ablation_heads"]["model"]) == {"tiny-bert", "tiny-llama"}
    names = [f.name for f in report.figures]
    assert {"tiny-bert-rollout-0.png", "tiny-bert-flow-0.png", "tiny-llama-rollout-0.png"} <= set(names)


def test_token_map_draws_rollout_and_flow_of_the_map():
    from headscope.reports.figures import token_map
    from headscope.reports.panels import FIGURES

    [amap] = hs.extract(tiny_model("llama"), "The cat sat on the mat.")
    fig = token_map(amap, "rollout")
    drawn = fig.axes[0].collections[0].get_array()  # seaborn's mesh, masked where a causal model cannot look
    expected = np.ma.masked_array(rollout(amap.attention).numpy(), np.triu(np.ones((len(amap),) * 2), 1))
    np.testing.assert_allclose(np.ma.compressed(drawn), np.ma.compressed(expected), rtol=1e-6)
    assert token_map(amap, "flow").axes[0].get_title().endswith("attention flow · token level")
    with pytest.raises(ValueError, match="kind must be one of"):
        token_map(amap, "saliency")

    class Section:  # a text too long for flow gets a rollout and no flow
        maps = (amap,)

    long = hs.extract(tiny_model("llama"), "word " * 25)[0]  # 2 layers × ~100 tokens² > 12,000 edges
    assert 2 * len(long) ** 2 > 12_000
    Section.maps = (long,)
    assert len(list(FIGURES["rollout"].panels(Section))) == 1 and not list(FIGURES["flow"].panels(Section))
    torch.testing.assert_close(flow(amap.attention).sum(-1), torch.ones(len(amap), dtype=torch.float64))


# --- the CLI -------------------------------------------------------------------------------------

def test_cli_ablation_flags(monkeypatch, tmp_path, draw_only):
    from headscope.cli import cli
    from headscope.commands import run as run_mod

    draw_only()  # the flags reach the record; the section's drawing is test_report_shows_ablation_columns_...

    monkeypatch.setattr(run_mod, "load_or_fail", lambda name, *placement: tiny_model("bert"))
    monkeypatch.setattr(run_mod, "models_or_fail", lambda *a, **kw: None)  # test model names are not real ones
    from headscope.analyses.relations import builtin_path

    base = ["run", "--model", "bert", "--limit", "4", "--permutations", "100", "--quiet", "--text", "The cat sat.",
            "--coref", str(builtin_path("agreement"))]
    on = CliRunner().invoke(cli, [*base, "--report", str(tmp_path / "on"), "--ablation-texts", "2", "--json"])
    assert on.exit_code == 0, on.output
    record = json.loads(on.stdout)
    assert record["models"][0]["ablation"]["n_texts"] == 2 and record["settings"]["ablation"] is None
    off = CliRunner().invoke(cli, [*base, "--report", str(tmp_path / "off"), "--no-ablation", "--json"])
    assert off.exit_code == 0, off.output
    assert json.loads(off.stdout)["models"][0]["ablation"] is None
    bad = CliRunner().invoke(cli, [*base, "--report", str(tmp_path / "bad"), "--ablation-texts", "0"])
    assert bad.exit_code != 0 and "--ablation-texts" in bad.output


def test_the_old_causal_flags_still_work_one_release_with_a_warning(monkeypatch, tmp_path, draw_only):
    from headscope.analyses.relations import builtin_path
    from headscope.cli import cli
    from headscope.commands import run as run_mod

    draw_only()  # the old flags reach the record as the new ones do; nothing drawn depends on them

    monkeypatch.setattr(run_mod, "load_or_fail", lambda name, *placement: tiny_model("bert"))
    monkeypatch.setattr(run_mod, "models_or_fail", lambda *a, **kw: None)  # test model names are not real ones
    base = ["run", "--model", "bert", "--limit", "4", "--permutations", "100", "--quiet", "--text", "The cat sat.",
            "--coref", str(builtin_path("agreement")), "--json"]
    old = CliRunner().invoke(cli, [*base, "--report", str(tmp_path / "old"), "--causal-texts", "2"])
    assert old.exit_code == 0, old.output
    assert json.loads(old.stdout)["models"][0]["ablation"]["n_texts"] == 2
    assert "deprecated" in old.stderr and "--ablation-texts" in old.stderr
    off = CliRunner().invoke(cli, [*base, "--report", str(tmp_path / "off"), "--no-causal"])
    assert off.exit_code == 0 and json.loads(off.stdout)["models"][0]["ablation"] is None
    assert "--ablation/--no-ablation" in off.stderr
