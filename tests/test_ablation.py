"""The ablation engine's statistics, effect readouts, gradient importance, norm-based attention, API and CLI.

Tiny random models and hand-built numbers; expected values from a reference loop, a finite
difference, or by hand.
"""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from headscope.workflows import ablation
from headscope.analyses.ablation import AblationResult, empirical_p, random_head_sets
from headscope.probe.effects import next_token_loss, sentence_cosine, word_cosine
from headscope.probe.forward import attention_layers, base_model
from headscope.probe.importance import gradient_importance, normalise_per_layer
from headscope.probe.interventions import ablate
from headscope.probe.norms import norm_attention, norm_weights
from headscope.probe.scratch import ScratchResult
from headscope.probe.tiny import TINY_CORPUS, tiny_model

TEXTS = list(TINY_CORPUS[:4])


@pytest.fixture(scope="module")
def gpt2():
    return tiny_model("gpt2")


@pytest.fixture(scope="module")
def bert():
    return tiny_model("bert")


# --- statistics ------------------------------------------------------------------------------

def test_empirical_p_counts_ties_and_follows_the_direction():
    assert empirical_p(1.0, [0.0, 0.5, 1.0, 2.0], stronger="higher") == pytest.approx(3 / 5)  # 1.0 and 2.0, +1
    assert empirical_p(1.0, [0.0, 0.5, 1.0, 2.0], stronger="lower") == pytest.approx(4 / 5)
    assert empirical_p(9.0, [0.0] * 19, stronger="higher") == pytest.approx(0.05)  # never 0
    assert empirical_p(1.0, [], stronger="higher") is None


def test_random_head_sets_exclude_the_chosen_heads_and_repeat_with_the_seed():
    chosen = [(0, 0), (1, 3)]
    sets = random_head_sets(3, 4, chosen, 3, 200, seed=7)
    assert all(len(set(s)) == 3 and not set(s) & set(chosen) for s in sets)
    assert sets == random_head_sets(3, 4, chosen, 3, 200, seed=7)
    counts = {}
    for s in sets:
        for h in s:
            counts[h] = counts.get(h, 0) + 1
    assert len(counts) == 10  # every other head is drawn
    with pytest.raises(ValueError, match="cannot draw 11"):
        random_head_sets(3, 4, chosen, 11, 1)


def test_ablation_result_dict_and_verdict():
    r = AblationResult(model="m", heads=((2, 1), (0, 3)), method="zero", effect_metric="next_token_loss", effect=1.5,
                       random_effects=tuple([0.1, 0.3] * 10), stronger="higher", baseline=2.0, n=7)
    d = r.to_dict()
    assert list(d)[:8] == ["model", "heads", "method", "effect_metric", "effect", "baseline", "n", "random"]
    assert d["heads"] == ["L2H1", "L0H3"] and d["random"]["n"] == 20
    assert d["random"]["mean"] == pytest.approx(0.2) and d["random"]["sd"] == pytest.approx(np.std([0.1, 0.3] * 10, ddof=1))
    assert d["p_value"] == pytest.approx(1 / 21)
    assert "stronger effect than random heads (p = 0.048)" in d["verdict"] and "L2H1+L0H3" in d["verdict"]
    weak = AblationResult(model="m", heads=((0, 0),), method="mean", effect_metric="x", effect=0.2,
                          random_effects=(0.1, 0.3), stronger="higher")
    assert "not a stronger effect" in weak.verdict
    floor = AblationResult(model="m", heads=((0, 0),), method="zero", effect_metric="x", effect=5.0,
                           random_effects=(0.1,) * 19, stronger="higher")
    assert floor.p_value == pytest.approx(0.05) and "a stronger effect than random heads (p = 0.05)" in floor.verdict
    json.dumps(d)


# --- effect readouts -------------------------------------------------------------------------

def test_next_token_loss_matches_a_per_text_loop(gpt2):
    task = next_token_loss(gpt2, TEXTS, batch_size=3)  # padded batches
    got = task.read(gpt2)
    for i, t in enumerate(TEXTS):
        ids = torch.tensor([gpt2.tokenizer(t)["input_ids"]])
        with torch.no_grad():
            logits = gpt2.model(input_ids=ids).logits[0]
        ref = F.cross_entropy(logits[:-1], ids[0, 1:])
        assert float(got[i]) == pytest.approx(float(ref), rel=1e-5)
    assert task.change(got, got + 0.25) == pytest.approx(0.25)


