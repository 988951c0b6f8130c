"""Mllama (Llama 3.2 Vision): the tiled vision encoder, the decoder's self-attention and its cross-attention layers
to the image, each verified from scratch; a cross-attention head built to read one patch lands on it."""

import copy
import dataclasses
import importlib

import numpy as np
import pytest
import torch

from conftest import _tiny
from headscope.probe.families import FAMILIES
from headscope.probe.families.mllama import CROSS, VISION, gates, key_patches
from headscope.probe.forward import base_model
from headscope.probe.types import ImagePatch
from headscope.probe.verify import verify
from headscope.probe.vision_language import encode_with_images

IMAGE = "<|image|>"


def _picture(seed: int = 0, shape=(16, 30, 3)) -> np.ndarray:
    """A wide picture: two tiles side by side in the tiny model (16-pixel tiles, at most 2)."""
    return np.random.default_rng(seed).random(shape)


@pytest.fixture(scope="session")
def mllama():
    return _tiny("mllama")


TEXTS = [f"before the picture {IMAGE} after it", f"{IMAGE} a cat"]


def test_every_stack_verifies_and_is_named(mllama):
    """The vision encoder (2 local + 1 global layers), the decoder's self-attention layers (0, 2) and its cross
    layer (1), on a wide picture (two real tiles) and a square one (one real tile, one padding tile), with text
    before the marker (tokens that may see no image) and after it."""
    v = verify(mllama, TEXTS, images=[_picture(1), _picture(2, (16, 16, 3))])
    assert v.passed, v.summary()
    kinds = [(c.kind, c.layer) for c in v.layers]
    assert kinds == [("vision", 0), ("vision", 1), ("vision", 2), ("decoder", 0), ("decoder", 2), ("cross", 1)]
    assert max(c.max_abs_err for c in v.layers) <= 1e-5


def _bent_family(family, stack_name, **changes):
    reading = family.vision_language
    stack = dataclasses.replace(getattr(reading, stack_name), **changes)
    return dataclasses.replace(family, vision_language=dataclasses.replace(reading, **{stack_name: stack}))


def _scaled(spec_fn, field, factor):
    def spec(base, i, cfg):
        s = spec_fn(base, i, cfg)
        return dataclasses.replace(s, **{field: getattr(s, field) * factor})
    return spec


@pytest.mark.parametrize("stack_name,changes,failing", [
    ("cross", {"visible": None}, "cross"),  # the cross_attention_mask ignored: tokens see the padding tile
    ("cross", {"visible": lambda cfg, inputs, T, S: torch.ones(1, T, S, dtype=torch.bool).tril()}, "cross"),
    ("cross", {"layer_spec": _scaled(CROSS.layer_spec, "k_norm", 1.01)}, "cross"),
    ("cross", {"layer_spec": _scaled(CROSS.layer_spec, "wo", 1.01)}, "cross"),
    ("vision", {"visible": None}, "vision"),  # padding hidden from padding: the vision mask matters
    ("vision", {"layer_spec": _scaled(VISION.layer_spec, "wq", 1.01)}, "vision"),
])
def test_break_it_a_wrong_mask_or_weight_fails(mllama, stack_name, changes, failing):
    family = _bent_family(FAMILIES["mllama"], stack_name, **changes)
    # one text: tokens before the marker (no image) and after it; a square picture (one real tile, one padding)
    v = verify(mllama, [f"before the picture {IMAGE} after it"], images=[_picture(2, (16, 16, 3))], family=family)
    assert not v.passed
    assert {c.kind for c in v.layers if not c.passed} == {failing}


def test_gates_are_reported_by_layer(mllama):
    base = base_model(mllama)
    g = gates(mllama)
    text = base.language_model
    assert set(g["cross_attn"]) == {1} and g["cross_attn"][1] == pytest.approx(
        float(torch.tanh(text.layers[1].cross_attn_attn_gate.detach())))
    assert set(g["vision_attn"]) == {2}  # the global layer after the 2 local ones
    assert g["vision_ffn"][2] == pytest.approx(float(torch.tanh(base.vision_model.global_transformer.layers[0].gate_ffn.detach())))


