"""Property-based tests (hypothesis): every reader, on arbitrary and on adversarial files, either returns
what an independent oracle expects or fails with its own error naming file and line; the from-scratch
attention on random shapes, masks and dtypes matches a plain reference loop."""

from __future__ import annotations

import json
import math
import re
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headscope.analyses.corpus import CorpusError, iter_corpus, read_corpus
from headscope.analyses.relations import ProbeDataError, read_gap, read_jsonl, read_probe_file
from headscope.probe.scratch import LayerSpec, attention_from_scratch

READERS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BOM = "\ufeff".encode()

# File-level problems have no line to name; everything else must say "<file>, line N" or "<file>:N".
_FILE_LEVEL = ("holds no texts", "no examples", "no row with exactly one", "more than once")


def _write(data: bytes, suffix: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="headscope-prop-"))
    path = folder / f"data{suffix}"
    path.write_bytes(data)
    return path


def _error_line(message: str, path: Path) -> int | None:
    """The line an error names, or None for a file-level problem; fails for any other message."""
    for pattern in (rf"^{re.escape(str(path))}, line (\d+): ", rf"^{re.escape(str(path))}:(\d+): "):
        m = re.match(pattern, message)
        if m and not (m.group(1) == "0" and any(s in message for s in _FILE_LEVEL)):  # "line 0": the whole file
            return int(m.group(1))
    assert message.startswith(f"{path}") and any(s in message for s in _FILE_LEVEL), message
    return None


