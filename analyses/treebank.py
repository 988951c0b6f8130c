"""Dependency treebanks in CoNLL-U, aligned to the characters of each sentence's text.

The `conllu` package parses the file; this module only turns each sentence into the plain facts
the syntax analyses need: the sentence text (its `# text` comment, else rebuilt from the forms and
`SpaceAfter=No`), the gold words with their governor and relation, and the character span of every
word in that text, so a model's tokens can be grouped into the gold words (a segmenter for
`probe.extract`).

Multi-word tokens (English *don't* = *do* + *n't*, Spanish *del* = *de* + *el*): when the words spell
the surface form, each word gets its own part of it; otherwise all its words share the surface span
(one unit for the model; an arc inside it cannot be scored). Empty nodes (ids such as 8.1) belong
to enhanced graphs only and are skipped. A sentence that cannot be aligned, or whose basic arcs are not
a tree (no single root, a word governing itself, a cycle), or that has a line of more than 10 columns
(the parser would drop the rest silently), is skipped and counted by reason, never guessed.
"""

from __future__ import annotations

import io
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, TextIO

from .lines import decoded_lines

__all__ = ["Sentence", "Treebank", "TreebankError", "read_conllu", "parse_conllu", "fold_relation", "segmenter_for"]


class TreebankError(ValueError):
    """A file that is not CoNLL-U (one clear line: which file, which sentence, what is wrong)."""


class _Unaligned(ValueError):
    """A sentence whose words cannot be placed in its text; the message is the (shared) reason."""


@dataclass(frozen=True)
class Sentence:
    """One gold sentence: words in order, each with its governor (0-based, -1 for the root) and relation.

    `segments` are the character spans of the units a model sees (in order, non-overlapping);
    `segment[i]` is the segment of word i (several words of an unsplittable multi-word token share one).

    >>> s = Sentence(id="1", text="Hi you", forms=("Hi", "you"), heads=(-1, 0), deprels=("root", "vocative"),
    ...              segment=(0, 1), segments=((0, 2), (3, 6)))
    >>> len(s), s.arcs()
    (2, [(1, 0, 'vocative')])
    """

    id: str
    text: str
    forms: tuple[str, ...]
    heads: tuple[int, ...]
    deprels: tuple[str, ...]
    segment: tuple[int, ...]
    segments: tuple[tuple[int, int], ...]

    def __len__(self) -> int:
        return len(self.forms)

    def arcs(self, *, subtypes: bool = False) -> list[tuple[int, int, str]]:
        """(dependent, governor, relation) of every word but the root."""
        return [(d, g, self.deprels[d] if subtypes else fold_relation(self.deprels[d]))
                for d, g in enumerate(self.heads) if g >= 0]

    @property
    def root(self) -> int:
        return self.heads.index(-1)


@dataclass(frozen=True)
class Treebank:
    """The sentences of one CoNLL-U file that could be aligned, and how many were skipped, by reason."""

    name: str
    sentences: tuple[Sentence, ...]
    skipped: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.sentences)


def fold_relation(deprel: str) -> str:
    """The universal relation without its language-specific subtype.

    >>> fold_relation("nmod:poss"), fold_relation("obj")
    ('nmod', 'obj')
    """
    return deprel.split(":", 1)[0]


def read_conllu(path: str | Path) -> Treebank:
    """Read a CoNLL-U file (see `parse_conllu`) with the line reader every headscope reader shares: a bad
    byte is named by line and column, a byte-order mark is dropped, CRLF endings are read as LF."""
    path = Path(path)
    try:
        lines = [line for _, line in decoded_lines(path, _line_error)]
    except OSError as exc:
        raise TreebankError(f"{path}: {exc.strerror or exc}") from None
    return parse_conllu("".join(line + "\n" for line in lines), name=path.name)


def _line_error(path: Path, line: int, problem: str) -> TreebankError:
    return TreebankError(f"{path}, line {line}: {problem}")


