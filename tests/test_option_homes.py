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


# ---------------------------------------------------------------- every shared option declared once


def _declarations() -> dict[str, dict[str, click.Option]]:
    """{long option: {command: its click.Option}} over the visible commands; hidden options are the old spellings
    kept for one release (`common.options.renamed`) and go with it."""
    found: dict[str, dict[str, click.Option]] = {}
    for name, command in cli.commands.items():
        if command.hidden:
            continue
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                for opt in param.opts + param.secondary_opts:
                    if opt.startswith("--"):
                        found.setdefault(opt, {})[name] = param
    return found


def _meaning(param: click.Option, *, default: bool = True) -> tuple:
    """What a user sees of an option: its type (choices, bounds), flag or not, default and help. Not the parameter's
    name inside the command, nor whether it repeats (one --model, or several for run)."""
    kind = param.type
    return (type(kind).__name__, tuple(getattr(kind, "choices", ()) or ()), getattr(kind, "min", None),
            getattr(kind, "max", None), param.is_flag, param.default if default else None, param.help)


def test_no_long_option_is_declared_twice_with_different_help_or_defaults():
    from headscope.common.options import PER_COMMAND_DEFAULTS, SharedOption

    found = _declarations()
    shared = {opt: where for opt, where in found.items() if len(where) > 1}
    assert {"--model", "--out", "--top", "--permutations", "--method", "--ablation-texts", "--random", "--seed",
            "--force", "--report", "--text"} <= set(shared)  # the scan sees the command tree
    for opt, where in shared.items():
        # declared once: in the shared module, or by the one factory that makes coref and relations (whose --data
        # names each one's own built-in sets)
        hand = sorted(c for c, p in where.items() if not isinstance(p, SharedOption))
        assert not hand or set(where) == {"coref", "relations"}, (opt, hand)
        meanings = {c: _meaning(p, default=opt not in PER_COMMAND_DEFAULTS)[:-1 if hand else None]
                    for c, p in where.items()}
        assert len(set(meanings.values())) == 1, (opt, meanings)


def test_the_scan_catches_a_second_declaration():
    """A command that declares --seed itself with another default is what the scan above refuses."""
    @click.command()
    @click.option("--seed", type=int, default=1, help="Seed.")
    def rogue(seed):
        pass

    from headscope.common.options import options

    @click.command()
    @options("seed")
    def good(seed):
        pass

    a, b = ([p for p in c.params if p.name == "seed"][0] for c in (rogue, good))
    assert _meaning(a) != _meaning(b)
    from headscope.common.options import SharedOption

    assert isinstance(b, SharedOption) and not isinstance(a, SharedOption)


def test_the_one_defaults_a_researcher_meets():
    """Where commands disagreed: one value now (`run --sinks` and `sinks` measure dormant calls alike)."""
    found = _declarations()
    assert {p.default for p in found["--method"].values()} == {"mean"}
    assert {p.default for p in found["--ablation-texts"].values()} == {32}
    assert {p.default for p in found["--permutations"].values()} == {10_000}
    assert {c: p.default for c, p in found["--random"].items() if p.default != 19} == {"retrieval": 10}
    assert set(found["--model"]) >= {"serve", "run"}  # serve takes the shared --model


def test_the_api_and_the_cli_take_one_ablation_method_by_default():
    """`--method` has one meaning: each command's default and the default of every public function with a `method`
    (hs.ablate, hs.ablate_each, hs.sinks, ...) are one value, read from the click options and the signatures."""
    import inspect

    cli_defaults = {c: p.default for c, p in _declarations()["--method"].items()}
    api_defaults = {}
    for name in hs.__all__:
        obj = getattr(hs, name)
        if not inspect.isfunction(obj):
            continue
        method = inspect.signature(obj).parameters.get("method")
        if method is not None and method.default is not inspect.Parameter.empty:
            api_defaults[name] = method.default
    assert {"ablate", "coref", "sinks"} <= set(cli_defaults)  # the scans see what they compare
    assert {"ablate", "ablate_each", "choice_check", "ablate_chosen_head", "ablation_evidence", "sinks"} <= set(api_defaults)
    assert len({*cli_defaults.values(), *api_defaults.values()}) == 1, (cli_defaults, api_defaults)
    assert hs.DEFAULT_ABLATION_METHOD in cli_defaults.values()


