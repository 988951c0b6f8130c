"""One home per CLI idea: placement is one value from one option group, every option two commands share is declared
once, `--top` means rows to show everywhere, and a command imports only the façade and the CLI support modules.
No model is loaded here (the commands' loader is replaced)."""

from __future__ import annotations

import ast
import pathlib
import warnings

import click
import pytest
from click.testing import CliRunner

import headscope as hs
from headscope.cli import cli
from headscope.probe.device_placement import Placement

ROOT = pathlib.Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- placement


def test_placement_reads_values_as_the_cli_does(tmp_path):
    p = Placement(device="CUDA:1", dtype="bfloat16", max_memory="0=1GB,cpu=300MB", offload_folder=str(tmp_path))
    assert (p.device, p.dtype, p.max_memory, p.offload_folder) == ("cuda:1", "bfloat16",
                                                                   {0: 10**9, "cpu": 3 * 10**8}, tmp_path)
    assert p.spread and not Placement().spread and Placement(device="auto").spread
    with pytest.raises(ValueError, match="device must be auto, cpu"):
        Placement(device="tpu")
    with pytest.raises(ValueError, match="dtype must be one of float32, float16, bfloat16"):
        Placement(dtype="float8")
    with pytest.raises(ValueError, match="max_memory"):
        Placement(max_memory="lots")
    with pytest.raises(AttributeError):
        Placement().device = "cuda"  # frozen: one value, passed on as it is
    assert hs.Placement is Placement


def test_placement_is_made_once_from_the_option_group(monkeypatch, tmp_path):
    """`--device --dtype --max-memory --offload-folder` reach the loader as one `Placement`, not four arguments."""
    import headscope.commands.verify as verify_cmd

    seen = []

    def loader(name, placement):
        seen.append(placement)
        raise SystemExit(0)

    monkeypatch.setattr(verify_cmd, "load_or_fail", loader)
    res = CliRunner().invoke(cli, ["verify", "--model", "tiny:llama", "--dtype", "bfloat16", "--device", "cpu",
                                   "--max-memory", "cpu=2GB", "--offload-folder", str(tmp_path / "off")])
    assert res.exit_code == 0, res.output
    assert seen == [Placement(device="cpu", dtype="bfloat16", max_memory={"cpu": 2 * 10**9},
                              offload_folder=tmp_path / "off")]
    # and no command's function takes the four loose values: every one that places a model takes `placement`
    import inspect

    placed = 0
    for name, command in cli.commands.items():
        takes = set(inspect.signature(inspect.unwrap(command.callback)).parameters)
        assert not takes & {"device", "dtype", "max_memory", "offload_folder"}, name
        placed += "placement" in takes or "options" in takes  # coref/relations: **options, checked below
    assert placed == len(cli.commands) - 1  # all but `models`, which loads none
    from headscope.commands.coref import run_command

    assert "placement" in inspect.signature(run_command).parameters


def test_load_takes_one_placement_and_the_old_keywords_for_one_release():
    lm = hs.load("tiny:llama", placement=Placement(dtype="bfloat16"))
    assert str(lm.dtype) == "torch.bfloat16"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = hs.load("tiny:llama", dtype="bfloat16")
    assert str(old.dtype) == "torch.bfloat16"
    assert [str(w.message) for w in caught if w.category is DeprecationWarning] == [
        "load(dtype=) is kept for one release; pass placement=headscope.Placement(...) instead"]
    with pytest.raises(TypeError, match="give placement= or device=, not both"):
        hs.load("tiny:llama", placement=Placement(), device="cpu")
    with pytest.raises(TypeError, match="placement must be a headscope.Placement"):
        hs.load("tiny:llama", placement="cpu")
    from headscope.probe.errors import PlacementError

    with pytest.raises(PlacementError, match="device must be"):  # a bad loose value: the loader's own error
        hs.load("tiny:llama", device="tpu")
