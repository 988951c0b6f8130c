"""Checkpoint comparison: NAME@REVISION, paired intervals over texts, and the perturbed-layer test."""

import copy
import dataclasses
import json
import math
import statistics

import pandas as pd
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from headscope.analyses.compare import compare_scores, per_text_scores
from headscope.workflows.compare import IncompatibleModels, compare_models
from headscope.probe import loading
from headscope.probe.registry import ModelNotAvailable
from headscope.probe.tiny import TINY_CORPUS, tiny_model

# --- NAME@REVISION --------------------------------------------------------------------------------


def test_revision_reaches_every_from_pretrained(monkeypatch):
    seen = {}

    def fake(path, gguf_file, dtype, device, name, *, revision=None):
        seen.update(path=path, revision=revision)
        lm = tiny_model("llama")
        return lm.model, lm.tokenizer

    monkeypatch.setattr(loading, "_from_folder", fake)
    lm = loading.load_model("EleutherAI/pythia-70m@step1000")
    assert seen == {"path": "EleutherAI/pythia-70m", "revision": "step1000"}
    assert lm.name == "EleutherAI/pythia-70m@step1000" and lm.source.endswith("at revision step1000")


def test_revision_of_a_local_folder_is_refused(tmp_path):
    with pytest.raises(ModelNotAvailable, match="applies to hub ids"):
        loading.load_model(f"{tmp_path}@main")
    folder = tmp_path / "run@2"  # an existing path with an @ is a path, not a revision
    folder.mkdir()
    assert loading.split_revision(str(folder)) == (str(folder), None)


def test_revision_offline_fails_clearly(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotAvailable, match="nobody-here/no-model@v1"):
        loading.load_model("nobody-here/no-model@v1")


# --- the statistics, on hand-built tables ---------------------------------------------------------


def _table(values: dict[tuple[int, int, str], list[float]]) -> pd.DataFrame:
    rows = [{"text": i, "layer": l, "head": h, "metric": m, "value": v, "n": 4}
            for (l, h, m), vals in values.items() for i, v in enumerate(vals)]
    return pd.DataFrame(rows)


def test_paired_t_interval_and_rule_by_hand():
    a = _table({(0, 0, "self"): [0.1, 0.2, 0.3, 0.4], (0, 1, "self"): [0.5] * 4, (1, 0, "entropy"): [1.0] * 4,
                (1, 1, "self"): [0.2, 0.2, 0.2, 0.2]})
    b = _table({(0, 0, "self"): [0.3, 0.5, 0.4, 0.6], (0, 1, "self"): [0.5] * 4, (1, 0, "entropy"): [1.07] * 4,
                (1, 1, "self"): [0.21, 0.23, 0.22, 0.22]})
    c = compare_scores(a, b, a_name="A", b_name="B")
    row = {(r.layer, r.head, r.metric): r for r in c.table.itertuples()}
    d = [0.2, 0.3, 0.1, 0.2]  # paired differences of head (0, 0)
    half = 3.182446305284263 * statistics.stdev(d) / math.sqrt(4)  # t(0.975, df=3), from a table
    r = row[(0, 0, "self")]
    assert r.diff == pytest.approx(0.2) and (r.a, r.b) == (pytest.approx(0.25), pytest.approx(0.45))
    assert (r.ci_low, r.ci_high) == (pytest.approx(0.2 - half), pytest.approx(0.2 + half))
    assert r.changed
    same = row[(0, 1, "self")]  # no text moved: exact p = 1, interval [0, 0]
    assert (same.diff, same.ci_low, same.ci_high, same.p, same.changed) == (0, 0, 0, 1, False)
    shift = row[(1, 0, "entropy")]  # every text moved by 0.07 nats: significant but below entropy's 0.1
    assert shift.p == 0 and not shift.changed
    small = row[(1, 1, "self")]  # consistent but tiny shift of about 0.02: below the 0.05 minimum effect
    assert small.p_holm < 0.05 and not small.changed
    assert c.changed_heads() == [(0, 0)]
    assert c.grid("self").loc[0, 0] == pytest.approx(0.2) and c.grid("self").loc[0, 1] == 0


