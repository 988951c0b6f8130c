"""Coreference / relation probes: scoring, honest selection, statistics, the runner and the CLI."""

import json
import math
from dataclasses import replace

import pytest
import torch

from headscope.analyses.coref import (
    CAUSAL_REASON,
    Excluded,
    ProbeResult,
    ProbeScores,
    blind_pairs,
    candidate_attention,
    collect_scores,
    concat_scores,
    head_correct,
    head_picks,
    score_probe,
)
from headscope.analyses.relations import builtin_set, parse_example
from headscope.analyses.selection import cross_validate, head_rank, select_head
from headscope.analyses.stats import Z95, group_folds, relabel_max_p, signflip_max_p, wilson
from headscope.probe.types import AttentionMap

# --------------------------------------------------------------------------------------------
# statistics


def test_wilson_known_values_and_score_equation():
    lo, hi = wilson(38, 40)
    assert lo == pytest.approx(0.834961, abs=1e-6) and hi == pytest.approx(0.986179, abs=1e-6)
    # Each bound is where the score statistic equals z (the definition of the Wilson interval).
    for p in (lo, hi):
        assert abs(0.95 - p) / math.sqrt(p * (1 - p) / 40) == pytest.approx(Z95, rel=1e-9)
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0
    assert all(math.isnan(x) for x in wilson(0, 0))
    with pytest.raises(ValueError):
        wilson(5, 3)


def test_group_folds_never_split_a_group_and_balance():
    groups = [f"g{i // 2}" for i in range(60)] + [f"s{i}" for i in range(15)]
    folds = group_folds(groups, 5, seed=3)
    for g in set(groups):
        assert len({f for f, h in zip(folds, groups) if h == g}) == 1
    sizes = [folds.count(f) for f in range(5)]
    assert max(sizes) - min(sizes) <= 2 and sum(sizes) == 75
    assert folds == group_folds(groups, 5, seed=3)  # deterministic
    assert folds != group_folds(groups, 5, seed=4)
    with pytest.raises(ValueError, match="cannot fill"):
        group_folds(["a", "a", "b"], 3)


def test_signflip_p_small_for_a_perfect_head_large_for_a_random_one():
    gen = torch.Generator().manual_seed(0)
    baseline = torch.randint(0, 2, (100,), generator=gen).float()  # right about half the time
    perfect = torch.ones(100)
    assert signflip_max_p((perfect - baseline)[:, None], n_perm=2000) < 0.001
    random_head = torch.randint(0, 2, (100,), generator=gen).float()
    assert signflip_max_p((random_head - baseline)[:, None], n_perm=2000) > 0.05
    # Many random heads: the best one looks good alone, but not once the max over heads is tested.
    half = torch.arange(200) % 2  # a baseline right on exactly half of 200 examples
    heads = torch.randint(0, 2, (200, 500), generator=gen).float()
    best = int((heads - half[:, None]).sum(0).argmax())
    alone = signflip_max_p((heads[:, best] - half)[:, None], n_perm=2000)
    family = signflip_max_p(heads - half[:, None], n_perm=2000)
    assert alone < 0.05 and family > 0.2, (alone, family)


def test_relabel_p_against_chance():
    answers = torch.zeros(100, dtype=torch.long)
    k = torch.full((100,), 2)
    assert relabel_max_p(torch.zeros(100, 1, dtype=torch.long), answers, k, n_perm=2000) < 0.001
    gen = torch.Generator().manual_seed(1)
    guess = torch.randint(0, 2, (100, 1), generator=gen)
    assert relabel_max_p(guess, answers, k, n_perm=2000) > 0.05
    # A head that never picks (all ties) cannot be above chance.
    assert relabel_max_p(torch.full((100, 1), -1), answers, k, n_perm=500) == 1.0


# --------------------------------------------------------------------------------------------
# from maps to [layer, head, candidate]


def _map(text, words, rows, *, causal=False, level="word", word_index=()):
    """A 1-layer map over `words` (found left to right in `text`); `rows[h][q]` = attention of head h, query q."""
    spans, pos = [], 0
    for w in words:
        a = text.index(w, pos)
        spans.append((a, a + len(w)))
        pos = a + len(w)
    att = torch.as_tensor(rows, dtype=torch.float32)[None]  # [layer=1, head, query, key]
    return AttentionMap(text=text, level=level, labels=tuple(words), spans=tuple(spans), special=(False,) * len(words),
                        attention=att, causal=causal, word_index=word_index)


