"""Wrong results and exits (issue 24, items 12-17 and the smaller list): each bad input is one line on
stderr and exit 2 before any model loads; each verdict follows its number."""

from __future__ import annotations

import json

import pytest
from conftest import one_line
from click.testing import CliRunner

from headscope.cli import cli

NO_MODEL = "no-such-model-h24"  # a command that reached the model would fail on this name instead




# ------------------------------------------------------------------ item 15: lone surrogates


def test_json_lines_with_a_lone_surrogate_are_refused_by_every_reader(tmp_path):
    from headscope.analyses.corpus import CorpusError, read_corpus
    from headscope.analyses.lines import strict_json_object
    from headscope.analyses.relations import ProbeDataError, read_jsonl

    assert strict_json_object('{"text": "pair \\ud83d\\ude00 ok"}') == {"text": "pair \U0001F600 ok"}
    for bad in ('{"text": "a \\ud800 b"}', '{"text": "ok", "x": ["\\udfff"]}', '{"\\udc80": 1}'):
        with pytest.raises(ValueError, match="lone surrogate"):
            strict_json_object(bad)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "fine"}\n{"text": "a \\ud800 b"}\n')
    with pytest.raises(CorpusError, match=r"c\.jsonl, line 2: .*lone surrogate"):
        read_corpus(corpus)
    probe = tmp_path / "p.jsonl"
    probe.write_text('{"text": "The cat said it was \\ud800 tired.", "source": "it", "target": "cat"}\n')
    with pytest.raises(ProbeDataError, match=r"p\.jsonl:1: .*lone surrogate"):
        read_jsonl(probe)


@pytest.mark.parametrize("command", ["heads", "coref"])
def test_a_lone_surrogate_in_a_data_file_is_one_line_and_exit_2_before_the_model(tmp_path, command):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "The cat said it was \\ud800 tired.", "source": "it", "target": "cat"}\n')
    flag = "--corpus" if command == "heads" else "--data"
    result = CliRunner().invoke(cli, [command, "--model", NO_MODEL, flag, str(path)])
    assert result.exit_code == 2
    line = one_line(result)
    assert "d.jsonl" in line and "lone surrogate" in line and NO_MODEL not in line


@pytest.mark.parametrize("args, flag", [
    (["run", "--text", "ok", "--text", "a \udcff b"], "--text 2"),
    (["run", "--text", "ok", "--target", "\udcfe"], "--target 1"),
    (["verify", "--text", "a \udcff b"], "--text 1"),
    (["explain", "a \udcff b", "--token", "a", "--head", "L0H0"], "TEXT"),
    (["generate", "--prompt", "a \udcff b"], "--prompt 1"),  # repeatable since issue 25: numbered like --text
])
def test_a_text_argument_that_is_not_utf8_is_refused_before_the_model(tmp_path, args, flag):
    # A byte that is not UTF-8 in argv arrives as a lone surrogate (U+DC00 + byte); the tokenizer met it only
    # after the model loaded ("unexpected TypeError: TextEncodeInput ...", or after the whole run).
    out = tmp_path / "report"
    extra = ["--report", str(out)] if args[0] == "run" else []
    result = CliRunner().invoke(cli, [args[0], "--model", NO_MODEL, *args[1:], *extra])
    assert result.exit_code == 2
    line = one_line(result)
    assert line.startswith(f"headscope: {flag} is not UTF-8 text") and "byte 0x" in line
    assert not out.exists()


# ------------------------------------------------------------------ item 16: nothing to score, duplicate IDs

_GAP_HEADER = "ID\tText\tPronoun\tPronoun-offset\tA\tA-offset\tA-coref\tB\tB-offset\tB-coref\tURL\n"


def _gap_row(ex_id: str) -> str:
    text = "Anna met Beth because she was bored."
    return f"{ex_id}\t{text}\tshe\t{text.index('she')}\tAnna\t0\tTRUE\tBeth\t{text.index('Beth')}\tFALSE\thttp://x\n"