def test_a_model_against_itself_warns_nothing_and_tests_only_what_has_a_spread():
    """Issue 45: `compare A A` printed numpy's "Degrees of freedom <= 0" for a metric that applied to one text only.
    Such a pair is not tested (no interval, no p); every other pair moved by exactly 0: p = 1, interval [0, 0]."""
    import warnings

    nan = float("nan")
    a = _table({(0, 0, "self"): [0.4, nan, nan], (0, 1, "self"): [0.2, 0.3, 0.5], (1, 0, "entropy"): [1.0, 2.0, nan]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        c = compare_scores(a, a.copy())
    row = {(r.layer, r.head, r.metric): r for r in c.table.itertuples()}
    one = row[(0, 0, "self")]
    assert one.n_texts == 1 and one.diff == 0 and math.isnan(one.p) and math.isnan(one.ci_low) and not one.changed
    for key in [(0, 1, "self"), (1, 0, "entropy")]:
        assert (row[key].diff, row[key].ci_low, row[key].ci_high, row[key].p, row[key].changed) == (0, 0, 0, 1, False)
    assert "across all 2 (head, metric) pairs" in c.rule and c.changed_heads() == []


@settings(max_examples=25, deadline=None)
@example([(3, 0), (3, 0), (3, 0)])  # the same shift of -0.003 thrice: its float sd was 1e-19, not 0
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=2, max_size=12))
def test_the_paired_t_test_is_scipy_s(pairs):
    """The p-value and interval of each pair are scipy's paired t-test's (a reference computed apart)."""
    import numpy as np
    from scipy import stats

    va, vb = [p[0] / 1000 for p in pairs], [p[1] / 1000 for p in pairs]
    c = compare_scores(_table({(0, 0, "self"): va}), _table({(0, 0, "self"): vb}))
    r = c.table.iloc[0]
    d = np.array(vb) - np.array(va)
    if np.ptp(d) == 0:  # every text moved alike: the exact case
        assert r.p == (1.0 if d[0] == 0 else 0.0)
        return
    ref = stats.ttest_rel(vb, va)
    assert r.p == pytest.approx(ref.pvalue, rel=1e-6, abs=1e-12)
    low, high = ref.confidence_interval(0.95)
    assert (r.ci_low, r.ci_high) == (pytest.approx(low, abs=1e-9), pytest.approx(high, abs=1e-9))


def test_holm_corrects_over_all_pairs():
    # one noisy but mean-shifted pair among many: unadjusted p < 0.05, Holm over 40 pairs is not
    vals_a = {(0, h, "self"): [0.5] * 5 for h in range(40)}
    vals_b = dict(vals_a)
    vals_b[(0, 0, "self")] = [0.7, 0.55, 0.8, 0.6, 0.65]  # differences 0.2, 0.05, 0.3, 0.1, 0.15: t = 3.7
    c = compare_scores(_table(vals_a), _table(vals_b))
    r = c.table.iloc[0]
    assert r.p < 0.05 < r.p_holm and not r.changed


def test_different_heads_or_texts_are_refused():
    a = _table({(0, 0, "self"): [0.1, 0.2]})
    b = _table({(0, 1, "self"): [0.1, 0.2]})
    with pytest.raises(ValueError, match="different texts or heads"):
        compare_scores(a, b)


# --- the workflow on tiny models -----------------------------------------------------------------


def _perturbed(lm, layer_query, scale):
    """A deep copy of `lm` whose chosen query weights get noise of `scale` × their std (the original is untouched).

    The tiny models' attention is near uniform (small random LayerNorm gains), so they need a larger scale.
    """
    model = copy.deepcopy(lm.model)
    weight = dict(model.named_parameters())[layer_query]
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        weight.add_(torch.randn(weight.shape, generator=gen) * weight.std() * scale)
    return dataclasses.replace(lm, name=lm.name + "-perturbed", model=model)


def test_identical_models_change_nothing():
    lm = tiny_model("gpt2")
    c = compare_models(lm, lm, list(TINY_CORPUS))
    assert c.n_texts == len(TINY_CORPUS) and not c.table["changed"].any()
    assert (c.table["diff"] == 0).all() and c.roles_changed.empty