def test_key_patches_by_hand(mllama):
    """Keys: image, tile, then CLS and a 4 x 4 grid per tile; a wide picture's tiles side by side (a 4 x 8 grid)."""
    [enc] = encode_with_images(mllama, [f"{IMAGE} a cat"], [_picture(1)])
    keys = key_patches(mllama.config, enc.inputs)
    assert len(keys) == 2 * 17
    assert keys[0] is None and keys[17] is None  # each tile's CLS token
    assert keys[1] == ImagePatch(0, 0, 0, 4, 8, view="tile 0,0")
    assert keys[17 + 1 + 4 + 2] == ImagePatch(0, 1, 6, 4, 8, view="tile 0,1")
    [square] = encode_with_images(mllama, [f"{IMAGE} a cat"], [_picture(2, (16, 16, 3))])
    keys = key_patches(mllama.config, square.inputs)
    assert keys[1] == ImagePatch(0, 0, 0, 4, 4, view="tile 0,0") and all(k is None for k in keys[17:])
    assert enc.pictures[0].shape[:2] == (16, 32)  # the two tiles put back side by side


def test_a_cross_head_built_to_read_one_patch_lands_on_it(mllama):
    """Head 0 of the cross layer is set so that the last text token's query matches one key alone: tile (0, 1),
    cell (1, 2) of its 4 x 4 grid — key (0 · 2 + 1) · 17 + 1 + 1 · 4 + 2 = 24 by hand (image, tile, CLS first).
    q and k are RMS-normed per head, so the key's direction, not its size, singles it out: two rows of the
    head, one 1 at the target and 0 elsewhere, the other the reverse (least squares over the vision tokens)."""
    lm = dataclasses.replace(mllama, model=copy.deepcopy(mllama.model))
    [enc] = encode_with_images(lm, [f"{IMAGE} a cat sits"], [_picture(5)])
    inputs = {"input_ids": torch.tensor([enc.ids]), **enc.inputs}
    attn = base_model(lm).language_model.layers[1].cross_attn
    caught = {}

    def grab(module, args, kwargs):
        caught["x"] = (args[0] if args else kwargs["hidden_states"])[0].detach().double()
        caught["m"] = kwargs["cross_attention_states"].reshape(-1, 32).detach().double()

    h = attn.register_forward_pre_hook(grab, with_kwargs=True)
    with torch.no_grad():
        lm.model(**inputs)
    h.remove()
    x, m = caught["x"], caught["m"]
    target = (0 * 2 + 1) * 17 + 1 + 1 * 4 + 2
    one_hot = torch.zeros(m.shape[0], dtype=torch.float64)
    one_hot[target] = 1.0
    wa = torch.linalg.lstsq(m, one_hot[:, None]).solution[:, 0]
    wb = torch.linalg.lstsq(m, (1 - one_hot)[:, None]).solution[:, 0]
    hs, query = attn.head_dim, x.shape[0] - 1
    with torch.no_grad():
        attn.q_proj.weight[:hs] = 0.0
        attn.k_proj.weight[:hs] = 0.0
        attn.q_proj.weight[0] = (x[query] / x[query].square().sum() * 400.0).float()
        attn.k_proj.weight[0], attn.k_proj.weight[1] = wa.float(), wb.float()
        attn.q_norm.weight[0] = attn.k_norm.weight[0] = 30.0
        out = lm.model(**inputs, output_attentions=True)
    probs = out.attentions[1][0, 0, query]  # the cross layer's weights: (heads, text, keys)
    assert int(probs.argmax()) == target and probs[target] > 0.9
    from headscope.probe.image_cross import image_cross_attention

    [r] = image_cross_attention(lm, f"{IMAGE} a cat sits", images=[_picture(5)])  # the same in the cross map
    got = int(r.cross.attention[0, 0, query].argmax())
    assert got == target and r.cross.keys.patches[got] == ImagePatch(0, 1, 6, 4, 8, view="tile 0,1")
    assert r.cross.keys.labels[got] == "img0:tile 0,1:r1c6"
    assert verify(lm, [f"{IMAGE} a cat sits"], images=[_picture(5)]).passed  # the built head still verifies


