"""Two-tower checkpoints (CLIP, SigLIP, SigLIP 2) from every command: images go to the image tower, texts to
the text tower, verification checks both, and every result names its tower."""

from __future__ import annotations

import importlib
import json

import pytest
import torch

from conftest import _tiny
from headscope.probe.extract import extract
from headscope.probe.images import TOWERS, models_for, tower
from headscope.probe.verify import verify

TYPES = sorted(TOWERS)


@pytest.fixture(scope="module")
def picture() -> str:
    import matplotlib.cbook

    return str(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))


def _cli(*args):
    from click.testing import CliRunner

    from headscope.cli import cli

    return CliRunner().invoke(cli, list(args))


@pytest.fixture(scope="module", params=TYPES)
def saved(request, tmp_path_factory) -> str:
    """A tiny two-tower model saved as a new user saves one: model, tokenizer and image processor in one folder."""
    lm = _tiny(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    lm.processor.save_pretrained(folder)
    return str(folder)


def test_a_saved_two_tower_folder_verifies_from_the_cli_and_names_both_towers(saved, picture):
    # the example: `headscope verify --model FOLDER --image F` — the image tower on F, the text tower on
    # the built-in texts (verify always checks both towers, each with its own family)
    r = _cli("verify", "--model", saved, "--image", picture, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["passed"] and set(out["towers"]) == {"image tower", "text tower"}
    image, text = out["towers"]["image tower"], out["towers"]["text tower"]
    assert image["family"] == "clip_vision" and text["family"] in ("clip_text", "siglip_text")
    assert image["n_texts"] == 1 and text["n_texts"] == 4  # the one image given; the four built-in texts
    assert image["max_abs_err"] <= 1e-5 and text["max_abs_err"] <= 1e-5
    assert {row["kind"] for row in out["layers"]} == {"image tower", "text tower"} and len(out["layers"]) == 4
    assert "image tower (clip_vision)" in out["summary"] and "text tower" in out["summary"]
    r = _cli("verify", "--model", saved, "--image", picture)
    assert r.exit_code == 0 and "(image tower) (clip_vision" in r.output and "(text tower)" in r.output, r.output


@pytest.mark.parametrize("model_type", TYPES)
def test_tiny_two_tower_models_send_images_and_texts_to_their_towers(model_type, picture):
    lm = _tiny(model_type)
    image, text = tower(lm, "image"), tower(lm, "text")
    assert image.model is lm.model.vision_model and text.model is lm.model.text_model  # the same weights
    assert image.name.endswith("(image tower)") and text.name.endswith("(text tower)")
    [m] = extract(lm, images=[picture])
    [t] = extract(lm, "The cat sat on the mat.")
    # the same maps as the towers' own: the composite adds nothing and drops nothing
    torch.testing.assert_close(m.attention, extract(image, images=[picture])[0].attention, atol=0, rtol=0)
    torch.testing.assert_close(t.attention, extract(text, "The cat sat on the mat.")[0].attention, atol=0, rtol=0)
    assert m.grid == (4, 4) and len(m) == 16 + (model_type == "clip")  # CLIP's [CLS]; SigLIP has none
    assert t.causal == (model_type == "clip")  # CLIP's text tower masks causally; SigLIP's is bidirectional
    with pytest.raises(ValueError, match="not both"):
        extract(lm, "a cat", images=[picture])


def test_verification_of_both_towers_is_each_towers_own_and_fails_when_one_does(picture, monkeypatch):
    import dataclasses

    from headscope.probe.families import SUPPORTED_TYPES

    lm = _tiny("siglip")
    v = verify(lm, ["A cat.", "Two dogs ran home."], images=[picture])
    alone = {"image tower": verify(tower(lm, "image"), images=[picture]),
             "text tower": verify(tower(lm, "text"), ["A cat.", "Two dogs ran home."])}
    assert [name for name, _ in v.towers] == ["image tower", "text tower"]
    for name, part in v.towers:
        assert part.max_abs_err == alone[name].max_abs_err and part.n_texts == alone[name].n_texts
    assert v.passed and v.n_texts == 3 and v.family == "clip_vision + siglip_text"
    # break the text tower (a causal mask SigLIP does not have): the whole verification fails, on its rows only
    siglip_text = SUPPORTED_TYPES["siglip_text_model"]
    causal = dataclasses.replace(siglip_text, layer_spec=lambda base, i, c: dataclasses.replace(
        siglip_text.layer_spec(base, i, c), causal=True))
    monkeypatch.setattr(importlib.import_module("headscope.probe.families.siglip_text"), "FAMILY", causal)  # its file
    broken = verify(lm, ["A cat.", "Two dogs ran home."], images=[picture])
    assert not broken.passed and "NOT verified" in broken.summary()
    assert all(c.passed == (c.kind == "image tower") for c in broken.layers)
    with pytest.raises(ValueError, match="two-tower"):
        verify(lm, family=causal)


def test_models_for_gives_the_towers_of_what_was_given():
    lm = _tiny("clip")
    names = lambda **given: [m.name.rsplit("(", 1)[-1] for m in models_for(lm, **given)]  # noqa: E731
    assert names(images=True, texts=False) == ["image tower)"]
    assert names(images=False, texts=True) == names(images=False, texts=False) == ["text tower)"]
    assert names(images=True, texts=True) == ["image tower)", "text tower)"]
    bert = _tiny("bert")
    assert models_for(bert, images=False, texts=True) == [bert]


def test_heads_and_explain_name_the_tower_they_read(picture):
    r = _cli("heads", "--model", "tiny:clip", "--image", picture, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["model"] == "tiny:clip (image tower)" and out["verification"]["passed"]
    r = _cli("heads", "--model", "tiny:siglip", "--limit", "3", "--induction-seqs", "0", "--json", "--quiet")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["model"] == "tiny:siglip (text tower)"
    r = _cli("explain", "A cat sat.", "--model", "tiny:clip", "--token", "cat", "--head", "L1H2", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["model"] == "tiny:clip (text tower)"
    r = _cli("explain", "--model", "tiny:siglip2", "--image", picture, "--token", "r1c2", "--head", "L0H1", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["model"] == "tiny:siglip2 (image tower)" and json.loads(r.output)["query"] == "r1c2"
    r = _cli("verify", "--model", "tiny:nosuch")
    assert r.exit_code == 2 and "clip" in r.output  # the tiny composites are listed among the tiny types


def test_run_reports_each_tower_given(tmp_path, picture, draw_only):
    draw_only("head_scores")
    out = tmp_path / "report"
    r = _cli("run", "--model", "tiny:clip", "--image", picture, "--text", "A cat sat on the mat.", "--report", str(out),
             "--quiet", "--dpi", "20", "--limit", "2", "--permutations", "100", "--induction-seqs", "0",
             "--no-ablation", "--json")
    assert r.exit_code == 0, r.output
    record = json.loads((out / "run.json").read_text())
    models = [m["model"] for m in record["models"]]
    assert models == ["tiny:clip (image tower)", "tiny:clip (text tower)"], models
