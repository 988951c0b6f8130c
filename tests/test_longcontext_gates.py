"""DuoAttention's gates: full and streaming attention mixed per KV head in the model's own attention path, and the
gate optimisation that ranks KV heads by them."""

import numpy as np
import pytest
import torch

from headscope.probe.kvplan import KVPlan
from headscope.probe.longcontext import gate_heads, kv_layout, optimise_gates, stream_heads
from headscope.probe.tiny import tiny_model

from conftest import _tiny

IDS = torch.tensor([[1, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]])


def _logits(lm, ids=IDS):
    with torch.no_grad():
        return lm.model(input_ids=ids, use_cache=False).logits


def _hooks(lm):
    """Hooks of ours on the model: transformers installs its own output-capturing hooks for good the first time
    a shared model is asked for `output_attentions` (by another test), and those are not ours to remove."""
    return sum(not getattr(h, "__module__", "").startswith("transformers.")
               for m in lm.model.modules() for d in (m._forward_pre_hooks, m._forward_hooks) for h in d.values())


# grouped-query (4 query heads over 2 KV), sliding layers, ALiBi biases passed per batch × head, a hybrid stack
@pytest.mark.parametrize("family", ["llama", "gemma3", "bloom", "qwen3_next"])
def test_gates_at_one_are_the_model_and_at_zero_the_all_streaming_plan(family):
    lm = _tiny(family)
    layout = kv_layout(lm)
    planned = np.array(layout.planned)
    clean = _logits(lm)
    with gate_heads(lm, torch.ones(layout.shape), sink=1, recent=2):
        assert torch.equal(_logits(lm), clean)  # α = 1: 1·full + 0·streaming, bit for bit
    with stream_heads(lm, KVPlan.all_streaming(layout.shape, sink=1, recent=2, planned=planned)):
        streamed = _logits(lm)
    with gate_heads(lm, torch.zeros(layout.shape), sink=1, recent=2):
        got = _logits(lm)
    assert torch.equal(got, streamed) and not torch.equal(got, clean)  # α = 0: 0·full + 1·streaming, bit for bit


def test_gates_of_zeros_and_ones_are_the_kv_plan_and_a_gate_reaches_every_query_head_of_its_kv_head():
    lm = _tiny("llama")
    for full in ([[True, False], [False, True]], [[False, True], [True, True]], [[True, True], [False, True]]):
        plan = KVPlan(np.array(full), sink=1, recent=3)
        with stream_heads(lm, plan):
            expected = _logits(lm)
        with gate_heads(lm, torch.tensor(full, dtype=torch.float32), sink=1, recent=3):
            assert torch.equal(_logits(lm), expected)


def test_a_gate_between_mixes_the_two_outputs_of_each_head_linearly():
    lm = _tiny("llama")
    caught = []  # W_O's input of layer 1 (as its forward reads it, after the gate's pre-hook) under gates 1, 0, 0.3
    o_proj = lm.model.model.layers[1].self_attn.o_proj
    handle = o_proj.register_forward_hook(lambda m, a, out: caught.append(a[0]))
    try:
        for a in (1.0, 0.0, 0.3):
            g = torch.ones(2, 2)
            g[1, 0] = a
            with gate_heads(lm, g, sink=1, recent=2):
                _logits(lm)
    finally:
        handle.remove()
    full, stream, mixed = (c[0] for c in caught)  # one mixed batch each time
    width = lm.config.head_dim
    heads_of_kv0 = slice(0, 2 * width)  # query heads 0 and 1 read KV head 0
    torch.testing.assert_close(mixed[..., heads_of_kv0], 0.3 * full[..., heads_of_kv0] + 0.7 * stream[..., heads_of_kv0],
                               rtol=0, atol=1e-6)
    assert torch.equal(mixed[..., 2 * width :], full[..., 2 * width :])  # KV head 1's gate is 1 in every run
    assert not torch.equal(stream[..., heads_of_kv0], full[..., heads_of_kv0])


