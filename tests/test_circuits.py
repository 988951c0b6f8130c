"""Patching of q, k, v and patterns, path patching, attribution patching, OV copying: limits and references."""

import pytest
import torch

from conftest import _tiny
from headscope.probe.patching import patch_metrics, path_patch_metrics, prepare_pairs

CLEAN = ["The cat sat on the", "and the dog sat on the"]  # the same length in both tiny tokenizers
CORRUPT = ["The dog sat on the", "and the cat sat on the"]


def _prepared(lm, corrupt=CORRUPT):
    return prepare_pairs(lm, CLEAN, corrupt, [" mat", " log"], [" dog", " cat"])


def _hooks(model):
    return [(name, list(m._forward_pre_hooks), list(m._forward_hooks)) for name, m in model.named_modules()]


def _state(model):
    """The weights and the hooks (transformers installs its own output-capturing hooks on a model's first
    `output_attentions` call and keeps them: a tool must leave the set as it found it, not empty)."""
    return {k: v.clone() for k, v in model.state_dict().items()}, _hooks(model)


def _same(model, state) -> bool:
    weights, hooks = state
    now = model.state_dict()
    return all(torch.equal(v, now[k]) for k, v in weights.items()) and _hooks(model) == hooks


def _jobs(*sets):
    return [frozenset(s) for s in sets]


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3"])
def test_qkv_and_pattern_patches_compose_into_the_heads_output_patch(family):
    lm = _tiny(family)
    p = _prepared(lm)
    state = _state(lm.model)
    L = lm.config.num_hidden_layers - 1
    for direction in ("denoise", "noise"):
        m = patch_metrics(lm, p, _jobs(
            [], [("head", L, 2)], [("q", L, 2), ("k", L, 2), ("v", L, 2)], [("pattern", L, 2), ("v", L, 2)],
            [("pattern", 0, 1)], [("q", 0, 1), ("k", 0, 1)],
            [("head", 0, h) for h in range(4)] + [("head", L, 0)],
            [(kind, 0, h) for h in range(4) for kind in ("q", "k", "v")] + [("pattern", L, 0), ("v", L, 0)]),
            direction=direction)
        base = patch_metrics(lm, p, [frozenset()], direction=direction)[0]
        assert torch.allclose(m[0], base, rtol=0, atol=1e-6)  # nothing patched: the base run
        assert torch.allclose(m[2], m[1], rtol=0, atol=1e-5) and torch.allclose(m[3], m[1], rtol=0, atol=1e-5)
        assert torch.allclose(m[5], m[4], rtol=0, atol=1e-5)  # q + k is the pattern
        assert torch.allclose(m[7], m[6], rtol=0, atol=1e-5)  # every head of a layer, and one more
        assert not torch.allclose(m[1], base, atol=1e-4)  # the patches do move the metric
    # clean == corrupt: no patch of any kind moves anything
    same = _prepared(lm, CLEAN)
    m = patch_metrics(lm, same, _jobs(*([(kind, l, h)] for kind in ("q", "k", "v", "pattern") for l in (0, L)
                                        for h in (0, 3))), direction="denoise")
    assert torch.allclose(m, m[:1].expand_as(m), rtol=0, atol=1e-6)
    assert _same(lm.model, state)


def _projection_hook(module, cols, replacement):
    """A reference patch through the model's own projection module: its output columns `cols` replaced."""
    def hook(m, args, out):
        out = out.clone()
        out[..., cols] = replacement[..., cols]
        return out
    return module.register_forward_hook(hook)


def _run_metric(lm, p, ids):
    with torch.no_grad():
        logits = lm.model(input_ids=ids, attention_mask=p.mask).logits[torch.arange(p.n), p.last].double()
    return logits[torch.arange(p.n), p.right] - logits[torch.arange(p.n), p.wrong]


def test_q_and_v_patches_match_a_patch_of_the_models_own_projections():
    # independent of the from-scratch attention: hooks on llama's q_proj / v_proj outputs
    lm = _tiny("llama")
    p = _prepared(lm)
    attn = lm.model.model.layers[1].self_attn
    hs = attn.head_dim
    got = {}
    hooks = [attn.q_proj.register_forward_hook(lambda m, a, o: got.__setitem__("q", o.detach().clone())),
             attn.v_proj.register_forward_hook(lambda m, a, o: got.__setitem__("v", o.detach().clone()))]
    _run_metric(lm, p, p.clean)
    for h in hooks:
        h.remove()
    # query head 3 alone; KV head 1 serves query heads 2 and 3, so v of both is that KV head's v_proj slice
    ref = []
    for proj, cols in ((attn.q_proj, slice(3 * hs, 4 * hs)), (attn.v_proj, slice(hs, 2 * hs))):
        handle = _projection_hook(proj, cols, got["q" if proj is attn.q_proj else "v"])
        try:
            ref.append(_run_metric(lm, p, p.corrupt))
        finally:
            handle.remove()
    m = patch_metrics(lm, p, _jobs([("q", 1, 3)], [("v", 1, 2), ("v", 1, 3)]), direction="denoise")
    assert torch.allclose(m, torch.stack(ref), rtol=0, atol=1e-5)


