"""The `headscope` command: thin wrappers over the public API (`headscope.api`).

Each subcommand lives in `headscope/commands/<name>.py` and exposes a click command `cli`.
"""

from __future__ import annotations

import warnings

import click

from . import __version__
from .commands import ablate, compare, coref, explain, generate, heads, importance, models, probe, run, syntax, verify


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="headscope")
def cli() -> None:
    """Look inside the attention heads of real pretrained models."""


# In the order `headscope --help` lists them.
_COMMANDS = {
    "models": models, "verify": verify, "explain": explain, "heads": heads, "coref": coref, "probe": probe,
    "syntax": syntax, "run": run, "compare": compare, "generate": generate, "ablate": ablate, "importance": importance,
}
for _name, _module in _COMMANDS.items():
    cli.add_command(_module.cli, name=_name)


def main() -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)
    cli(prog_name="headscope")