def parse_conllu(source: str | TextIO, *, name: str = "<text>") -> Treebank:
    """Sentences of CoNLL-U text (a string or an open file), aligned to their text.

    >>> tb = parse_conllu('''# text = I don't.
    ... 1\\tI\\tI\\tPRON\\t_\\t_\\t2\\tnsubj\\t_\\t_
    ... 2-3\\tdon't\\t_\\t_\\t_\\t_\\t_\\t_\\t_\\t_
    ... 2\\tdo\\tdo\\tAUX\\t_\\t_\\t0\\troot\\t_\\t_
    ... 3\\tn't\\tnot\\tPART\\t_\\t_\\t2\\tadvmod\\t_\\tSpaceAfter=No
    ... 4\\t.\\t.\\tPUNCT\\t_\\t_\\t2\\tpunct\\t_\\t_
    ... ''')
    >>> s = tb.sentences[0]
    >>> [s.text[a:b] for a, b in s.segments], s.heads
    (['I', 'do', "n't", '.'], (1, -1, 1, 1))
    """
    import conllu

    text = source if isinstance(source, str) else source.read()
    extra = _extra_columns(text)
    sentences: list[Sentence] = []
    skipped: Counter = Counter()
    try:
        for i, tokens in enumerate(conllu.parse_incr(io.StringIO(text))):
            _check_fields(tokens)
            try:
                if i in extra:  # the parser drops the extra columns silently
                    raise _Unaligned(f"a line has more than the {extra[i]} columns")
                sentences.append(_sentence(tokens, i))
            except _Unaligned as exc:
                skipped[str(exc)] += 1
    except (conllu.exceptions.ParseException, _Invalid) as exc:
        raise TreebankError(f"{name}: not valid CoNLL-U after {len(sentences) + sum(skipped.values())} "
                            f"sentence(s): {exc}") from None
    return Treebank(name=name, sentences=tuple(sentences), skipped=dict(skipped))


class _Invalid(ValueError):
    """A line that is not CoNLL-U (the parser is lenient about missing columns)."""


_FIELDS = ("id", "form", "head", "deprel", "misc")


def _check_fields(tokens) -> None:
    for t in tokens:
        missing = [f for f in _FIELDS if f not in t]
        if missing:
            raise _Invalid(f"a line has {len(t)} of the 10 columns (no {', '.join(missing)})")


def _extra_columns(text: str) -> dict[int, int]:
    """{sentence index: its column count} for each sentence with a line of more columns than the file has.

    Sentences are split as `conllu.parse_incr` splits them (its `parse_sentences`), so the indices match;
    the count is 10, or the number in a CoNLL-U Plus `# global.columns` line.
    """
    from conllu.parser import parse_sentences

    out: dict[int, int] = {}
    n_columns = 10
    for i, block in enumerate(parse_sentences(io.StringIO(text))):
        lines = block.strip().split("\n")
        for line in lines:
            if line.startswith("# global.columns = "):
                n_columns = len(line.split("=", 1)[1].split())
        if any(not line.startswith("#") and line.count("\t") + 1 > n_columns for line in lines):
            out[i] = n_columns
    return out


def _is_word(tok) -> bool:
    return isinstance(tok["id"], int)


def _sentence(tokens, index: int) -> Sentence:
    words = [t for t in tokens if _is_word(t)]  # ranges (multi-word tokens) and empty nodes are not words
    if not words:
        raise _Unaligned("no words")
    ids = {t["id"]: i for i, t in enumerate(words)}
    heads, deprels = [], []
    for t in words:
        if not isinstance(t["head"], int) or (t["head"] != 0 and t["head"] not in ids):
            raise _Unaligned("a word has no basic-tree governor (HEAD is _ or points to no word)")
        heads.append(ids[t["head"]] if t["head"] else -1)
        deprels.append(str(t["deprel"]))
    if heads.count(-1) != 1:
        raise _Unaligned("not exactly one root")
    if any(g == d for d, g in enumerate(heads)):
        raise _Unaligned("a word is its own governor (HEAD = its ID)")
    if not _reaches_root(heads):
        raise _Unaligned("the arcs form a cycle (not a tree)")
    text = tokens.metadata.get("text") or _rebuild_text(tokens)
    segments, segment = _align(text, list(_surface_units(tokens)))
    return Sentence(id=str(tokens.metadata.get("sent_id", index + 1)), text=text,
                    forms=tuple(str(t["form"]) for t in words), heads=tuple(heads), deprels=tuple(deprels),
                    segment=tuple(segment), segments=tuple(segments))


