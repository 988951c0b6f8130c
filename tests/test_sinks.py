"""Attention sinks: a hand-built tiny llama whose sink and value norm are known, the StreamingLLM mask's
identities, the sink rate, massive activations and dormant calls on hand-built numbers, the API and CLI.

Expected values come from the construction (a head that can only see position 0, a value that is ~0
there), from the model's own forward pass (bit for bit), or by hand.
"""

import copy
import dataclasses
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from headscope.analyses.metrics import METRICS
from headscope.analyses.sinks import (MASSIVE_ABS, SinkRate, dormant_calls, first_k_share, massive_activations,
                                      sequence_mass, sink_rate)
from headscope.probe.forward import base_model
from headscope.probe.sinks import head_internals, residual_stream, token_nll, window_mask
from headscope.probe.tiny import TINY_CORPUS
from headscope.workflows.heads import heads
from headscope.workflows.sinks import _head_table, sinks, streaming

from conftest import _tiny

TEXT = "Mary told John that she would call him tomorrow."


@pytest.fixture(scope="module")
def sink_llama():
    """A tiny llama whose head L0H0 attends (almost) only to position 0, where its value is ~0.

    Position 0 holds token s. Dimension 30 of every embedding is 1 (a constant for the query), dimension 31
    is 1 for s only; s's embedding is otherwise ~0. Head 0 (KV head 0) has one query row reading dim 30 and
    one key row reading dim 31, both in the rotary pair of the lowest frequency (dims 3 and 7 of the head,
    rotated by < 0.03 rad over these positions), so only key 0 scores, 1.2² · 8^-0.5 · x₃₀ x₃₁ ≈ 7.7 (x
    normalised to RMS 1): query i puts about e^7.7 / (e^7.7 + i) > 0.9 of its attention there.
    KV head 0's value rows ignore dims 30 and 31, so v at position 0 is ~1e-6 of the others.
    """
    shared = _tiny("llama")
    lm = dataclasses.replace(shared, model=copy.deepcopy(shared.model))  # the shared tiny model stays as it is
    ids = lm.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    s = ids[0]
    assert s not in ids[1:]
    base = base_model(lm)
    with torch.no_grad():
        emb = base.embed_tokens.weight
        emb[:, 30] = 1.0
        emb[:, 31] = 0.0
        emb[s] = 1e-6 * emb[s]
        emb[s, 30] = emb[s, 31] = 1.0
        base.layers[0].input_layernorm.weight[30:] = 1.0  # the random norm weights could flip a sign
        attn = base.layers[0].self_attn
        hd = attn.head_dim
        attn.q_proj.weight[:hd] = 0
        attn.q_proj.weight[3, 30] = 1.2
        attn.k_proj.weight[:hd] = 0
        attn.k_proj.weight[3, 31] = 1.2
        attn.v_proj.weight[:hd, 30:] = 0
    return lm, ids


# --- the hand-built sink ------------------------------------------------------------------------

def test_hand_built_sink_has_known_share_and_value_norm(sink_llama):
    lm, ids = sink_llama
    [item] = list(head_internals(lm, [TEXT]))
    assert item.probs.shape[-1] == len(ids)
    assert item.probs[0, 0, 1:, 0].min() > 0.9  # every query of L0H0 mostly on position 0
    ratio = item.value_norms[0, 0, 0] / item.value_norms[0, 0, 1:].median()
    assert ratio < 1e-4
    table = _head_table(lm, [TEXT], batch_size=8)
    row = table[(table["layer"] == 0) & (table["head"] == 0)].iloc[0]
    assert row.first_share_1 > 0.9 and row.value_norm_ratio < 1e-4
    assert row.norm_share < 0.01  # Kobayashi: it looks at the sink and adds (almost) nothing from it
    shares = table[[f"first_share_{k}" for k in range(1, 5)] + ["norm_share"]].to_numpy()
    assert ((shares >= 0) & (shares <= 1 + 1e-6)).all()


def test_hand_built_sink_is_a_no_op_under_mean_ablation(sink_llama):
    """Its output is ~0 everywhere, so replacing it by its mean changes the loss by ~0."""
    from headscope.workflows.ablation import ablate_each

    lm, _ = sink_llama
    frame = ablate_each(lm, method="mean", corpus=[TEXT])
    effect = frame[(frame["layer"] == 0) & (frame["head"] == 0)]["effect"].iloc[0]
    assert abs(effect) < 1e-3
    assert frame.effect.abs().max() > 10 * abs(effect)


