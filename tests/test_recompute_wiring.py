"""Recompute-mode attention wired into the analyses: head scores, probes and explain from blocks of
query rows equal their eager values (the blocks never make a `[layer, head, T, T]` of all layers)."""

import numpy
import pytest
import torch

import headscope as hs
from headscope.analyses.heads import METRICS, HeadScoreAccumulator
from headscope.probe import extract_ids
from headscope.probe.extract import extract
from headscope.probe.forward import base_model
from headscope.probe.families import family_for
from headscope.probe.errors import UnsupportedFeature
from headscope.probe.blocks import Block
from headscope.probe.types import Units

from conftest import in_turn

TEXTS = ["The cat sat on the mat, didn't it?", "A dog ran! Unbelievably fast..."]


def _whole_sequences_only(lm) -> bool:
    """Content↔position terms (DeBERTa) are recomputed for whole sequences only (tests/test_recompute.py)."""
    family = family_for(lm.config)
    first = family.attention_layers(lm.config)[0]  # a hybrid stack's layer 0 may have no attention
    return family.layer_spec(base_model(lm), first, lm.config).position_scores is not None


def _blocks(amap, rows):
    """A token-level map cut into blocks of `rows` query rows, layer by layer (as iter_blocks gives them)."""
    a = amap.attention  # [layer, head, query, key]
    rows = rows or len(amap)
    for li, layer in enumerate(amap.layer_ids):
        for start in range(0, len(amap), rows):
            yield Block(layer, amap.head_ids, start, a[li, :, start : start + rows])


def _assert_same(got, want, tol=1e-5):
    assert list(got.table["metric"]) == list(want.table["metric"])
    assert (got.table["n"].values == want.table["n"].values).all()
    g, w = got.table["value"].values, want.table["value"].values
    assert ((abs(g - w) <= tol) | (numpy.isnan(g) & numpy.isnan(w))).all(), abs(g - w).max()


@pytest.mark.parametrize("tiny, options", in_turn(("token", True), ("word", False), ("token", False), ("word", True)),
                         indirect=["tiny"])
def test_block_sums_equal_whole_map_sums(tiny, options):
    level, include_special = options
    maps = extract(tiny, TEXTS)
    whole = HeadScoreAccumulator(level=level, include_special=include_special)
    for m in maps:
        whole.update(m)
    want = whole.result()
    for rows in (1, 3, None):  # one row, a few rows (blocks end inside words), the whole map
        acc = HeadScoreAccumulator(level=level, include_special=include_special)
        for m in maps:
            acc.update_blocks(Units.of(m), _blocks(m, rows), causal=m.causal, layers=m.layer_ids, heads=m.head_ids)
        _assert_same(acc.result(), want)


def test_pattern_sums_from_blocks_equal_whole_map():
    from headscope.probe.tiny import tiny_model

    lm = tiny_model("llama")
    seqs = [(5, 9, 11, 5, 9, 11), (7, 3, 8, 2, 7, 3, 8, 2)]
    maps = extract_ids(lm, seqs)
    whole, blocks = HeadScoreAccumulator(level="token"), HeadScoreAccumulator(level="token")
    for m in maps:
        whole.update_repeated(m)
        blocks.update_repeated_blocks(m.token_ids, _blocks(m, 2), causal=True, layers=m.layer_ids, heads=m.head_ids)
    _assert_same(blocks.result(), whole.result())


def test_blocks_outside_the_scored_heads_are_refused():
    acc = HeadScoreAccumulator(level="token")
    units = Units("ab", "token", ("a", "b"), ((0, 1), (1, 2)), (False, False), word_index=(0, 1))
    with pytest.raises(ValueError, match="outside the layers"):
        acc.update_blocks(units, [Block(3, (0,), 0, torch.full((1, 2, 2), 0.5))], causal=False, layers=[0], heads=[0])