def test_candidate_attention_sums_a_multiword_name_and_head_word_option():
    ex = parse_example({"text": "Ann Lee met Bo; she", "pronoun": "she", "candidates": ["Ann Lee", "Bo"],
                        "answer": "Ann Lee"})
    rows = torch.zeros(1, 6, 6)
    rows[0, 5] = torch.tensor([0.2, 0.3, 0.1, 0.15, 0.05, 0.2])
    m = _map(ex.text, ["Ann", "Lee", "met", "Bo", ";", "she"], rows)
    torch.testing.assert_close(candidate_attention(m, ex), torch.tensor([[[0.5, 0.15]]]))
    torch.testing.assert_close(candidate_attention(m, ex, head_word=True), torch.tensor([[[0.3, 0.15]]]))


def test_candidate_attention_token_level_averages_source_pieces():
    ex = parse_example({"text": "Bo met Al; Bo", "source": "Bo", "source_occurrence": 1, "candidates": ["Al", "met"],
                        "target": "Al"})
    # tokens: Bo | met | A | l | ; | B | o   (the source "Bo" and the candidate "Al" are two pieces each)
    text = ex.text
    spans = ((0, 2), (3, 6), (7, 8), (8, 9), (9, 10), (11, 12), (12, 13))
    att = torch.zeros(1, 1, 7, 7)
    att[0, 0, 5] = torch.tensor([0.1, 0.1, 0.3, 0.1, 0.0, 0.4, 0.0])
    att[0, 0, 6] = torch.tensor([0.0, 0.3, 0.1, 0.1, 0.1, 0.2, 0.2])
    m = AttentionMap(text=text, level="token", labels=("Bo", "met", "A", "l", ";", "B", "o"), spans=spans,
                     special=(False,) * 7, attention=att, causal=True, word_index=(0, 1, 2, 2, 3, 4, 4))
    # "Al": mean over the two source pieces of (A + l) = (0.4 + 0.2) / 2; "met": (0.1 + 0.3) / 2
    torch.testing.assert_close(candidate_attention(m, ex), torch.tensor([[[0.3, 0.2]]]))
    torch.testing.assert_close(candidate_attention(m, ex, head_word=True), torch.tensor([[[0.3, 0.2]]]))


def test_decoder_excludes_a_candidate_after_the_source():
    ex = parse_example({"text": "Before she left, Ann met Bea.", "pronoun": "she", "pronoun_occurrence": 0,
                        "candidates": ["Ann", "Bea"], "answer": "Ann"})
    words = ["Before", "she", "left", ",", "Ann", "met", "Bea", "."]
    m = _map(ex.text, words, torch.full((1, 8, 8), 1 / 8), causal=True)
    with pytest.raises(Excluded) as info:
        candidate_attention(m, ex)
    assert info.value.reason == CAUSAL_REASON
    encoder = _map(ex.text, words, torch.full((1, 8, 8), 1 / 8), causal=False)
    assert candidate_attention(encoder, ex).shape == (1, 1, 2)
    data = collect_scores([(ex, m), (ex, encoder)])
    assert len(data) == 1 and data.excluded == {CAUSAL_REASON: 1}


# --------------------------------------------------------------------------------------------
# picks, selection and the result, on known tensors


def test_picks_and_ties():
    scores = torch.tensor([[[[0.2, 0.7], [0.4, 0.4]]], [[[0.9, float("nan")], [0.1, 0.3]]]])  # [ex, layer, head, cand]
    assert head_picks(scores).tolist() == [[[1, -1]], [[0, 1]]]  # an exact tie is no pick
    answers = torch.tensor([1, 0])
    assert head_correct(scores, answers).tolist() == [[[True, False]], [[True, False]]]


def _toy(n_pairs=30, *, good=(1, 2), causal=False, seed=0):
    """Winograd-like pairs; head `good` (layer, head) of a 3x4 model always attends most to the answer."""
    gen = torch.Generator().manual_seed(seed)
    examples, rows = [], []
    for i in range(n_pairs):
        for answer in ("Ann", "Bea"):
            text = f"Ann met Bea and she was {'tired' if answer == 'Ann' else 'happy'} {i}."
            examples.append(parse_example({"text": text, "pronoun": "she", "candidates": ["Ann", "Bea"],
                                           "answer": answer, "group": f"p{i}", "id": f"{i}{answer}"}))
            s = torch.rand(3, 4, 2, generator=gen)  # [layer, head, candidate]
            s[good] = torch.tensor([0.8, 0.1]) if answer == "Ann" else torch.tensor([0.1, 0.8])
            rows.append(s)
    return ProbeScores(examples=tuple(examples), scores=torch.stack(rows), model="toy", causal=causal)


