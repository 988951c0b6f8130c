"""Checks before any heavy work (issue 45): a model that cannot take the input given (--image on a text model,
texts on an image model) is refused before any model loads, the second of two as well as the first."""

from __future__ import annotations

import functools
import json

import pytest
from click.testing import CliRunner

from headscope.probe import images as image_inputs
from headscope.probe import loading


def _invoke(command: str, args: list[str], monkeypatch):
    """`headscope COMMAND ARGS` with loading a model an error: a refusal here comes before any model loads."""
    import importlib

    from headscope.cli import cli

    def no_load(*a, **kw):
        raise AssertionError("a model was loaded before the refusal")

    monkeypatch.setattr(importlib.import_module(f"headscope.commands.{command}"), "load_or_fail", no_load)
    return CliRunner().invoke(cli, [command, *args])


def _refused(r, *words: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("headscope: "), r.output
    assert all(w in lines[0] for w in words), lines[0]


def test_run_checks_every_model_before_loading_the_first(picture_file, tmp_path, monkeypatch):
    r = _invoke("run", ["--model", "tiny:llava", "--model", "tiny:llama", "--image", str(picture_file),
                        "--report", str(tmp_path / "r")], monkeypatch)
    _refused(r, "tiny:llama is a text model", "not images")
    r = _invoke("run", ["--model", "tiny:llama,tiny:vit", "--report", str(tmp_path / "r")], monkeypatch)
    _refused(r, "tiny:vit is an image model", "--image FILE")
    assert not (tmp_path / "r").exists()


def test_a_folder_s_type_is_read_from_its_config_without_loading(tmp_path, monkeypatch):
    folder = tmp_path / "vit-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "vit"}))  # no weights at all: nothing loads
    assert loading.model_type_of(str(folder)) == "vit"
    r = _invoke("run", ["--model", "tiny:llama", "--model", str(folder), "--report", str(tmp_path / "r")], monkeypatch)
    _refused(r, "is an image model (vit)")


@pytest.mark.parametrize("command, extra", [("verify", []), ("generate", ["--prompt", "Hi"]),
                                            ("explain", ["The cat sat.", "--token", "cat", "--head", "L0H0"]), ("heads", [])])
def test_an_image_for_a_text_model_is_refused_before_it_loads(command, extra, picture_file, monkeypatch):
    r = _invoke(command, ["--model", "tiny:llama", "--image", str(picture_file), *extra], monkeypatch)
    _refused(r, "tiny:llama is a text model")


@functools.lru_cache(maxsize=None)
def _loaded(model_type: str):
    return loading.load_model(f"tiny:{model_type}")


@pytest.mark.parametrize("model_type", ["llama", "vit", "llava", "clip", "t5", "mllama"])
@pytest.mark.parametrize("images", [True, False])
def test_the_check_before_loading_is_the_check_after(model_type, images):
    """`modality_refusal` on the type (before loading) refuses exactly what `require_modality` refuses of the
    loaded model, with the same line."""
    lm = _loaded(model_type)
    assert loading.model_type_of(f"tiny:{model_type}") == lm.model_type == model_type
    before = image_inputs.modality_refusal(lm.name, model_type, images=images)
    try:
        image_inputs.require_modality(lm, images=images)
        after = None
    except ValueError as exc:
        after = str(exc)
    assert before == after
