"""Direct logit attribution, QK attribution and activation patching: identities, exact limits, hooks left clean."""

import json

import numpy as np

import pytest
import torch

from conftest import _tiny
from headscope.probe.attribution import direct_logit_attribution

DECODERS = ["llama", "gpt2", "gemma3"]
PROMPT = "The cat sat on the"


def _hooks(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(model, state) -> bool:
    now = model.state_dict()
    return state.keys() == now.keys() and all(torch.equal(v, now[k]) for k, v in state.items())


def _model_logits(lm, text):
    ids = lm.tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return lm.model(ids).logits[0, -1].double()


@pytest.mark.parametrize("family", DECODERS + ["olmo2", "opt", "falcon"])
def test_dla_parts_sum_to_the_models_own_logit_difference(family):
    lm = _tiny(family)
    a, b = " mat", " dog"
    r = direct_logit_attribution(lm, PROMPT, a, b)
    ia, ib = (lm.tokenizer(x, add_special_tokens=False)["input_ids"][0] for x in (a, b))
    logits = _model_logits(lm, PROMPT)  # the model's own forward, apart from the traced one
    assert r.total == pytest.approx(float(logits[ia] - logits[ib]), abs=1e-5)
    assert abs(float(r.table["value"].sum()) - r.total) == pytest.approx(r.identity_abs_err)
    assert r.identity_abs_err < 1e-5 and r.attention_abs_err < 1e-5 and r.final_norm_abs_err < 1e-5
    n_layers, n_heads = lm.config.num_hidden_layers, lm.config.num_attention_heads
    assert r.grid().shape == (n_layers, n_heads)
    assert set(r.table["component"]) >= {"embed", "L0H0", f"L{n_layers - 1}.mlp"}
    # without a wrong answer the parts sum to the logit itself
    single = direct_logit_attribution(lm, PROMPT, a)
    assert single.total == pytest.approx(float(logits[ia]), abs=1e-5) and single.identity_abs_err < 1e-5


def test_dla_applies_gemma2s_final_softcap_after_and_says_so():
    lm = _tiny("gemma2")
    r = direct_logit_attribution(lm, PROMPT, " mat", " dog")
    capped = _model_logits(lm, PROMPT)  # Gemma 2's output logits are the capped ones
    ia, ib = (lm.tokenizer(x, add_special_tokens=False)["input_ids"][0] for x in (" mat", " dog"))
    assert r.softcap == lm.config.final_logit_softcapping
    assert r.capped_total == pytest.approx(float(capped[ia] - capped[ib]), abs=1e-5)
    assert r.identity_abs_err < 1e-5 and "caps logits" in r.summary()


def test_dla_leaves_the_model_as_it_was_also_after_an_error():
    lm = _tiny("llama")
    state, hooks = _state(lm.model), _hooks(lm.model)
    direct_logit_attribution(lm, PROMPT, " mat")
    assert _same(lm.model, state) and _hooks(lm.model) == hooks

    def boom(module, args):
        raise RuntimeError("boom")

    handle = lm.model.model.layers[1].register_forward_pre_hook(boom)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            direct_logit_attribution(lm, PROMPT, " mat")
    finally:
        handle.remove()
    assert _same(lm.model, state) and _hooks(lm.model) == hooks


def test_dla_refuses_an_encoder_in_one_line():
    with pytest.raises(ValueError, match="needs a decoder"):
        direct_logit_attribution(_tiny("bert"), PROMPT, " mat")


def test_dla_command_json_and_refusal(tmp_path):
    from click.testing import CliRunner

    from headscope.cli import cli

    runner = CliRunner()
    res = runner.invoke(cli, ["dla", "--model", "tiny:gpt2", "--prompt", PROMPT, "--answer", " mat", "--wrong", " dog",
                              "--json", "--figure", str(tmp_path / "grid.png")])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert sum(c["value"] for c in out["components"]) == pytest.approx(out["total"], abs=1e-5)
    assert {"embed", "L1H3", "L1.mlp"} <= {c["component"] for c in out["components"]}
    assert (tmp_path / "grid.png").read_bytes()[:4] == b"\x89PNG"
    res = runner.invoke(cli, ["dla", "--model", "tiny:gpt2", "--prompt", PROMPT, "--answer", " mat",
                              "--figure", str(tmp_path / "grid.png")])  # never replaces a file, before any work
    assert res.exit_code == 2 and "exists" in res.stderr and len(res.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------------------------
# Activation patching

from headscope.analyses.patching import PatchPair, bootstrap_ci, read_pairs, strength  # noqa: E402
from headscope.probe.patching import patch_metrics, prepare_pairs, sweep_sites  # noqa: E402

CLEAN = ["The cat sat on the", "and the dog sat on the"]  # the same length in both tiny tokenizers
CORRUPT = ["The dog sat on the", "and the cat sat on the"]


def _prepared(lm):
    return prepare_pairs(lm, CLEAN, CORRUPT, [" mat", " log"], [" dog", " cat"])


@pytest.mark.parametrize("family", DECODERS)
def test_patching_limits_are_exact(family):
    lm = _tiny(family)
    p = _prepared(lm)
    state, hooks = _state(lm.model), _hooks(lm.model)
    clean = patch_metrics(lm, p, [frozenset()], direction="noise")[0]
    corrupt = patch_metrics(lm, p, [frozenset()], direction="denoise")[0]
    # the metric read off the model's own logits, apart from the patching code
    for i, (text, r, w) in enumerate(zip(CLEAN, p.right, p.wrong)):
        logits = _model_logits(lm, text)
        assert float(clean[i]) == pytest.approx(float(logits[r] - logits[w]), abs=1e-5)
    L = lm.config.num_hidden_layers
    resid = [frozenset([("resid", l, None)]) for l in range(L)]
    heads = [frozenset([s]) for s in sweep_sites(lm, "head_out")]
    # the last layer's heads and MLP and its input, all patched together
    last = frozenset({("resid", L - 1, None), ("mlp", L - 1, None), *(s for h in heads for s in h if s[1] == L - 1)})
    for direction, base, source in (("denoise", corrupt, clean), ("noise", clean, corrupt)):
        m = patch_metrics(lm, p, [frozenset(), *resid, last], direction=direction, batch_rows=5)
        assert torch.allclose(m[0], base, rtol=0, atol=1e-6)  # patching nothing: the base run
        assert torch.allclose(m[1:], source.expand(L + 1, -1), rtol=0, atol=1e-6)  # the whole stream: the source
    if family == "llama":  # clean == corrupt: no effect anywhere
        same = prepare_pairs(lm, CLEAN, CLEAN, [" mat", " log"], [" dog", " cat"])
        m = patch_metrics(lm, same, heads + resid, direction="denoise")
        assert torch.allclose(m, clean.expand_as(m), rtol=0, atol=1e-6)
    assert _same(lm.model, state) and _hooks(lm.model) == hooks


def test_batched_patching_equals_one_patch_per_forward():
    lm = _tiny("llama")
    p = _prepared(lm)
    jobs = [frozenset([("head", 0, 1)]), frozenset([("head", 1, 3), ("resid", 1, 2)]), frozenset(sweep_sites(lm, "mlp"))]
    batched = patch_metrics(lm, p, jobs, direction="noise", batch_rows=512)  # every job in one forward
    one_by_one = torch.stack([patch_metrics(lm, p.subset([i]), [j], direction="noise", batch_rows=1)[0, 0]
                              for j in jobs for i in range(p.n)]).view(len(jobs), p.n)  # reference loop
    assert torch.allclose(batched, one_by_one, rtol=0, atol=1e-5)


def test_patching_leaves_the_model_as_it_was_after_an_error():
    lm = _tiny("gpt2")
    p = _prepared(lm)
    state, hooks = _state(lm.model), _hooks(lm.model)

    def boom(module, args):
        raise RuntimeError("boom")

    handle = lm.model.transformer.h[1].register_forward_pre_hook(boom)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            patch_metrics(lm, p, [frozenset([("head", 0, 1)]), frozenset([("resid", 1, 2)])], direction="denoise")
    finally:
        handle.remove()
    assert _same(lm.model, state) and _hooks(lm.model) == hooks


def test_patching_refuses_pairs_of_different_lengths_and_bad_files(tmp_path):
    lm = _tiny("llama")
    with pytest.raises(ValueError, match="pair 0: the clean prompt has"):
        prepare_pairs(lm, ["The cat sat"], ["The cat sat on the mat"], [" on"], [" in"])
    bad = tmp_path / "pairs.jsonl"
    bad.write_text('{"clean": "a", "corrupt": "b", "right": "c"}\n')
    with pytest.raises(ValueError, match="line 1: needs the text fields wrong"):
        read_pairs(bad)


def test_patch_statistics_by_hand():
    # strength: how far a patch moves the metric toward the source run, signed by clean − corrupt
    clean, corrupt = np.array([2.0, 4.0]), np.array([0.0, 0.0])
    assert strength(np.array([1.0, 1.0]), clean, corrupt, "denoise").tolist() == [1.0, 1.0]
    assert strength(np.array([1.0, 1.0]), clean, corrupt, "noise").tolist() == [1.0, 3.0]
    # the bootstrap interval of a mean lies inside the data's range and holds the mean
    v = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    lo, hi = bootstrap_ci(v)
    assert 0.0 <= lo < v.mean() < hi <= 7.0


def test_patch_workflow_and_command_on_a_pair_file(tmp_path):
    from click.testing import CliRunner

    from headscope.cli import cli
    from headscope.workflows.mechanisms import patch

    lm = _tiny("llama")
    pairs = [PatchPair(a, b, r, w) for a, b, r, w in zip(CLEAN * 2, CORRUPT * 2, [" mat", " log"] * 2,
                                                         [" dog", " cat"] * 2)]
    r = patch(lm, pairs, n_random=3, k=2)
    frame = r.to_frame()
    assert len(frame) == 8 and r.confirmation is not None and len(r.confirmation.heads) == 2
    assert set(r.confirmation.selection).isdisjoint(r.confirmation.heldout)
    assert frame["value"].tolist() == pytest.approx(r.values.mean(-1).tolist())
    gap = r.clean.mean() - r.corrupt.mean()
    assert frame["normalised"].tolist() == pytest.approx(((r.values.mean(-1) - r.corrupt.mean()) / gap).tolist())
    assert "random sets" in r.verdict
    f = tmp_path / "pairs.jsonl"
    f.write_text("\n".join(json.dumps({"clean": p.clean, "corrupt": p.corrupt, "right": p.right, "wrong": p.wrong})
                           for p in pairs))
    res = CliRunner().invoke(cli, ["patch", "--model", "tiny:llama", "--pairs", str(f), "--random", "3", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert {"clean", "corrupt", "heads", "verdict"} <= set(out) and len(out["heads"]) == 8
    assert {"layer", "head", "value"} <= set(out["heads"][0])
    res = CliRunner().invoke(cli, ["patch", "--model", "tiny:llama", "--pairs", str(tmp_path / "missing.jsonl")])
    assert res.exit_code == 2 and "no such file" in res.stderr


# --------------------------------------------------------------------------------------------
# QK attribution

from headscope.probe.attribution import qk_attribution  # noqa: E402

TEXT = "The cat sat on the mat."


def _model_attention(lm, text, layer, head):
    ids = lm.tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return lm.model(ids, output_attentions=True).attentions[layer][0, head].double()  # (T, T)


@pytest.mark.parametrize("family", DECODERS + ["gemma2", "bloom", "olmo2"])
def test_qk_terms_sum_to_the_from_scratch_score_and_match_the_models_attention(family):
    lm = _tiny(family)
    layer, head, q = lm.config.num_hidden_layers - 1, 1, 5
    state, hooks = _state(lm.model), _hooks(lm.model)
    a = qk_attribution(lm, TEXT, layer=layer, head=head, query=q, key=2)
    b = qk_attribution(lm, TEXT, layer=layer, head=head, query=q, key=4)
    assert _same(lm.model, state) and _hooks(lm.model) == hooks
    for r in (a, b):
        assert r.identity_abs_err < 1e-5 and r.input_abs_err < 1e-5
        assert float(r.terms.to_numpy().sum()) + sum(r.extra.values()) == pytest.approx(r.score, abs=1e-5)
    # independent of the from-scratch code: the model's own weights, whose log-ratio is the score difference
    p = _model_attention(lm, TEXT, layer, head)
    assert a.weight == pytest.approx(float(p[q, 2]), abs=1e-5)
    assert a.score - b.score == pytest.approx(float(torch.log(p[q, 2] / p[q, 4])), abs=1e-4)
    # removing a part changes the key's weight exactly as the softmax of the changed score row says
    if "softcap" not in a.extra:
        row = a.weight_without.set_index(["side", "component"])["weight"]
        n_q = len(a.terms.index)
        assert len(row) == n_q + len(a.terms.columns)
        part = a.terms.columns[0]  # key side: only this key's score moves, by the column sum
        moved = a.score - float(a.terms[part].sum())
        logits = torch.log(p[q, : q + 1])  # the row's logits up to a constant
        logits[2] = logits[2] - a.score + moved
        assert row[("key", part)] == pytest.approx(float(torch.softmax(logits, -1)[2]), abs=1e-4)


def test_qk_on_a_pre_norm_encoder_and_refused_on_a_post_norm_one():
    r = qk_attribution(_tiny("modernbert"), TEXT, layer=1, head=0, query=2, key=4)  # bidirectional: a later key
    assert r.identity_abs_err < 1e-5
    with pytest.raises(ValueError, match="post-LN"):
        qk_attribution(_tiny("bert"), TEXT, layer=1, head=0, query=2, key=4)


def test_qk_refuses_a_key_after_the_query_in_a_decoder():
    with pytest.raises(ValueError, match="comes after query"):
        qk_attribution(_tiny("llama"), TEXT, layer=1, head=0, query=1, key=3)


def test_qk_command(tmp_path):
    from click.testing import CliRunner

    from headscope.cli import cli

    res = CliRunner().invoke(cli, ["qk", TEXT, "--model", "tiny:gpt2", "--head", "L1H2", "--query", "5", "--key", "2",
                                   "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["sum_of_terms"] == pytest.approx(out["score"], abs=1e-5) and out["identity_abs_err"] < 1e-5
    res = CliRunner().invoke(cli, ["qk", TEXT, "--model", "tiny:gpt2", "--head", "nonsense", "--query", "5", "--key", "2"])
    assert res.exit_code == 2 and "--head" in res.stderr


# --------------------------------------------------------------------------------------------
# The done criteria on the packaged decoders


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_real_decoders_decompose_exactly_and_patch_limits_hold(name, request):
    from headscope.analyses.patching import builtin_pairs

    lm = request.getfixturevalue(name)
    state = _state(lm.model)
    prompt = "When Mary and John went to the store, John gave a drink to"
    r = direct_logit_attribution(lm, prompt, " Mary", " John")
    assert r.total > 1 and r.identity_rel_err < 1e-4  # the model prefers the indirect object, and the parts sum back
    q = qk_attribution(lm, prompt, layer=lm.config.num_hidden_layers // 2, head=0, query=len(r.labels) - 1, key=2)
    assert q.identity_abs_err < 1e-5
    pairs = builtin_pairs("ioi")[:4]
    p = prepare_pairs(lm, [x.clean for x in pairs], [x.corrupt for x in pairs], [x.right for x in pairs],
                      [x.wrong for x in pairs])
    clean = patch_metrics(lm, p, [frozenset()], direction="noise")[0]
    corrupt = patch_metrics(lm, p, [frozenset()], direction="denoise")[0]
    L = lm.config.num_hidden_layers
    m = patch_metrics(lm, p, [frozenset(), frozenset([("resid", 0, None)]), frozenset([("resid", L - 1, None)])],
                      direction="noise")
    assert torch.allclose(m[0], clean, rtol=0, atol=1e-5) and torch.allclose(m[1:], corrupt.expand(2, -1), rtol=0, atol=1e-5)
    assert _same(lm.model, state)


# --------------------------------------------------------------------------------------------
# Composition scores

from headscope.probe.composition import composition_scores, head_factors  # noqa: E402


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_composition_scores_match_the_full_matrices(family):
    lm = _tiny(family)
    state = _state(lm.model)
    c = composition_scores(lm, n_random=5)
    f = head_factors(lm)
    assert _same(lm.model, state)

    def score(x, y):  # the definition, with the D × D matrices built in full
        return float(torch.linalg.norm(x @ y) / (torch.linalg.norm(x) * torch.linalg.norm(y)))

    L, nh = len(f.q), f.q[0].shape[0]
    for a, ha, b, hb in [(0, 0, 1, 3), (0, 2, L - 1, 1), (L - 2, 3, L - 1, 0)]:
        ov = f.v[a][ha] @ f.o[a][ha]
        qk = f.q[b][hb] @ f.k[b][hb]
        assert c.scores["q"][a, ha, b, hb] == pytest.approx(score(ov, qk), rel=1e-9)
        assert c.scores["k"][a, ha, b, hb] == pytest.approx(score(ov, qk.T), rel=1e-9)
        assert c.scores["v"][a, ha, b, hb] == pytest.approx(score(ov, f.v[b][hb] @ f.o[b][hb]), rel=1e-9)
    assert np.isnan(c.scores["q"][1, 0, 0, 0]) and np.isnan(c.scores["v"][0, 0, 0, 1])  # only later receivers
    # the folded factors are the model's: V O applied to a vector is what the head's value path writes
    spec = lm.model.model.layers[0].self_attn
    assert f.v[0].shape == (nh, lm.config.hidden_size, spec.head_dim)
    assert 0 < min(c.baseline.values()) < 1 and len(c.to_frame()) == 3 * nh * nh * L * (L - 1) // 2
