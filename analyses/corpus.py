"""Corpora for head analyses: the built-in English sentences and user files.

A user corpus is a text file with one text per line, or JSON Lines (`.jsonl`/`.ndjson`) with one
object per line holding a `text` string. Empty (whitespace-only) lines are skipped; any other bad
line stops reading with an error naming the file and line number. Files are read lazily, so a
corpus of any size streams.

>>> texts = builtin_corpus()
>>> len(texts) >= 300, texts[0].split()[:3]
(True, ['The', 'city', 'council'])
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Iterator, Literal

__all__ = ["CorpusError", "CorpusFormat", "builtin_corpus", "iter_corpus", "read_corpus"]

CorpusFormat = Literal["auto", "txt", "jsonl"]
_JSONL_SUFFIXES = (".jsonl", ".ndjson")


class CorpusError(ValueError):
    """A corpus line that cannot be used; `path` and `line` (1-based) say where."""

    def __init__(self, path: str | Path, line: int, problem: str) -> None:
        self.path, self.line, self.problem = str(path), line, problem
        super().__init__(f"{path}, line {line}: {problem}")


def builtin_corpus() -> list[str]:
    """The built-in English corpus: several hundred hand-written sentences (news-like, dialogue,
    lists, numbers, questions, punctuation-heavy lines), one text each."""
    source = resources.files("headscope.analyses") / "data" / "corpus.txt"
    with resources.as_file(source) as path:
        return read_corpus(path, format="txt")


def read_corpus(path: str | Path, *, format: CorpusFormat = "auto") -> list[str]:
    """All texts of a corpus file (see `iter_corpus`); an error when it holds none."""
    texts = list(iter_corpus(path, format=format))
    if not texts:
        raise CorpusError(path, 0, "the file holds no texts (only empty lines); give one text per line")
    return texts


def iter_corpus(path: str | Path, *, format: CorpusFormat = "auto") -> Iterator[str]:
    """Texts of `path` one by one: one per line (txt) or each line's `text` field (JSONL).

    `format="auto"` reads `.jsonl`/`.ndjson` as JSON Lines and anything else as plain text.
    """
    path = Path(path)
    kind = _kind(path, format)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {path} does not exist (or is not a file)")
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            line = _decode(raw, path, number)
            if not line.strip():
                continue
            yield _jsonl_text(line, path, number) if kind == "jsonl" else line.strip()


def _kind(path: Path, format: str) -> str:
    if format not in ("auto", "txt", "jsonl"):
        raise ValueError(f"format must be 'auto', 'txt' or 'jsonl', got {format!r}")
    if format != "auto":
        return format
    if path.suffix.lower() in _JSONL_SUFFIXES:
        return "jsonl"
    if path.suffix.lower() == ".json":
        raise ValueError(f"{path}: a .json file is not read as a corpus; give JSON Lines (.jsonl, one "
                         '{"text": ...} object per line) or a text file with one text per line')
    return "txt"


def _decode(raw: bytes, path: Path, number: int) -> str:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorpusError(path, number, f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
                                        "save the file as UTF-8") from None
    if number == 1:
        line = line.removeprefix("\ufeff")  # a byte-order mark is not text
    return line.rstrip("\r\n")


def _jsonl_text(line: str, path: Path, number: int) -> str:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise CorpusError(path, number, f"not valid JSON ({exc.msg} at column {exc.colno}); "
                                        'each line must be an object like {"text": "..."}') from None
    if not isinstance(obj, dict):
        raise CorpusError(path, number, f'expected an object like {{"text": "..."}}, got a JSON {type(obj).__name__}')
    if "text" not in obj:
        keys = ", ".join(repr(k) for k in list(obj)[:8]) or "none"
        raise CorpusError(path, number, f'the object has no "text" field (its keys: {keys})')
    text = obj["text"]
    if not isinstance(text, str):
        raise CorpusError(path, number, f'"text" is a JSON {type(text).__name__}, not a string')
    if not text.strip():
        raise CorpusError(path, number, '"text" is empty; remove the line or give it some text')
    return text