def _reaches_root(heads: list[int]) -> bool:
    """Does every word reach the root (-1) by following its governors? (No cycle: a tree.)"""
    ok = {-1}
    for start in range(len(heads)):
        path, w = [], start
        while w not in ok and w not in path and len(path) <= len(heads):
            path.append(w)
            w = heads[w]
        if w not in ok:
            return False
        ok.update(path)
    return True


def _surface_units(tokens) -> Iterator[tuple[str, list[str], dict | None]]:
    """(surface form, forms of its words, MISC) per surface token, in order."""
    covered_until = 0
    for i, t in enumerate(tokens):
        tid = t["id"]
        if isinstance(tid, tuple) and len(tid) == 3 and tid[1] == "-":
            first, last = tid[0], tid[2]
            parts = [str(w["form"]) for w in tokens[i + 1:] if _is_word(w) and first <= w["id"] <= last]
            covered_until = last
            yield str(t["form"]), parts, t["misc"]
        elif _is_word(t) and tid > covered_until:
            yield str(t["form"]), [str(t["form"])], t["misc"]


def _rebuild_text(tokens) -> str:
    out = []
    for surface, _, misc in _surface_units(tokens):
        out.append(surface + ("" if misc and misc.get("SpaceAfter") == "No" else " "))
    return "".join(out).rstrip()


def _align(text: str, units: list[tuple[str, list[str], dict | None]]) -> tuple[list[tuple[int, int]], list[int]]:
    """Character spans of the model-facing segments and the segment of each word."""
    segments: list[tuple[int, int]] = []
    segment: list[int] = []
    pos = 0
    for surface, parts, _ in units:
        m = _pattern(surface).match(text, pos)
        if m is None:
            raise _Unaligned("a form is not where the sentence's # text has it")
        start, end = m.span(1)
        pieces = _split(text[start:end], parts)
        if pieces is None:  # the words do not spell the surface (del = de + el): one shared segment
            segments.append((start, end))
            segment.extend([len(segments) - 1] * len(parts))
        else:
            for a, b in pieces:
                segments.append((start + a, start + b))
                segment.append(len(segments) - 1)
        pos = end
    if text[pos:].strip():
        raise _Unaligned("the # text has characters after the last form")
    return segments, segment


def _pattern(surface: str) -> re.Pattern:
    # Leading whitespace is skipped; spaces inside a form may be present or absent in the text.
    chars = [re.escape(c) for c in surface if not c.isspace()]
    return re.compile(r"\s*(?=\S)(" + r"\s*".join(chars) + ")") if chars else re.compile(r"(?!)")


def _split(surface: str, parts: list[str]) -> list[tuple[int, int]] | None:
    """Spans of `parts` inside `surface` when they spell it (case and spaces aside), else None."""
    if len(parts) == 1:
        return [(0, len(surface))]
    flat = [i for i, c in enumerate(surface) if not c.isspace()]  # positions of non-space characters
    joined = "".join(p for p in parts).replace(" ", "")
    if joined.lower() != "".join(surface[i] for i in flat).lower() or any(not p.strip() for p in parts):
        return None
    spans, k = [], 0
    for p in parts:
        n = len(p.replace(" ", ""))
        spans.append((flat[k], flat[k + n - 1] + 1))
        k += n
    return spans


def segmenter_for(sentences: Iterable[Sentence]):
    """A `probe` segmenter (text -> word spans) that returns each sentence's gold segments.

    Two sentences with the same text and different segments keep the first's (their arcs are then
    checked against the units the model saw, so nothing is misattributed).
    """
    table: dict[str, tuple[tuple[int, int], ...]] = {}
    for s in sentences:
        table.setdefault(s.text, s.segments)

    def segment(text: str):
        return table[text]

    return segment
