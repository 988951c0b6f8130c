"""Vision transformers: images in, verified attention over patch units out, the vision head metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import IMAGE, _tiny
from headscope.analyses.heads import score_corpus
from headscope.analyses.metrics import METRICS, neighbour_patches, patch_distance, previous_patch
from headscope.probe.extract import extract
from headscope.probe.families import FAMILIES
from headscope.probe.types import AttentionMap
from headscope.probe.verify import verify

IMAGE_TYPES = sorted(t for name in IMAGE for t in FAMILIES[name].model_types)
# the tokens before the patches, per type (read from the embeddings' code: CLS, DeiT's distillation token,
# the registers the tiny DINOv2 config asks for, none in SigLIP)
PREFIX = {"beit": ("[CLS]",), "vit": ("[CLS]",), "deit": ("[CLS]", "[DIST]"), "dinov2": ("[CLS]",),
          "dinov2_with_registers": ("[CLS]", "[REG0]", "[REG1]"), "clip_vision_model": ("[CLS]",),
          "siglip_vision_model": (), "siglip2_vision_model": (), "dinov3_vit": ("[CLS]", "[REG0]", "[REG1]")}


@pytest.fixture(scope="module")
def picture() -> str:
    import matplotlib.cbook

    return str(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))


def test_every_image_type_is_covered():
    assert set(IMAGE_TYPES) == set(PREFIX)


@pytest.mark.parametrize("model_type", IMAGE_TYPES)
def test_verified_from_scratch_on_a_real_image_with_patch_units(model_type, picture):
    lm = _tiny(model_type)
    v = verify(lm, images=[picture])
    assert v.passed and v.max_abs_err <= 1e-5 and v.max_rel_err_output <= 1e-5
    [m] = extract(lm, images=[picture])
    prefix = PREFIX[model_type]
    assert m.grid == (4, 4) and len(m) == len(prefix) + 16  # 32 x 32 pixels in 8 x 8 patches
    assert m.labels[: len(prefix)] == prefix and m.special == (True,) * len(prefix) + (False,) * 16
    assert m.positions[len(prefix)] == (0, 0) and m.positions[-1] == (3, 3) and m.labels[-1] == "r3c3"
    assert m.attention.shape == (2, 4, len(m), len(m)) and not m.causal  # [layer, head, query, key]
    torch.testing.assert_close(m.attention.sum(-1), torch.ones(2, 4, len(m)))
    assert m.image.shape == (32, 32, 3) and 0 <= m.image.min() and m.image.max() <= 1


def test_beit_needs_its_relative_position_bias_per_layer_or_shared(picture):
    import dataclasses

    from headscope.probe.families._vision import projection_spec
    from headscope.probe.tiny import tiny_model

    beit = FAMILIES["beit"]
    no_bias = dataclasses.replace(beit, layer_spec=lambda base, i, cfg: projection_spec(base.layers[i].attention))
    lm = _tiny("beit")
    assert verify(lm, images=[picture]).passed
    assert not verify(lm, images=[picture], family=no_bias).passed  # the bias is there, and is reproduced
    shared = tiny_model("beit", use_relative_position_bias=False, use_shared_relative_position_bias=True)
    assert verify(shared, images=[picture]).passed and not verify(shared, images=[picture], family=no_bias).passed


def test_dinov3_needs_its_2d_rotary_on_the_patches_and_none_on_cls_and_registers(picture):
    import dataclasses

    from headscope.probe.families.dinov3_vit import patch_angles

    dino = FAMILIES["dinov3_vit"]
    lm = _tiny("dinov3_vit")

    def broken(change):
        def layer_spec(base, i, cfg):
            spec = dino.layer_spec(base, i, cfg)
            return dataclasses.replace(spec, rotary_angles=change(spec.rotary_angles))
        return dataclasses.replace(dino, layer_spec=layer_spec)

    assert verify(lm, images=[picture]).passed
    assert not verify(lm, images=[picture], family=broken(lambda angles: None)).passed  # no rotary at all
    # the first patch's angles on [CLS] and the registers too: the model leaves them unrotated
    every = broken(lambda angles: lambda T: torch.cat([angles(T)[3:4].expand(3, -1), angles(T)[3:]]))
    assert not verify(lm, images=[picture], family=every).passed
    # the angles, by hand: the centre of patch (row 0, col 3) of 4 x 4 is (y, x) = (-0.75, 0.75)
    a = patch_angles(4, 4, torch.tensor([1.0, 0.5]))
    torch.testing.assert_close(a[3], 2 * math.pi * torch.tensor([-0.75, -0.375, 0.75, 0.375]))


def test_siglip2_reads_each_images_grid_from_spatial_shapes_and_matches_the_padded_masked_model(picture):
    from PIL import Image

    lm = _tiny("siglip2_vision_model")
    wide = np.zeros((20, 60, 3), dtype=np.uint8)
    wide[:, ::3] = 255  # stripes: patches that differ
    out = lm.processor(images=[Image.open(picture).convert("RGB"), Image.fromarray(wide)], return_tensors="pt")
    shapes = [tuple(s) for s in out["spatial_shapes"].tolist()]
    assert shapes[1][0] < shapes[1][1] and out["pixel_attention_mask"][1].sum() < out["pixel_attention_mask"].shape[1]
    v = verify(lm, images=[picture, wide])  # two grids: one padded with masked patches in the model's own input
    assert v.passed and v.max_abs_err <= 1e-5
    maps = extract(lm, images=[picture, wide])
    assert [m.grid for m in maps] == shapes
    rows, cols = shapes[1]
    assert maps[1].positions[cols] == (1, 0) and maps[1].labels[-1] == f"r{rows - 1}c{cols - 1}"
    with torch.inference_mode():  # the model on its processor's own padded batch, padding masked
        ref = lm.model(**out, output_attentions=True).attentions  # per layer (B, nh, N, N)
    for i, m in enumerate(maps):
        n = len(m)
        torch.testing.assert_close(m.attention, torch.stack([a[i, :, :n, :n] for a in ref]), atol=1e-6, rtol=0)


def test_a_path_a_pil_image_and_an_array_give_the_same_map_and_are_left_unchanged(picture):
    from PIL import Image

    lm = _tiny("vit")
    pil = Image.open(picture)
    array = np.asarray(pil.convert("RGB")).copy()
    before_pil, before_array = pil.copy(), array.copy()
    maps = extract(lm, images=[picture, pil, array, array / 255.0])
    for m in maps[1:]:
        torch.testing.assert_close(m.attention, maps[0].attention, atol=2e-3, rtol=0)  # float input: rounding
    assert np.array_equal(array, before_array) and np.array_equal(np.asarray(pil), np.asarray(before_pil))
    assert [m.meta["image"] for m in maps] == ["grace_hopper.jpg", "image 1", "image 2", "image 3"]


def test_an_image_on_a_text_model_and_a_text_on_an_image_model_are_refused(picture):
    with pytest.raises(ValueError, match="is a text model .* not images"):
        extract(_tiny("bert"), images=[picture])
    with pytest.raises(ValueError, match="is an image model .* not texts"):
        extract(_tiny("vit"), "a cat")
    with pytest.raises(ValueError, match="is an image model"):
        verify(_tiny("vit"), ["a cat"])
    for bad, what in (("/no/such.png", "no file"), (np.zeros((4, 4, 2)), r"\[H, W\]"), (3, "is a int")):
        with pytest.raises((ValueError, TypeError), match=what):
            extract(_tiny("vit"), images=[bad])


def test_a_saved_dinov2_with_registers_loads_by_path_with_its_registers_marked(tmp_path, picture):
    from headscope.probe.loading import load_model

    lm = _tiny("dinov2_with_registers")
    lm.model.save_pretrained(tmp_path)
    lm.processor.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    assert loaded.is_image and loaded.tokenizer is None and type(loaded.processor).__name__.endswith("Pil")
    [m] = extract(loaded, images=[picture])
    assert m.labels[:3] == ("[CLS]", "[REG0]", "[REG1]") and m.special[:3] == (True, True, True)
    torch.testing.assert_close(m.attention, extract(lm, images=[picture])[0].attention)


# --- the vision metrics, against loops over a hand-built map --------------------------------------------


def _grid_map(rows: int, cols: int, registers: int, seed: int) -> AttentionMap:
    prefix = ("[CLS]", *(f"[REG{r}]" for r in range(registers)))
    labels = prefix + tuple(f"r{r}c{c}" for r in range(rows) for c in range(cols))
    n = len(labels)
    a = torch.rand(2, 3, n, n, generator=torch.Generator().manual_seed(seed)) ** 4
    return AttentionMap(text="img", level="token", labels=labels, spans=((0, 0),) * n,
                        special=(True,) * len(prefix) + (False,) * (rows * cols), attention=a / a.sum(-1, keepdim=True),
                        causal=False, grid=(rows, cols))


def _reference(maps):
    """The definitions as loops: per head, the mean over counted query rows."""
    out = {}
    for metric in ("registers", "attention_distance", "previous_patch", "neighbour_patches"):
        for l in range(2):
            for h in range(3):
                total, count = 0.0, 0
                for m in maps:
                    pos = m.positions
                    regs = [k for k, lab in enumerate(m.labels) if lab.startswith("[REG")]
                    for q in range(len(m)):
                        row = m.attention[l, h, q].double()
                        if metric == "registers":
                            if regs and q not in regs:
                                total, count = total + sum(row[k] for k in regs), count + 1
                            continue
                        if pos[q] is None:
                            continue
                        (r, c), keys = pos[q], [(k, p) for k, p in enumerate(pos) if p is not None]
                        if metric == "attention_distance":
                            total += sum(row[k] * math.dist((r, c), p) for k, p in keys)
                        elif metric == "previous_patch":
                            if c == 0:
                                continue
                            total += sum(row[k] for k, p in keys if p == (r, c - 1))
                        else:
                            total += sum(row[k] for k, p in keys if max(abs(p[0] - r), abs(p[1] - c)) == 1)
                        count += 1
                out[metric, l, h] = float(total) / count if count else float("nan")
    return out


def test_vision_metrics_match_their_definitions_as_loops():
    maps = [_grid_map(3, 4, 2, 0), _grid_map(2, 2, 0, 1)]
    table = score_corpus(maps, level="token").to_frame()
    for (metric, l, h), want in _reference(maps).items():
        got = table[(table["metric"] == metric) & (table["layer"] == l) & (table["head"] == h)]["value"].item()
        assert got == pytest.approx(want, rel=1e-5), (metric, l, h)


def test_vision_metric_weights_by_hand():
    labels, special = ["[CLS]", "r0c0", "r0c1", "r1c0", "r1c1"], [True, False, False, False, False]
    w, counted = patch_distance(labels, special)
    assert counted == [False, True, True, True, True] and w[4, 1].item() == pytest.approx(math.sqrt(2))
    w, counted = previous_patch(labels, special)
    assert counted == [False, False, True, False, True] and w[2].tolist() == [0, 1, 0, 0, 0]
    w, _ = neighbour_patches(labels, special)
    assert w[1].tolist() == [0, 0, 1, 1, 1]  # every other patch of a 2 x 2 grid is a neighbour


def test_vision_metrics_count_no_row_of_a_text(tiny_text_map=None):
    [m] = extract(_tiny("bert"), "The cat sat on the mat.")
    table = score_corpus([m]).to_frame()
    for name, spec in METRICS.items():
        if spec.applies_to == "images":
            assert table[table.metric == name].n.eq(0).all() and table[table.metric == name].value.isna().all()


# --- CLIP's two towers --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    """A tiny random CLIP saved as a folder (model, tokenizer, image processor) and loaded by path."""
    from transformers import CLIPConfig, CLIPModel

    from headscope.probe.families._vision import tiny_image_processor
    from headscope.probe.loading import load_model
    from headscope.probe.tiny import tiny_tokenizer

    tok = tiny_tokenizer("bytebpe")
    text = dict(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                max_position_embeddings=64, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, pad_token_id=0)
    vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32,
                  patch_size=8)
    torch.manual_seed(0)
    model = CLIPModel._from_config(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16),
                                   attn_implementation="eager")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    folder = tmp_path_factory.mktemp("clip")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    tiny_image_processor(model.config.vision_config).save_pretrained(folder)
    return load_model(str(folder))


def test_clip_towers_are_verified_and_an_image_text_pair_has_no_cross_attention(tiny_clip, picture):
    from headscope.probe.towers import image_text, towers

    vision, text = towers(tiny_clip)
    assert vision.model is tiny_clip.model.vision_model and text.model is tiny_clip.model.text_model  # no copies
    assert verify(vision, images=[picture]).passed and verify(text).passed
    pair = image_text(tiny_clip, picture, "The cat sat on the mat.")
    assert pair.image.labels[0] == "[CLS]" and pair.image.grid == (4, 4) and not pair.image.causal
    assert pair.text.causal and pair.text.labels[:3] == ("The", "cat", "sat")
    assert "no cross-attention" in pair.note and pair.to_dict()["cross_attention"] is None
    # the similarity is the model's own: its forward pass on the same inputs gives the same cosine (× its scale)
    ids = torch.tensor([pair.text.token_ids])
    pixels = tiny_clip.processor(images=[picture], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = tiny_clip.model(input_ids=ids, pixel_values=pixels)
    scale = tiny_clip.model.logit_scale.exp().item()
    assert out.logits_per_image.item() == pytest.approx(pair.similarity * scale, rel=1e-4)
    with pytest.raises(ValueError, match="not a two-tower"):
        towers(_tiny("vit"))


@pytest.mark.parametrize("model_type", ["siglip", "siglip2"])
def test_siglip_towers_are_verified_bidirectional_and_the_similarity_is_the_models(model_type, picture):
    import dataclasses

    import transformers

    from headscope.probe.families import family_of_type
    from headscope.probe.model import LoadedModel
    from headscope.probe.tiny import tiny_tokenizer
    from headscope.probe.towers import image_text, towers

    tok = tiny_tokenizer("bytebpe")
    text = dict(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                max_position_embeddings=64, pad_token_id=0, bos_token_id=0, eos_token_id=0)
    vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, patch_size=8,
                  **({"num_patches": 16} if model_type == "siglip2" else {"image_size": 32}))
    prefix = "Siglip" if model_type == "siglip" else "Siglip2"
    cfg = getattr(transformers, f"{prefix}Config")(text_config=text, vision_config=vision)
    torch.manual_seed(0)
    model = getattr(transformers, f"{prefix}Model")._from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    processor = family_of_type(f"{model_type}_vision_model").tiny_processor(model.config.vision_config)
    lm = LoadedModel(name=f"tiny {model_type}", model=model, tokenizer=tok, processor=processor, source="random init",
                     dtype=torch.float32, device=torch.device("cpu"))
    vision_lm, text_lm = towers(lm)
    assert vision_lm.model is model.vision_model and text_lm.model is model.text_model  # no copies
    assert verify(vision_lm, images=[picture]).passed and verify(text_lm).passed
    caption = "The cat sat on the mat."
    pair = image_text(lm, picture, caption)
    assert pair.image.grid == (4, 4) and len(pair.image) == 16 and not pair.text.causal  # no CLS; bidirectional
    assert "no cross-attention" in pair.note and pair.to_dict()["cross_attention"] is None
    # the text tower really is bidirectional: a causal spec does not reproduce it
    siglip_text = family_of_type(f"{model_type}_text_model")
    causal = dataclasses.replace(siglip_text, layer_spec=lambda base, i, c: dataclasses.replace(
        siglip_text.layer_spec(base, i, c), causal=True))
    assert not verify(text_lm, family=causal).passed
    # the similarity is the model's own: its forward pass gives the same logit (cosine × scale + bias)
    inputs = processor(images=[picture], return_tensors="pt")
    with torch.no_grad():
        out = model(input_ids=torch.tensor([pair.text.token_ids]), **inputs)
    expected = pair.similarity * model.logit_scale.exp().item() + model.logit_bias.item()
    assert out.logits_per_image.item() == pytest.approx(expected, rel=1e-4, abs=1e-4)


# --- the command line ---------------------------------------------------------------------------------


def _cli(*args):
    from click.testing import CliRunner

    from headscope.cli import cli

    return CliRunner().invoke(cli, list(args))


def test_cli_verify_heads_and_explain_take_an_image_and_refuse_a_mismatch(picture):
    import json

    r = _cli("verify", "--model", "tiny:deit", "--image", picture, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["passed"] and json.loads(r.stdout)["n_tokens"] == 18
    r = _cli("heads", "--model", "tiny:dinov2_with_registers", "--image", picture, "--json")
    assert r.exit_code == 0, r.output
    top = json.loads(r.output)
    assert all(top["top"][m] for m in ("registers", "attention_distance", "previous_patch", "neighbour_patches"))
    r = _cli("explain", "--model", "tiny:vit", "--image", picture, "--token", "r1c2", "--head", "L1H0", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["query"] == "r1c2"
    for args in (("verify", "--model", "tiny:bert", "--image", picture), ("verify", "--model", "tiny:vit", "--text", "a"),
                 ("heads", "--model", "tiny:vit"), ("verify", "--model", "tiny:vit", "--image", "/no/such.png")):
        r = _cli(*args)
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, (args, r.output)


def test_cli_run_writes_the_vision_section_with_overlays_mosaic_rollout_and_metrics(tmp_path, picture, draw_only):
    from headscope.reports.panels import FIGURES

    # the vision section's figures, the head grids asserted and the attention figures on patch maps; the
    # verification plot (the same for every model) is drawn in test_run.py
    draw_only("head_scores", *(n for n, spec in FIGURES.items() if spec.group in ("vision", "attention")))
    out = tmp_path / "report"
    r = _cli("run", "--model", "tiny:dinov2_with_registers", "--image", picture, "--report", str(out), "--quiet", "--dpi", "30")
    assert r.exit_code == 0, r.output
    figures = {p.name for p in (out / "figures").iterdir()}
    for stem in ("vision-0-", "vision-layer-", "vision-rollout-0", "heads-attention_distance", "heads-registers"):
        assert any(stem in f for f in figures), (stem, sorted(figures))
    page = (out / "index.html").read_text(encoding="utf-8")
    assert 'id="vision"' in page and "[REG0]" in page and "random weights" in page
    r = _cli("run", "--model", "tiny:bert", "--image", picture, "--report", str(tmp_path / "other"), "--quiet")
    assert r.exit_code == 2 and not (tmp_path / "other").exists()


def test_plot_draws_the_query_row_on_the_patch_grid_and_leaves_the_map_unchanged(picture):
    import headscope as hs

    [m] = extract(_tiny("dinov2_with_registers"), images=[picture])
    before = m.attention.clone()
    fig = hs.plot(m, layer=1, head=2)  # from [CLS]
    heat = fig.axes[0].get_images()[-1].get_array()  # the overlay laid over the picture
    row = m.attention[1, 2, 0, 3:].reshape(4, 4)  # [CLS]'s row over the 16 patch keys, row by row
    np.testing.assert_allclose(np.asarray(heat), row.numpy(), rtol=1e-6)
    fig = hs.plot(m, layer=0, head=1, query=(2, 1))  # from a patch: its row
    np.testing.assert_allclose(np.asarray(fig.axes[0].get_images()[-1].get_array()),
                               m.attention[0, 1, 3 + 2 * 4 + 1, 3:].reshape(4, 4).numpy(), rtol=1e-6)
    assert len([ax for ax in hs.plot(m, layer=0).axes if ax.get_images()]) == 4  # every head of the layer
    assert hs.plot(m, layer=0, view="rollout").axes[0].get_images()
    assert torch.equal(m.attention, before)
    with pytest.raises(ValueError, match="no patch"):
        hs.plot(m, layer=0, head=0, query=(9, 9))
