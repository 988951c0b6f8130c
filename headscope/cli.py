"""The `headscope` command: thin wrappers over the public API (`import headscope as hs`, the façade).

Each subcommand lives in `headscope/commands/<name>.py` and exposes a click command `cli`.
Whatever goes wrong ends in one line on stderr and a non-zero exit: a bad argument exits 2, an
unexpected error 1 (`--debug` shows its traceback), Ctrl-C 130. headscope's own warnings (an
unusable cache folder) print as one line too.
"""

from __future__ import annotations

import copy
import gc
import importlib
import os
import pkgutil
import signal
import sys
import threading
import warnings
from contextlib import contextmanager, nullcontext, redirect_stderr, redirect_stdout

import click

from . import __version__, commands
from .common.interrupts import Interrupts


class _OneLine(click.ClickException):
    """A click error (bad option value, unknown command) shown as one line, not usage + hint + error."""

    def show(self, file=None) -> None:
        click.echo(f"headscope: {self.format_message()}", err=True)


def _warning_line(message, category, filename, lineno, file=None, line=None, *, default=warnings.showwarning):
    """headscope's own warnings ("headscope: ...") as the line they say; anything else as Python prints it."""
    if str(message).startswith("headscope:"):
        click.echo(str(message), err=True)
    else:
        default(message, category, filename, lineno, file, line)


class _Group(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_command_files()})

    def get_command(self, ctx: click.Context, name: str):
        """A command file added to `headscope.commands` after import (a plug-in folder on its path) is found too."""
        if name not in self.commands and name in _command_files():
            self.add_command(importlib.import_module(f"{commands.__name__}.{name}").cli, name=name)
        return super().get_command(ctx, name)

    def invoke(self, ctx: click.Context):
        debug = ctx.params.get("debug", False)
        try:
            # Every command under one Ctrl-C guard: an interrupt that a finaliser swallowed still ends in 130,
            # one that came after the output was in place (`Interrupts.commit`) is announced, not raised.
            # `main` opens it for the whole process (ctx.obj); a caller of `cli` itself gets one per command.
            guard = nullcontext(ctx.obj) if isinstance(ctx.obj, Interrupts) else Interrupts()
            with warnings.catch_warnings(), guard as interrupts:  # both restored afterwards
                ctx.obj = interrupts  # for the commands' writers (`common.write_table`)
                if not debug:
                    warnings.showwarning = _warning_line
                try:
                    result = super().invoke(ctx)
                    interrupts.check()
                finally:
                    if interrupts.late:
                        click.echo(f"headscope: Ctrl-C came after {interrupts.committed} was in place; it is "
                                   "complete, so the command finished", err=True)
                return result
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except click.ClickException as exc:
            if debug:
                raise
            where = exc.ctx.command_path if getattr(exc, "ctx", None) is not None else "headscope"
            command = where.removeprefix("headscope").strip()
            error = _OneLine(f"{command + ': ' if command else ''}{exc.format_message()} "
                             f"(see {where} --help)".replace("\n", " "))
            error.exit_code = exc.exit_code
            raise error from None
        except KeyboardInterrupt:
            click.echo("\nheadscope: interrupted; nothing was written or replaced", err=True)
            sys.exit(130)
        except BrokenPipeError:
            # The reader of stdout went away (`headscope heads | head`): stop quietly, as Unix tools do.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(141)
        except Exception as exc:
            if debug:
                raise
            text = " ".join(str(exc).split()) or "no message"
            click.echo(f"headscope: unexpected {type(exc).__name__}: {text} (--debug shows the traceback)", err=True)
            sys.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="headscope")
@click.option("--debug", is_flag=True, help="Show the full traceback of an unexpected error.")
def cli(debug: bool) -> None:
    """Look inside the attention heads of real pretrained models."""


def _command_files() -> list[str]:
    """The commands are the files of `headscope.commands` (one module per command, each exposing a click
    command named `cli`): a new command is one file there, found by its name like a family file."""
    return sorted(info.name for info in pkgutil.iter_modules(commands.__path__) if not info.name.startswith("_"))


_COMMANDS = {name: importlib.import_module(f"{commands.__name__}.{name}") for name in _command_files()}
for _name, _module in _COMMANDS.items():
    cli.add_command(_module.cli, name=_name)
# The name before 0.2, for one release: `headscope probe` runs `headscope relations` after a warning.
cli.add_command(copy.copy(_COMMANDS["relations"].cli), name="probe")
cli.commands["probe"].hidden = True
cli.commands["probe"].deprecated = "use `headscope relations`"


@contextmanager
def _quiet_unless_rank_zero():
    """In a torchrun run only rank 0 prints: every rank holds the same merged results, and an error on
    any rank is raised on all of them (`headscope.distributed.together`), so rank 0 says it once.
    Read from the environment directly: `headscope --help` does not import torch."""
    if os.environ.get("RANK", "0").strip() in ("", "0"):
        yield
        return
    with open(os.devnull, "w") as null, redirect_stdout(null), redirect_stderr(null):
        yield


def main(args: list[str] | None = None) -> None:
    """The `headscope` command, `python -m headscope` and every process of `torchrun -m headscope`."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    # The process's Ctrl-C guard, opened before click parses anything, so that no moment of the command is
    # unguarded. Once the command has ended (its report written and announced, say) the process is only
    # shutting down: an interrupt then is too late to stop anything and must not turn the exit status into a
    # death by SIGINT, so it is ignored (SIG_IGN, which Python's own shutdown keeps: a Python handler it resets).
    interrupts = Interrupts().__enter__()
    try:
        with _quiet_unless_rank_zero():
            cli(args=args, prog_name="headscope", obj=interrupts)
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # first, so that no moment is left to the default
        interrupts.__exit__()  # its hook; the handler it leaves, being no longer its own
        # The objects alive now live until the exit, whose last collections would walk every one of them (torch's
        # and a model's: about a second): frozen, they are skipped. Only the process's own command gets here.
        gc.freeze()