def test_a_repeated_id_is_refused_naming_both_lines(tmp_path):
    from headscope.analyses.relations import ProbeDataError, read_gap, read_jsonl

    gap = tmp_path / "g.tsv"
    gap.write_text(_GAP_HEADER + _gap_row("dev-1") + _gap_row("dev-2") + _gap_row("dev-1"))
    with pytest.raises(ProbeDataError, match=r"g\.tsv:4: id 'dev-1' is already used on line 2"):
        read_gap(gap)
    gap.write_text(_GAP_HEADER + _gap_row("dev-1") + _gap_row("dev-2"))
    assert [e.id for e in read_gap(gap)] == ["dev-1", "dev-2"]
    row = {"text": "Anna met Beth because she was bored.", "source": "she", "candidates": ["Anna", "Beth"],
           "answer": "Anna"}
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("\n".join(json.dumps({**row, "id": i}) for i in ("a", "b", "c", "b")) + "\n")
    with pytest.raises(ProbeDataError, match=r"p\.jsonl:4: id 'b' is already used on line 2"):
        read_jsonl(jsonl)


def test_coref_with_no_scorable_example_says_so_and_exits_2(tmp_path, monkeypatch):
    # A decoder cannot score an example whose candidates come after the source: with all excluded, the tables
    # were all nan% and the exit 0.
    from conftest import _tiny

    import headscope.commands.coref as coref_cmd

    monkeypatch.setattr(coref_cmd, "load_or_fail", lambda *a: _tiny("llama"))
    row = {"text": "It was tired, said the old cat to the dog.", "source": "It", "source_occurrence": 0,
           "candidates": ["cat", "dog"], "answer": "cat"}
    data = tmp_path / "after.jsonl"
    data.write_text(json.dumps(row) + "\n" + json.dumps({**row, "answer": "dog"}) + "\n")
    result = CliRunner().invoke(cli, ["coref", "--model", "tiny:llama", "--data", str(data), "--quiet", "--no-verify",
                                      "--permutations", "100"])
    assert result.exit_code == 2, result.output
    line = one_line(result)
    assert "nothing to score: none of the 2 example(s)" in line and "2 × a candidate is not before the source" in line
    assert "nan" not in result.stdout


# ------------------------------------------------------------------ every command under one Ctrl-C guard


class _SwallowedInterrupt:
    """An object whose finaliser takes a Ctrl-C: Python prints 'Exception ignored ... KeyboardInterrupt' and goes on."""

    def __del__(self):
        import signal

        signal.raise_signal(signal.SIGINT)
        for _ in range(1000):  # the handler runs between bytecodes, here: inside the finaliser
            pass


@pytest.mark.parametrize("command", ["models", "syntax"])
def test_a_ctrl_c_that_a_finaliser_swallows_still_ends_the_command_with_130(monkeypatch, command):
    # Seen on `syntax`: SIGINT ended with "KeyboardInterrupt:" on stderr and exit 0; only `run` had the guard.
    import click

    def body(**kwargs):
        _SwallowedInterrupt()  # collected at once
        click.echo("done")

    monkeypatch.setattr(cli.commands[command], "callback", body)
    args = [command] + (["--conllu", "x.conllu"] if command == "syntax" else [])
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 130, (result.exit_code, result.output)
    assert one_line(result) == "headscope: interrupted; nothing was written or replaced"
    assert "Exception ignored" not in result.stderr


def test_nested_guards_mark_the_outer_one_and_restore_the_handlers():
    import signal
    import sys

    from headscope.common import Interrupts

    before, hook = signal.getsignal(signal.SIGINT), sys.unraisablehook
    with Interrupts() as outer:
        with Interrupts() as inner:
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
                for _ in range(1000):
                    pass
        assert inner.received and outer.received
        with pytest.raises(KeyboardInterrupt):
            outer.check()
    assert signal.getsignal(signal.SIGINT) is before and sys.unraisablehook is hook


# ------------------------------------------------------------------ smaller items: shared options, tables


def test_every_command_takes_quiet():
    # The docs promise --quiet on every command; verify, explain, compare, generate, ablate and importance lacked it.
    missing = [name for name, cmd in cli.commands.items()
               if not any("--quiet" in p.opts for p in cmd.params if hasattr(p, "opts"))]
    assert missing == []