# ---------------------------------------------------------------- --top means rows shown


def test_top_means_rows_shown_everywhere():
    found = _declarations()
    assert {p.name for p in found["--top"].values()} == {"k"}
    assert all(p.help.startswith("Rows shown") for p in found["--top"].values())
    assert "ablate" not in found["--top"] and "patch" not in found["--top"]  # their choices have their own names
    assert {"--heads-by"} <= set(_declarations()) and "--confirm" in found


@pytest.fixture
def ablate_spy(monkeypatch):
    """`headscope ablate` up to the façade's ablate: what it is asked to ablate, no model loaded."""
    import headscope.commands.ablate as ablate_cmd

    seen = {}

    def ablate(lm, heads, **kw):
        seen.update(kw, heads=heads)
        raise SystemExit(0)

    monkeypatch.setattr(ablate_cmd, "load_or_fail", lambda name, placement: name)
    monkeypatch.setattr(hs, "ablate", ablate)
    return seen


@pytest.mark.parametrize("flag, warned", [("--heads-by", False), ("--top", True)])
def test_ablate_heads_by_and_its_old_spelling(flag, warned, ablate_spy):
    res = CliRunner().invoke(cli, ["ablate", "--model", "tiny:llama", flag, "induction:5", "--task", "induction"])
    assert res.exit_code == 0, res.output
    assert ablate_spy["heads_by"] == "induction:5" and ablate_spy["heads"] is None  # both spellings: one choice
    if warned:
        assert res.stderr == ("headscope: ablate --top METRIC:K is deprecated: write --heads-by METRIC:K (the old "
                              "spelling works for one more release)\n")
    else:
        assert res.stderr == ""


def test_ablate_refuses_both_or_neither_choice_by_their_new_names(monkeypatch):
    import headscope.commands.ablate as ablate_cmd

    monkeypatch.setattr(ablate_cmd, "load_or_fail", lambda *a: pytest.fail("loaded a model"))
    res = CliRunner().invoke(cli, ["ablate", "--task", "induction"])
    assert res.exit_code == 2 and "--heads-by METRIC:K" in res.stderr
    for flag in ("--heads-by", "--top"):  # a bad choice is refused before any model loads, in either spelling
        res = CliRunner().invoke(cli, ["ablate", flag, "bogus:3", "--task", "induction"])
        assert res.exit_code == 2 and res.stderr.splitlines()[-1].startswith(f"headscope: {flag} 'bogus:3': unknown "
                                                                             "metric 'bogus'"), res.stderr


@pytest.mark.parametrize("args, old, new, value", [
    (["patch", "--pairs", "ioi"], "--top", "--confirm", "2"),
    (["sinks"], "--length", "--sequence-length", "8"),
    (["coref"], "--random-sets", "--random", "7"),
    (["sinks"], "--no-ablation", "--no-dormant", None),
])
def test_the_other_renamed_options_still_work_for_one_release(args, old, new, value, monkeypatch):
    import importlib

    module = importlib.import_module(f"headscope.commands.{args[0]}")
    got = {}

    def stop(*a, **k):
        raise SystemExit(0)

    monkeypatch.setattr(module, "load_or_fail", stop)
    real = click.Context.invoke

    def spy(ctx, callback, *a, **kw):
        got.update(kw)
        return real(ctx, callback, *a, **kw)

    monkeypatch.setattr(click.Context, "invoke", spy)
    for flag in (new, old):
        got.clear()
        res = CliRunner().invoke(cli, [*args, flag, *([value] if value else [])])
        assert res.exit_code == 0, res.output
        if value:
            assert str(value) in map(str, got.values())
        else:  # a flag pair: the old --no-ablation turns the dormant calls off as --no-dormant does
            assert got["ablation"] is False
            assert flag == new or "sinks --ablation/--no-ablation is deprecated: write --dormant/--no-dormant" in \
                res.stderr
        assert ("is deprecated" in res.stderr) == (flag == old), res.stderr