def test_first_share_is_the_first_token_metric_and_norm_share_its_norm_weighted_twin():
    lm = _tiny("llama")
    texts = list(TINY_CORPUS[:3])
    table = _head_table(lm, texts, batch_size=8)
    one = {"first_token": METRICS["first_token"]}
    plain = heads(lm, texts, level="token", metrics=one, induction_sequences=0).grid("first_token").to_numpy()
    norm = heads(lm, texts, level="token", metrics=one, induction_sequences=0, weight="norm").grid("first_token").to_numpy()
    np.testing.assert_allclose(table.first_share_1.to_numpy(), plain.reshape(-1), atol=1e-6)
    np.testing.assert_allclose(table.norm_share.to_numpy(), norm.reshape(-1), atol=1e-6)


def test_first_k_share_by_hand_and_callers_tensor_untouched():
    P = torch.tensor([[[[1.0, 0, 0, 0], [0.5, 0.5, 0, 0], [0.2, 0.3, 0.5, 0], [0.1, 0.2, 0.3, 0.4]]]])
    before = P.clone()
    # k = 1: queries 1..3 -> (0.5 + 0.2 + 0.1) / 3; k = 2: queries 2, 3 -> (0.5 + 0.3) / 2
    assert first_k_share(P, 1, causal=True).item() == pytest.approx(0.8 / 3)
    assert first_k_share(P, 2, causal=True).item() == pytest.approx(0.4)
    assert math.isnan(first_k_share(P, 4, causal=True).item())
    # Gu et al.'s α averages over every query: k = 1 -> (1 + 0.5 + 0.2 + 0.1) / 4
    assert sequence_mass(P[None], 2)[0, 0, 0].tolist() == pytest.approx([0.45, (1 + 1 + 0.5 + 0.3) / 4])
    assert torch.equal(P, before)


# --- the StreamingLLM mask ----------------------------------------------------------------------

def test_window_mask_by_hand_and_its_dense_limits():
    m = window_mask(4, 2, keep=1)
    assert m.int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 1, 1]]
    dense = window_mask(6, None)
    assert torch.equal(dense, torch.ones(6, 6).tril().bool())
    assert torch.equal(window_mask(6, 2, keep=6), dense)  # keep >= T: dense
    assert torch.equal(window_mask(6, 6), dense)  # window >= T: dense
    with pytest.raises(ValueError, match="at least 1"):
        window_mask(3, 0)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_dense_mask_path_is_the_models_own_forward_bit_for_bit(family):
    """The explicit 4-D mask (per layer type for Gemma 3's sliding and full layers) gives the very logits of
    the model's normal forward; window >= T and keep >= T too; the model is left as it was."""
    lm = _tiny(family)
    ids = lm.tokenizer(TINY_CORPUS[3], return_tensors="pt")["input_ids"]
    params = [p.clone() for p in lm.model.parameters()]
    hooks = _hooks(lm)
    with torch.inference_mode():
        logits = lm.model(input_ids=ids, use_cache=False).logits
    own = F.cross_entropy(logits[0, :-1].float(), ids[0, 1:], reduction="none").double()
    T = ids.shape[1]
    assert torch.equal(token_nll(lm, ids[0]), own)
    assert torch.equal(token_nll(lm, ids[0], window=T), own)
    assert torch.equal(token_nll(lm, ids[0], window=2, keep=T), own)
    narrow = token_nll(lm, ids[0], window=2)
    assert torch.equal(narrow[:2], own[:2]) and not torch.equal(narrow, own)  # the first 2 queries see all keys
    assert all(torch.equal(a, b) for a, b in zip(params, lm.model.parameters()))
    assert _hooks(lm) == hooks


def _hooks(lm):
    return [(list(m._forward_hooks), list(m._forward_pre_hooks)) for m in lm.model.modules()]