def test_models_families_columns_never_run_together():
    from headscope.probe.families import family_table

    rows = family_table()
    result = CliRunner().invoke(cli, ["models", "--families"])
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    for row, line in zip(rows, lines[1:]):
        cells = [row["model_type"], row["family"], row["kind"], row["file"]]
        assert line.split()[:4] == cells, line  # each cell its own word: "encoder-decoderprobe/..." was one


# ------------------------------------------------------------------ encoder–decoders in ablation and importance


def test_ablation_and_importance_refuse_encoder_decoders_by_name(monkeypatch, tmp_path):
    # Was transformers' raw "You must specify exactly one of input_ids or inputs_embeds".
    import torch
    from conftest import _tiny

    from headscope.probe.importance import gradient_importance
    from headscope.probe.interventions import ablate as ablate_heads, head_mask, head_means
    from headscope.workflows.ablation import ablate, ablation_evidence

    t5 = _tiny("t5")
    calls = [lambda: ablate(t5, [(0, 0)], corpus=["The cat sat."], n_random=1),
             lambda: ablation_evidence(t5, ["The cat sat."]),
             lambda: gradient_importance(t5, ["The cat sat."]),
             lambda: head_means(t5, ["The cat sat."]),
             lambda: ablate_heads(t5, [(0, 0)]).__enter__(),
             lambda: head_mask(t5, torch.ones(2, 4)).__enter__()]
    for call in calls:
        with pytest.raises(ValueError, match="tiny-t5 is an encoder–decoder model: .* covers encoders and decoders only"):
            call()
    corpus = tmp_path / "c.txt"
    corpus.write_text("The cat sat on the mat.\n")
    for command in ("importance", "ablate"):
        monkeypatch.setattr(f"headscope.commands.{command}.load_or_fail", lambda *a: t5)
        extra = ["--heads", "L0H0"] if command == "ablate" else []
        result = CliRunner().invoke(cli, [command, "--model", "tiny:t5", "--corpus", str(corpus), *extra])
        assert result.exit_code == 2 and "is an encoder–decoder model" in one_line(result)


def test_cli_refusals_spell_the_flag_not_the_api_keyword(monkeypatch, tmp_path):
    from conftest import _tiny

    from headscope.common import flag_spelling

    assert flag_spelling("use attention='eager' for this model") == "use --attention eager for this model"
    assert flag_spelling('attention="auto", weight=\'norm\'') == "--attention auto, weight='norm'"  # no --weight flag
    monkeypatch.setattr("headscope.commands.heads.load_or_fail", lambda *a: _tiny("t5"))
    corpus = tmp_path / "c.txt"
    corpus.write_text("The cat sat on the mat.\n")
    result = CliRunner().invoke(cli, ["heads", "--model", "tiny:t5", "--attention", "recompute", "--corpus", str(corpus),
                                      "--quiet", "--no-verify"])
    line = one_line(result)
    assert result.exit_code == 2 and "encoder-decoder" in line
    assert line.endswith("use --attention eager") and "attention='eager'" not in line


def test_a_treebank_too_small_to_split_says_what_it_read():
    # "no sentence could be read ... (skipped: none)" for a treebank of one good sentence
    from headscope.analyses.treebank import parse_conllu
    from headscope.workflows.syntax import syntax

    row = "{}\t{}\t_\t_\t_\t_\t{}\t{}\t_\t_"
    one = parse_conllu("# text = Hi you\n" + row.format(1, "Hi", 0, "root") + "\n" + row.format(2, "you", 1, "vocative")
                       + "\n\n", name="one.conllu")
    loop = parse_conllu("# text = Hi\n" + row.format(1, "Hi", 1, "root") + "\n\n", name="loop.conllu")
    with pytest.raises(ValueError, match=r"^one\.conllu: only 1 sentence, .* needs at least 2; .*--select-on"):
        syntax(None, one)  # refused before the model is touched
    with pytest.raises(ValueError, match=r"^loop\.conllu: no sentence could be read \(skipped: 1 × not exactly one root\)"):
        syntax(None, loop)
    with pytest.raises(ValueError, match=r"^loop\.conllu: no sentence could be read"):
        syntax(None, one, select_on=loop)


