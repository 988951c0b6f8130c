"""One reader of sizes and memory budgets (`probe.sizes`) for the API and the CLI (issue 45): what `--max-memory`
and `--memory-budget` take, `hs.load(max_memory=...)` and `memory_budget=...` take too, and a refusal names the
argument in the API and the flag in the CLI."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from headscope.probe.errors import PlacementError
from headscope.probe.device_placement import Placement
from headscope.probe.loading import load_model, placement
from headscope.probe.sizes import SIZE_UNITS, parse_max_memory, parse_size
from headscope.probe.sources import memory_budget

UNITS = {"kB": 1000, "MB": 10**6, "GB": 10**9, "KiB": 1024, "MiB": 2**20, "GiB": 2**30, "": 1}


@given(st.integers(1, 10**6), st.sampled_from(sorted(UNITS)), st.sampled_from(["", " "]))
def test_a_size_is_its_number_times_its_unit(n, unit, gap):
    assert parse_size(f"{n}{gap}{unit}") == n * UNITS[unit] == parse_size(n * UNITS[unit])
    assert parse_size(f"{n}{gap}{unit.upper()}") == n * SIZE_UNITS[unit.lower()]


@pytest.mark.parametrize("bad", ["", "lots", "3XB", "-1", "0", "0.0001kB", " MB", True, 0, -5, 1.5, None, [1]])
def test_what_is_not_a_size_is_one_line_naming_it(bad):
    with pytest.raises(ValueError, match="is not a size") as exc:
        parse_size(bad)
    assert "\n" not in str(exc.value) and "--" not in str(exc.value)


@pytest.mark.parametrize("text, by_hand", [
    ("cpu=300MB", {"cpu": 300 * 10**6}),
    ("0=20GiB,1=20GiB,cpu=60GiB", {0: 20 * 2**30, 1: 20 * 2**30, "cpu": 60 * 2**30}),
    ("cuda:1=1kb, CPU = 2 GB", {1: 1000, "cpu": 2 * 10**9}),
    ("disk=1TB", {"disk": 10**12}),
])
def test_the_api_takes_what_the_cli_takes(text, by_hand):
    """The CLI's string, the same budget as a dict of its size strings and as a dict of bytes."""
    as_dict = dict(part.split("=") for part in text.split(","))
    assert parse_max_memory(text) == parse_max_memory(as_dict) == parse_max_memory(by_hand) == by_hand


def test_load_takes_a_budget_as_the_cli_writes_it(tmp_path):
    # refused before: "give a size ... got '300MB'"
    lm = load_model("tiny:llama", placement=Placement(max_memory={"cpu": "300MB"}))
    assert set(lm.model.hf_device_map.values()) == {"cpu"}
    off = load_model("tiny:llama", placement=Placement(max_memory="cpu=1kB", offload_folder=tmp_path))
    assert "disk" in off.model.hf_device_map.values()
    assert placement("cpu", {"cpu": "300MB"}, None).max_memory == {"cpu": 300_000_000}
    assert memory_budget("1GiB") == 2**30 and memory_budget(2**30) == 2**30


@pytest.mark.parametrize("bad, says", [
    ({"cpu": "300XB"}, "max_memory cpu: '300XB' is not a size"),
    ({"gpu": "1GB"}, "max_memory 'gpu' is not a device"),
    ({99: "1GB"}, "max_memory gives GPU 99 a budget"),
    ("cpu", "is not DEVICE=SIZE"),
    ({}, "is not a memory budget"),
    ({"cpu": "1GB", "CPU": "2GB"}, "names cpu twice"),
])
def test_a_bad_budget_names_the_argument_not_a_flag(bad, says):
    with pytest.raises(PlacementError) as exc:
        load_model("tiny:llama", max_memory=bad)
    assert says in str(exc.value) and "--" not in str(exc.value) and "\n" not in str(exc.value)


def test_a_bad_memory_budget_names_the_argument():
    with pytest.raises(ValueError, match=r"^memory_budget 'lots' is not a size"):
        memory_budget("lots")


@pytest.mark.parametrize("args, says", [
    (["--max-memory", "99=1GB"], "headscope: --max-memory gives GPU 99 a budget"),
    (["--max-memory", "cpu=1kB"], "give --offload-folder DIR"),
    (["--device", "cuda:7"], "--device cuda:7"),
])
def test_the_cli_names_its_flags_for_the_same_refusals(args, says):
    from headscope.cli import cli

    r = CliRunner().invoke(cli, ["verify", "--model", "tiny:llama", *args])
    lines = r.stderr.splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and says in lines[0], r.output
    assert "max_memory" not in lines[0] and "offload_folder" not in lines[0] and "device=" not in lines[0]