def test_cosines_are_one_without_ablation_and_pick_the_word(bert):
    task = sentence_cosine(bert, TEXTS)
    clean = task.read(bert)
    assert task.change(clean, task.read(bert)) == pytest.approx(1.0)
    texts = ["The cat sat on the mat.", "A dog and a cat."]
    wt = word_cosine(bert, texts, "cat")
    vec = wt.read(bert)
    enc = bert.tokenizer(texts[1], return_offsets_mapping=True)
    ids = torch.tensor([enc["input_ids"]])
    with torch.no_grad():
        h = base_model(bert)(input_ids=ids).last_hidden_state[0]
    cat = [i for i, (a, b) in enumerate(enc["offset_mapping"]) if a < 15 and b > 12 and b > a]  # "cat" is chars 12..15
    ref = h[cat].mean(0)
    torch.testing.assert_close(vec[1].float(), ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="does not contain the word 'horse'"):
        word_cosine(bert, texts, "horse")


def test_decoder_only_effects_refuse_an_encoder(bert):
    with pytest.raises(ValueError, match="needs a decoder"):
        next_token_loss(bert, TEXTS)


# --- the ablate workflow ---------------------------------------------------------------------

def test_ablate_effect_is_the_readout_change_and_random_sets_repeat(gpt2):
    heads = [(1, 2)]
    r = ablation.ablate(gpt2, heads, method="zero", corpus=TEXTS, n_random=5, seed=3)
    task = next_token_loss(gpt2, TEXTS)
    clean = task.read(gpt2)
    with ablate(gpt2, heads):
        hit = task.read(gpt2)
    assert r.effect == pytest.approx(float((hit - clean).mean()), rel=1e-6)
    assert r.baseline == pytest.approx(float(clean.mean()))
    assert r.random_effects == ablation.ablate(gpt2, heads, method="zero", corpus=TEXTS, n_random=5,
                                                seed=3).random_effects
    sets = random_head_sets(2, 4, heads, 1, 5, seed=3)
    with ablate(gpt2, sets[0]):
        first = float((task.read(gpt2) - clean).mean())
    assert r.random_effects[0] == pytest.approx(first, rel=1e-6)


def test_ablating_every_head_of_an_encoder_moves_the_embedding_more_than_one_head(bert):
    every = [(l, h) for l in range(2) for h in range(4)]
    assert ablation.ablate(bert, every, corpus=TEXTS, n_random=0).effect < ablation.ablate(bert, [(0, 0)], corpus=TEXTS,
                                                                                       n_random=0).effect < 1.0


def test_induction_task_and_cloze_on_a_decoder():
    lm = tiny_model("llama")
    r = ablation.ablate(lm, [(1, 0)], task=ablation.InductionTask(n_sequences=2, length=6), n_random=2, method="uniform")
    assert r.effect_metric == "sequence_loss" and r.n == 2 and r.extra["task"] == "induction"
    cloze = ablation.Cloze(("The cat sat on the",), (" mat",), (" dog",))
    r = ablation.ablate(lm, [(1, 0)], task=cloze, n_random=2, method="mean")
    assert r.effect_metric == "logit_diff" and r.stronger == "lower"


def test_ablate_each_gives_one_row_per_head(gpt2):
    frame = ablation.ablate_each(gpt2, corpus=TEXTS[:2])
    assert len(frame) == 8 and set(frame.columns) == {"model", "layer", "head", "effect_metric", "effect"}
    single = ablation.ablate(gpt2, [(1, 3)], corpus=TEXTS[:2], n_random=0).effect
    assert frame.query("layer == 1 and head == 3")["effect"].item() == pytest.approx(single)


def test_ablate_says_what_is_wrong(gpt2, bert):
    with pytest.raises(ValueError, match="exactly one of corpus"):
        ablation.ablate(gpt2, [(0, 0)])
    with pytest.raises(ValueError, match="needs a decoder"):
        ablation.ablate(bert, [(0, 0)], task="induction")
    with pytest.raises(ValueError, match="no heads"):
        ablation.ablate(gpt2, [], corpus=TEXTS)