def test_a_head_that_always_attends_to_the_answer_is_selected_and_crowned():
    data = _toy()
    result = score_probe(data, task="toy", n_perm=2000)
    assert result.best_head == (1, 2) and result.fold_heads == ((1, 2),) * 5
    row = result.heads.query("layer == 1 and head == 2").iloc[0]
    assert (row.accuracy, row.correct, row.n) == (1.0, 60, 60)
    assert result.heldout_accuracy == 1.0 and (result.heldout_correct, result.heldout_n) == (60, 60)
    assert result.ci95 == pytest.approx(wilson(60, 60))
    # baselines by hand: every pair has one answer first (= Ann) and one nearest (= Bea)
    assert result.baselines == {"nearest": 0.5, "first": 0.5, "chance": 0.5}
    assert result.best_baseline == "nearest" and result.beats_baseline
    assert result.p_value < 0.001 and result.p_value_max < 0.001
    assert result.verdict.startswith("L1H2 (chosen in all 5 folds) resolves 60/60 held-out pronouns")
    assert "above the nearest-candidate baseline (30/60)" in result.verdict
    assert list(result.heads.columns) == ["layer", "head", "accuracy", "correct", "n", "ci_low", "ci_high"]
    assert len(result.heads) == 12


def test_random_heads_do_not_beat_the_baselines():
    data = _toy(good=(0, 0))
    # Seed 12 gives a head that is lucky all over (chosen in every fold): testing the pooled
    # held-out outcomes as if independent would reject; the test of the whole k-fold procedure
    # (selection re-run in every permutation) does not.
    noise = torch.rand(data.scores.shape, generator=torch.Generator().manual_seed(12))
    result = score_probe(ProbeScores(examples=data.examples, scores=noise, model="toy"), task="noise", n_perm=2000)
    heldout, _, _ = cross_validate(head_correct(noise, data.answers),
                                   group_folds([e.group for e in data.examples], 5), head_rank(3, 4))
    # the result's held-out outcomes are the ones the naive test below sees
    assert result.heldout_correct == int(heldout.sum()) and len(set(result.fold_heads)) == 1
    nearest_right = (data.answers == 1).double()  # "Bea" is the nearest candidate
    naive = signflip_max_p((heldout.double() - nearest_right)[:, None], n_perm=2000)
    assert naive < 0.05 < result.p_value
    assert not result.beats_baseline and result.verdict.startswith("no head beats the baselines")
    assert result.best_head is not None  # the choice is still reported, just not crowned


def test_the_kfold_test_keeps_its_level_on_noise():
    data = _toy(good=(0, 0), n_pairs=15)
    rejections, correct = 0, 0
    for seed in range(40):
        noise = torch.rand(data.scores.shape, generator=torch.Generator().manual_seed(100 + seed))
        result = score_probe(ProbeScores(examples=data.examples, scores=noise), task="noise", n_perm=300, seed=seed)
        rejections += result.beats_baseline
        correct += result.heldout_correct
    assert rejections <= 5  # about 2 expected at alpha = 0.05; the pooled-outcome test gave 7 in 40
    # a head chosen on noise is right half the time on examples it was not chosen on:
    # 40 x 30 held-out pairs, standard error 0.5 / sqrt(1200) ~ 0.014
    assert abs(correct / (40 * len(data)) - 0.5) < 4 * 0.5 / math.sqrt(40 * len(data))


def test_shuffled_scores_fall_to_the_baseline():
    data = _toy()  # head L1H2 is always right ...
    shuffled = data.scores[torch.randperm(len(data), generator=torch.Generator().manual_seed(0))]
    result = score_probe(ProbeScores(examples=data.examples, scores=shuffled, model="toy"), task="t", n_perm=500)
    # ... until its rows are dealt to other examples: then the answer is a coin flip for every head
    assert abs(result.heldout_accuracy - 0.5) < 3 * 0.5 / math.sqrt(len(data))
    assert not result.beats_baseline and result.verdict.startswith("no head beats the baselines")


def test_too_few_examples_crown_no_head():
    data = _toy(n_pairs=8)  # 16 examples < 20
    result = score_probe(data, task="tiny", n_perm=500)
    assert result.best_head is None and result.p_value is None and result.ci95 is None
    assert result.verdict.startswith("too few examples to crown a head: 16 held-out")
    assert "L1H2" in result.verdict and result.to_dict()["best_head"] is None


