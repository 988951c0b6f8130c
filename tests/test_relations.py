"""Probe data: JSONL and GAP readers, word location, built-in sets, baseline choices."""

import json
from collections import Counter

import pytest

from headscope.analyses.relations import (
    BUILTIN_SETS,
    ProbeDataError,
    builtin_path,
    builtin_set,
    first_choice,
    nearest_choice,
    parse_example,
    read_gap,
    read_jsonl,
    read_probe_file,
    sniff_format,
)


def _ex(**kw):
    base = {"text": "The animal didn't cross the street because it was too tired.", "pronoun": "it",
            "candidates": ["animal", "street"], "answer": "animal"}
    return parse_example({**base, **kw})


def _words(ex):
    return ex.text[slice(*ex.source_span)], [ex.text[a:b] for a, b in ex.candidate_spans]


def test_parse_resolves_words_to_spans():
    ex = _ex()
    assert _words(ex) == ("it", ["animal", "street"])
    assert ex.source_span == (43, 45) and ex.answer == 0 and ex.answer_text == "animal"
    assert ex.preceding() == (True, True)


def test_source_is_first_occurrence_after_the_first_candidate():
    text = "It was late. The dog saw the cat and it ran. Then it slept."
    ex = parse_example({"text": text, "pronoun": "it", "candidates": ["dog", "cat"], "answer": "cat"})
    assert ex.source_span[0] == text.index("and it") + 4
    explicit = parse_example({"text": text, "pronoun": "it", "candidates": ["dog", "cat"], "answer": "cat",
                              "pronoun_occurrence": 2})
    assert explicit.source_span[0] == text.index("Then it") + 5


def test_candidate_occurrences_and_case_insensitive_whole_words():
    text = "Cat food for the cat: the CAT ate it."
    ex = parse_example({"text": text, "pronoun": "it", "candidates": ["cat", "food"], "answer": "cat",
                        "candidate_occurrences": [2, None]})
    assert ex.candidate_spans[0] == (26, 29) and ex.candidates[0] == "CAT"
    # "John" is not the whole word "John's"
    with pytest.raises(ProbeDataError, match="not in the text as a whole word"):
        parse_example({"text": "John's dog bit Mary and she cried.", "pronoun": "she",
                       "candidates": ["John", "Mary"], "answer": "Mary"})


def test_multiword_candidate_and_source_target_aliases():
    ex = parse_example({"text": "New York is bigger than Boston, but it is older.", "source": "it",
                        "candidates": ["new york", "Boston"], "target": "Boston"})
    assert ex.candidates == ("New York", "Boston") and ex.candidate_spans[0] == (0, 8) and ex.answer == 1


@pytest.mark.parametrize("change, message", [
    ({"answer": "cat"}, "answer 'cat' is not among the candidates"),
    ({"candidates": ["animal", "horse"]}, "candidate 'horse' is not in the text"),
    ({"pronoun": "she"}, "no occurrence of 'she' after the first candidate"),
    ({"pronoun_occurence": 1}, "unknown field"),
    ({"source": "it"}, "either 'pronoun' or 'source'"),
    ({"candidates": ["animal"]}, "at least two"),
    ({"candidates": ["animal", "Animal"]}, "repeat a word"),
    ({"pronoun_occurrence": 5}, "'it' occurs 1 time"),
    ({"pronoun_occurrence": -1}, "non-negative integer"),
    ({"candidate_occurrences": [0]}, "one entry"),
    ({"pronoun_occurrence": 0, "source_occurrence": 0}, "either 'pronoun_occurrence' or 'source_occurrence'"),
    ({"group": [1]}, "'group' must be"),
])
def test_bad_examples_say_what_is_wrong(change, message):
    with pytest.raises(ProbeDataError, match=message):
        _ex(**change)