# --- gradient importance ---------------------------------------------------------------------

def _loss_with_gate(lm, text, layer, head, value):
    xi = torch.ones(lm.config.num_hidden_layers, lm.config.num_attention_heads, dtype=torch.float64)
    xi[layer, head] = value
    from headscope.probe.interventions import head_mask

    ids = torch.tensor([lm.tokenizer(text)["input_ids"]])
    with torch.no_grad(), head_mask(lm, xi):
        if lm.is_causal:
            logits = lm.model(input_ids=ids).logits[0]
            return float(F.cross_entropy(logits[:-1].double(), ids[0, 1:]))
        return float(base_model(lm)(input_ids=ids).last_hidden_state[0].double().mean(0).norm())


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_importance_is_the_mean_absolute_gradient(family):
    """Against central finite differences per text, and the same in one padded batch as text by text."""
    lm = tiny_model(family)
    texts = TEXTS[:2]
    imp = gradient_importance(lm, texts, batch_size=2)
    eps = 1e-3
    for layer, head in [(0, 1), (1, 3)]:
        fd = [abs(_loss_with_gate(lm, t, layer, head, 1 + eps) - _loss_with_gate(lm, t, layer, head, 1 - eps)) / (2 * eps)
              for t in texts]
        assert float(imp.raw[layer, head]) == pytest.approx(np.mean(fd), rel=2e-2, abs=1e-5)
    one_by_one = gradient_importance(lm, texts, batch_size=1)
    torch.testing.assert_close(imp.raw, one_by_one.raw, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(imp.importance.norm(dim=-1), torch.ones(lm.config.num_hidden_layers))
    frame = imp.to_frame()
    assert list(frame.columns) == ["model", "layer", "head", "importance", "n"] and (frame["n"] == 2).all()
    assert frame["importance"].is_monotonic_decreasing
    assert imp.loss == ("next_token_loss" if lm.is_causal else "embedding_norm")


def test_normalise_per_layer_keeps_ratios():
    s = torch.tensor([[1.0, 2.0, 2.0], [0.0, 0.0, 5.0]])
    torch.testing.assert_close(normalise_per_layer(s), torch.tensor([[1 / 3, 2 / 3, 2 / 3], [0.0, 0.0, 1.0]]))


def test_importance_leaves_the_model_as_it_was(gpt2):
    before = {k: v.clone() for k, v in gpt2.model.state_dict().items()}
    gradient_importance(gpt2, TEXTS[:2])
    assert all(torch.equal(before[k], v) for k, v in gpt2.model.state_dict().items())
    assert all(p.grad is None for p in gpt2.model.parameters())


# --- norm-based attention --------------------------------------------------------------------

def test_norm_weights_by_hand():
    # 2 heads of width 1, 2 tokens, D = 2. W_O maps head 0 to e0 and head 1 to -e0 · 2.
    probs = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]], [[1.0, 0.0], [0.25, 0.75]]]])  # (1, 2, 2, 2)
    values = torch.tensor([[[[3.0], [4.0]], [[1.0], [2.0]]]])  # (1, 2, T, 1)
    wo = torch.tensor([[1.0, -2.0], [0.0, 0.0]])  # (D, nh*hs)
    res = ScratchResult(scores=probs, probs=probs, values=values, heads_out=probs @ values, output=torch.zeros(1, 2, 2))
    per_head, per_layer = norm_weights(res, wo)
    # ‖f‖: head 0 keys (3, 4); head 1 keys (2, 4)
    torch.testing.assert_close(per_head[0, 0], torch.tensor([[3.0, 0.0], [1.5, 2.0]]))
    torch.testing.assert_close(per_head[0, 1], torch.tensor([[2.0, 0.0], [0.5, 3.0]]))
    # summed vectors along e0: query 0 key 0: 3 - 2 = 1; query 1: key 0 1.5 - 0.5 = 1, key 1 2 - 3 = -1
    torch.testing.assert_close(per_layer[0], torch.tensor([[1.0, 0.0], [1.0, 1.0]]))


