"""Corpora for head analyses: the built-in English sentences and user files.

A user corpus is a text file with one text per line, or JSON Lines (`.jsonl`/`.ndjson`) with one
object per line holding a `text` string. Empty (whitespace-only) lines are skipped; any other bad
line stops reading with an error naming the file and line number. Files are read lazily, so a
corpus of any size streams. `iter_corpus_lines` keeps each text's line number, so a problem found
later (a text longer than the model's context) can still be reported as `file, line N`.

>>> texts = builtin_corpus()
>>> len(texts) >= 300, texts[0].split()[:3]
(True, ['The', 'city', 'council'])
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterator, Literal

from .lines import decoded_lines, strict_json_object

__all__ = ["CorpusError", "CorpusFormat", "CorpusLine", "builtin_corpus", "iter_corpus", "iter_corpus_lines",
           "read_corpus"]

CorpusFormat = Literal["auto", "txt", "jsonl"]
_JSONL_SUFFIXES = (".jsonl", ".ndjson")


class CorpusError(ValueError):
    """A corpus line that cannot be used; `path` and `line` (1-based) say where."""

    def __init__(self, path: str | Path, line: int, problem: str) -> None:
        self.path, self.line, self.problem = str(path), line, problem
        super().__init__(f"{path}, line {line}: {problem}")


@dataclass(frozen=True)
class CorpusLine:
    """One text of a corpus file and where it stands (1-based line)."""

    text: str
    path: str
    line: int

    def error(self, problem: str) -> CorpusError:
        """A `CorpusError` naming this text's file and line."""
        return CorpusError(self.path, self.line, problem)


def builtin_corpus() -> list[str]:
    """The built-in English corpus: several hundred hand-written sentences (news-like, dialogue,
    lists, numbers, questions, punctuation-heavy lines), one text each."""
    source = resources.files(__package__) / "data" / "corpus.txt"
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
    return (item.text for item in iter_corpus_lines(path, format=format))


def iter_corpus_lines(path: str | Path, *, format: CorpusFormat = "auto") -> Iterator[CorpusLine]:
    """Like `iter_corpus`, with each text's file and line number (`CorpusLine`)."""
    path = Path(path)
    kind = _kind(path, format)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {path} does not exist (or is not a file)")
    return _lines(path, kind)


def _lines(path: Path, kind: str) -> Iterator[CorpusLine]:
    for number, line in decoded_lines(path, CorpusError):
        if not line.strip():
            continue
        text = _jsonl_text(line, path, number) if kind == "jsonl" else line.strip()
        yield CorpusLine(text=text, path=str(path), line=number)


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


def _jsonl_text(line: str, path: Path, number: int) -> str:
    try:
        obj = strict_json_object(line)
    except json.JSONDecodeError as exc:
        raise CorpusError(path, number, f"not valid JSON ({exc.msg} at column {exc.colno}); "
                                        'each line must be an object like {"text": "..."}') from None
    except ValueError as exc:  # a key given twice
        raise CorpusError(path, number, str(exc)) from None
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
