"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL read images (issue 36): the maps' image tokens carry the cells that the
model's own 3-D positions give them, the decoder is verified at those positions, the vision encoder on its
block outputs (its attention returns no weights), each broken on purpose."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from conftest import _tiny_type
from headscope.probe.extract import extract
from headscope.probe.families import family_for
from headscope.probe.mrope import qwen_vl_positions
from headscope.probe.verify import verify

TYPES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"]
# the mixtures of experts' attention is their dense kin's module (only the MLP differs): broken on purpose once
DENSE = [t for t in TYPES if not t.endswith("_moe")]


def _picture(seed: int, shape=(40, 52, 3)) -> np.ndarray:
    return np.random.default_rng(seed).random(shape)


@pytest.mark.parametrize("model_type", TYPES)
def test_image_tokens_carry_the_cells_of_the_models_own_positions(model_type):
    lm = _tiny_type(model_type)
    slot = lm.processor.image_token
    images = [_picture(0), _picture(1, (30, 30, 3))]
    [m] = extract(lm, f"Look {slot} and {slot} now", images=images)
    ids = torch.tensor([list(m.token_ids)])
    grid = lm.processor.image_processor(images, return_tensors="pt")["image_grid_thw"]
    expected = qwen_vl_positions(lm.model, ids, image_grid_thw=grid).patches(0)
    assert m.patches == expected[: len(m)]
    assert sum(p is not None for p in m.patches) == int(grid.prod(-1).sum()) // 4  # 2 x 2 patches per token
    assert len(m.pictures) == 2 and m.pictures[1].shape[:2] == tuple(int(x) * 2 for x in grid[1, 1:])


@pytest.mark.parametrize("model_type", TYPES)
def test_both_towers_verify_and_the_vision_rows_say_they_are_outputs_only(model_type):
    lm = _tiny_type(model_type)
    v = verify(lm, images=[_picture(2)])
    assert v.passed, v.to_frame()
    vision = [c for c in v.layers if c.kind == "vision"]
    decoder = [c for c in v.layers if c.kind == "decoder"]
    # Qwen3.5's decoder is hybrid: only its softmax-attention layers are verified, under their own numbers
    assert [c.layer for c in decoder] == list(family_for(lm.config).attention_layers(lm.config))
    assert len(vision) == lm.model.config.vision_config.depth
    assert all(np.isnan(c.max_abs_err) and c.max_rel_err_output <= 1e-5 for c in vision)
    assert all(c.max_abs_err <= 1e-5 for c in decoder) and v.max_abs_err == max(c.max_abs_err for c in decoder)
    assert "vision layers checked on their outputs only" in v.summary()
    record = json.loads(json.dumps(v.to_dict(), allow_nan=False))  # strict JSON: no NaN
    assert all(r["max_abs_err"] is None for r in record["layers"] if r["kind"] == "vision")


@pytest.mark.parametrize("model_type", DENSE)
@pytest.mark.parametrize("part", ["1-D positions", "vision rows and columns swapped", "vision weight"])
def test_break_it_text_positions_or_a_wrong_vision_layer_fail(model_type, part, monkeypatch):
    from headscope.probe import qwen_vision

    lm = _tiny_type(model_type)
    family = family_for(lm.config)
    vl = family.vision_language
    kind = "decoder" if part == "1-D positions" else "vision"
    if part == "1-D positions":  # the decoder at positions 0 .. T-1 on every stream
        vl = dataclasses.replace(vl, decoder_at=None)
    elif part == "vision weight":  # layer 0's keys permuted
        def bent(base, i, cfg, spec_of=vl.vision.layer_spec):
            s = spec_of(base, i, cfg)
            return dataclasses.replace(s, wk=s.wk.flip(0)) if i == 0 else s
        vl = dataclasses.replace(vl, vision=dataclasses.replace(vl.vision, layer_spec=bent))
    else:  # each patch's 2-D rotary turned by (column, row)
        real = qwen_vision.vision_positions
        monkeypatch.setattr(qwen_vision, "vision_positions", lambda visual, grid: real(visual, grid).flip(-1))
    v = verify(lm, images=[_picture(3)], family=dataclasses.replace(family, vision_language=vl))
    assert not v.passed and any(not c.passed for c in v.layers if c.kind == kind)


@pytest.mark.parametrize("model_type", DENSE)
def test_a_hidden_checkpoint_of_another_seed_and_picture_verifies(model_type):
    from headscope.probe.tiny import tiny_model

    lm = tiny_model(model_type, as_type=True, seed=11)
    slot = lm.processor.image_token
    v = verify(lm, [f"Two {slot} pictures {slot} here."], images=[_picture(7, (64, 24, 3)), _picture(8, (20, 20, 3))])
    assert v.passed, v.to_frame()


def test_cli_verify_reads_an_image(tmp_path):
    from click.testing import CliRunner
    from PIL import Image

    from headscope.cli import cli

    path = tmp_path / "picture.png"
    Image.fromarray((_picture(5) * 255).astype(np.uint8)).save(path)
    result = CliRunner().invoke(cli, ["verify", "--model", "tiny:qwen2_vl", "--image", str(path)])
    assert result.exit_code == 0, result.output
    assert "2 vision + 2 decoder layers" in result.output and "outputs only" in result.output
    vision_rows = [line for line in result.output.splitlines() if line.strip().startswith("vision ")]
    assert len(vision_rows) == 2 and all("—" in line and "nan" not in line for line in vision_rows)


def test_break_it_qwen2_5_vl_windows_read_as_whole_images(monkeypatch):
    from headscope.probe import qwen_vision

    lm = _tiny_type("qwen2_5_vl")
    whole = lambda visual, i, grid: [(0, int(grid.prod(-1).sum()))]  # noqa: E731  (one picture: one segment)
    monkeypatch.setattr(qwen_vision, "vision_segments", whole)
    v = verify(lm, images=[_picture(3)])
    window_layers = [c for c in v.layers if c.kind == "vision" and c.layer not in lm.model.config.vision_config.fullatt_block_indexes]
    assert window_layers and not any(c.passed for c in window_layers)
    assert all(c.passed for c in v.layers if c.kind == "decoder")


def test_a_qwen3_vl_folder_loads_its_own_processor_class_without_a_video_processor(tmp_path):
    from headscope.probe.loading import load_model

    lm = _tiny_type("qwen3_vl")
    lm.model.save_pretrained(tmp_path)
    lm.processor.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    assert type(loaded.processor).__name__ == "Qwen3VLProcessor" and loaded.processor.chat_template
    slot = loaded.processor.image_token
    [a] = extract(lm, f"See {slot} here", images=[_picture(4)])
    [b] = extract(loaded, f"See {slot} here", images=[_picture(4)])
    assert a.token_ids == b.token_ids and a.patches == b.patches
    torch.testing.assert_close(a.attention, b.attention)
