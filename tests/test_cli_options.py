"""One CLI vocabulary: the options every command shares are defined once (`headscope.common.options`), a head
name is read by one parser, and a choice is checked once, in the workflow. No model is loaded here."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from headscope.cli import cli

# Options that mean one thing wherever they appear: name -> what every command that has it must agree on.
SHARED = ("--corpus", "--limit", "--batch-size", "--seed", "--special", "--level", "--truncate", "--json", "--quiet",
          "--no-verify", "--attention", "--memory-budget", "--device", "--dtype", "--figure", "--heads",
          "--sender")
# Where a shared option's default or bound differs on purpose (what the command lists or needs).
DIFFERENT_DEFAULTS = {"--limit"}


def _options():
    """{option name: {command: click.Option}} over every command (the hidden `probe` included)."""
    found: dict[str, dict[str, click.Option]] = {}
    for name, command in cli.commands.items():
        for param in command.params:
            for opt in param.opts:
                found.setdefault(opt, {})[name] = param
    return found


def _shape(param: click.Option) -> tuple:
    kind = type(param.type).__name__
    extra = tuple(param.type.choices) if isinstance(param.type, click.Choice) else ()
    bounds = (getattr(param.type, "min", None), getattr(param.type, "max", None))
    return (param.name, kind, extra, param.multiple, param.is_flag, param.default, bounds, param.help)


@pytest.mark.parametrize("option", SHARED)
def test_a_shared_option_is_the_same_in_every_command(option):
    where = _options()[option]
    shapes = {command: _shape(param) for command, param in where.items()}
    if option in DIFFERENT_DEFAULTS:
        shapes = {c: s[:5] for c, s in shapes.items()}
    if option in ("--corpus", "--seed", "--level", "--limit", "--truncate", "--figure"):  # help says what it is for
        shapes = {c: s[:-1] for c, s in shapes.items()}
    assert len(set(shapes.values())) == 1, shapes


def test_special_has_one_default_the_workflows_default():
    from headscope.probe.names import DEFAULT_INCLUDE_SPECIAL

    where = _options()["--special"]
    assert set(where) == {"heads", "compare"}
    assert {p.default for p in where.values()} == {DEFAULT_INCLUDE_SPECIAL}


def test_a_new_command_takes_its_options_from_the_groups():
    from headscope.common.options import GROUPS, options

    @click.command()
    @options("model", "corpus", "heads", "batching", "seed", "out", "json", "device")
    def command(**given):
        click.echo(repr(sorted(given.items())))

    res = CliRunner().invoke(command, ["--heads", "L1H3,2,0x"])
    assert res.exit_code == 2 and "--heads '2' is not a head name" in res.output
    res = CliRunner().invoke(command, ["--heads", "L1H3, l2h0", "--limit", "4"])
    assert res.exit_code == 0, res.output
    from headscope.probe.device_placement import Placement

    given = dict(eval(res.output, {"Placement": Placement}))  # noqa: S307 - our own repr of plain values
    assert given["heads"] == [(1, 3), (2, 0)] and given["limit"] == 4 and given["corpus_path"] is None
    # --device, --dtype, --max-memory, --offload-folder reach the command as one value, the one hs.load takes
    assert given["batch_size"] == 8 and given["seed"] == 0 and given["placement"] == Placement(device="cpu")
    assert not {"device", "dtype", "max_memory", "offload_folder"} & set(given)
    with pytest.raises(ValueError, match="no option group 'corpora'"):
        options("corpora")
    assert {"corpus", "batching", "seed", "top", "heads", "out", "attention", "device", "quiet"} <= set(GROUPS)


@pytest.fixture
def no_model(monkeypatch):
    import headscope.probe.loading

    monkeypatch.setattr(headscope.probe.loading, "load_model", lambda *a, **k: pytest.fail("loaded a model"))


@pytest.mark.parametrize("args, option", [
    (["qk", "a cat", "--head", "L1", "--query", "1", "--key", "0"], "--head"),
    (["explain", "a cat", "--token", "cat", "--head", "L1"], "--head"),
    (["coref", "--head", "L1"], "--head"),
    (["relations", "--head", "L1"], "--head"),
    (["ablate", "--heads", "L0H0,L1", "--task", "induction"], "--heads"),
    (["patch", "--what", "path", "--sender", "L1"], "--sender"),
])
def test_a_bad_head_name_is_one_line_naming_its_option_before_a_model_loads(args, option, no_model):
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, res.output
    assert res.stderr.strip() == (f"headscope: {option} 'L1' is not a head name; write LAYERHHEAD such as L1H3 "
                                  "(0-based layer and head)")


def test_patch_leaves_its_choices_to_the_workflow_and_spells_them_as_flags(monkeypatch):
    from conftest import _tiny

    monkeypatch.setattr("headscope.commands.patch.load_or_fail", lambda *a: _tiny("llama"))
    res = CliRunner().invoke(cli, ["patch", "--pairs", "agreement", "--what", "path"])
    assert res.exit_code == 2
    assert res.stderr.strip() == ("headscope: path patching needs a sender head (--sender L9H6), and only path "
                                  "patching takes one")
    res = CliRunner().invoke(cli, ["patch", "--pairs", "agreement", "--what", "q", "--attribution"])
    assert res.exit_code == 2
    assert res.stderr.strip() == ("headscope: attribution patching covers --what head_out and --what resid, "
                                  "not --what q")