def test_perturbed_last_layer_flags_only_last_layer_tiny():
    lm = tiny_model("bert")
    last = lm.config.num_hidden_layers - 1
    other = _perturbed(lm, f"encoder.layer.{last}.attention.self.query.weight", 100)
    c = compare_models(lm, other, list(TINY_CORPUS))
    heads = c.changed_heads()
    assert heads and {layer for layer, _ in heads} == {last}
    earlier = c.table[c.table["layer"] < last]
    assert (earlier["diff"] == 0).all()  # the earlier layers' attention is bit-identical


def test_different_architecture_or_tokenizer_is_refused():
    with pytest.raises(IncompatibleModels, match="compare checkpoints of one architecture"):
        compare_models(tiny_model("bert"), tiny_model("gpt2"), ["a b c", "d e"])
    llama, gpt2 = tiny_model("llama"), tiny_model("gpt2")
    renamed = dataclasses.replace(llama, tokenizer=tiny_model("gemma3").tokenizer)
    with pytest.raises(IncompatibleModels, match="tokenize the text"):
        compare_models(llama, renamed, ["The cat sat.", "A dog ran!"])
    assert gpt2.model_type != llama.model_type


def test_per_text_scores_pool_to_the_corpus_scores():
    from headscope.analyses.heads import score_corpus
    from headscope.probe.extract import extract

    maps = extract(tiny_model("llama"), list(TINY_CORPUS), level="word")
    per_text = per_text_scores(maps)
    pooled = per_text[per_text["n"] > 0].assign(w=lambda f: f["value"] * f["n"]).groupby(
        ["layer", "head", "metric"])[["w", "n"]].sum()
    corpus = score_corpus(maps).table.set_index(["layer", "head", "metric"])
    joined = pooled.join(corpus, rsuffix="_corpus")
    assert (joined["n"] == joined["n_corpus"]).all()
    assert ((joined["w"] / joined["n"]) - joined["value"]).abs().max() < 1e-9


def test_cli_json_on_two_local_folders(tmp_path):
    from click.testing import CliRunner

    from headscope.cli import cli

    lm = tiny_model("bert")
    other = _perturbed(lm, "encoder.layer.1.attention.self.query.weight", 100)
    for name, m in (("a", lm), ("b", other)):
        m.model.save_pretrained(tmp_path / name)
        m.tokenizer.save_pretrained(tmp_path / name)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TINY_CORPUS), encoding="utf-8")
    res = CliRunner().invoke(cli, ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--corpus", str(corpus),
                                   "--json", "--no-verify"])
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)  # stderr has the progress bars
    assert {"a", "b", "n_texts", "heads"} <= set(obj) and obj["n_texts"] == len(TINY_CORPUS)
    assert set(obj["heads"][0]) == {"layer", "head", "metric", "a", "b", "diff", "ci95", "changed"}
    assert {h["layer"] for h in obj["heads"] if h["changed"]} == {1}
    text = CliRunner().invoke(cli, ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--corpus", str(corpus),
                                    "--no-verify"])
    assert text.exit_code == 0 and "difference (B - A), layer × head" in text.output
    bad = CliRunner().invoke(cli, ["compare", str(tmp_path / "a"), str(tmp_path / "nowhere"), "--corpus",
                                   str(corpus), "--no-verify"])
    assert bad.exit_code == 2 and "nowhere" in bad.output


@pytest.mark.slow
def test_perturbed_minilm_last_layer_flags_only_last_layer(minilm):
    from headscope.analyses.corpus import builtin_corpus

    last = minilm.config.num_hidden_layers - 1
    other = _perturbed(minilm, f"encoder.layer.{last}.attention.self.query.weight", 1)
    c = compare_models(minilm, other, builtin_corpus()[:40])
    heads = c.changed_heads()
    assert heads, "the perturbed layer must show changed heads"
    assert {layer for layer, _ in heads} == {last}
    assert (c.table[c.table["layer"] < last]["diff"] == 0).all()
