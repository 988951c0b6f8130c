"""Hybrid stacks and gated attention: verified attention layers under the model's own numbers, the layers
without softmax attention named in every result, and the output gate of Qwen3.5 / Qwen3-Next."""

import dataclasses

import pytest
import torch
from conftest import _tiny

from headscope.probe.families import FAMILIES, family_for
from headscope.probe.forward import attention_layers, base_model
from headscope.probe.scratch import LayerSpec, attention_from_scratch
from headscope.probe.verify import verify

TEXTS = ["The cat sat on the mat.", "Mary told John that she would call."]


def test_output_gate_by_hand():
    # one head of 2 dims; every key gets the same score, so P is uniform over the visible keys
    z = torch.zeros(2, 2)
    wv, wo = torch.eye(2), torch.eye(2)
    x = torch.tensor([[[1.0, 0.0], [0.0, 3.0]]])  # (B=1, T=2, D=2)
    gate_w, gate_b = torch.tensor([[2.0, 0.0], [0.0, 0.0]]), torch.tensor([0.0, -1.0])
    spec = LayerSpec(z, z, wv, wo, None, None, None, None, n_heads=1, n_kv_heads=1, head_dim=2, scale=1.0,
                     causal=True, output_gate=gate_w, output_gate_bias=gate_b)
    out = attention_from_scratch(x, spec, torch.ones(1, 2)).output[0]
    # query 0 sees key 0: P v = (1, 0); gate = sigmoid((2, -1)). query 1 sees both: P v = (0.5, 1.5); gate = sigmoid((0, -1))
    sig = lambda t: 1 / (1 + torch.exp(-torch.tensor(t)))
    expected = torch.stack([torch.stack([sig(2.0), 0 * sig(-1.0)]), torch.stack([0.5 * sig(0.0), 1.5 * sig(-1.0)])])
    torch.testing.assert_close(out, expected)
    ungated = attention_from_scratch(x, dataclasses.replace(spec, output_gate=None, output_gate_bias=None),
                                     torch.ones(1, 2))
    torch.testing.assert_close(ungated.probs, attention_from_scratch(x, spec, torch.ones(1, 2)).probs, rtol=0, atol=0)


def test_the_gate_is_part_of_the_verified_block_output():
    lm = _tiny("qwen3_next")
    family = family_for(lm.config)
    v = verify(lm, TEXTS)
    assert v.passed and v.no_attention == (2,) and [c.layer for c in v.layers] == [0, 1, 3]
    assert v.summary().endswith("; no softmax attention in layers 2 (hybrid stack)")
    assert v.to_dict()["no_softmax_attention_layers"] == [2]
    no_gate = dataclasses.replace(family, layer_spec=lambda b, i, c: dataclasses.replace(
        family.layer_spec(b, i, c), output_gate=None, output_gate_bias=None))
    broken = verify(lm, TEXTS, family=no_gate)
    assert not broken.passed and broken.max_abs_err < 1e-5  # the probabilities still match, the output does not


# Another seed and another layer pattern (or positions, scale, shared blocks) than the family's tiny model
SECOND_CONFIGS = {
    "qwen3_next": {"layer_types": ["linear_attention", "full_attention", "full_attention", "linear_attention"]},
    "qwen3_5_moe_text": {},
    "jamba": {"attn_layer_offset": 0},
    "bamba": {"attn_layer_indices": [0, 3]},
    "granitemoehybrid": {"position_embedding_type": None,
                         "layer_types": ["full_attention", "linear_attention", "linear_attention", "full_attention"]},
    "falcon_h1": {"key_multiplier": 2.5},
    "lfm2": {"layer_types": ["full_attention", "conv", "conv", "full_attention"]},
    "lfm2_moe": {},
    "recurrent_gemma": {"block_types": ["attention", "recurrent", "recurrent"], "attention_window_size": 3},
    "zamba2": {"layers_block_type": ["hybrid", "mamba", "hybrid", "hybrid"], "hybrid_layer_ids": [0, 2, 3],
               "num_mem_blocks": 2},
    "mpnet": {"num_attention_heads": 2},  # no hybrid: every layer has attention, 2 heads of 16 dims
    "albert": {"num_hidden_layers": 4, "num_hidden_groups": 2},  # two shared modules, two layers each
}