def test_streaming_result_and_encoder_refused():
    lm = _tiny("llama")
    r = streaming(lm, TINY_CORPUS[3] * 2, window=4, keep=2, max_tokens=30)
    assert r.n_tokens == 30 and len(r.dense) == 29 and sorted(r.sink_window) == [1, 2]
    d = r.to_dict()
    assert {"dense_ppl", "window_ppl", "sink_window_ppl", "n_tokens"} <= set(d)
    assert d["dense_ppl"] == pytest.approx(math.exp(r.dense.mean()))
    assert np.array_equal(r.window_only[:4], r.dense[:4])  # the first queries see fewer than 4 keys anyway
    with pytest.raises(ValueError, match="needs a decoder"):
        streaming(_tiny("bert"), "a b c")


# --- sink rate, massive activations, dormant calls ---------------------------------------------

def test_sink_rate_and_its_bootstrap_on_hand_built_masses():
    m = np.zeros((6, 2, 2, 1))
    m[:, 0, 0, 0] = 0.9  # a sink on every sequence
    m[:3, 1, 1, 0] = 0.6  # mean 0.3: not above ε = 0.3
    before = m.copy()
    r = sink_rate(m, k=1, epsilon=0.3, n_boot=200)
    assert isinstance(r, SinkRate) and r.value == 0.25 and r.n_sequences == 6
    assert 0 <= r.ci95[0] <= r.value <= r.ci95[1] <= 1
    assert sink_rate(m, epsilon=0.2).value == 0.5
    assert np.array_equal(m, before)
    with pytest.raises(ValueError, match="at least one sequence"):
        sink_rate(np.zeros((0, 1, 1, 1)))


def test_massive_activations_find_a_planted_spike():
    gen = torch.Generator().manual_seed(0)
    states = torch.randn(2, 3, 5, 8, generator=gen)
    states[1, 2, 0, 6] = -5000.0  # layer 2, sequence 1, position 0, dim 6
    tokens = [[f"t{n}{t}" for t in range(5)] for n in range(2)]
    states[0, 2, 0, 6] = 4000.0  # the same place in another sequence: not a second row
    before = states.clone()
    frame = massive_activations(states, tokens, top=2)
    assert len(frame) == 6 and torch.equal(states, before)
    assert abs(frame[frame.layer == 2].iloc[1].value) < 100
    top = frame[frame.layer == 2].iloc[0]
    assert (top.sequence, top.position, top.token, top.dim, top.value) == (1, 0, "t10", 6, -5000.0)
    assert top.ratio_to_median == pytest.approx(5000 / float(states[:, 2].abs().median()))
    assert top.massive and top.value < -MASSIVE_ABS
    assert not frame[frame.layer < 2].massive.any()