def test_norm_attention_on_every_family(tiny):
    [m] = norm_attention(tiny, TEXTS[2])
    L, H = len(attention_layers(tiny)), tiny.config.num_attention_heads  # a hybrid stack: its attention layers
    T = len(m.labels)
    assert m.per_head.shape == (L, H, T, T) and m.per_layer.shape == (L, T, T)
    assert (m.per_layer <= m.per_head.sum(1) + 1e-4).all()  # the norm of a sum is at most the sum of norms
    if tiny.is_causal:
        assert (m.per_head.triu(1) == 0).all()
    batch = norm_attention(tiny, [TEXTS[0], TEXTS[2]], batch_size=2)  # padded: the same numbers
    torch.testing.assert_close(batch[1].per_head, m.per_head, rtol=1e-4, atol=1e-5)


# --- CLI -------------------------------------------------------------------------------------

def _cli(monkeypatch, lm, args):
    from click.testing import CliRunner

    from headscope.cli import cli
    from headscope.commands import ablate as ablate_cmd, importance as importance_cmd

    monkeypatch.setattr(ablate_cmd, "load_or_fail", lambda name, *placement: lm)
    monkeypatch.setattr(importance_cmd, "load_or_fail", lambda name, *placement: lm)
    return CliRunner().invoke(cli, args)


def test_cli_ablate_json(monkeypatch, tmp_path, gpt2):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(TEXTS))
    res = _cli(monkeypatch, gpt2, ["ablate", "--model", "t", "--heads", "L1H2,L0H0", "--corpus", str(corpus),
                                   "--random", "4", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)  # stderr has the progress bar
    # the CLI's one --method default is mean (every command that ablates: ablate, coref --ablate, sinks)
    assert d["heads"] == ["L0H0", "L1H2"] and d["random"]["n"] == 4 and d["method"] == "mean"
    assert d["effect"] == pytest.approx(ablation.ablate(gpt2, [(0, 0), (1, 2)], corpus=TEXTS, n_random=0,
                                                        method="mean").effect)
    res = _cli(monkeypatch, gpt2, ["ablate", "--heads-by", "previous_token:2", "--task", "induction", "--random", "2",
                                   "--method", "uniform"])
    assert res.exit_code == 0, res.output
    assert "random sets of 2 heads" in res.output


@pytest.mark.parametrize("args, message", [
    (["--corpus", "x.txt"], "exactly one of --heads"),
    (["--heads", "L0H0"], "exactly one of --corpus"),
    (["--heads", "L0H0", "--task", "induction", "--corpus", "x"], "exactly one of --corpus"),
    (["--heads", "X9", "--task", "induction"], "'X9' is not a head name"),
    (["--heads", "L7H0", "--task", "induction"], "out of range"),
    (["--heads-by", "induction", "--task", "induction"], "write METRIC:K"),
    (["--heads-by", "bogus:3", "--task", "induction"], "unknown metric 'bogus'"),
])
def test_cli_ablate_bad_input_is_one_line_and_nonzero(monkeypatch, gpt2, args, message):
    res = _cli(monkeypatch, gpt2, ["ablate", *args])
    assert res.exit_code == 2 and message in res.output
    assert "Traceback" not in res.output


def test_cli_importance_writes_tidy_rows(monkeypatch, tmp_path, gpt2):
    import pandas as pd

    corpus, out = tmp_path / "c.txt", tmp_path / "imp.csv"
    corpus.write_text("\n".join(TEXTS))
    res = _cli(monkeypatch, gpt2, ["importance", "--corpus", str(corpus), "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    frame = pd.read_csv(out)
    assert list(frame.columns) == ["model", "layer", "head", "importance", "n"] and len(frame) == 8
    ref = gradient_importance(gpt2, TEXTS).importance
    assert frame.iloc[0]["importance"] == pytest.approx(float(ref.max()), rel=1e-5)
    assert json.loads(res.stdout)["loss"] == "next_token_loss"
    res = _cli(monkeypatch, gpt2, ["importance", "--corpus", str(corpus), "--out", str(tmp_path / "x.txt")])
    assert res.exit_code == 2 and "use a .csv, .parquet, .json" in res.output