def test_maps_of_the_self_and_cross_layers(mllama):
    """The self-attention layers' map over the text (the marker a special unit, layers 0 and 2) and the cross
    layer's map: a row per text token over every vision key, each key on its cell; a token before the marker sees
    no image, so its cross row is the softmax over every key (the model's own rule), one after it sees only the
    real tiles."""
    from headscope.probe.image_cross import image_cross_attention

    [r] = image_cross_attention(mllama, f"before {IMAGE} after", images=[_picture(2, (16, 16, 3))])
    assert r.decoder.layers == (0, 2) and r.cross.layers == (1,)
    assert r.decoder.attention.shape[-1] == len(r.decoder) and r.decoder.causal
    marker = r.decoder.labels.index(IMAGE)
    assert r.decoder.special[marker]
    assert r.cross.attention.shape[-2:] == (len(r.decoder), 34)
    assert r.cross.keys.patches[1] == ImagePatch(0, 0, 0, 4, 4, view="tile 0,0")
    rows = r.cross.attention[0, :, :, :].sum(-1)
    assert torch.allclose(rows, torch.ones_like(rows), atol=1e-5)
    after = r.cross.attention[0, :, marker + 1]
    assert float(after[:, 17:].sum()) < 1e-6  # the padding tile is hidden once the image may be seen
    before = r.cross.attention[0, :, 0]
    assert float(before[:, 17:].sum()) > 0.1  # no image allowed: every key, padding tile included
    assert set(r.gates["cross_attn"]) == {1}


def test_folder_round_trip_loads_the_processor(mllama, tmp_path):
    from headscope.probe.loading import load_model

    mllama.model.save_pretrained(tmp_path)
    mllama.processor.save_pretrained(tmp_path)
    lm = load_model(str(tmp_path))
    assert lm.reads_images and lm.processor is not None
    assert verify(lm, [f"{IMAGE} a cat"], images=[_picture(1)]).passed


def test_a_model_whose_image_tokens_stand_in_the_text_is_told_to_use_extract():
    from headscope.probe.image_cross import image_cross_attention

    with pytest.raises(ValueError, match="reads no image through cross-attention"):
        image_cross_attention(_tiny("llava"), "a <image> b", images=[_picture(1)])


def test_texts_without_images_and_the_commands_say_where_mllama_maps_come_from(mllama, tmp_path):
    """The per-layer maps of a text alone would mix self- and cross-attention layers: one clear line naming the
    images' road instead."""
    from headscope.probe.extract import extract

    with pytest.raises(ValueError, match="give it its images"):
        extract(mllama, "a cat")


def _other_config(vocab: int, model_type: str):
    """Another tiny Mllama: cross layers 0 and 3 of 4, as many KV heads as query heads, up to 4 tiles (a 2 x 2
    picture), 8-pixel tiles of 2-pixel patches (17 tokens a tile: padded to 24), 2 global vision layers."""
    from transformers import AutoConfig

    vision = dict(hidden_size=16, attention_heads=2, num_hidden_layers=1, num_global_layers=2, intermediate_size=32,
                  image_size=8, patch_size=2, max_num_tiles=4, intermediate_layers_indices=[0],
                  vision_output_dim=16 * 2, supported_aspect_ratios=[[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2],
                                                                     [3, 1], [4, 1]])
    text = dict(vocab_size=vocab, hidden_size=32, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=4,
                cross_attention_layers=[0, 3], intermediate_size=48, max_position_embeddings=256,
                rope_parameters={"rope_type": "default", "rope_theta": 500.0}, rms_norm_eps=1e-5, pad_token_id=0,
                bos_token_id=1, eos_token_id=2)
    return AutoConfig.for_model(model_type, vision_config=vision, text_config=text, image_token_index=vocab - 1)


def test_another_config_and_seed_verifies(monkeypatch):
    from headscope.probe.tiny import tiny_model

    family = FAMILIES["mllama"]
    monkeypatch.setattr(importlib.import_module("headscope.probe.families.mllama"), "FAMILY",  # the family's file
                        dataclasses.replace(family, tiny_config=_other_config))
    lm = tiny_model("mllama", seed=7, std=0.3)
    v = verify(lm, [f"a {IMAGE} tall picture", f"{IMAGE} and {IMAGE} two"],
               images=[_picture(3, (20, 9, 3)), _picture(4, (9, 9, 3)), _picture(5, (18, 18, 3))])
    assert v.passed, v.summary()
    assert [(c.kind, c.layer) for c in v.layers if c.kind != "vision"] == [("decoder", 1), ("decoder", 2),
                                                                             ("cross", 0), ("cross", 3)]
    assert sum(c.kind == "vision" for c in v.layers) == 3