def test_the_gradient_reaches_the_gates_and_matches_finite_differences():
    lm = _tiny("llama")
    gates = torch.full((2, 2), 0.5, requires_grad=True)
    with gate_heads(lm, gates, sink=1, recent=2):
        (grad,) = torch.autograd.grad(lm.model(input_ids=IDS, use_cache=False).logits.sum(), gates)
    eps = 1e-2
    for cell in [(0, 0), (1, 1)]:
        up, down = torch.full((2, 2), 0.5), torch.full((2, 2), 0.5)
        up[cell] += eps
        down[cell] -= eps
        with torch.no_grad(), gate_heads(lm, up, sink=1, recent=2):
            hi = lm.model(input_ids=IDS, use_cache=False).logits.sum()
        with torch.no_grad(), gate_heads(lm, down, sink=1, recent=2):
            lo = lm.model(input_ids=IDS, use_cache=False).logits.sum()
        assert float(grad[cell]) == pytest.approx(float(hi - lo) / (2 * eps), rel=2e-2, abs=1e-4)
    assert all(p.grad is None for p in lm.model.parameters())


def test_optimisation_keeps_the_one_kv_head_that_matters_and_drives_the_others_to_zero():
    lm = tiny_model("llama", seed=3)  # a model of this test's own: only KV head 0 of layer 1 reaches the output
    width = lm.config.head_dim
    with torch.no_grad():
        for layer, cols in ((0, slice(None)), (1, slice(2 * width, None))):
            lm.model.model.layers[layer].self_attn.o_proj.weight[:, cols] = 0
        # and it matters: random weights are small, so its W_O columns are scaled up until streaming it moves the
        # last hidden states enough to outweigh the L1 penalty
        lm.model.model.layers[1].self_attn.o_proj.weight[:, : 2 * width] *= 30
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    rng = np.random.default_rng(0)
    examples = [(rng.integers(3, 100, size=24).tolist(), 20) for _ in range(3)]
    fit = optimise_gates(lm, examples, sink=1, recent=2, steps=15, lr=0.1, l1=0.05, seed=0)
    assert fit.gates[1, 0] > 0.5
    assert fit.gates[0, 0] == fit.gates[0, 1] == fit.gates[1, 1] == 0.0  # no distillation gradient: L1 alone
    assert fit.distill[0] == 0.0 and len(fit.losses) == 15 and fit.settings["tokens"] == 15 * 24
    assert fit.settings["steps"] == 15 and fit.settings["l1"] == 0.05
    after = lm.model.state_dict()  # the weights frozen: untouched, no gradient kept, no hook left
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in lm.model.parameters()) and _hooks(lm) == 0


def test_layers_the_model_windows_get_no_gate():
    lm = _tiny("gemma3")  # layers 0, 1 slide; layer 2 is global
    fit = optimise_gates(lm, [(list(range(3, 15)), 9)], sink=1, recent=2, steps=2)
    assert np.isnan(fit.gates[:2]).all() and np.isfinite(fit.gates[2]).all()


def test_hooks_are_removed_after_an_error_and_bad_calls_say_what_to_do():
    lm = _tiny("llama")
    clean = _logits(lm)
    with pytest.raises(RuntimeError, match="inside"):
        with gate_heads(lm, torch.zeros(2, 2), sink=1, recent=2):
            raise RuntimeError("inside")
    assert _hooks(lm) == 0 and torch.equal(_logits(lm), clean)
    with pytest.raises(ValueError, match="without a KV cache"):
        with gate_heads(lm, torch.ones(2, 2), sink=1, recent=2):
            lm.model(input_ids=IDS, use_cache=True)
    assert _hooks(lm) == 0
    with pytest.raises(ValueError, match=r"\(2, 2\)"):
        with gate_heads(lm, torch.ones(3, 2), sink=1, recent=2):
            pass
    with pytest.raises(ValueError, match="answer starts"):
        optimise_gates(lm, [([1, 2, 3], 3)], sink=1, recent=2, steps=1)
    with pytest.raises(ValueError, match="steps"):
        optimise_gates(lm, [([1, 2, 3], 2)], sink=1, recent=2, steps=0)