def test_sinks_dormant_and_run_report_keep_their_old_spellings(tmp_path, monkeypatch):
    import headscope.commands.run as run_cmd

    seen = []
    monkeypatch.setattr(run_cmd, "models_or_fail", lambda *a, **k: None)
    monkeypatch.setattr(run_cmd, "inputs_or_fail", lambda *a, **k: None)
    monkeypatch.setattr(run_cmd, "_read_inputs", lambda *a: seen.append("read") or SystemExit(0))

    def stop(*a):
        raise SystemExit(0)

    monkeypatch.setattr(run_cmd, "_read_inputs", stop)
    new = CliRunner().invoke(cli, ["run", "--report", str(tmp_path / "r")])
    old = CliRunner().invoke(cli, ["run", "--out", str(tmp_path / "r")])
    assert new.exit_code == old.exit_code == 0, (new.output, old.output)
    assert new.stderr == "" and old.stderr.startswith("headscope: run --out DIR is deprecated: write --report DIR")
    missing = CliRunner().invoke(cli, ["run"])
    assert missing.exit_code == 2 and missing.stderr == "headscope: give --report DIR: the folder the report is " \
                                                        "written into\n"
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("not headscope's")
    for flag in ("--report", "--out"):  # the old spelling is checked as the new one is, before any work
        res = CliRunner().invoke(cli, ["run", flag, str(taken)])
        assert res.exit_code == 2 and flag in res.stderr.splitlines()[-1], res.output


# ---------------------------------------------------------------- thin commands


# What a command may import: the façade itself (`headscope`, the module, not what lies under it), the CLI support
# package (with `common.internals`, its one door to the names below the façade that are not public API), another
# command (relations is coref's factory), and the live explorer's server, a front end beside the CLI.
_FACADE = "headscope"
_ALLOWED = ("headscope.common", "headscope.commands", "headscope.serve", "headscope.guard")


def _imports(path: pathlib.Path) -> set[str]:
    """Every module `path` imports, relative imports resolved against `headscope.commands`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = "headscope.commands".split(".")[: 2 - (node.level - 1)] if node.level else []
            found.add(".".join([*base, *([node.module] if node.module else [])]))
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("headscope")}


def _internal(modules: set[str]) -> set[str]:
    """The modules of `modules` below the façade that a command may not import."""
    return {m for m in modules if m != _FACADE and not any(m == a or m.startswith(a + ".") for a in _ALLOWED)}


def test_a_command_imports_only_the_facade_and_the_cli_support():
    commands = sorted((ROOT / "headscope" / "commands").glob("*.py"))
    assert len(commands) > 15
    found = {path.name: sorted(_internal(_imports(path))) for path in commands}
    assert {name: inside for name, inside in found.items() if inside} == {}


def test_the_import_scan_sees_an_internal_import():
    source = ROOT / "headscope" / "commands" / "ablate.py"
    assert "headscope.common.internals" not in _imports(source) and "headscope.common" in _imports(source)
    fake = pathlib.Path(__file__).with_name("_scan_probe_tmp.py")
    try:
        fake.write_text("def f():\n    from headscope.probe.types import head_name\n    from ..common import fail\n"
                        "    from headscope.workflows.heads import checked_heads\n    from headscope import heads\n")
        assert _imports(fake) == {"headscope.probe.types", "headscope.common", "headscope.workflows.heads", "headscope"}
        # the façade is the module `headscope`, not a prefix: a workflow (or any room) imported by its path is caught
        assert _internal(_imports(fake)) == {"headscope.probe.types", "headscope.workflows.heads"}
    finally:
        fake.unlink()


def test_every_command_that_prints_a_result_writes_it_through_the_one_writer():
    """`common.outputs.emit` writes --out, --figure and --json for every command (`run` writes its report folder;
    `heads` is left to the change that moves its body; `serve` prints no result)."""
    for path in sorted((ROOT / "headscope" / "commands").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        if path.name in ("__init__.py", "relations.py", "serve.py", "run.py", "heads.py"):
            continue
        assert "emit(" in text and "echo_json(" not in text, path.name
        assert "write_table(" not in text or path.name == "syntax.py", path.name  # syntax: its --clusters table