def test_jsonl_errors_name_file_and_line(tmp_path):
    good = json.dumps({"text": "Mary told John that she left.", "pronoun": "she", "candidates": ["Mary", "John"],
                       "answer": "Mary"})
    path = tmp_path / "probe.jsonl"
    path.write_text(good + "\n\n" + "{not json\n")
    with pytest.raises(ProbeDataError, match=r"probe\.jsonl:3: not valid JSON"):
        read_jsonl(path)
    path.write_text(good + "\n" + good.replace('"answer": "Mary"', '"answer": "Sue"') + "\n")
    with pytest.raises(ProbeDataError, match=r"probe\.jsonl:2: answer 'Sue' is not among"):
        read_jsonl(path)
    path.write_text(good + "\n" + good.replace("Mary told", "Anna told") + "\n")
    with pytest.raises(ProbeDataError, match=r"probe\.jsonl:2: candidate 'Mary' is not in the text"):
        read_jsonl(path)
    path.write_text("\n")
    with pytest.raises(ProbeDataError, match="no examples"):
        read_jsonl(path)
    with pytest.raises(ProbeDataError, match="no such file"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_jsonl_reads_groups_kinds_and_ids(tmp_path):
    rows = [{"text": "Mary told John that she left.", "pronoun": "she", "candidates": ["Mary", "John"], "answer": "Mary",
             "group": "p1", "kind": "gender"},
            {"text": "Mary told John that he left.", "pronoun": "he", "candidates": ["Mary", "John"], "answer": "John",
             "group": "p1", "kind": "gender", "id": "x"}]
    path = tmp_path / "set.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    a, b = read_jsonl(path)
    assert (a.group, b.group, a.kind, a.id, b.id) == ("p1", "p1", "gender", "0", "x")
    assert a.origin.endswith("set.jsonl:1") and b.answer == 1


def test_builtin_sets_are_big_enough_and_pairs_flip():
    agreement, winograd, relation = (builtin_set(n) for n in ("agreement", "winograd", "verb-subject"))
    assert len(agreement) >= 60 and len(relation) >= 60
    groups = Counter(e.group for e in winograd)
    assert len(groups) >= 30 and set(groups.values()) == {2}
    for g in groups:
        a, b = [e for e in winograd if e.group == g]
        assert a.answer != b.answer and a.candidates == b.candidates, g
        # one word flips the answer: the two texts differ in a single word
        wa, wb = a.text.split(), b.text.split()
        assert len(wa) == len(wb) and sum(x != y for x, y in zip(wa, wb)) == 1, g
    for examples in (agreement, winograd, relation):
        # answers are balanced between the first and the nearest candidate: neither baseline is a free ride
        assert sum(first_choice(e) == e.answer for e in examples) == len(examples) // 2
        assert all(all(e.preceding()) for e in examples)  # decoders can score every example
    assert set(BUILTIN_SETS) == {"agreement", "winograd", "verb-subject"}


def test_baseline_choices_by_hand():
    ex = parse_example({"text": "Ann met Bea and Cy; she left with Dee.", "pronoun": "she",
                        "candidates": ["Bea", "Ann", "Dee", "Cy"], "answer": "Ann"})
    assert ex.candidates[nearest_choice(ex)] == "Cy"  # the nearest one before "she"
    assert ex.candidates[first_choice(ex)] == "Ann"
    cataphora = parse_example({"text": "Before she left, Ann met Bea.", "pronoun": "she", "pronoun_occurrence": 0,
                               "candidates": ["Bea", "Ann"], "answer": "Ann"})
    assert cataphora.candidates[nearest_choice(cataphora)] == "Ann"  # none before: the nearest after
    assert cataphora.preceding() == (False, False)


def test_gap_reader_on_the_real_files(shared_data):
    dev = shared_data / "gap" / "gap-development.tsv"
    examples = read_gap(dev)
    assert len(examples) == 1799  # of 2,000 rows, those with exactly one coreferent name
    assert len(read_gap(shared_data / "gap" / "gap-validation.tsv")) == 392
    first = examples[0]
    assert (first.id, first.source, first.candidates, first.answer_text) == (
        "development-1", "her", ("Cheryl Cassidy", "Pauline"), "Cheryl Cassidy")
    assert first.text[slice(*first.source_span)] == "her"
    assert sniff_format(dev) == "gap" and len(read_probe_file(dev)) == 1799
    assert len({e.group for e in examples}) == len(examples)


def test_gap_errors_name_file_and_line(tmp_path):
    header = "ID\tText\tPronoun\tPronoun-offset\tA\tA-offset\tA-coref\tB\tB-offset\tB-coref\tURL\n"
    row = "t-1\tAnn met Bea and she left.\tshe\t{p}\tAnn\t0\tTRUE\tBea\t8\tFALSE\thttp://x\n"
    path = tmp_path / "gap.tsv"
    path.write_text(header + row.format(p=16))
    [ex] = read_gap(path)
    assert ex.answer_text == "Ann" and ex.source_span == (16, 19)
    path.write_text(header + row.format(p=16) + row.format(p=12).replace("t-1", "t-2"))
    with pytest.raises(ProbeDataError, match=r"gap\.tsv:3: Pronoun 'she' is not at offset 12"):
        read_gap(path)
    path.write_text(header + row.format(p=16).replace("FALSE", "TRUE"))
    with pytest.raises(ProbeDataError, match="no row with exactly one coreferent name"):
        read_gap(path)
    path.write_text("hello world\n")
    with pytest.raises(ProbeDataError, match="neither probe JSONL"):
        read_probe_file(path)


# ---- hardening: decoding, duplicate keys, BOM, negative GAP offsets (issue 15)

_GOOD = {"text": "Mary told John that she left.", "pronoun": "she", "candidates": ["Mary", "John"], "answer": "Mary"}
_GAP_HEADER_LINE = "ID\tText\tPronoun\tPronoun-offset\tA\tA-offset\tA-coref\tB\tB-offset\tB-coref\tURL\n"


def test_probe_jsonl_bad_utf8_names_file_line_and_byte(tmp_path):
    path = tmp_path / "probe.jsonl"
    path.write_bytes(json.dumps(_GOOD).encode() + b'\n{"text": "caf\xff"}\n')
    with pytest.raises(ProbeDataError, match=r"probe\.jsonl, line 2: not valid UTF-8 \(byte 0xff at column 14\)"):  # after 13 bytes
        read_probe_file(path)
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")  # a binary file (a PNG's signature)
    with pytest.raises(ProbeDataError, match=r"line 1: not valid UTF-8 \(byte 0x89 at column 1\)"):
        read_probe_file(path)


def test_probe_jsonl_duplicate_key_is_an_error_not_last_wins(tmp_path):
    path = tmp_path / "probe.jsonl"
    line = json.dumps(_GOOD)[:-1] + ', "answer": "John"}'  # "answer" twice: last-one-wins would say John
    path.write_text(json.dumps(_GOOD) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ProbeDataError, match=r"probe\.jsonl:2: the key 'answer' is given twice"):
        read_jsonl(path)


def test_bom_is_dropped_by_every_reader(tmp_path):
    jsonl = tmp_path / "probe.jsonl"
    jsonl.write_bytes(b"\xef\xbb\xbf" + json.dumps(_GOOD).encode() + b"\r\n")
    assert sniff_format(jsonl) == "jsonl" and read_probe_file(jsonl)[0].answer_text == "Mary"
    gap = tmp_path / "gap.tsv"
    row = "t-1\tAnn met Bea and she left.\tshe\t16\tAnn\t0\tTRUE\tBea\t8\tFALSE\thttp://x\r\n"
    gap.write_bytes(b"\xef\xbb\xbf" + (_GAP_HEADER_LINE.replace("\n", "\r\n") + row).encode())
    assert sniff_format(gap) == "gap" and read_probe_file(gap)[0].source_span == (16, 19)


@pytest.mark.parametrize("column, offsets", [("Pronoun", ("-3", "0", "8")), ("A", ("16", "-25", "8"))])
def test_gap_negative_offset_is_rejected_when_read(tmp_path, column, offsets):
    # text[-3:] of "...she left." is "ft." — but text[-25:-22] is "Ann": a negative offset can even "match".
    p, a, b = offsets
    path = tmp_path / "gap.tsv"
    path.write_text(_GAP_HEADER_LINE + f"t-1\tAnn met Bea and she left.\tshe\t{p}\tAnn\t{a}\tTRUE\tBea\t{b}\tFALSE\tu\n")
    with pytest.raises(ProbeDataError, match=rf"gap\.tsv:2: {column}-offset must be 0 or more"):
        read_gap(path)


def test_gap_over_long_cell_names_the_line(tmp_path):
    path = tmp_path / "gap.tsv"
    path.write_text(_GAP_HEADER_LINE + "t-1\t" + "x" * 200_000 + "\tshe\t0\tA\t0\tTRUE\tB\t0\tFALSE\tu\n")
    with pytest.raises(ProbeDataError, match=r"gap\.tsv:2: not a readable tab-separated row"):
        read_gap(path)


def test_builtin_sets_load_from_any_working_directory(tmp_path):
    # The data files were looked up as the top-level package "analyses", found only from the repo root.
    import subprocess
    import sys

    code = "from headscope.analyses.relations import builtin_set; print(len(builtin_set('winograd')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-500:]
    assert int(out.stdout) == sum(1 for line in builtin_path("winograd").read_text().splitlines() if line.strip())


def test_probe_jsonl_nested_too_deeply_names_the_line(tmp_path):
    path = tmp_path / "probe.jsonl"
    path.write_text(json.dumps(_GOOD) + "\n" + '{"text": ' * 100_000 + "\n", encoding="utf-8")  # was: RecursionError
    with pytest.raises(ProbeDataError, match=r"probe\.jsonl:2: not valid JSON \(nested too deeply"):
        read_jsonl(path)
