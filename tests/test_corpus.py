"""Corpus reading: the built-in sentences, text files and JSON Lines, errors with line numbers."""

import json

import pytest

from headscope.analyses.corpus import CorpusError, builtin_corpus, iter_corpus, read_corpus


def test_builtin_corpus_is_large_varied_and_clean():
    texts = builtin_corpus()
    assert len(texts) >= 300
    assert len(set(texts)) == len(texts), "duplicate sentences"
    assert all(t == t.strip() and t for t in texts)
    assert sum(t.endswith("?") for t in texts) >= 40  # questions
    assert sum(any(c.isdigit() for c in t) for t in texts) >= 40  # numbers
    assert sum(t.startswith('"') for t in texts) >= 40  # dialogue
    assert sum(t.count(",") + t.count(";") >= 2 for t in texts) >= 40  # lists
    assert sum(sum(not c.isalnum() and not c.isspace() for c in t) >= 6 for t in texts) >= 30  # punctuation-heavy


def test_text_file_skips_empty_lines_and_strips(tmp_path):
    f = tmp_path / "c.txt"
    f.write_bytes("\ufeffFirst text.\r\n\r\n   \n  Second one  \nThird\n".encode("utf-8"))
    assert read_corpus(f) == ["First text.", "Second one", "Third"]


def test_text_file_bad_utf8_names_the_line(tmp_path):
    f = tmp_path / "c.txt"
    f.write_bytes(b"fine\n\nalso fine\nbad \xff byte\n")
    with pytest.raises(CorpusError, match=r"line 4: not valid UTF-8 \(byte 0xff at column 5\)") as err:
        read_corpus(f)
    assert err.value.line == 4 and err.value.path == str(f)


def test_jsonl_reads_text_fields_and_skips_empty_lines(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"text": "One.", "id": 1}) + "\n\n" + json.dumps({"text": "Two?"}) + "\n", encoding="utf-8")
    assert read_corpus(f) == ["One.", "Two?"]


@pytest.mark.parametrize("line, message", [
    ('{"text": "ok"', "line 3: not valid JSON"),
    ('["a list"]', "line 3: expected an object"),
    ('{"body": "x", "id": 2}', "line 3: the object has no \"text\" field \\(its keys: 'body', 'id'\\)"),
    ('{"text": 42}', "line 3: \"text\" is a JSON int, not a string"),
    ('{"text": "   "}', "line 3: \"text\" is empty"),
])
def test_jsonl_bad_line_names_its_number(tmp_path, line, message):
    f = tmp_path / "c.jsonl"
    f.write_text('{"text": "first"}\n\n' + line + "\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=message):
        read_corpus(f)


def test_reading_streams_until_the_bad_line(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text('{"text": "a"}\n{"text": "b"}\nnot json\n', encoding="utf-8")
    it = iter_corpus(f)
    assert [next(it), next(it)] == ["a", "b"]
    with pytest.raises(CorpusError, match="line 3"):
        next(it)


def test_format_choice_and_refusals(tmp_path):
    f = tmp_path / "c.data"
    f.write_text('{"text": "a"}\n', encoding="utf-8")
    assert read_corpus(f) == ['{"text": "a"}']  # plain text by default
    assert read_corpus(f, format="jsonl") == ["a"]
    j = tmp_path / "c.json"
    j.write_text('[{"text": "a"}]', encoding="utf-8")
    with pytest.raises(ValueError, match="JSON Lines"):
        read_corpus(j)
    with pytest.raises(ValueError, match="format must be"):
        read_corpus(f, format="csv")


def test_empty_and_missing_files(tmp_path):
    f = tmp_path / "empty.txt"
    f.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(CorpusError, match="no texts"):
        read_corpus(f)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_corpus(tmp_path / "nope.txt")


# ---- hardening (issue 15)


def test_jsonl_duplicate_text_key_is_an_error(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text('{"text": "a"}\n{"text": "kept?", "text": "or this?"}\n', encoding="utf-8")
    with pytest.raises(CorpusError, match="line 2: the key 'text' is given twice"):
        read_corpus(f)


def test_lines_keep_their_file_line_numbers(tmp_path):
    from headscope.analyses.corpus import iter_corpus_lines

    f = tmp_path / "c.txt"
    f.write_bytes(b"\xef\xbb\xbfone\r\n\r\n  \ntwo\nthree")
    got = [(c.text, c.line) for c in iter_corpus_lines(f)]
    assert got == [("one", 1), ("two", 4), ("three", 5)]
    err = next(iter(iter_corpus_lines(f))).error("has 9000 tokens; the model takes at most 512")
    assert isinstance(err, CorpusError) and str(err) == f"{f}, line 1: has 9000 tokens; the model takes at most 512"


def test_builtin_corpus_loads_from_any_working_directory(tmp_path):
    import subprocess
    import sys

    code = "from headscope.analyses.corpus import builtin_corpus; print(len(builtin_corpus()))"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-500:]
    assert int(out.stdout) == len(builtin_corpus())


def test_jsonl_nested_too_deeply_is_invalid_json_not_a_recursion_error(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text('{"text": "a"}\n' + "[" * 100_000 + "\n", encoding="utf-8")  # was: RecursionError
    with pytest.raises(CorpusError, match=r"line 2: not valid JSON \(nested too deeply"):
        read_corpus(f)


@pytest.mark.parametrize("limit", [None, 1, 2, 9])
def test_a_streamed_corpus_numbers_the_lines_it_scores(tmp_path, limit):
    """`Corpus.numbered()` (the lines `heads` checks for length, as it streams the texts) are the lines a kept
    corpus holds: the first `limit` texts, empty lines skipped, each with its line number."""
    from headscope.common.corpus import corpus_or_fail

    f = tmp_path / "c.txt"
    f.write_text("one\n\n  two  \nthree\n", encoding="utf-8")
    streamed, kept = corpus_or_fail(str(f), limit, stream=True), corpus_or_fail(str(f), limit)
    expected = [("one", 1), ("two", 3), ("three", 4)][:limit]
    assert [(c.text, c.line) for c in streamed.numbered()] == [(c.text, c.line) for c in kept.numbered()] == expected
    assert list(streamed.texts) == [t for t, _ in expected]
    assert list(corpus_or_fail(None, 3).numbered()) == []  # the built-in corpus has no file to name