def test_cross_validation_scores_each_example_with_a_head_chosen_without_it():
    data = _toy(n_pairs=20)
    noise = torch.rand(data.scores.shape, generator=torch.Generator().manual_seed(3))
    correct = head_correct(noise, data.answers)
    rank = head_rank(3, 4, seed=1)
    folds = group_folds([e.group for e in data.examples], 4)
    heldout, which, choices = cross_validate(correct, folds, rank)
    assert len(choices) == 4 and heldout.shape == (40,)
    for i, f in enumerate(folds):
        train = [j for j, g in enumerate(folds) if g != f]
        li, hi = select_head(correct[train], rank)
        assert tuple(which[i].tolist()) == (li, hi) and heldout[i] == correct[i, li, hi]


def test_select_head_prefers_accuracy_then_the_seeded_order():
    correct = torch.zeros(4, 2, 2, dtype=torch.bool)
    correct[:, 0, 1] = True
    correct[:, 1, 0] = True
    assert select_head(correct, torch.tensor([0.0, 1.0, 3.0, 2.0])) == (1, 0)
    assert select_head(correct, torch.tensor([0.0, 3.0, 1.0, 2.0])) == (0, 1)
    correct[0, 1, 0] = False
    assert select_head(correct, torch.tensor([0.0, 1.0, 3.0, 2.0])) == (0, 1)
    assert sorted(head_rank(3, 4).tolist()) == list(range(12))


def test_chosen_on_one_set_scored_on_another():
    train, test = _toy(n_pairs=15, seed=1), _toy(n_pairs=12, seed=2)
    result = score_probe(train, task="a->b", heldout=test, n_perm=1000)
    assert result.best_head == (1, 2) and result.heldout_n == 24 and result.heldout_correct == 24
    assert result.n == 30 and "chosen on 30 examples, scored on 24 others" == result.selection
    assert "(chosen on the selection set)" in result.verdict


def test_chance_is_the_comparator_when_position_baselines_are_worse():
    data = _toy()
    # Put the answer always in the middle of three candidates: nearest and first are always wrong.
    examples = tuple(parse_example({"text": "Ann met Bea and Cy, so she left.", "pronoun": "she",
                                    "candidates": ["Ann", "Bea", "Cy"], "answer": "Bea", "group": e.group, "id": e.id})
                     for e in data.examples)
    scores = torch.rand(60, 3, 4, 3, generator=torch.Generator().manual_seed(0))
    scores[:, 1, 2] = torch.tensor([0.1, 0.8, 0.1])
    result = score_probe(ProbeScores(examples=examples, scores=scores), task="three", n_perm=1000)
    assert result.baselines["nearest"] == 0 and result.baselines["chance"] == pytest.approx(1 / 3)
    assert result.best_baseline == "chance" and result.beats_baseline and result.p_value < 0.01
    assert "20.0/60 expected" in result.verdict


def test_decoder_blind_pairs_are_noted():
    data = _toy()
    # both halves of each pair read the same up to "she": a decoder cannot separate them
    assert blind_pairs(data) == 0
    causal = ProbeScores(examples=data.examples, scores=data.scores, causal=True)
    assert blind_pairs(causal) == 60
    assert "60 of 60 examples read the same" in score_probe(causal, task="t", n_perm=200).notes[0]


def test_result_dict_is_json_ready_and_drill_down(tmp_path):
    result = score_probe(_toy(), task="toy", n_perm=500)
    obj = json.loads(json.dumps(result.to_dict()))
    for key in ("model", "n", "best_head", "heldout_accuracy", "ci95", "baselines", "p_value", "verdict", "heads"):
        assert key in obj
    assert obj["best_head"] == {"layer": 1, "head": 2} and set(obj["baselines"]) == {"nearest", "first", "chance"}
    assert len(obj["heads"]) == 12 and obj["heads"][0].keys() >= {"layer", "head", "accuracy", "ci_low"}
    ex = result.examples
    assert list(ex.columns) == ["example", "text", "source", "candidate", "attention", "chosen", "correct"]
    assert len(ex) == 120 and (ex.chosen == ex.correct).all()  # the best head is always right
    other = result.drill_down(0, 0)
    assert other.attention.tolist() == pytest.approx(result.data.scores[:, 0, 0].flatten().tolist())
    with pytest.raises(ValueError, match="layer 7 is not among the layers of these scores"):
        result.drill_down(7, 0)
    assert "L1H2" in result._repr_html_() and result.to_frame() is result.heads