@pytest.mark.parametrize("tiny, level", in_turn("token", "word"), indirect=["tiny"])
def test_heads_recompute_equals_eager_on_every_family(tiny, level):
    kw = dict(level=level, induction_sequences=2, induction_length=5)
    eager = hs.heads(tiny, TEXTS, attention="eager", **kw)
    for budget in (1, 10**9):  # one row per block, and the whole map in one block
        if budget == 1 and _whole_sequences_only(tiny):
            with pytest.raises(UnsupportedFeature, match="whole sequences"):
                hs.heads(tiny, TEXTS, attention="recompute", budget=budget, **kw)
            continue
        got = hs.heads(tiny, TEXTS, attention="recompute", budget=budget, **kw)
        _assert_same(got, eager)
        assert got.meta["check"]["passed"] and got.meta["attention"]["recompute"] == len(TEXTS)
    assert "check" not in eager.meta  # an eager run's output is as it was


def test_auto_recomputes_only_texts_beyond_the_budget():
    from headscope.probe.tiny import tiny_model

    lm = tiny_model("bert")
    short, long = "A cat.", "The cat sat on the mat and looked at the dog for a long while."
    n_short = len(lm.tokenizer(short)["input_ids"])
    budget = 2 * lm.config.num_hidden_layers * lm.config.num_attention_heads * n_short**2 * 4  # batch of 2
    got = hs.heads(lm, [short, long], attention="auto", budget=budget, level="token")
    assert got.meta["attention"] == {"asked": "auto", "budget": budget, "eager": 1, "recompute": 1}
    _assert_same(got, hs.heads(lm, [short, long], level="token"))


def test_bad_attention_and_budget_get_one_clear_error():
    from headscope.probe.tiny import tiny_model

    lm = tiny_model("bert")
    with pytest.raises(ValueError, match="attention must be"):
        hs.heads(lm, TEXTS, attention="fast")
    with pytest.raises(ValueError, match="memory_budget 0 is not a size; give at least 1 byte"):
        hs.heads(lm, TEXTS, attention="auto", budget=0)


@pytest.mark.parametrize("family", ["bert", "llama"])
@pytest.mark.parametrize("level", ["token", "word"])
def test_probe_scores_recompute_equal_eager(family, level):
    from headscope.probe.tiny import tiny_model

    lm = tiny_model(family)
    examples = hs.builtin_set("agreement")[:6] + hs.builtin_set("winograd")[:6]
    eager = hs.extract_scores(lm, examples, level=level)
    got = hs.extract_scores(lm, examples, level=level, attention="recompute", budget=2_000)  # a few rows per block
    assert [e.text for e in got.examples] == [e.text for e in eager.examples] and got.excluded == eager.excluded
    torch.testing.assert_close(got.scores, eager.scores, atol=1e-5, rtol=0, equal_nan=True)
    assert got.check["passed"] and eager.check is None


def test_query_rows_keep_only_the_asked_rows():
    from headscope.analyses.coref import query_rows

    units = Units("ab c", "token", ("a", "##b", "c"), ((0, 1), (1, 2), (3, 4)), (False,) * 3, word_index=(0, 0, 1))
    a = torch.tensor([[[0.5, 0.25, 0.25], [0.2, 0.4, 0.4], [0.1, 0.6, 0.3]]])  # one head, [query, key]
    blocks = [Block(0, (0,), 0, a[:, :1]), Block(0, (0,), 1, a[:, 1:])]
    words = query_rows(units, blocks, [0], level="word", causal=False, layers=[0], heads=[0])
    # word 0 = tokens 0 and 1: keys summed per word (0.75, 0.25) and (0.6, 0.4), queries averaged
    assert list(words.rows) == [0] and torch.allclose(words.rows[0], torch.tensor([[[0.675, 0.325]]]))
    tokens = query_rows(units, blocks, [2], level="token", causal=False, layers=[0], heads=[0])
    assert list(tokens.rows) == [2] and torch.equal(tokens.rows[2], a[None, :, 2])


def test_explain_recompute_equals_eager(tiny):
    text = "The cat sat on the mat because it was tired."
    kw = dict(token="it", layer=tiny.config.num_hidden_layers - 1, head=1)
    eager = hs.explain(tiny, text, **kw)
    got = hs.explain(tiny, text, attention="recompute", **kw)
    assert got.table["key"].tolist() == eager.table["key"].tolist()
    for column in ("raw_score", "weight", "contribution_norm"):
        numpy.testing.assert_allclose(got.table[column], eager.table[column], atol=1e-5, rtol=0)
    assert eager.check is None and got.check["passed"] and got.model_weight_max_abs_err <= got.check["tolerance"]