def test_residual_stream_is_the_models_hidden_states():
    lm = _tiny("llama")
    ids = lm.tokenizer(TINY_CORPUS[0], return_tensors="pt")["input_ids"]
    states = residual_stream(lm, ids)
    with torch.inference_mode():
        hidden = base_model(lm)(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
    assert states.shape[:3] == (1, lm.config.num_hidden_layers, ids.shape[1])
    for layer in range(lm.config.num_hidden_layers - 1):  # the last hidden state has the final norm applied
        torch.testing.assert_close(states[:, layer], hidden[layer + 1], rtol=0, atol=1e-6)


def test_dormant_calls_need_a_sink_and_a_weak_ablation():
    share = np.array([[0.9, 0.9, 0.1], [0.2, 0.1, 0.95]])
    single = np.array([[0.0, 5.0, 0.3], [0.2, 0.4, 0.25]])  # loss changes: higher = mattered more
    frame = dormant_calls(share, single, stronger="higher", effect_metric="next_token_loss", n_random=5)
    calls = {(r.layer, r.head): r for r in frame.itertuples()}
    assert calls[(0, 0)].dormant is True  # a sink, the weakest ablation of all
    assert calls[(0, 1)].dormant is False and calls[(0, 1)].ablation_p == pytest.approx(1 / 6)  # the strongest
    assert calls[(0, 2)].dormant is None and not calls[(0, 2)].sink  # not a sink: no call
    assert calls[(1, 2)].sink and calls[(1, 2)].ablation_p > 0.05


# --- the workflow and the CLI -------------------------------------------------------------------

def test_sinks_json_has_the_issue_fields():
    lm = _tiny("llama")
    r = sinks(lm, list(TINY_CORPUS) * 2, length=12, n_sequences=4, n_random_sequences=2, ablation_texts=2,
              n_random=3, n_boot=20, massive_sequences=2, head_texts=2)
    d = json.loads(json.dumps(r.to_dict()))
    assert set(d["sink_rate"]) >= {"k", "epsilon", "value", "ci95"}
    assert {"layer", "head", "first_share", "value_norm_ratio", "norm_share", "dormant", "ablation_p"} <= set(d["heads"][0])
    assert {"layer", "position", "token", "dim", "value", "ratio_to_median"} <= set(d["massive"][0])
    assert [x["source"] for x in d["rates"]][:2] == ["text", "random"] and len(d["rates"]) == 5
    assert len(d["heads"]) == 8 and all(0 <= h["first_share"] <= 1 for h in d["heads"])
    assert all(h["dormant"] is None for h in d["heads"] if not h["sink"])
    assert len(r.to_frame()) == 8


def _cli(monkeypatch, lm, args):
    from click.testing import CliRunner

    from headscope.cli import cli
    from headscope.commands import sinks as sinks_cmd

    monkeypatch.setattr(sinks_cmd, "load_or_fail", lambda name, *placement: lm)
    return CliRunner().invoke(cli, ["sinks", *args])


def test_cli_sinks_and_streaming(monkeypatch, tmp_path):
    lm = _tiny("llama")
    corpus, out = tmp_path / "c.txt", tmp_path / "heads.csv"
    corpus.write_text("\n".join(TINY_CORPUS))
    res = _cli(monkeypatch, lm, ["--corpus", str(corpus), "--sequence-length", "12", "--sequences", "3", "--random-sequences",
                                 "2", "--no-dormant", "--json", "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["sink_rate"]["k"] == 1 and out.exists()
    text = tmp_path / "long.txt"
    text.write_text(" ".join(TINY_CORPUS))
    res = _cli(monkeypatch, lm, ["--streaming", "--window", "8", "--keep", "2", "--text-file", str(text), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert {"dense_ppl", "window_ppl", "sink_window_ppl", "n_tokens"} <= set(d)


@pytest.mark.parametrize("args, message", [
    (["--streaming", "--text-file", "nope.txt"], "no such file"),
    (["--text-file", "x.txt"], "--text-file is the long text of --streaming"),
    (["--k", "5"], "--k"),
])
def test_cli_sinks_bad_input_is_one_line_exit_2(monkeypatch, args, message):
    res = _cli(monkeypatch, _tiny("llama"), args)
    assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output


def test_cli_streaming_refuses_an_encoder(monkeypatch):
    res = _cli(monkeypatch, _tiny("bert"), ["--streaming"])
    assert res.exit_code == 2 and "needs a decoder" in res.output


# --- the packaged models (slow) -----------------------------------------------------------------

@pytest.mark.slow
def test_smollm2_needs_its_sink_tokens_beyond_the_window(smollm2, shared_data):
    """StreamingLLM's finding on the first 192 tokens of the EWT text: beyond a window of 48 keys the window
    alone loses, the window plus the first 4 tokens is back near dense attention (2048 tokens: docs/sinks.md)."""
    text = " ".join(line[9:].strip() for line in (shared_data / "ud-english-ewt" / "en_ewt-ud-test.conllu")
                    .read_text(encoding="utf-8").splitlines() if line.startswith("# text = "))
    ids = smollm2.tokenizer(text)["input_ids"][:192]
    dense, window, kept = (float(token_nll(smollm2, ids, window=w, keep=k)[48:].mean())
                           for w, k in ((None, 0), (48, 0), (48, 4)))
    assert window > dense + 0.2  # nats: perplexity × 1.2 and more
    assert abs(kept - dense) < 0.25 * (window - dense)


@pytest.mark.slow
def test_minilm_sink_rate_and_value_norms(minilm):
    r = sinks(minilm, list(TINY_CORPUS) * 8, length=32, n_sequences=8, n_random_sequences=8, ablation=False,
              head_texts=8, n_boot=200, massive_sequences=2)
    assert 0 < r.sink_rate.value <= 1 and r.sink_rate.ci95[0] <= r.sink_rate.value <= r.sink_rate.ci95[1]
    sinks_ = r.heads[r.heads["sink"]]
    assert len(sinks_) and (sinks_["value_norm_ratio"] < 1).mean() > 0.5  # a sink reads a small value at [CLS]