def test_concat_scores_pads_candidates_and_adds_exclusions():
    a = _toy(n_pairs=2)
    b = ProbeScores(examples=a.examples[:1], scores=torch.zeros(1, 3, 4, 3), excluded={"x": 2})
    both = concat_scores([ProbeScores(examples=a.examples, scores=a.scores, excluded={"x": 1}), b])
    assert both.scores.shape == (5, 3, 4, 3) and torch.isnan(both.scores[:4, ..., 2]).all()
    assert both.excluded == {"x": 3}
    assert both.check is None  # no part recomputed a text


def test_concat_scores_keeps_the_check_of_whichever_part_made_one():
    # torchrun: rank 0's shard may hold no text long enough to recompute while rank 1's does
    a = _toy(n_pairs=1)
    check = {"passed": True, "max_abs_err": 1e-7}
    parts = [ProbeScores(examples=a.examples, scores=a.scores), replace(a, check=check)]
    assert concat_scores(parts).check == check and concat_scores(parts[::-1]).check == check


# --------------------------------------------------------------------------------------------
# the runner and the CLI on tiny random models


def test_runner_on_tiny_models(tiny):
    import headscope as hs

    examples = builtin_set("agreement")[:24]
    result = hs.coref(tiny, examples, task="coref-agreement", n_perm=200, folds=3)
    assert isinstance(result, ProbeResult) and result.n == 24 and result.model == tiny.name
    from headscope.probe.forward import attention_layers

    n_layers, n_heads = len(attention_layers(tiny)), tiny.config.num_attention_heads  # a hybrid: attention layers
    assert len(result.heads) == n_layers * n_heads
    assert result.heldout_n == 24 and result.verdict


def test_decoder_crop_changes_no_number():
    from headscope import extract_scores
    from headscope.probe.tiny import tiny_model

    lm = tiny_model("llama")
    examples = builtin_set("winograd")[:6]
    full = extract_scores(lm, examples, crop=False)
    cropped = extract_scores(lm, examples, crop=True)
    assert [e.id for e in cropped.examples] == [e.id for e in examples]
    torch.testing.assert_close(cropped.scores, full.scores, rtol=1e-5, atol=1e-6)


def test_runner_counts_texts_longer_than_the_context():
    from headscope import extract_scores
    from headscope.probe.encoding import TOO_LONG
    from headscope.probe.tiny import tiny_model

    lm = tiny_model("bert")  # 128 positions
    long = parse_example({"text": "Ann met Bea " + "and then " * 80 + "she left.", "pronoun": "she",
                          "candidates": ["Ann", "Bea"], "answer": "Ann"})
    data = extract_scores(lm, [long] + builtin_set("agreement")[:2])
    assert len(data) == 2 and list(data.excluded) == [f"{TOO_LONG} (128 tokens)"]


def test_cli_json_keys(monkeypatch, tmp_path):
    from click.testing import CliRunner

    import headscope.commands.coref as coref_cmd
    from headscope.cli import cli
    from headscope.probe.tiny import tiny_model

    lm = tiny_model("gpt2")
    monkeypatch.setattr(coref_cmd, "load_or_fail", lambda name, *placement: lm)
    out = tmp_path / "heads.csv"
    res = CliRunner().invoke(cli, ["coref", "--model", "tiny", "--permutations", "200", "--limit", "16", "--json",
                                   "--out", str(out), "--head", "1,2"])
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    for key in ("model", "n", "best_head", "heldout_accuracy", "ci95", "baselines", "p_value", "verdict", "heads"):
        assert key in obj
    assert obj["task"] == "coref-builtin" and set(obj["sets"]) == {"coref-agreement", "coref-winograd"}
    assert obj["n"] == obj["sets"]["coref-agreement"]["n"] + obj["sets"]["coref-winograd"]["n"]
    assert obj["drill_down"]["layer"] == 1 and len(obj["drill_down"]["examples"]) == 2 * obj["n"]
    assert out.read_text().splitlines()[0] == "model,task,layer,head,accuracy,correct,n,ci_low,ci_high"

    res = CliRunner().invoke(cli, ["relations", "--model", "tiny", "--permutations", "200", "--limit", "30"])
    assert res.exit_code == 0, res.output
    assert "verb-subject" in res.output and "verdict:" in res.output

    res = CliRunner().invoke(cli, ["coref", "--model", "tiny", "--permutations", "200", "--data", "agreement",
                                   "--heldout", "winograd", "--limit", "24", "--json"])
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    assert obj["task"] == "coref-agreement->coref-winograd" and obj["heldout_n"] == 24
    assert obj["selection"] == "chosen on 24 examples, scored on 24 others" and "coref-agreement" in obj["sets"]

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x", "pronoun": "it"}\n')
    res = CliRunner().invoke(cli, ["relations", "--model", "tiny", "--data", str(bad)])
    assert res.exit_code == 2 and "bad.jsonl:1: missing 'answer'" in res.output


