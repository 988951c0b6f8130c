"""The texts a command reads: `--corpus FILE` (or the built-in corpus), checked before any model loads."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from typing import Any, Iterable

from .exits import fail

__all__ = ["Corpus", "corpus_or_fail", "too_long_or_fail"]


@dataclass(frozen=True)
class Corpus:
    """The texts of `--corpus` (or the built-in corpus), checked before any model loads.

    `texts` is a list, or (`stream=True`) an iterator over the file read again lazily; `lines` holds
    each text with its file and line (`analyses.corpus.CorpusLine`) when they were read into memory,
    so a text too long for a model can be named by its line.
    """

    texts: Any
    total: int
    source: str
    path: str | None
    lines: tuple = ()

    def numbered(self) -> Iterable:
        """The texts with their file and line (`CorpusLine`s): the kept `lines`, or (streamed) the file's first
        `total` texts read again; none for the built-in corpus, which has no file."""
        if self.lines or self.path is None:
            return self.lines
        from headscope.analyses.corpus import iter_corpus_lines

        return islice(iter_corpus_lines(self.path), self.total)


def corpus_or_fail(path: str | None, limit: int | None = None, *, stream: bool = False) -> Corpus:
    """The corpus of `--corpus PATH` (the first `limit` texts), or the built-in one; a bad file is one line, exit 2.

    A file is read once through to check every line; with `stream` its texts are then read again as
    they are scored (a corpus larger than memory), else they are kept.
    """
    from headscope.analyses.corpus import CorpusError, builtin_corpus, iter_corpus, iter_corpus_lines

    if path is None:
        texts = builtin_corpus()[:limit] if limit else builtin_corpus()
        return Corpus(texts=texts, total=len(texts), source="built-in corpus", path=None)
    try:
        if stream:
            total = sum(1 for _ in islice(iter_corpus(path), limit))  # the checking pass: a bad line fails here
            lines: tuple = ()
        else:
            lines = tuple(islice(iter_corpus_lines(path), limit))
            total = len(lines)
    except FileNotFoundError:
        fail(f"--corpus {path}: no such file; give a text file with one text per line (or JSONL with a 'text' "
             "field), or leave --corpus out for the built-in corpus")
    except (CorpusError, OSError, UnicodeError, ValueError) as exc:
        fail(f"--corpus {path}: {exc}")
    if not total:
        fail(f"--corpus {path}: the file holds no texts (only empty lines); give one text per line")
    texts = islice(iter_corpus(path), limit) if stream else [line.text for line in lines]
    return Corpus(texts=texts, total=total, source=str(path), path=str(path), lines=lines)


def too_long_or_fail(lm, lines, *, truncate: bool, batch: int = 256) -> None:
    """Fail with the file and line of the first corpus text longer than `lm`'s context (unless `truncate`).

    `lines` are `analyses.corpus.CorpusLine`s; counted with special tokens, as extraction counts them.
    """
    from headscope.probe.encoding import bounded_text

    if truncate:
        return
    stream = iter(lines)
    while chunk := list(islice(stream, batch)):
        looked = [bounded_text(lm.tokenizer, c.text, lm.max_length) for c in chunk]  # a huge line only in part
        for line, (_, cut), ids in zip(chunk, looked, lm.tokenizer([shown for shown, _ in looked])["input_ids"]):
            if len(ids) > lm.max_length:
                count = f"more than {lm.max_length} tokens ({len(line.text):,} characters)" if cut else f"{len(ids)} tokens"
                fail(str(line.error(f"the text has {count}; {lm.name} takes at most {lm.max_length}. "
                                    "Split it, or pass --truncate to keep its first tokens")))