def test_the_reported_gate_is_what_scales_the_cross_block(mllama):
    """What the cross block adds to the residual stream (the input of its post-attention norm minus the layer's
    input) is the reported tanh(gate) times the block's W_O output; a gate off by 0.05 is caught."""
    [enc] = encode_with_images(mllama, [f"{IMAGE} a cat"], [_picture(1)])
    layer = base_model(mllama).language_model.layers[1]
    caught = {}
    hooks = [layer.register_forward_pre_hook(lambda m, a, k: caught.__setitem__("x", (a[0] if a else k["hidden_states"]).clone()),
                                             with_kwargs=True),
             layer.cross_attn.o_proj.register_forward_hook(lambda m, a, o: caught.__setitem__("a", o.clone())),
             layer.post_attention_layernorm.register_forward_pre_hook(lambda m, a: caught.__setitem__("h", a[0].clone()))]
    try:
        with torch.no_grad():
            mllama.model(input_ids=torch.tensor([enc.ids]), **enc.inputs)
    finally:
        for h in hooks:
            h.remove()
    added, out = caught["h"] - caught["x"], caught["a"]
    g = gates(mllama)["cross_attn"][1]
    assert abs(g) > 0.01  # a random gate, not the zero transformers starts from
    assert (added - g * out).abs().max() <= 1e-5 * out.abs().max()
    assert (added - (g + 0.05) * out).abs().max() > 1e-3 * out.abs().max()


@pytest.mark.parametrize("shape,axis", [((16, 32, 3), 1), ((32, 16, 3), 0)])
def test_the_picture_is_the_tiles_put_back(mllama, shape, axis):
    """A picture dark in its first half and light in its second (left/right, or top/bottom): two tiles, and the
    picture drawn under the keys is dark then light along the same axis (the tiles in their places)."""
    img = np.zeros(shape)
    half = [slice(None)] * 2
    half[axis] = slice(16, None)
    img[tuple(half)] = 1.0
    [enc] = encode_with_images(mllama, [f"{IMAGE} x"], [img])
    seen = enc.pictures[0]
    assert seen.shape[:2] == shape[:2]
    first, second = np.split(seen[..., 0], 2, axis=axis)
    assert first.max() < 0.05 and second.min() > 0.95


def test_ablation_and_importance_take_only_the_self_attention_heads(mllama):
    """Mllama's cross-attention layer has no self-attention head: ablation switches heads of layers 0 and 2 only,
    its random sets too, and gradient importance lists no head of layer 1 (it had a row of 0.000 for each)."""
    from headscope.probe.effects import next_token_loss
    from headscope.probe.forward import attention_layers
    from headscope.probe.importance import gradient_importance
    from headscope.probe.interventions import ablate as ablate_heads
    from headscope.workflows.ablation import ablate

    texts = ["The cat sat on the mat.", "Mary told John that she would call him."]
    assert attention_layers(mllama) == (0, 2)
    result = ablate(mllama, [(2, 1)], method="zero", corpus=texts, n_random=3)
    measure = next_token_loss(mllama, texts, batch_size=8)
    clean = measure.read(mllama)
    with ablate_heads(mllama, [(2, 1)]):  # the whole pass, nothing replayed
        ablated = measure.read(mllama)
    assert result.effect == pytest.approx(measure.change(clean, ablated), rel=1e-5, abs=1e-7)
    imp = gradient_importance(mllama, texts)
    assert set(imp.to_frame()["layer"]) == {0, 2} and torch.isnan(imp.importance[1]).all()
    assert torch.isfinite(imp.importance[[0, 2]]).all()


@pytest.mark.parametrize("what", ["dla", "composition", "sinks"])
def test_a_decomposition_over_every_layer_names_the_cross_attention_layers_and_what_works(mllama, what):
    from headscope.probe.families import UnsupportedFeature
    from headscope.workflows.mechanisms import composition, dla
    from headscope.workflows.sinks import sinks

    run = {"dla": lambda: dla(mllama, "The cat sat on the", answer=" mat"), "composition": lambda: composition(mllama),
           "sinks": lambda: sinks(mllama, ["The cat sat on the mat."], n_sequences=2, length=12)}[what]
    with pytest.raises(UnsupportedFeature, match=r"layers 1 are cross-attention layers.*verify, importance and ablate"):
        run()