def _oracle_lines(data: bytes) -> list[bytes]:
    """Lines as the readers define them: split at b"\\n", a trailing b"\\r" and a leading BOM dropped."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if lines and lines[0].startswith(BOM):
        lines[0] = lines[0][len(BOM):]
    return [ln.rstrip(b"\r") for ln in lines]


def _first_bad_utf8(data: bytes) -> tuple[int, int, int] | None:
    """(line, byte, column) of the first byte that is not UTF-8, all 1-based, or None.

    Columns count bytes of the line as stored, a leading byte-order mark included.
    """
    for number, raw in enumerate(data.split(b"\n"), 1):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return number, raw[exc.start], exc.start + 1
    return None


# ------------------------------------------------------------------ arbitrary bytes, every reader

_noise = st.lists(st.sampled_from([b"\n", b"\r\n", b"\r", b"\t", b" ", b"\xff", b"\xc3", b"\xef\xbb\xbf", b"{", b"}",
                                   b'"text"', b":", b",", b"[", b"x", "é".encode(), "我".encode(), b"\x00"])
                  | st.binary(max_size=12), max_size=40).map(b"".join)
_bytes = st.one_of(st.binary(max_size=300), _noise)


@READERS
@given(data=_bytes, suffix=st.sampled_from([".txt", ".jsonl"]))
def test_corpus_reader_on_any_bytes(data, suffix):
    path = _write(data, suffix)
    try:
        texts = read_corpus(path)
    except CorpusError as exc:
        line = _error_line(str(exc), path)
        assert line is None or 1 <= line <= len(_oracle_lines(data))
        bad = _first_bad_utf8(data)
        if suffix == ".txt" and bad:  # a text corpus fails only on a bad byte ...
            assert line == bad[0] and f"not valid UTF-8 (byte 0x{bad[1]:02x} at column {bad[2]})" in str(exc)
        elif suffix == ".txt":  # ... or when it holds no text at all
            assert line is None and "holds no texts" in str(exc)
        return
    assert all(isinstance(t, str) and t == t.strip() and t for t in texts)
    if suffix == ".txt":
        expected = [ln.decode("utf-8").strip() for ln in _oracle_lines(data)]
        assert texts == [t for t in expected if t]


@READERS
@given(data=_bytes, gap=st.booleans())
def test_probe_readers_on_any_bytes(data, gap):
    if gap:  # make it past the header check sometimes, so rows get parsed
        data = "ID\tText\tPronoun\tPronoun-offset\tA\tA-offset\tA-coref\tB\tB-offset\tB-coref\tURL\n".encode() + data
    path = _write(data, ".tsv" if gap else ".jsonl")
    for read in (read_probe_file, read_jsonl, read_gap):
        try:
            examples = read(path)
        except ProbeDataError as exc:
            line = _error_line(str(exc), path)
            assert line is None or 1 <= line <= max(1, len(_oracle_lines(data)))
        else:
            assert examples and all(e.text[slice(*e.source_span)] for e in examples)


# ------------------------------------------------------------------ corpus JSONL, line kinds known by construction

_text = st.text(min_size=1, max_size=30).filter(lambda t: t.strip())


@st.composite
def _corpus_line(draw):
    """(kind, text or None, line) with kind "good", "blank" or a way to be bad."""
    kind = draw(st.sampled_from(["good", "good", "good", "blank", "huge", "bad-json", "not-object", "no-text",
                                 "text-not-str", "text-empty", "duplicate", "bad-utf8"]))
    text = draw(_text)
    ascii_only = draw(st.booleans())
    extra = draw(st.dictionaries(st.sampled_from(["id", "source", "meta"]), st.integers(), max_size=2))
    if kind == "good":
        return kind, text, json.dumps({"text": text, **extra}, ensure_ascii=ascii_only).encode()
    if kind == "huge":  # far longer than any buffer a reader might use
        big = text * (200_000 // len(text) + 1)
        return "good", big, json.dumps({"text": big}, ensure_ascii=ascii_only).encode()
    if kind == "blank":
        return kind, None, draw(st.sampled_from([b"", b"  ", b"\t", b" \r"]))
    bad = {
        "bad-json": json.dumps({"text": text})[:-1],
        "not-object": json.dumps([text]),
        "no-text": json.dumps({"body": text, **extra}),
        "text-not-str": json.dumps({"text": draw(st.one_of(st.integers(), st.none(), st.lists(st.integers())))}),
        "text-empty": json.dumps({"text": draw(st.sampled_from(["", " ", "\n\t"]))}),
        "duplicate": '{"text": %s, "text": %s}' % (json.dumps(text), json.dumps(text + "!")),
    }
    if kind == "bad-utf8":
        raw = json.dumps({"text": text}, ensure_ascii=False).encode()
        cut = draw(st.integers(0, len(raw)))
        return kind, None, raw[:cut] + b"\xff" + raw[cut:]
    return kind, None, bad[kind].encode()


@READERS
@given(lines=st.lists(_corpus_line(), max_size=8), crlf=st.booleans(), bom=st.booleans(), final_newline=st.booleans())
def test_corpus_jsonl_reads_good_lines_and_names_the_first_bad_one(lines, crlf, bom, final_newline):
    end = b"\r\n" if crlf else b"\n"
    data = (BOM if bom else b"") + end.join(raw for _, _, raw in lines) + (end if final_newline and lines else b"")
    path = _write(data, ".jsonl")
    first_bad = next((i + 1 for i, (kind, _, _) in enumerate(lines) if kind not in ("good", "blank")), None)
    good = [t for kind, t, _ in lines[: (first_bad or len(lines) + 1) - 1] if kind == "good"]
    if first_bad is not None:
        with pytest.raises(CorpusError) as err:
            read_corpus(path)
        assert err.value.line == first_bad and str(err.value).startswith(f"{path}, line {first_bad}: ")
        assert list(_stream_until_error(path)) == good  # streaming yields every text before the bad line
    elif not good:
        with pytest.raises(CorpusError, match="holds no texts"):
            read_corpus(path)
    else:
        assert read_corpus(path) == good


def _stream_until_error(path: Path):
    try:
        yield from iter_corpus(path)
    except CorpusError:
        return


# ------------------------------------------------------------------ probe JSONL

_NAMES = ["Mary", "Anna", "John", "Paul", "Zoë", "Hélène"]


@st.composite
def _probe_line(draw):
    kind = draw(st.sampled_from(["good", "good", "good", "blank", "bad-json", "not-object", "unknown-field",
                                 "no-pronoun", "wrong-answer", "duplicate", "bad-utf8", "deep"]))
    a, b = draw(st.permutations(_NAMES))[:2]
    answer = draw(st.sampled_from([a, b]))
    obj = {"text": f"{a} told {b} that she would call.", "pronoun": "she", "candidates": [a, b], "answer": answer}
    raw = json.dumps(obj, ensure_ascii=draw(st.booleans()))
    if kind == "good":
        return kind, answer, raw.encode()
    if kind == "blank":
        return kind, None, draw(st.sampled_from([b"", b"   ", b"\t"]))
    bad = {
        "bad-json": raw[:-1],
        "not-object": json.dumps([obj]),
        "unknown-field": json.dumps(obj | {"pronoun_occurence": 0}),  # the typo the reader exists to catch
        "no-pronoun": json.dumps({k: v for k, v in obj.items() if k != "pronoun"}),
        "wrong-answer": json.dumps(obj | {"answer": "Nobody"}),
        "duplicate": raw[:-1] + ', "answer": ' + json.dumps(b if answer == a else a) + "}",
        "deep": "[" * 50_000,
    }
    if kind == "bad-utf8":
        cut = draw(st.integers(0, len(raw)))
        return kind, None, raw.encode()[:cut] + b"\x80" + raw.encode()[cut:]
    return kind, None, bad[kind].encode()


@READERS
@given(lines=st.lists(_probe_line(), max_size=8), crlf=st.booleans(), bom=st.booleans())
def test_probe_jsonl_reads_good_lines_and_names_the_first_bad_one(lines, crlf, bom):
    end = b"\r\n" if crlf else b"\n"
    path = _write((BOM if bom else b"") + end.join(raw for _, _, raw in lines), ".jsonl")
    first_bad = next((i + 1 for i, (kind, _, _) in enumerate(lines) if kind not in ("good", "blank")), None)
    answers = [ans for kind, ans, _ in lines if kind == "good"]
    if first_bad is not None:
        with pytest.raises(ProbeDataError) as err:
            read_probe_file(path)
        assert _error_line(str(err.value), path) == first_bad  # from the sniffer when it is the first text line
    elif not answers:
        with pytest.raises(ProbeDataError):
            read_probe_file(path)
    else:
        assert [e.answer_text for e in read_probe_file(path)] == answers


# ------------------------------------------------------------------ GAP

_HEADER = "ID\tText\tPronoun\tPronoun-offset\tA\tA-offset\tA-coref\tB\tB-offset\tB-coref\tURL"


@st.composite
def _gap_row(draw, i):
    kind = draw(st.sampled_from(["good", "good", "good", "both-false", "blank", "negative-offset", "wrong-offset",
                                 "offset-not-int", "few-columns", "bad-label", "bad-utf8", "huge-cell"]))
    a, b = draw(st.permutations(_NAMES))[:2]
    text = f"{a} met {b} and she left."
    p_off, a_off, b_off = text.index("she"), 0, text.index(b)
    labels = draw(st.sampled_from([("TRUE", "FALSE"), ("FALSE", "TRUE")]))
    cells = [f"r-{i}", text, "she", str(p_off), a, str(a_off), labels[0], b, str(b_off), labels[1], "http://x"]
    if kind == "both-false":
        cells[6] = cells[9] = "FALSE"
    elif kind == "negative-offset":
        cells[draw(st.sampled_from([3, 5, 8]))] = str(-draw(st.integers(1, len(text))))
    elif kind == "wrong-offset":
        cells[3] = str(p_off + draw(st.integers(1, 5)))
    elif kind == "offset-not-int":
        cells[5] = draw(st.sampled_from(["zero", "1.5", ""]))
    elif kind == "few-columns":
        cells = cells[: draw(st.integers(1, 9))]
    elif kind == "bad-label":
        cells[6] = draw(st.sampled_from(["yes", "1", ""]))
    elif kind == "huge-cell":
        cells[10] = "u" * 200_000  # beyond the csv module's field limit
    raw = "\t".join(cells).encode() if kind != "blank" else b"\t \t"
    if kind == "bad-utf8":
        raw = raw.replace(b"she", b"sh\xe9", 1)  # Latin-1 "é" in a UTF-8 file
    kept = kind == "good"
    return kind, (f"r-{i}", labels[0] == "TRUE") if kept else None, raw


@READERS
@given(data=st.data(), n=st.integers(0, 6), crlf=st.booleans(), bom=st.booleans())
def test_gap_reads_good_rows_and_names_the_first_bad_one(data, n, crlf, bom):
    rows = [data.draw(_gap_row(i)) for i in range(n)]
    end = b"\r\n" if crlf else b"\n"
    path = _write((BOM if bom else b"") + end.join([_HEADER.encode()] + [raw for _, _, raw in rows]) + end, ".tsv")
    fine = ("good", "both-false", "blank")
    first_bad = next((i + 2 for i, (kind, _, _) in enumerate(rows) if kind not in fine), None)
    kept = [k for kind, k, _ in rows if kind == "good"]
    if first_bad is not None:
        with pytest.raises(ProbeDataError) as err:
            read_gap(path)
        assert _error_line(str(err.value), path) == first_bad
    elif not kept:
        with pytest.raises(ProbeDataError, match="no row with exactly one coreferent name"):
            read_gap(path)
    else:
        got = [(e.id, e.answer == 0) for e in read_probe_file(path)]
        assert got == kept


# ------------------------------------------------------------------ attention from scratch


def _reference_probs(x, spec: LayerSpec, key_valid) -> torch.Tensor:
    """Attention probabilities by plain loops in float64: per (batch, head, query) a list of visible keys."""
    x = x.double()
    B, T, _ = x.shape
    nh, nkv, hs = spec.n_heads, spec.n_kv_heads, spec.head_dim

    def proj(w, bias, n):
        out = x @ w.double().T + (0 if bias is None else bias.double())
        return out.view(B, T, n, hs)  # (B, T, n, hs)

    q, k = proj(spec.wq, spec.bq, nh), proj(spec.wk, spec.bk, nkv)
    if spec.q_norm is not None:
        def norm(t, w):
            return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + spec.norm_eps) * (1 + w.double())
        q, k = norm(q, spec.q_norm), norm(k, spec.k_norm)
    if spec.inv_freq is not None:  # rotary as complex multiplication: pair (i, i + hs/2) turns by pos * freq_i
        half = hs // 2
        angle = torch.arange(T, dtype=torch.float64)[:, None] * spec.inv_freq.double()[None, :]  # (T, hs/2)
        turn = spec.rope_scaling * torch.polar(torch.ones_like(angle), angle)[None, :, None, :]

        def rotate(t):
            z = torch.complex(t[..., :half], t[..., half:]) * turn
            return torch.cat([z.real, z.imag], dim=-1)
        q, k = rotate(q), rotate(k)
    probs = torch.zeros(B, nh, T, T, dtype=torch.float64)
    for b in range(B):
        for h in range(nh):
            g = h // (nh // nkv)  # the KV head this query head shares
            for i in range(T):
                visible = [j for j in range(T) if key_valid[b][j] and (not spec.causal or j <= i)
                           and (spec.sliding_window is None or i - j < spec.sliding_window)]
                if not visible:
                    continue  # a fully masked row attends to nothing: all zeros
                s = torch.stack([q[b, i, h] @ k[b, j, g] * spec.scale for j in visible])
                p = torch.exp(s - s.max())
                probs[b, h, i, visible] = p / p.sum()
    return probs


@st.composite
def _attention_case(draw):
    nkv = draw(st.integers(1, 2))
    nh = nkv * draw(st.integers(1, 3))
    hs = draw(st.sampled_from([2, 4, 6]))
    B, T, D = draw(st.integers(1, 3)), draw(st.integers(1, 7)), draw(st.integers(1, 10))
    valid = draw(st.lists(st.lists(st.booleans(), min_size=T, max_size=T), min_size=B, max_size=B))
    flags = dict(causal=draw(st.booleans()), bias=draw(st.booleans()), norm=draw(st.booleans()),
                 rotary=draw(st.booleans()), window=draw(st.none() | st.integers(1, 4)))
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
    return (B, T, D, nh, nkv, hs), valid, flags, dtype, draw(st.integers(0, 2**31 - 1))


@settings(max_examples=100, deadline=None)
@given(case=_attention_case())
def test_scratch_attention_matches_a_reference_loop(case):
    (B, T, D, nh, nkv, hs), valid, flags, dtype, seed = case
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    w = 1 / math.sqrt(D)
    spec = LayerSpec(
        wq=rand(nh * hs, D, scale=w), wk=rand(nkv * hs, D, scale=w), wv=rand(nkv * hs, D, scale=w),
        wo=rand(D, nh * hs, scale=w),
        bq=rand(nh * hs) if flags["bias"] else None, bk=rand(nkv * hs) if flags["bias"] else None,
        bv=rand(nkv * hs) if flags["bias"] else None, bo=rand(D) if flags["bias"] else None,
        n_heads=nh, n_kv_heads=nkv, head_dim=hs, scale=hs ** -0.5, causal=flags["causal"],
        sliding_window=flags["window"],
        inv_freq=1.0 / (10_000 ** (torch.arange(0, hs, 2).double() / hs)) if flags["rotary"] else None,
        q_norm=rand(hs, scale=0.1) if flags["norm"] else None, k_norm=rand(hs, scale=0.1) if flags["norm"] else None,
    )
    x = rand(B, T, D).to(dtype)
    key_valid = torch.tensor(valid, dtype=torch.long)
    x_before = x.clone()
    got = attention_from_scratch(x, spec, key_valid)
    expected = _reference_probs(x, spec, valid)

    assert torch.equal(x, x_before)  # the caller's input is untouched
    assert got.probs.shape == (B, nh, T, T) and got.output.shape == (B, T, D)
    assert not got.probs.isnan().any() and not got.output.isnan().any()  # fully masked rows too
    atol = {torch.float64: 1e-5, torch.float32: 1e-4, torch.bfloat16: 4e-2}[dtype]  # q/k norm runs in float32
    torch.testing.assert_close(got.probs.double(), expected, atol=atol, rtol=0)
    seen = expected.sum(-1) > 0  # rows with at least one visible key
    torch.testing.assert_close(got.probs.double().sum(-1)[seen], torch.ones(int(seen.sum()), dtype=torch.float64),
                               atol=atol * T, rtol=0)
    assert (got.probs[expected == 0] == 0).all()  # masked keys get exactly nothing


# --- CoNLL-U -------------------------------------------------------------------------------------

from headscope.analyses.treebank import TreebankError, read_conllu  # noqa: E402

_form = st.text(alphabet=st.characters(categories=("L", "N"), max_codepoint=0x9FFF), min_size=1, max_size=6)


@READERS
@given(data=_bytes)
def test_conllu_reader_on_arbitrary_bytes_loads_or_names_the_file(data):
    path = _write(data, ".conllu")
    try:
        tb = read_conllu(path)
    except TreebankError as exc:
        assert str(exc).startswith((f"{path}, line ", f"{path.name}: ", f"{path}: ")), str(exc)
        assert "\n" not in str(exc)
    else:
        for s in tb.sentences:  # whatever was read is aligned to its own text
            assert all(0 <= a < b <= len(s.text) for a, b in s.segments)


@READERS
@given(sentences=st.lists(st.lists(_form, min_size=1, max_size=6), min_size=1, max_size=4),
       crlf=st.booleans(), bom=st.booleans())
def test_conllu_reader_reads_every_generated_sentence(sentences, crlf, bom):
    """Oracle: a chain tree (word i's governor is word i-1, word 1 the root) over words joined by spaces."""
    blocks = []
    for words in sentences:
        rows = [f"# text = {' '.join(words)}"]
        rows += [f"{i}\t{w}\t{w}\tX\t_\t_\t{i - 1}\t{'root' if i == 1 else 'dep'}\t_\t_" for i, w in enumerate(words, 1)]
        blocks.append("\n".join(rows) + "\n\n")
    text = "".join(blocks).replace("\n", "\r\n" if crlf else "\n")
    path = _write((BOM if bom else b"") + text.encode("utf-8"), ".conllu")
    tb = read_conllu(path)
    assert len(tb.sentences) == len(sentences) and not tb.skipped
    for s, words in zip(tb.sentences, sentences):
        assert [s.text[a:b] for a, b in s.segments] == words
