"""Folders laid out as hub downloads load by path (issue 45): a vision–language checkpoint whose processor class
takes a video processor (Qwen-VL, LLaVA-OneVision, SmolVLM) loads its own processor class, images only, where
the video processor cannot be built (it needs torchvision), in either layout a hub folder has (separate files or
one nested `processor_config.json`); a package the processor class itself needs is named in one line with the
extra that installs it."""

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from conftest import _tiny_type
from headscope.probe.extract import extract
from headscope.probe.loading import load_model
from headscope.probe.tiny import save_tiny

VIDEO_TYPES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava_onevision", "smolvlm"]


def _picture(seed: int = 0, shape=(40, 52, 3)) -> np.ndarray:
    return np.random.default_rng(seed).random(shape)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    made = {}

    def get(model_type: str, layout: str):
        if (model_type, layout) not in made:
            made[model_type, layout] = save_tiny(_tiny_type(model_type), tmp_path_factory.mktemp(model_type),
                                                 layout=layout)
        return made[model_type, layout]
    return get


@pytest.mark.parametrize(("model_type", "layout"), [*((t, "hub") for t in VIDEO_TYPES), ("qwen2_vl", "nested"),
                                                     ("llava_onevision", "nested")])
def test_a_folder_with_video_settings_loads_its_own_processor_and_reads_images_as_the_tiny_model(
        model_type, layout, saved):
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    folder = saved(model_type, layout)
    names = {p.name for p in folder.iterdir()}
    assert ("video_preprocessor_config.json" in names) == (layout == "hub")
    assert ("preprocessor_config.json" in names) == (layout == "hub")
    lm, loaded = _tiny_type(model_type), load_model(str(folder))
    assert type(loaded.processor).__name__ == PROCESSOR_MAPPING_NAMES[model_type] and loaded.processor.chat_template
    images = [_picture(3)]
    [a] = extract(lm, "What is here?", images=images)  # the chat template puts the image in a user turn
    [b] = extract(loaded, "What is here?", images=images)
    assert a.token_ids == b.token_ids and a.patches == b.patches
    torch.testing.assert_close(a.attention, b.attention, rtol=0, atol=1e-6)  # the same weights, the same inputs


def test_the_cli_verifies_a_hub_folder_of_qwen_vl(saved):
    from headscope.cli import cli

    result = CliRunner().invoke(cli, ["verify", "--model", str(saved("qwen2_vl", "hub"))])
    assert result.exit_code == 0, result.output
    assert "unexpected" not in result.output


def test_a_missing_package_of_the_processor_class_is_one_line_naming_the_extra(saved, monkeypatch):
    """SmolVLM's processor class needs num2words even for images: without it, one line, exit 2, the extra named."""
    from transformers.models.smolvlm import processing_smolvlm

    from headscope.cli import cli
    from headscope.probe.registry import ModelNotAvailable

    folder = saved("smolvlm", "hub")
    monkeypatch.setattr(processing_smolvlm, "num2words", None)
    with pytest.raises(ModelNotAvailable, match=r"num2words.*pip install 'headscope\[vision\]'"):
        load_model(str(folder))
    result = CliRunner().invoke(cli, ["verify", "--model", str(folder)])
    assert result.exit_code == 2, result.output
    [line] = [x for x in result.output.splitlines() if x.strip()]
    assert "headscope[vision]" in line and "unexpected" not in line


@pytest.mark.parametrize("there", ["a folder with a file of the user's", "a file"])
def test_save_tiny_never_replaces_files_it_did_not_write(there, tmp_path):
    from headscope.probe.tiny import save_tiny, tiny_model

    target = tmp_path / "model"
    if there == "a file":
        target.write_text("mine")
        mine = target
    else:
        target.mkdir()
        mine = target / "config.json"
        mine.write_text("mine")
    with pytest.raises(ValueError, match="new or empty folder"):
        save_tiny(tiny_model("gpt2"), target)
    assert mine.read_text() == "mine"