def test_cli_attention_option_on_heads_coref_and_explain(monkeypatch):
    import json

    from click.testing import CliRunner

    import headscope.commands.coref as coref_cmd
    import headscope.commands.explain as explain_cmd
    import headscope.commands.heads as heads_cmd
    from headscope.probe.tiny import tiny_model

    lm = tiny_model("llama")
    for mod in (heads_cmd, coref_cmd, explain_cmd):
        monkeypatch.setattr(mod, "load_or_fail", lambda name, *placement: lm)
    base = ["--quiet", "--no-verify", "--induction-seqs", "2", "--induction-length", "5", "--limit", "3"]
    res = CliRunner().invoke(heads_cmd.cli, base + ["--attention", "recompute"])
    assert res.exit_code == 0, res.output
    assert "3 of 3 texts recomputed in blocks" in res.output and "checked against eager attention" in res.output
    res = CliRunner().invoke(heads_cmd.cli, base + ["--attention", "auto", "--memory-budget", "1KiB", "--json"])
    d = json.loads(res.stdout)
    assert d["meta"]["attention"]["recompute"] == 3 and d["meta"]["check"]["passed"] is True
    plain = json.loads(CliRunner().invoke(heads_cmd.cli, base + ["--attention", "eager", "--json"]).stdout)
    assert "check" not in plain["meta"] and "attention" not in plain["meta"]  # eager output as it was
    default = json.loads(CliRunner().invoke(heads_cmd.cli, base + ["--json"]).stdout)  # auto: the mode recorded
    assert default["meta"]["attention"] == {"asked": "auto", "budget": default["meta"]["attention"]["budget"],
                                            "eager": 3, "recompute": 0} and default["meta"]["check"] is None
    assert default["table"] == plain["table"] if "table" in plain else default["top"] == plain["top"]
    res = CliRunner().invoke(heads_cmd.cli, base)  # the chosen mode printed
    assert res.exit_code == 0 and "attention: 0 of 3 texts recomputed in blocks (--attention auto" in res.output
    for bad in ("lots", "0", "-5GB", "12 parsecs"):
        res = CliRunner().invoke(heads_cmd.cli, base + ["--attention", "auto", "--memory-budget", bad])
        assert res.exit_code == 2 and res.output.count("\n") == 1 and "--memory-budget" in res.output, res.output

    res = CliRunner().invoke(coref_cmd.cli, ["--quiet", "--no-verify", "--limit", "12", "--permutations", "100",
                                             "--attention", "recompute", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["check"]["passed"] is True

    res = CliRunner().invoke(explain_cmd.cli, ["The cat sat because it was tired.", "--token", "it", "--head", "L1H2",
                                               "--attention", "recompute"])
    assert res.exit_code == 0, res.output
    assert "checked against eager attention" in res.output


REAL_TEXTS = ["The animal didn't cross the street because it was too tired.", "我爱北京天安门",
              "Mary told John that she would call him tomorrow, and he agreed. " * 4]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["minilm", "smollm2"])
def test_recompute_equals_eager_on_real_models(name, request):
    lm = request.getfixturevalue(name)
    for level in ("word", "token"):
        kw = dict(level=level, induction_sequences=2, induction_length=10)
        _assert_same(hs.heads(lm, REAL_TEXTS, attention="recompute", budget=2**20, **kw), hs.heads(lm, REAL_TEXTS, **kw))
    examples = hs.builtin_set("agreement")[:8]
    got = hs.extract_scores(lm, examples, attention="recompute", budget=2**20)
    torch.testing.assert_close(got.scores, hs.extract_scores(lm, examples).scores, atol=1e-5, rtol=0, equal_nan=True)
    kw = dict(token="it", layer=2, head=3)
    e, r = hs.explain(lm, REAL_TEXTS[0], **kw), hs.explain(lm, REAL_TEXTS[0], attention="recompute", **kw)
    numpy.testing.assert_allclose(r.table["weight"], e.table["weight"], atol=1e-5, rtol=0)
    assert r.check["passed"]