def test_retrieval_ranks_by_learned_gates_on_the_selection_needles_only():
    from headscope.probe.kvplan import Phrasing
    from headscope.workflows.retrieval import gate_examples, retrieval

    lm = _tiny("llama")
    kw = dict(n_needles=4, lengths=[60], depths=[0.5], check=False, sink=2, recent=8, seed=1,
              phrasings=[Phrasing("Key {key}.", "Key:")])
    r = retrieval(lm, gate_steps=3, ranking="gate", fraction=0.5, curve=(0.5,), n_random_plans=1,
                  scope="question", **kw)
    # the same optimisation run by hand on the selection needles' prompts and keys (never a held-out needle)
    from headscope.probe.longcontext import needle_prompt
    from headscope.analyses.corpus import builtin_corpus

    lines = builtin_corpus()[: len(builtin_corpus()) // 2]
    prompts = [needle_prompt(lm, n, lines) for n in r.needles if n.split == "selection"]
    examples = gate_examples(lm, prompts)
    assert [e[0][e[1]:] for e in examples] == [tuple(lm.tokenizer(" " + p.key, add_special_tokens=False)["input_ids"])
                                               for p in prompts]
    fit = optimise_gates(lm, examples, sink=2, recent=8, steps=3, seed=1)
    assert np.array_equal(r.gates, fit.gates)
    g = r.settings["gates"]
    assert (g["steps"], g["l1"], g["lr"], g["tokens"]) == (3, 0.05, 0.1, fit.settings["tokens"])
    assert np.array_equal(r.plan.full, KVPlan.from_ranking(fit.gates, 0.5, sink=2, recent=8).full)
    assert r.ranking == "gate" and "gate 50%" in set(r.costs["plan"]) and "gate" in set(r.costs["kind"])
    kv = r.kv_frame()
    assert np.array_equal(kv["gate"].to_numpy().reshape(2, 2), fit.gates)
    assert (r.to_frame().groupby(["layer", "kv_head"])["gate"].nunique() == 1).all()
    from headscope.reports.analysis import ModelAnalysis
    from headscope.reports.html import build_report

    html = build_report([ModelAnalysis(model="tiny-llama", long_context=r)]).html
    assert f"3 Adam steps (lr 0.1) over 2 selection needles, {fit.settings['tokens']:,} tokens in all, λ = 0.05" in html
    with pytest.raises(ValueError, match="gate_steps"):
        retrieval(lm, ranking="gate", **kw)


def test_cli_gates_write_the_learned_gates_beside_the_pattern(monkeypatch, tmp_path):
    import pandas as pd
    from click.testing import CliRunner

    from headscope.cli import cli
    from headscope.commands import retrieval as retrieval_cmd

    lm = _tiny("llama")
    monkeypatch.setattr(retrieval_cmd, "load_or_fail", lambda name, *placement: lm)
    out, pattern = tmp_path / "heads.csv", tmp_path / "pattern"
    res = CliRunner().invoke(cli, ["retrieval", "--needles", "2", "--length", "60", "--depth", "0.5", "--no-check",
                                   "--phrasing", "Key {key}.|Key:", "--sink", "2", "--recent", "8", "--gates", "2",
                                   "--rank-by", "gate", "--fraction", "0.25", "--out", str(out), "--pattern",
                                   str(pattern)])
    assert res.exit_code == 0, res.output
    assert "gates: 2 steps" in res.output and "plan by gate" in res.output
    gates = np.loadtxt(pattern / "gates.tsv", delimiter="\t", ndmin=2)  # as DuoAttention loads it
    frame = pd.read_csv(out)
    kv = frame.groupby(["layer", "kv_head"])["gate"].first().to_numpy().reshape(2, 2)
    np.testing.assert_allclose(gates, kv, rtol=1e-5)
    full = np.loadtxt(pattern / "full_attention_heads.tsv", delimiter="\t", ndmin=2)
    assert full.sum() == 1 and gates[full == 1].item() == gates.max()  # the plan keeps a highest gate
    refused = CliRunner().invoke(cli, ["retrieval", "--needles", "2", "--rank-by", "gate"])
    assert refused.exit_code == 2 and "--gates STEPS" in refused.output