@pytest.mark.parametrize("freeze_mlps", [False, True])
def test_path_patching_matches_a_reference_built_from_the_models_own_modules(freeze_mlps):
    lm = _tiny("llama")
    p = _prepared(lm)
    state = _state(lm.model)
    layers = lm.model.model.layers
    hs = layers[0].self_attn.head_dim
    got = {}

    def keep(name):
        return lambda m, a: got.__setitem__(name, a[0].detach().clone())

    def run(ids, hooks):  # forward hooks (module, kind, fn) on the model's own modules, removed after
        handles = [getattr(m, "register_forward_pre_hook" if pre else "register_forward_hook")(fn)
                   for m, pre, fn in hooks]
        try:
            return _run_metric(lm, p, ids)
        finally:
            for h in handles:
                h.remove()

    # the clean (source) and corrupt (base) runs' head inputs of layer 0, MLP outputs, layer-1 head inputs
    for tag, ids in (("src", p.clean), ("base", p.corrupt)):
        run(ids, [(layers[0].self_attn.o_proj, True, keep(f"{tag}0")),
                  (layers[1].self_attn.o_proj, True, keep(f"{tag}1")),
                  (layers[0].mlp, False, lambda m, a, o, t=tag: got.__setitem__(f"{t}mlp", o.detach().clone()))])
    y0 = got["base0"].clone()
    y0[..., 1 * hs : 2 * hs] = got["src0"][..., 1 * hs : 2 * hs]  # sender L0H1 from the clean run
    hooks = [(layers[0].self_attn.o_proj, True, lambda m, a: (y0,)),
             (layers[1].self_attn.o_proj, True, lambda m, a: (got["base1"],)),  # layer 1's heads frozen
             (layers[1].self_attn.q_proj, True, lambda m, a: got.__setitem__("x1", a[0].detach().clone()))]
    if freeze_mlps:
        hooks.append((layers[0].mlp, False, lambda m, a, o: got["basemlp"]))
    run(p.corrupt, hooks)
    # the receivers' queries (all four heads) from that input, everything else recomputed
    q_new = layers[1].self_attn.q_proj(got["x1"]).detach()
    ref_all = run(p.corrupt, [(layers[1].self_attn.q_proj, False, lambda m, a, o: q_new)])
    ref_one = run(p.corrupt, [(layers[1].self_attn.q_proj, False,
                               lambda m, a, o: torch.cat([o[..., : 2 * hs], q_new[..., 2 * hs : 3 * hs],
                                                          o[..., 3 * hs :]], -1))])
    m = path_patch_metrics(lm, p, (0, 1), _jobs([], [("q", 1, h) for h in range(4)], [("q", 1, 2)]),
                           freeze_mlps=freeze_mlps)
    base = patch_metrics(lm, p, [frozenset()])[0]
    assert torch.allclose(m[0], base, rtol=0, atol=1e-6)
    assert torch.allclose(m[1], ref_all, rtol=0, atol=1e-5) and torch.allclose(m[2], ref_one, rtol=0, atol=1e-5)
    assert not torch.allclose(m[1], base, atol=1e-4)
    same = _prepared(lm, CLEAN)  # clean == corrupt: no path moves anything
    m = path_patch_metrics(lm, same, (0, 1), _jobs(*([(kind, 1, h)] for kind in "qkv" for h in range(4))),
                           freeze_mlps=freeze_mlps)
    assert torch.allclose(m, m[:1].expand_as(m), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="after the sender"):
        path_patch_metrics(lm, p, (1, 0), _jobs([("q", 1, 2)]))
    assert _same(lm.model, state)