# --------------------------------------------------------------------------------------------
# a real model


@pytest.mark.slow
def test_minilm_agreement_has_a_head_that_beats_the_baselines(minilm):
    import headscope as hs

    result = hs.coref(minilm, builtin_set("agreement"), task="coref-agreement", n_perm=2000)
    assert result.n == 70 and result.baselines["nearest"] == 0.5
    assert result.beats_baseline and result.heldout_accuracy > 0.75, result.verdict
    assert result.examples.groupby("example").chosen.sum().le(1).all()


def test_cli_causal_check_on_a_tiny_decoder(monkeypatch):
    from click.testing import CliRunner

    import headscope.commands.coref as coref_cmd
    from headscope.cli import cli
    from headscope.probe.tiny import tiny_model

    lm = tiny_model("llama")
    monkeypatch.setattr(coref_cmd, "load_or_fail", lambda name, *placement: lm)
    res = CliRunner().invoke(cli, ["coref", "--model", "tiny", "--data", "agreement", "--limit", "20", "--permutations",
                                   "200", "--ablate", "--random", "2", "--json"])
    assert res.exit_code == 0, res.output
    ablation = json.loads(res.stdout)["ablation"]
    assert ablation["n"] == 20 and len(ablation["random_deltas"]) == 2 and ablation["verdict"].startswith("ablating L")
    # the CLI's one --method default is mean (ablate, coref --ablate, sinks)
    assert ablation["prompt_template"].endswith('refers to') and ablation["method"] == "mean"
    res = CliRunner().invoke(cli, ["coref", "--model", "tiny", "--data", "agreement", "--limit", "20", "--permutations",
                                   "200", "--ablate", "--method", "uniform", "--random", "2"])
    assert res.exit_code == 0, res.output
    assert "(uniform) flips " in res.output and "random 1-head ablations flip" in res.output
    monkeypatch.setattr(coref_cmd, "load_or_fail", lambda name, *placement: tiny_model("bert"))
    res = CliRunner().invoke(cli, ["relations", "--model", "tiny", "--limit", "20", "--permutations", "200", "--ablate"])
    assert res.exit_code == 0, res.output
    assert "is an encoder: it does not predict a continuation" in res.output


def test_a_decoder_with_nothing_to_score_says_so():
    from headscope import extract_scores
    from headscope.probe.tiny import tiny_model

    lm = tiny_model("llama")
    after = parse_example({"text": "Before she left, Ann met Bea.", "pronoun": "she", "pronoun_occurrence": 0,
                           "candidates": ["Ann", "Bea"], "answer": "Ann"})
    data = extract_scores(lm, [after] * 3)
    assert len(data) == 0 and data.excluded == {CAUSAL_REASON: 3} and data.scores.shape == (0, 2, 4, 2)
    result = score_probe(data, task="empty", n_perm=100)
    assert result.best_head is None and result.verdict.startswith("too few examples to crown a head: 0 held-out")
    assert len(result.heads) == 8


def test_the_old_probe_command_still_works_one_release_with_a_warning(monkeypatch):
    from click.testing import CliRunner

    from headscope.cli import cli
    from headscope.probe.tiny import tiny_model

    monkeypatch.setattr("headscope.commands.coref.load_or_fail", lambda name, *placement: tiny_model("bert"))
    new = CliRunner().invoke(cli, ["relations", "--limit", "20", "--permutations", "100", "--no-verify", "--json"])
    old = CliRunner().invoke(cli, ["probe", "--limit", "20", "--permutations", "100", "--no-verify", "--json"])
    assert new.exit_code == old.exit_code == 0, old.output
    assert json.loads(old.stdout)["verdict"] == json.loads(new.stdout)["verdict"]
    assert "deprecated" in old.stderr and "headscope relations" in old.stderr and "deprecated" not in new.stderr