@pytest.mark.parametrize("model_type", sorted(SECOND_CONFIGS))
def test_each_new_type_verifies_on_another_random_config(model_type):
    from headscope.probe.tiny import tiny_model

    lm = tiny_model(model_type, seed=7, **SECOND_CONFIGS[model_type])
    v = verify(lm, TEXTS)
    assert v.passed, (model_type, v.max_abs_err, v.max_rel_err_output)
    have = attention_layers(lm)
    assert [c.layer for c in v.layers] == list(have)
    assert v.no_attention == tuple(i for i in range(lm.config.num_hidden_layers) if i not in have)


def test_decompositions_over_every_layer_refuse_a_hybrid_in_one_line():
    from headscope.probe.attribution import trace
    from headscope.probe.errors import UnsupportedFeature

    with pytest.raises(UnsupportedFeature, match="layers 2 of this hybrid stack have none"):
        trace(_tiny("qwen3_next"), "The cat sat.")


# --- layers without softmax attention: named in maps and tables, labelled rows in figures, never renumbered ---


@pytest.fixture(scope="module")
def hybrid_scores():
    from headscope.workflows.heads import heads

    return heads(_tiny("qwen3_next"), TEXTS, induction_sequences=0)


def test_maps_and_tables_name_the_layers_without_attention(hybrid_scores):
    from headscope.probe.extract import extract
    from headscope.probe.words import to_word_level

    lm = _tiny("qwen3_next")  # attention at 0, 1 and 3; a gated delta-net at 2
    [m] = extract(lm, TEXTS[0])
    assert m.layer_ids == (0, 1, 3) and m.no_attention == (2,) and m.attention.shape[0] == 3  # no row of zeros
    assert to_word_level(m).no_attention == (2,)
    [one] = extract(lm, TEXTS[0], layers=[3])
    assert torch.equal(one.attention[0], m.attention[2])  # L3 is the map's third row, and stays L3
    assert hybrid_scores.no_attention == (2,) and set(hybrid_scores.table["layer"]) == {0, 1, 3}
    assert hybrid_scores.to_dict(table=False)["no_softmax_attention_layers"] == [2]


def test_figures_draw_a_labelled_row_for_a_layer_without_attention(hybrid_scores):
    from headscope.probe.extract import extract
    from headscope.reports.figures import attention_heatmap, attention_mosaic, score_grid

    fig = score_grid(hybrid_scores, "previous_token")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "1", "2", "3"]  # the model's own numbers
    assert "L2: no softmax attention" in [t.get_text() for t in ax.texts]
    [m] = extract(_tiny("qwen3_next"), TEXTS[0])
    mosaic = attention_mosaic(m).axes[0]
    assert [t.get_text() for t in mosaic.get_yticklabels()] == ["0", "1", "2", "3"]
    assert "L2: no softmax attention" in [t.get_text() for t in mosaic.texts]
    with pytest.raises(ValueError, match="layer 2 has no softmax attention"):
        attention_heatmap(m, 2, 0)
    from headscope.reports.figures import verification_plot

    plot = verification_plot(verify(_tiny("qwen3_next"), TEXTS)).axes[0]
    assert "L2: no softmax attention" in [t.get_text() for t in plot.texts]
    import matplotlib.pyplot as plt

    plt.close("all")


# --- ALBERT: one layer module run by every layer, each call captured as its own layer ---


def test_a_shared_layer_module_is_captured_call_by_call():
    from headscope.probe.encoding import encode_many, pad_batch
    from headscope.probe.verify import capture

    lm = _tiny("albert")  # 3 layers, one module
    family, base = family_for(lm.config), base_model(lm)
    assert family.shares_modules(base, lm.config)
    items = encode_many(lm, TEXTS)
    cap = capture(lm, items, family)
    ids, mask = pad_batch(items, lm.device)
    with torch.no_grad():  # the model's own record: hidden_states[i] is layer i's input
        hidden = base(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    for i in range(3):
        torch.testing.assert_close(cap.inputs[i], hidden[i], rtol=0, atol=0)
    assert not torch.equal(cap.inputs[0], cap.inputs[2])  # not the last repeat's input for every layer
    v = verify(lm, TEXTS)
    assert v.passed and [c.layer for c in v.layers] == [0, 1, 2]
