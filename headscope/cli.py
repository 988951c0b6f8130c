"""The `headscope` command: a thin layer that wires probe -> analyses -> reports.

Each subcommand lives in `headscope/commands/<name>.py` and exposes a click command `cli`.
"""

from __future__ import annotations

import importlib
import warnings

import click

from . import __version__

# Subcommand modules, in the order `headscope --help` lists them.
_COMMANDS = ("models", "verify", "explain", "heads", "coref", "probe", "syntax", "run")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="headscope")
def cli() -> None:
    """Look inside the attention heads of real pretrained models."""


for _name in _COMMANDS:
    try:
        _module = importlib.import_module(f"headscope.commands.{_name}")
    except ModuleNotFoundError as exc:  # a command whose module is not written yet
        if exc.name != f"headscope.commands.{_name}":
            raise
        continue
    cli.add_command(_module.cli, name=_name)


def main() -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)
    cli(prog_name="headscope")