def test_attribution_patching_is_the_derivative_along_the_patch_and_leaves_no_gradients():
    import copy
    from dataclasses import replace

    from headscope.probe.patching import attribution_estimates

    small = _tiny("llama")
    lm = replace(small, model=copy.deepcopy(small.model).double(), dtype=torch.float64)  # float64: finite differences
    p = _prepared(lm)
    layers = lm.model.model.layers
    hs = layers[0].self_attn.head_dim
    got = {}
    for tag, ids in (("src", p.clean), ("base", p.corrupt)):
        handles = [layers[l].self_attn.o_proj.register_forward_pre_hook(
            lambda m, a, key=(tag, l): got.__setitem__(key, a[0].detach().clone())) for l in range(2)]
        _run_metric(lm, p, ids)
        for h in handles:
            h.remove()
    sites, est = attribution_estimates(lm, p, "head_out", direction="denoise")
    base = _run_metric(lm, p, p.corrupt)
    eps = 1e-2  # eager attention takes its softmax in float32 even here: a larger step, a looser tolerance
    for i, (_, l, h) in enumerate(sites):
        def moved(alpha):  # the base run with head h's output moved alpha of the way to the source's
            cols = slice(h * hs, (h + 1) * hs)

            def pre(m, a):
                y = a[0].clone()
                y[..., cols] += alpha * (got[("src", l)] - got[("base", l)])[..., cols]
                return (y,)
            handle = layers[l].self_attn.o_proj.register_forward_pre_hook(pre)
            try:
                return _run_metric(lm, p, p.corrupt)
            finally:
                handle.remove()
        slope = (moved(eps) - moved(-eps)) / (2 * eps)
        assert torch.allclose(est[i] - base, slope, rtol=1e-3, atol=1e-5), (sites[i], est[i] - base, slope)
    assert all(w.grad is None for w in lm.model.parameters())
    same = _prepared(small, CLEAN)  # clean == corrupt: every estimate is the base run
    for what in ("head_out", "resid"):
        _, est = attribution_estimates(small, same, what)
        assert torch.allclose(est, est[:1].expand_as(est), rtol=0, atol=1e-6)


def test_patch_command_new_kinds_and_attribution(tmp_path):
    import json

    from click.testing import CliRunner

    from headscope.cli import cli

    runner = CliRunner()
    res = runner.invoke(cli, ["patch", "--model", "tiny:llama", "--pairs", "agreement", "--what", "path", "--sender",
                              "L0H1", "--receivers", "v", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["sender"] == "L0H1" and [(h["layer"], h["input"]) for h in out["heads"]] == [(1, "v")] * 4
    from headscope.reports.canvas import save
    from headscope.reports.figures import patch_grid
    from headscope.workflows.mechanisms import patch

    r = patch(_tiny("llama"), "agreement", what="pattern", k=0)
    assert len(r.to_dict()["heads"]) == 8 and r.grid().shape == (2, 4)
    save(patch_grid(r), tmp_path / "g.png")
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"
    res = runner.invoke(cli, ["patch", "--model", "tiny:llama", "--pairs", "agreement", "--attribution", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert -1 <= out["spearman"] <= 1 and len(out["sites"]) == 8
    for bad in (["--what", "path"], ["--what", "path", "--sender", "nonsense"], ["--what", "q", "--sender", "L0H1"],
                ["--what", "q", "--attribution"]):
        res = runner.invoke(cli, ["patch", "--model", "tiny:llama", "--pairs", "agreement", *bad])
        assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, (bad, res.output)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_ov_copying_scores_match_the_eigenvalues_of_the_full_vocabulary_circuit(family):
    from headscope.probe.composition import copying_scores, head_factors

    lm = _tiny(family)
    state = _state(lm.model)
    c = copying_scores(lm)
    sub = copying_scores(lm, tokens=range(3, 60))
    assert _same(lm.model, state)
    f = head_factors(lm)
    E = lm.model.get_input_embeddings().weight.detach().double()
    w = lm.model.model.norm.weight.detach().double() + (1.0 if family == "gemma3" else 0.0)  # the final norm's weight
    U = lm.model.get_output_embeddings().weight.detach().double() * w  # (V, D)
    for l, h in [(0, 0), (1, 3)]:
        for got, ids in ((c.scores[l, h], slice(None)), (sub.scores[l, h], slice(3, 60))):
            full = E[ids] @ f.v[l][h] @ f.o[l][h] @ U[ids].T  # the whole V × V circuit, built in full
            lam = torch.linalg.eigvals(full)
            assert got == pytest.approx(float(lam.sum().real / lam.abs().sum()), abs=1e-9)
    assert c.n_tokens == lm.config.vocab_size and sub.n_tokens == 57 and len(c.to_frame()) == c.scores.size


def test_composition_command_json_figure_and_refusal(tmp_path):
    import json

    from click.testing import CliRunner

    from headscope.cli import cli

    runner = CliRunner()
    res = runner.invoke(cli, ["composition", "--model", "tiny:llama", "--kind", "k", "--top", "3", "--json",
                              "--figure", str(tmp_path / "graph.png")])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert [e["kind"] for e in out["edges"]] == ["k"] * 3 and len(out["copying"]) == 8
    assert out["edges"][0]["ratio"] >= out["edges"][-1]["ratio"] and set(out["baseline"]) == {"k"}
    assert (tmp_path / "graph.png").read_bytes()[:4] == b"\x89PNG"
    res = runner.invoke(cli, ["composition", "--model", "tiny:llama", "--figure", str(tmp_path / "graph.png")])
    assert res.exit_code == 2 and "exists" in res.stderr and len(res.stderr.strip().splitlines()) == 1
