"""Lines of a UTF-8 text file, shared by every reader (corpus, probe JSONL, GAP).

Bytes are decoded one line at a time, so a bad byte is reported with its line and column and a file
of any size streams. Lines end at "\\n" (a "\\r\\n" ending is removed too); a UTF-8 byte-order mark at
the start of the file is not text and is dropped. JSON objects are decoded with `strict_json_object`,
which refuses a key given twice (plain `json.loads` keeps the last one silently) and a string holding a
lone surrogate (a `\\ud800` escape without its pair: not text, and a tokenizer's TypeError later), and
reports JSON nested too deeply for the decoder as invalid JSON, not as a RecursionError.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator

__all__ = ["LineError", "decoded_lines", "utf8_problem", "strict_json_object"]

# Builds the reader's own exception from (file, 1-based line, problem).
LineError = Callable[[Path, int, str], Exception]


def decoded_lines(path: Path, error: LineError) -> Iterator[tuple[int, str]]:
    """`(line number, text)` for each line of `path`, without its line ending; `error` for bad UTF-8."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            problem = utf8_problem(raw)
            if problem:
                raise error(path, number, problem)
            line = raw.decode("utf-8")
            if number == 1:
                line = line.removeprefix("\ufeff")
            yield number, line.rstrip("\r\n")


def utf8_problem(raw: bytes) -> str | None:
    """Why `raw` is not UTF-8 (the first bad byte and its 1-based column), or None.

    >>> utf8_problem("café".encode()), utf8_problem(b"bad \\xff byte")
    (None, 'not valid UTF-8 (byte 0xff at column 5); save the file as UTF-8')
    """
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); save the file as UTF-8"
    return None


def strict_json_object(line: str) -> object:
    """`json.loads(line)`, except that an object holding one key twice is a `ValueError`.

    >>> strict_json_object('{"a": 1, "b": 2}')
    {'a': 1, 'b': 2}
    >>> strict_json_object('{"a": 1, "a": 2}')
    Traceback (most recent call last):
    ...
    ValueError: the key 'a' is given twice in one object; give each field once
    """
    try:
        obj = json.loads(line, object_pairs_hook=_unique_keys)
    except RecursionError:  # "[[[[..." thousands deep: the decoder recurses once per level
        raise json.JSONDecodeError("nested too deeply", line, 0) from None
    _no_lone_surrogate(obj)
    return obj


def _no_lone_surrogate(obj: object) -> None:
    """A `ValueError` naming the first string of `obj` (keys too) with an unpaired UTF-16 half in it."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:  # the tokenizer would fail with a bare TypeError
                half = f"\\u{ord(item[exc.start]):04x}"
                raise ValueError(f"the string {item[:40]!r} holds a lone surrogate (an unpaired {half} escape), which "
                                 "is not Unicode text; remove it or give the full pair") from None


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"the key {key!r} is given twice in one object; give each field once")
        seen[key] = value
    return seen
