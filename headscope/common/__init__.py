"""What every command shares, one module per idea:

    options       the option groups, each defined once, composed by name (`options("corpus", "heads")`)
    exits         `fail`: one line on stderr and a non-zero exit; `refusals`, the API's errors mapped to it
    outputs       --out tables, report folders, --figure, JSON and progress lines, checked before any work
    corpus        the texts of --corpus (or the built-in corpus), checked before any model loads
    loading       models loaded (or refused) with the list of offline models
    runs          a torchrun run: this process's place, its process group joined
    verification  the attention verified before an analysis, exit 1 on a mismatch
    interrupts    Ctrl-C that a finaliser cannot swallow
    internals     the one door to what a command needs below the façade that is not public API (looked up lazily)

A command imports the façade (`import headscope`) and this package, nothing else (`tests/test_option_homes.py`).

A command imports from those modules; the names below are gathered here too, for code that takes
them from `headscope.common` (each is defined in one of the modules).
"""

from __future__ import annotations

from .corpus import Corpus, corpus_or_fail, too_long_or_fail
from .exits import fail, flag_spelling, refusals
from .interrupts import Interrupts, committed
from .loading import load_or_fail, models_or_fail
from .options import parse_size, parsed, utf8_text
from .outputs import (TABLE_WRITERS, attention_note, check_out, echo_json, emit, new_file_or_fail, say,
                      writable_or_fail, write_table)
from .runs import join_run
from .verification import finish, verify_step

__all__ = [
    "fail", "refusals", "flag_spelling", "parsed", "utf8_text", "parse_size", "TABLE_WRITERS", "write_table",
    "writable_or_fail", "new_file_or_fail",
    "check_out", "echo_json", "emit", "say", "attention_note", "Corpus", "corpus_or_fail", "too_long_or_fail",
    "load_or_fail", "models_or_fail", "join_run", "verify_step", "finish", "Interrupts", "committed",
]