# ------------------------------------------------------------------ hs.show and hs.extract inputs


def test_show_refuses_non_finite_and_meta_attention():
    import torch

    import headscope as hs

    labels = ["a", "b"]
    for value in (float("nan"), float("inf"), -float("inf")):
        att = torch.full((1, 2, 2, 2), 0.5)
        att[0, 1, 1, 0] = value
        before = att.clone()
        with pytest.raises(ValueError, match=r"1 NaN or infinite value\(s\), the first at layer index 0, head 1, query 1, key 0"):
            hs.show(att, labels)
        torch.testing.assert_close(att, before, rtol=0, atol=0, equal_nan=True)  # the caller's tensor is untouched
    with pytest.raises(ValueError, match="meta tensor"):
        hs.show(torch.empty(1, 1, 2, 2, device="meta"), labels)
    assert "-2147483648" not in hs.show(torch.full((1, 1, 2, 2), 0.5), labels).html


def test_extract_refuses_a_dict_a_set_and_a_segmenter_with_no_words():
    # A dict was iterated for its keys ({"text": "a"} analysed "text"); a segmenter returning [] made the whole
    # text one unit.
    from conftest import _tiny

    import headscope as hs

    lm = _tiny("bert")
    with pytest.raises(TypeError, match=r"texts is a dict; pass a str or a list of str"):
        hs.extract(lm, {"text": "a"})
    with pytest.raises(TypeError, match="texts is a set, which has no order"):
        hs.extract(lm, {"a cat", "a dog"})
    with pytest.raises(ValueError, match="segmenter returned no word span for the text 'the cat sat'"):
        hs.extract(lm, "the cat sat", level="word", segmenter=lambda text: [])
    [m] = hs.extract(lm, "the cat sat", level="word", segmenter=lambda text: [(0, 3), (4, 7), (8, 11)])
    assert [lab for lab, sp in zip(m.labels, m.special) if not sp] == ["the", "cat", "sat"]


def test_special_tokens_written_in_the_text_are_flagged_special():
    # The tokenizer turns a typed "[MASK]" / "[SEP]" into the special token itself, but its mask flagged only the
    # ones it added: they survived --no-special as if they were words. The unknown token stays text.
    from conftest import _tiny

    import headscope as hs
    from headscope.probe.encoding import encode, special_ids

    lm = _tiny("bert")
    tok = lm.tokenizer
    [m] = hs.extract(lm, "The [MASK] sat [SEP] here", level="token")
    by_id = {tok.convert_tokens_to_ids(t) for t in ("[CLS]", "[SEP]", "[MASK]")}
    assert [int(i) in by_id for i in m.token_ids] == list(m.special)
    assert m.labels[2] == "[MASK]" and m.special[2] and m.labels[4] == "[SEP]" and m.special[4]
    assert tok.unk_token_id not in special_ids(tok) and tok.mask_token_id in special_ids(tok)
    plain = encode(lm, "The cat sat here")
    assert plain.special == tuple(bool(s) for s in tok("The cat sat here", return_special_tokens_mask=True)["special_tokens_mask"])


def test_a_report_with_a_probe_that_scored_nothing_is_written():
    # `run --coref` on a decoder whose examples all have a candidate after the pronoun died after all the compute
    # with "unexpected ValueError: All objects passed were None" (the empty probe tables).
    import torch
    from report_samples import verification

    from headscope.analyses.coref import ProbeScores, score_probe
    from headscope.reports.analysis import ModelAnalysis
    from headscope.reports.sections import report_tables

    empty = ProbeScores(examples=(), scores=torch.zeros(0, 2, 4, 2), model="toy", layer_ids=(0, 1),
                        head_ids=(0, 1, 2, 3), excluded={"a candidate is not before the source": 2}, causal=True)
    result = score_probe(empty, task="after", n_perm=100)
    assert result.n == 0
    tables = report_tables([ModelAnalysis(model="toy", verification=verification("toy"), probes=(result,))])
    assert "probe_examples" not in tables  # nothing scored: no example rows to write
    assert len(tables["probe_heads"]) == 8 and (tables["probe_heads"]["n"] == 0).all()
