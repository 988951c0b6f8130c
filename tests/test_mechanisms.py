"""Direct logit attribution, QK attribution and activation patching: identities, exact limits, hooks left clean."""

import json

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
    res = runner.invoke(cli, ["dla", "--model", "tiny:bert", "--prompt", PROMPT, "--answer", " mat"])
    assert res.exit_code == 2 and "needs a decoder" in res.stderr and len(res.stderr.strip().splitlines()) == 1
