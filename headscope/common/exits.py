"""How a command stops on a bad input: one line on stderr and a non-zero exit (2 for a usage error).

`fail` is the one way out; `refusals` maps what the API raises (a model headscope cannot take apart,
a bad argument) to it, and `flag_spelling` writes the API's keyword choices as the flags that set them.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import click

__all__ = ["fail", "refusals", "flag_spelling"]


def fail(message: str, code: int = 2) -> None:
    """Print `message` to stderr as one line and exit with `code` — no traceback wall.

    The API's spelling of a choice in the message (`attention='eager'`) becomes the flag's (`--attention eager`).
    """
    line = "; ".join(part.strip() for part in str(message).splitlines() if part.strip())
    click.echo(f"headscope: {flag_spelling(line)}", err=True)
    sys.exit(code)


@contextmanager
def refusals(model_name: str, *bad: type[BaseException]):
    """Inside: a model headscope cannot take apart ends in one line and exit 3, a bad argument (TypeError,
    ValueError, and any of `bad`) in one line and exit 2 — the mapping every command that computes shares."""
    from headscope.probe.families import UnsupportedArchitecture, UnsupportedFeature

    try:
        yield
    except (UnsupportedArchitecture, UnsupportedFeature) as exc:
        fail(str(exc) if str(exc).startswith(model_name) else f"{model_name}: {exc}", code=3)
    except (TypeError, ValueError, *bad) as exc:
        fail(str(exc))


# Keyword arguments of the API whose CLI flag has the same name and takes the same values.
_FLAG_KEYWORDS = ("attention", "what", "sender", "positions", "receivers", "direction", "device")
# Arguments of the API whose flag is their name with dashes, named bare in a message (`max_memory cpu: ...`).
_FLAG_ARGUMENTS = ("max_memory", "offload_folder", "memory_budget", "heads_by")


def flag_spelling(message: str) -> str:
    """`message` with each API keyword choice (`attention='eager'`) written as its flag (`--attention eager`), and
    each argument named bare (`max_memory`) as its flag (`--max-memory`).

    >>> flag_spelling("recomputed attention covers encoders only, use attention='eager'")
    'recomputed attention covers encoders only, use --attention eager'
    >>> flag_spelling("max_memory gives GPU 3 a budget; use device='cuda:0'")
    '--max-memory gives GPU 3 a budget; use --device cuda:0'
    """
    import re

    message = re.sub(rf"\b({'|'.join(_FLAG_KEYWORDS)})=(['\"])([\w:.-]+)\2", r"--\1 \3", message)
    return re.sub(rf"(?<![\w-])({'|'.join(_FLAG_ARGUMENTS)})\b", lambda m: "--" + m.group(1).replace("_", "-"), message)
