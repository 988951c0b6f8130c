"""The public API (`import headscope as hs`) and the one CLI option set every command shares."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import pandas as pd
import pytest
from click.testing import CliRunner

import headscope as hs
from headscope.cli import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_import_headscope_loads_no_torch_and_no_model():
    code = "import sys, headscope; print(sorted(m for m in ('torch', 'transformers', 'pandas') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_public_name_resolves():
    for name in hs.__all__:
        assert getattr(hs, name) is not None, name
    assert hs.HeadScores.__module__ == "headscope.analyses.heads"
    with pytest.raises(AttributeError):
        hs.no_such_name  # noqa: B018


def _headscope_imports(text: str) -> list[str]:
    return re.findall(r"^\s*(?:from|import)\s+(headscope[\w.]*)", text, flags=re.MULTILINE)


def test_notebook_and_benchmarks_use_the_public_api_not_the_cli():
    notebook = json.loads((ROOT / "examples" / "quickstart.ipynb").read_text(encoding="utf-8"))
    sources = {f"quickstart.ipynb cell {i}": "".join(c["source"]) for i, c in enumerate(notebook["cells"])
               if c["cell_type"] == "code"}
    sources |= {p.name: p.read_text(encoding="utf-8") for p in (ROOT / "benchmarks").glob("*.py")}
    imports = {name: _headscope_imports(text) for name, text in sources.items()}
    assert "headscope" in imports["quickstart.ipynb cell 1"]  # the scan does see imports
    bad = {name: [m for m in mods if m.startswith("headscope.commands") or m == "headscope.cli"]
           for name, mods in imports.items()}
    assert not {k: v for k, v in bad.items() if v}


def test_the_scan_catches_a_cli_import():
    assert _headscope_imports("x = 1\n    from headscope.commands.heads import cli\n") == ["headscope.commands.heads"]


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".json"])
def test_write_table_round_trips(tmp_path, suffix):
    from headscope.common import write_table

    table = pd.DataFrame({"layer": [0, 1], "head": [2, 3], "value": [0.5, float("nan")]})
    path = tmp_path / f"t{suffix}"
    write_table(table, path)
    back = {".csv": pd.read_csv, ".parquet": pd.read_parquet, ".json": pd.read_json}[suffix](path)
    pd.testing.assert_frame_equal(back, table, check_dtype=False)


@pytest.mark.parametrize("command", [["models"], ["verify"], ["heads"], ["coref"], ["relations"],
                                     ["explain", "x", "--token", "x", "--head", "L0H0"]])
def test_an_unknown_out_suffix_is_one_line_before_any_work(command, tmp_path, monkeypatch):
    import headscope.probe.loading

    monkeypatch.setattr(headscope.probe.loading, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
    res = CliRunner().invoke(cli, [*command, "--out", str(tmp_path / "t.xlsx")])
    assert res.exit_code == 2 and res.output.count("\n") == 1
    assert "use a .csv, .parquet, .json file name" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("command", ["verify", "explain", "heads", "coref", "relations", "run"])
def test_every_model_command_takes_the_same_options(command):
    params = {opt for p in cli.commands[command].params for opt in p.opts}
    assert {"--model", "--device", "--dtype", "--json"} <= params
    if command not in ("verify", "explain"):
        assert "--quiet" in params


def test_models_out_writes_the_table(tmp_path):
    from headscope.probe.registry import model_table

    out = tmp_path / "models.json"
    res = CliRunner().invoke(cli, ["models", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text()) == json.loads(json.dumps(model_table()))


def test_explain_head_spellings_agree(monkeypatch):
    import headscope.commands.explain as cmd
    from headscope.probe.tiny import tiny_model

    monkeypatch.setattr(cmd, "load_or_fail", lambda name, *placement: tiny_model("bert"))
    outputs = [CliRunner().invoke(cli, ["explain", "The cat sat.", "--token", "cat", *args, "--json"])
               for args in (["--head", "L1H2"], ["--head", "1,2"], ["--layer", "1", "--head", "2"])]
    assert all(r.exit_code == 0 for r in outputs), [r.output for r in outputs]
    objs = [json.loads(r.stdout) for r in outputs]
    assert objs[0] == objs[1] == objs[2] and (objs[0]["layer"], objs[0]["head"]) == (1, 2)
    bad = CliRunner().invoke(cli, ["explain", "The cat sat.", "--token", "cat", "--head", "2"])
    assert bad.exit_code == 2 and "give the layer too" in bad.output
