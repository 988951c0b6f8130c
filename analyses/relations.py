"""Probe data: "this word should attend to that word", read, checked and located in the text.

One example is a text, a *source* word (a pronoun, a verb, ...), two or more *candidates*, and the
candidate that is the *answer* (the word the source refers to or depends on). Everything is resolved
here to character spans, so that the scoring side only has to find which attention units overlap
them — the same for our JSONL files (words found in the text) and for GAP (character offsets).

JSONL, one example a line::

    {"text": "The animal didn't cross the street because it was too tired.",
     "pronoun": "it", "candidates": ["animal", "street"], "answer": "animal",
     "group": "animal-street", "kind": "winograd"}

- `source`/`target` may stand for `pronoun`/`answer` (any word-to-word relation).
- Words (and multi-word candidates such as "New York") are matched as whole words of the text,
  case-insensitively, with the same word rule as `probe.word_spans` ("didn't" and "John's" are
  single words, so "John" does not match "John's").
- A candidate is its first occurrence unless `candidate_occurrences` (0-based, one per candidate,
  null = first) says otherwise. The source is its first occurrence that starts after the end of
  the earliest candidate in the text, unless `pronoun_occurrence`/`source_occurrence` (0-based,
  counted over the whole text) says otherwise.
- `group` keeps examples together when data is split (both halves of a Winograd pair); without it
  each example is its own group. `kind` is a free label ("gender", "number", "winograd", ...).
- `id` is optional. Any other field is an error (a typo such as `pronoun_occurence` would
  otherwise silently change which word is probed), and so is a field given twice.

Files are read as UTF-8 by the same line reader as corpora (`analyses.lines`): a bad byte is named
by file, line and column, and a byte-order mark at the start is dropped.

GAP (Webster et al. 2018) is read with `read_gap`: the pronoun and the two names come as character
offsets (0 or more); only rows where exactly one name is coreferent are kept.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Iterator, Literal, Sequence

from headscope.probe.words import word_spans

from .lines import decoded_lines, strict_json_object

__all__ = [
    "RelationExample",
    "ProbeDataError",
    "Span",
    "BUILTIN_SETS",
    "read_jsonl",
    "parse_example",
    "read_gap",
    "read_probe_file",
    "sniff_format",
    "builtin_set",
    "builtin_path",
    "nearest_choice",
    "first_choice",
    "continuation",
    "COREF_TEMPLATE",
    "RELATION_TEMPLATE",
]

Span = tuple[int, int]  # (start, end) character offsets into the text

# Built-in data sets: name -> (file in analyses/data, task name used in results).
BUILTIN_SETS: dict[str, tuple[str, str]] = {
    "agreement": ("coref_agreement.jsonl", "coref-agreement"),
    "winograd": ("coref_winograd.jsonl", "coref-winograd"),
    "verb-subject": ("relation_verb_subject.jsonl", "verb-subject"),
}

_KNOWN_FIELDS = {
    "text", "pronoun", "source", "answer", "target", "candidates", "pronoun_occurrence",
    "source_occurrence", "candidate_occurrences", "group", "kind", "id",
}


class ProbeDataError(ValueError):
    """A probe data file or example that cannot be used; the message names file, line and problem."""


@dataclass(frozen=True)
class RelationExample:
    """One probe example with every word resolved to its character span in `text`.

    >>> ex = parse_example({"text": "Mary told John that she would call.", "pronoun": "she",
    ...                     "candidates": ["Mary", "John"], "answer": "Mary"})
    >>> ex.source_span, ex.candidate_spans, ex.answer
    ((20, 23), ((0, 4), (10, 14)), 0)
    """

    text: str
    source: str  # the source word as written in the text (e.g. "she")
    source_span: Span
    candidates: tuple[str, ...]  # as written in the text
    candidate_spans: tuple[Span, ...]
    answer: int  # index into `candidates`
    group: str
    kind: str = ""
    id: str = ""
    origin: str = ""  # "file:line", for messages

    @property
    def answer_text(self) -> str:
        return self.candidates[self.answer]

    @property
    def n_candidates(self) -> int:
        return len(self.candidates)

    def preceding(self) -> tuple[bool, ...]:
        """Whether each candidate ends before the source starts (a decoder's source can only see those)."""
        return tuple(e <= self.source_span[0] for _, e in self.candidate_spans)


# --------------------------------------------------------------------------------------------
# JSONL


def parse_example(obj: object, *, origin: str = "<example>", index: int = 0) -> RelationExample:
    """Check one decoded JSON object and resolve its words to spans (errors name `origin`)."""
    if not isinstance(obj, dict):
        raise ProbeDataError(f"{origin}: expected a JSON object per line, got {type(obj).__name__}")
    unknown = sorted(set(obj) - _KNOWN_FIELDS)
    if unknown:
        raise ProbeDataError(f"{origin}: unknown field(s) {unknown}; known fields are {sorted(_KNOWN_FIELDS)}")
    text = _field_str(obj, "text", origin)
    source = _either(obj, "pronoun", "source", origin)
    answer = _either(obj, "answer", "target", origin)
    candidates = obj.get("candidates")
    if not isinstance(candidates, list) or len(candidates) < 2 or not all(isinstance(c, str) and c.strip() for c in candidates):
        raise ProbeDataError(f"{origin}: 'candidates' must be a list of at least two non-empty strings, got {candidates!r}")
    folded = [_fold(c) for c in candidates]
    if len(set(folded)) != len(folded):
        raise ProbeDataError(f"{origin}: candidates {candidates} repeat a word; give each candidate once")
    if _fold(answer) not in folded:
        raise ProbeDataError(f"{origin}: answer {answer!r} is not among the candidates {candidates}")

    words = word_spans(text)
    occ = obj.get("candidate_occurrences")
    if occ is not None and (not isinstance(occ, list) or len(occ) != len(candidates)):
        raise ProbeDataError(f"{origin}: 'candidate_occurrences' needs one entry (or null) per candidate, got {occ!r}")
    cand_spans = []
    for j, cand in enumerate(candidates):
        k = _occurrence(occ[j] if occ else None, f"candidate_occurrences[{j}]", origin)
        cand_spans.append(_locate(text, words, cand, k, origin, what="candidate"))
    if "pronoun_occurrence" in obj and "source_occurrence" in obj:
        raise ProbeDataError(f"{origin}: give either 'pronoun_occurrence' or 'source_occurrence', not both")
    src_key = "pronoun_occurrence" if "pronoun_occurrence" in obj else "source_occurrence"
    src_occ = _occurrence(obj.get(src_key), src_key, origin)
    if src_occ is None:
        after = min(a for a, _ in cand_spans)
        after_end = next(e for a, e in cand_spans if a == after)
        hits = [s for s in _all_occurrences(text, words, source) if s[0] >= after_end]
        if not hits:
            raise ProbeDataError(
                f"{origin}: no occurrence of {source!r} after the first candidate {text[after:after_end]!r}; "
                f"give '{src_key}' (0-based, counted over the whole text) to pick one"
            )
        src_span = hits[0]
    else:
        src_span = _locate(text, words, source, src_occ, origin, what="source")
    for j, (a, b) in enumerate(cand_spans):
        if a < src_span[1] and src_span[0] < b:
            raise ProbeDataError(f"{origin}: the source {source!r} overlaps candidate {candidates[j]!r}")
    if len(set(cand_spans)) != len(cand_spans):
        raise ProbeDataError(f"{origin}: two candidates resolve to the same words; use 'candidate_occurrences'")
    group = obj.get("group")
    if group is not None and not isinstance(group, (str, int)):
        raise ProbeDataError(f"{origin}: 'group' must be a string or an integer, got {group!r}")
    kind = obj.get("kind", "")
    if not isinstance(kind, str):
        raise ProbeDataError(f"{origin}: 'kind' must be a string, got {kind!r}")
    ex_id = str(obj.get("id", index))
    return RelationExample(
        text=text,
        source=text[src_span[0]:src_span[1]],
        source_span=src_span,
        candidates=tuple(text[a:b] for a, b in cand_spans),
        candidate_spans=tuple(cand_spans),
        answer=folded.index(_fold(answer)),
        group=str(group) if group is not None else f"#{ex_id}",
        kind=kind,
        id=ex_id,
        origin=origin,
    )


def read_jsonl(path: str | Path) -> list[RelationExample]:
    """Read a probe JSONL file; a bad line raises `ProbeDataError` naming `file:line` and the problem."""
    path = Path(path)
    examples: list[RelationExample] = []
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        origin = f"{path}:{lineno}"
        try:
            obj = strict_json_object(line)
        except json.JSONDecodeError as exc:
            raise ProbeDataError(f"{origin}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        except ValueError as exc:  # a key given twice: the last one would silently win
            raise ProbeDataError(f"{origin}: {exc}") from None
        examples.append(parse_example(obj, origin=origin, index=len(examples)))
    if not examples:
        raise ProbeDataError(f"{path}: no examples (the file is empty)")
    seen: dict[str, str] = {}
    for e in examples:
        _unique_id(seen, e.id, e.origin)
    return examples


def _unique_id(seen: dict[str, str], ex_id: str, origin: str) -> None:
    """Record `ex_id` as read at `origin` ("file:line"); a `ProbeDataError` naming both lines if it was read before."""
    if ex_id in seen:
        first = seen[ex_id].rsplit(":", 1)[-1]
        raise ProbeDataError(f"{origin}: id {ex_id!r} is already used on line {first}; ids must be unique")
    seen[ex_id] = origin


def _field_str(obj: dict, key: str, origin: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ProbeDataError(f"{origin}: '{key}' must be a non-empty string, got {value!r}")
    return value


def _either(obj: dict, a: str, b: str, origin: str) -> str:
    if a in obj and b in obj:
        raise ProbeDataError(f"{origin}: give either '{a}' or '{b}', not both")
    if a not in obj and b not in obj:
        raise ProbeDataError(f"{origin}: missing '{a}' (or '{b}')")
    return _field_str(obj, a if a in obj else b, origin)


def _occurrence(value: object, name: str, origin: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProbeDataError(f"{origin}: '{name}' must be a non-negative integer (0 = first), got {value!r}")
    return value


def _fold(s: str) -> str:
    return " ".join(s.split()).casefold()


def _all_occurrences(text: str, words: Sequence[Span], phrase: str) -> list[Span]:
    """Spans of every run of whole words of `text` equal to `phrase`'s words (case-insensitive)."""
    target = [_fold(phrase[a:b]) for a, b in word_spans(phrase)]
    if not target:
        return []
    folded = [_fold(text[a:b]) for a, b in words]
    n = len(target)
    return [
        (words[i][0], words[i + n - 1][1])
        for i in range(len(words) - n + 1)
        if folded[i : i + n] == target
    ]


def _locate(text: str, words: Sequence[Span], phrase: str, occurrence: int | None, origin: str, *, what: str) -> Span:
    hits = _all_occurrences(text, words, phrase)
    k = occurrence or 0
    if k >= len(hits):
        found = f"occurs {len(hits)} time(s)" if hits else "is not in the text as a whole word"
        raise ProbeDataError(f"{origin}: {what} {phrase!r} {found}" + (f"; occurrence {k} was asked for" if hits else ""))
    return hits[k]


# --------------------------------------------------------------------------------------------
# GAP

_GAP_HEADER = ["ID", "Text", "Pronoun", "Pronoun-offset", "A", "A-offset", "A-coref", "B", "B-offset", "B-coref", "URL"]


def read_gap(path: str | Path) -> list[RelationExample]:
    """Read a GAP .tsv file; keep the rows where exactly one of the two names is coreferent.

    Offsets are checked against the text (a mismatch is an error naming `file:line`), and IDs must be
    unique (a repeated one is an error naming both lines). Each example is its own group; `kind` is "gap".
    """
    path = Path(path)
    out: list[RelationExample] = []
    rows = _gap_rows(path)
    _, header = next(rows, (1, None))
    if header is None or [h.strip() for h in header[:11]] != _GAP_HEADER:
        raise ProbeDataError(f"{path}:1: not a GAP file: expected the header {' '.join(_GAP_HEADER)}, got {header!r}")
    seen: dict[str, str] = {}
    for lineno, row in rows:
        if not any(cell.strip() for cell in row):
            continue
        origin = f"{path}:{lineno}"
        if len(row) < 10:
            raise ProbeDataError(f"{origin}: expected 11 tab-separated columns, got {len(row)}")
        _unique_id(seen, row[0], origin)  # every row, also one that is not kept: two rows with one ID are a broken file
        ex = _gap_row(row, origin)
        if ex is not None:
            out.append(ex)
    if not out:
        raise ProbeDataError(f"{path}: no row with exactly one coreferent name")
    return out


def _gap_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line number, cells) per line: one row a line, as GAP has no quoting."""
    for lineno, line in _lines(path):
        try:
            row = next(csv.reader([line], delimiter="\t", quoting=csv.QUOTE_NONE), [])
        except csv.Error as exc:  # e.g. a cell over csv's size limit
            raise ProbeDataError(f"{path}:{lineno}: not a readable tab-separated row ({exc})") from None
        yield lineno, row


def _gap_row(row: list[str], origin: str) -> RelationExample | None:
    ex_id, text, pron, pron_off, a, a_off, a_coref, b, b_off, b_coref = row[:10]
    labels = []
    for name, value in (("A-coref", a_coref), ("B-coref", b_coref)):
        v = value.strip().upper()
        if v not in ("TRUE", "FALSE"):
            raise ProbeDataError(f"{origin}: {name} must be TRUE or FALSE, got {value!r}")
        labels.append(v == "TRUE")
    if sum(labels) != 1:
        return None
    spans = [_gap_span(text, word, off, col, origin) for word, off, col in
             ((pron, pron_off, "Pronoun"), (a, a_off, "A"), (b, b_off, "B"))]
    return RelationExample(
        text=text, source=pron, source_span=spans[0], candidates=(a, b), candidate_spans=(spans[1], spans[2]),
        answer=0 if labels[0] else 1, group=ex_id, kind="gap", id=ex_id, origin=origin,
    )


def _gap_span(text: str, word: str, offset: str, column: str, origin: str) -> Span:
    try:
        start = int(offset)
    except ValueError:
        raise ProbeDataError(f"{origin}: {column}-offset must be an integer, got {offset!r}") from None
    if start < 0:  # text[-3:] would read from the end, and a later step would call the word missing
        raise ProbeDataError(f"{origin}: {column}-offset must be 0 or more (a character offset), got {start}")
    end = start + len(word)
    if not word or text[start:end] != word:
        raise ProbeDataError(f"{origin}: {column} {word!r} is not at offset {start} (the text there reads {text[start:end]!r})")
    return start, end


# --------------------------------------------------------------------------------------------
# Files and built-in sets


def sniff_format(path: str | Path) -> Literal["jsonl", "gap"]:
    """Tell our JSONL from a GAP .tsv by the content of the first non-blank line."""
    path = Path(path)
    number, first = next(((n, line) for n, line in _lines(path) if line.strip()), (1, ""))
    if first.lstrip().startswith("{"):
        return "jsonl"
    if first.split("\t")[:3] == _GAP_HEADER[:3]:
        return "gap"
    raise ProbeDataError(
        f"{path}:{number}: neither probe JSONL (a JSON object per line) nor GAP .tsv (header 'ID<TAB>Text<TAB>Pronoun...'); "
        f"the file starts {first[:60]!r}"
    )


def read_probe_file(path: str | Path) -> list[RelationExample]:
    """Read our JSONL or a GAP .tsv, told apart by content."""
    return read_gap(path) if sniff_format(path) == "gap" else read_jsonl(path)


def builtin_path(name: str) -> Path:
    """Path of a built-in data set (`agreement`, `winograd`, `verb-subject`)."""
    if name not in BUILTIN_SETS:
        raise ProbeDataError(f"unknown built-in set {name!r}; choose one of {sorted(BUILTIN_SETS)}")
    return Path(str(resources.files(__package__) / "data" / BUILTIN_SETS[name][0]))


def builtin_set(name: str) -> list[RelationExample]:
    """The examples of a built-in set.

    >>> len(builtin_set("winograd")) >= 60
    True
    """
    return read_jsonl(builtin_path(name))


def _lines(path: Path):
    """(line number, text) of a probe file, decoded as the corpus reader decodes (BOM dropped, bad UTF-8 named)."""
    if not path.exists():
        raise ProbeDataError(f"{path}: no such file")
    if path.is_dir():
        raise ProbeDataError(f"{path}: is a folder; pass a .jsonl or GAP .tsv file")
    return decoded_lines(path, _line_error)


def _line_error(path: Path, line: int, problem: str) -> ProbeDataError:
    return ProbeDataError(f"{path}, line {line}: {problem}")


# --------------------------------------------------------------------------------------------
# Baseline choices (pure functions of the spans)


def nearest_choice(ex: RelationExample) -> int:
    """The candidate nearest before the source (largest end <= source start); if none precedes, the nearest after."""
    s0, s1 = ex.source_span
    before = [(e, j) for j, (_, e) in enumerate(ex.candidate_spans) if e <= s0]
    if before:
        return max(before)[1]
    return min((a - s1, j) for j, (a, _) in enumerate(ex.candidate_spans))[1]


def first_choice(ex: RelationExample) -> int:
    """The candidate that comes first in the text."""
    return min((a, j) for j, (a, _) in enumerate(ex.candidate_spans))[1]


# Continuation prompts for the ablation check: a decoder completes them with one of the candidates.
COREF_TEMPLATE = '{text} In that sentence, "{source}" refers to'
RELATION_TEMPLATE = '{text} In that sentence, the word "{source}" goes with'

_DETERMINERS = {"the", "a", "an", "my", "his", "her", "their", "our", "your", "its"}


def continuation(ex: RelationExample, *, template: str = COREF_TEMPLATE) -> tuple[str, tuple[str, ...]]:
    """A prompt that asks a decoder which candidate the source means, and the options to compare.

    Each option is the candidate with the determiner it has in the text ("the animal", "his
    daughter"), after a space, so a model's preference between options is its answer.

    >>> continuation(parse_example({"text": "The animal didn't cross the street because it was too tired.",
    ...     "pronoun": "it", "candidates": ["animal", "street"], "answer": "animal"}))[1]
    (' the animal', ' the street')
    """
    words = word_spans(ex.text)
    options = []
    for a, b in ex.candidate_spans:
        before = [w for w in words if w[1] <= a]
        det = ex.text[slice(*before[-1])].lower() if before else ""
        options.append(f" {det} {ex.text[a:b]}" if det in _DETERMINERS else f" {ex.text[a:b]}")
    return template.format(text=ex.text.rstrip(), source=ex.source), tuple(options)
