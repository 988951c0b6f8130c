"""A command is its file: one module dropped on `headscope.commands`' path, exposing a click `cli`, is found by
`headscope` (listed in --help, run by name) with nothing else touched — the command half of "a new family in one
file and a new command in one file" (the family half: tests/test_family_file.py)."""

from __future__ import annotations

import sys
import textwrap

import pytest
from click.testing import CliRunner

import headscope.commands as commands
from headscope.cli import cli

# A thin command as a user would write one: parse options, call the API, print. It counts a tiny model's attention
# layers and checks each map's rows sum to one, so it runs a real model through the public API.
_TOY = textwrap.dedent('''
    import click

    @click.command()
    @click.argument("text")
    @click.option("--model", default="tiny:llama", show_default=True)
    def cli(text, model):
        """Count the layers of MODEL's attention on TEXT."""
        import headscope as hs

        [att] = hs.extract(hs.load(model), [text], level="token")
        rows = att.attention.sum(-1)
        click.echo(f"{att.n_layers} layers, {att.n_heads} heads, rows sum to one: {bool(((rows - 1).abs() < 1e-5).all())}")
''')


@pytest.fixture
def toy_command(tmp_path, monkeypatch):
    (tmp_path / "toy_layers.py").write_text(_TOY)
    monkeypatch.setattr(commands, "__path__", [*commands.__path__, str(tmp_path)])
    yield
    cli.commands.pop("toy_layers", None)
    sys.modules.pop("headscope.commands.toy_layers", None)


def test_a_new_command_in_one_file_is_listed_and_runs(toy_command):
    runner = CliRunner()
    listed = runner.invoke(cli, ["--help"])
    assert listed.exit_code == 0 and "toy_layers" in listed.output and "Count the layers" in listed.output
    from headscope.probe.tiny import tiny_model

    config = tiny_model("llama").config  # the expected counts from the model's own config, not from the command
    ran = runner.invoke(cli, ["toy_layers", "The cat sat on the mat."])
    assert ran.exit_code == 0, ran.output
    assert ran.output.strip() == (f"{config.num_hidden_layers} layers, {config.num_attention_heads} heads, "
                                  "rows sum to one: True")


def test_without_the_file_the_name_is_unknown():
    ran = CliRunner().invoke(cli, ["toy_layers", "x"])
    assert ran.exit_code == 2 and "No such command 'toy_layers'" in ran.output
