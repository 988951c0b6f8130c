"""Heads for long context: the per-head streaming mask and the KV plan's identities, needles, retrieval counts."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from headscope.analyses.longcontext import RetrievalCheck, accuracy_p
from headscope.probe.kvplan import KVPlan, Needle, Phrasing, make_needles, pool_kv
from headscope.probe.longcontext import (Answer, NeedlePrompt, answer, kv_layout, needle_prompt, retrieval_hits,
                                         stream_heads, stream_sensitivity)
from headscope.probe.sinks import window_mask


from conftest import _tiny, one_line

IDS = torch.tensor([[1, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]])


def _logits(lm, ids=IDS, **kw):
    with torch.no_grad():
        return lm.model(input_ids=ids, use_cache=False, **kw).logits


def test_all_full_plan_is_the_model_bit_for_bit():
    lm = _tiny("llama")
    clean = _logits(lm)
    with stream_heads(lm, KVPlan.all_full((2, 2), sink=1, recent=2)):
        assert torch.equal(_logits(lm), clean)


def test_a_window_reaching_every_key_is_the_full_model_bit_for_bit():
    lm = _tiny("llama")
    clean = _logits(lm)
    # hooks installed (every head streams) but sink + recent cover all 12 keys: the mask entries are the model's own
    for sink, recent in ((0, 12), (4, 8), (12, 1)):
        with stream_heads(lm, KVPlan.all_streaming((2, 2), sink=sink, recent=recent)):
            assert torch.equal(_logits(lm), clean)
    with stream_heads(lm, KVPlan.all_streaming((2, 2), sink=1, recent=10)):  # one key short: not the model
        assert not torch.equal(_logits(lm), clean)


def test_all_streaming_is_the_streamingllm_mask_on_every_layer():
    lm = _tiny("llama")
    T = IDS.shape[1]
    allowed = window_mask(T, 3, 2)  # probe.sinks' own mask: the last 3 keys and the first 2
    additive = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[None, None]
    expected = _logits(lm, attention_mask=additive)
    with stream_heads(lm, KVPlan.all_streaming((2, 2), sink=2, recent=3)):
        got = _logits(lm)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert not torch.allclose(got, _logits(lm))


def test_a_plan_is_per_kv_head_and_streams_every_query_head_reading_it():
    lm = _tiny("llama")  # 4 query heads over 2 KV heads: query heads 0, 1 read KV head 0
    plan = KVPlan(np.array([[True, True], [False, True]]), sink=1, recent=3)
    with torch.no_grad():
        clean = lm.model(input_ids=IDS, output_attentions=True).attentions[1][0]
        with stream_heads(lm, plan):
            hit = lm.model(input_ids=IDS, output_attentions=True).attentions[1][0]
    dropped = ~window_mask(IDS.shape[1], 3, 1)
    for h in (0, 1):
        assert float(hit[h][dropped].abs().max()) == 0.0  # no weight outside the sink and the recent window
        assert torch.allclose(hit[h].sum(-1), torch.ones(IDS.shape[1]))
    assert torch.equal(hit[2:], clean[2:])


def test_stacked_copies_run_each_plan_as_alone():
    lm = _tiny("llama")
    plans = [KVPlan(np.array([[False, True], [True, True]]), sink=1, recent=2),
             KVPlan(np.array([[True, True], [True, False]]), sink=0, recent=4)]
    alone = []
    for p in plans:
        with stream_heads(lm, p):
            alone.append(_logits(lm)[0])
    with stream_heads(lm, plans):
        both = _logits(lm, ids=IDS.repeat(2, 1))
    for c in range(2):
        torch.testing.assert_close(both[c], alone[c], rtol=0, atol=1e-6)


def test_decoding_with_the_cache_sees_the_same_keys_as_the_whole_sequence():
    lm = _tiny("llama")
    plan = KVPlan(np.array([[False, False], [True, False]]), sink=1, recent=3)
    ids = IDS[0].tolist()
    with stream_heads(lm, plan):
        ans = answer(lm, ids, max_new_tokens=4)
        whole = list(ids)
        for _ in range(4):  # greedy by whole-sequence passes: what the cache must reproduce
            whole.append(int(_logits(lm, ids=torch.tensor([whole]))[0, -1].argmax()))
    assert list(ans.ids) == whole[len(ids):]


def test_bytes_are_the_arithmetic_of_the_kept_keys():
    plan = KVPlan(np.array([[True, False, False], [False, True, True]]), sink=4, recent=16)
    n, hd, b = 1000, 64, 2
    # by hand: 3 full heads keep 1000 keys, 3 streaming heads 20; keys and values, 64 numbers of 2 bytes
    assert plan.kv_bytes(n, head_dim=hd, bytes_per_value=b) == (3 * 1000 + 3 * 20) * 2 * 64 * 2
    full = KVPlan.all_full((2, 3), sink=4, recent=16)
    saved = full.kv_bytes(n, head_dim=hd, bytes_per_value=b) - plan.kv_bytes(n, head_dim=hd, bytes_per_value=b)
    assert saved == 3 * (1000 - 20) * 2 * 64 * 2
    assert plan.kv_bytes(10, head_dim=hd, bytes_per_value=b) == full.kv_bytes(10, head_dim=hd, bytes_per_value=b)
    windowed = KVPlan(np.ones((2, 3), bool), sink=4, recent=16, planned=np.array([False, True]), own_window=(8, None))
    assert windowed.kv_bytes(n, head_dim=1, bytes_per_value=1) == (3 * 8 + 3 * 1000) * 2
    assert plan.pattern_table() == "1\t0\t0\n0\t1\t1\n"
    assert plan.pattern_config() == {"sink_size": 4, "recent_size": 16}


def test_rankings_fill_the_plan_by_score_and_random_plans_by_seed():
    scores = np.array([[0.5, 0.1], [0.5, 0.9], [0.0, np.nan]])
    plan = KVPlan.from_ranking(scores, 0.5, sink=1, recent=2)
    # by hand: 0.9 (1, 1), then the tie at 0.5 — the later layer (1, 0) before (0, 0); NaN ranks last
    assert plan.full.tolist() == [[True, False], [True, True], [False, False]]
    assert KVPlan.from_ranking(scores, 2 / 6, sink=1, recent=2).full.tolist() == [[False, False], [True, True], [False, False]]
    r1, r2 = (KVPlan.random((3, 2), 3, sink=1, recent=2, seed=s) for s in (0, 0))
    assert r1.n_full == 3 and np.array_equal(r1.full, r2.full)
    assert pool_kv(np.array([[0.1, 0.7, 0.2, 0.0]]), 2).tolist() == [[0.7, 0.2]]


def test_gemma3_plans_only_its_global_layers():
    lm = _tiny("gemma3")  # layers 0, 1 slide over 4 keys; layer 2 is global
    layout = kv_layout(lm)
    assert layout.planned == (False, False, True) and layout.own_window[:2] == (4, 4)
    bad = KVPlan(np.array([[False, True], [True, True], [True, True]]), sink=1, recent=2)
    with pytest.raises(ValueError, match="not planned"):
        with stream_heads(lm, bad):
            pass
    planned = np.array(layout.planned)
    plan = KVPlan.all_streaming(layout.shape, sink=1, recent=2, planned=planned)
    assert plan.n_planned == 2 and plan.full[:2].all()
    clean = _logits(lm)
    with stream_heads(lm, plan):
        assert not torch.equal(_logits(lm), clean)


def test_needles_are_seeded_split_and_placed():
    short = [Phrasing("Key {key}.", "Key:"), Phrasing("Code {key}.", "Code:")]  # tiny-llama reads 128 tokens
    a = make_needles(6, lengths=[70, 110], depths=[0.0, 0.5, 1.0], seed=3, phrasings=short, n_lines=30)
    assert a == make_needles(6, lengths=[70, 110], depths=[0.0, 0.5, 1.0], seed=3, phrasings=short, n_lines=30)
    assert [n.split for n in a].count("held_out") == 3 and len({n.key for n in a}) == 6
    lm = _tiny("llama")
    lines = [f"Line {i} is dull." for i in range(30)]
    for n in a:
        p = needle_prompt(lm, n, lines)
        text = lm.tokenizer.decode(list(p.ids[p.span[0]:p.span[1]]))
        assert n.key in text.replace(" ", "") and p.ids[-1] != p.ids[p.span[1] - 1]
        assert abs(p.n_tokens - n.length) <= 20
        depth = p.span[0] / p.n_tokens
        assert abs(depth - n.depth) < 0.35
    with pytest.raises(ValueError, match="at least 2 needles"):
        make_needles(1, lengths=[60], depths=[0.5])
    with pytest.raises(ValueError, match="limit of 128"):
        needle_prompt(lm, make_needles(2, lengths=[500], depths=[0.5])[0], lines)


def test_a_haystack_line_longer_than_the_prompt_is_cut_to_the_length_asked():
    # a corpus of long lines (a paragraph a line) once gave one whole line, 160 tokens for a 120-token prompt
    short = [Phrasing("Key {key}.", "Key:")]
    lm = _tiny("llama")
    long_line = " ".join(f"word{i}" for i in range(400))
    for n in make_needles(2, lengths=[60, 120], depths=[0.0, 0.5], seed=1, phrasings=short, n_lines=3):
        p = needle_prompt(lm, n, [long_line, "A short line.", long_line])
        assert p.n_tokens <= n.length + 4, (p.n_tokens, n.length)
        assert n.key in lm.tokenizer.decode(list(p.ids[p.span[0]:p.span[1]])).replace(" ", "")


def test_retrieval_hits_count_copies_and_heads_that_point_at_the_token():
    needle = Needle(index=0, key="12", phrasing=0, length=10, depth=0.5, offset=0, split="selection", statement="",
                    question="")
    prompt = NeedlePrompt(needle=needle, ids=(1, 2, 7, 8, 3, 4), span=(2, 4), key="12", context=4)
    # step 0 writes 7 (in the needle): head (0,0) points at position 2 (a 7) — a hit; head (0,1) at 3 (an 8) — none
    # step 1 writes 9 (not in the needle): no copy step; step 2 writes 8: head (0,1) at 3 — a hit
    top = np.array([[[2, 3]], [[2, 3]], [[0, 3]]])  # [step, layer, head]
    hits, copies = retrieval_hits(prompt, Answer(ids=(7, 9, 8), text="", top_keys=top))
    assert copies == 2 and hits.tolist() == [[1, 1]]


def test_the_causal_check_says_when_no_head_set_matters_more():
    same = RetrievalCheck(model="m", heads=((1, 0),), clean=(1,) * 8, chosen=(1,) * 8,
                          random_sets=(((0, 0),),) * 10, random=((1,) * 8,) * 10)
    assert "no head set matters more than random" in same.verdict and same.p_value == 1.0
    worse = RetrievalCheck(model="m", heads=((1, 0),), clean=(1,) * 8, chosen=(0,) * 8,
                           random_sets=(((0, 0),),) * 10, random=((1,) * 8,) * 10)
    assert "matter more for retrieval" in worse.verdict and worse.drop_beyond_random == 100
    assert accuracy_p([0] * 8, [[1] * 8] * 10) == pytest.approx(1 / 256, abs=0.003)  # 2^-8 of sign patterns


def _cli(monkeypatch, lm, args):
    from click.testing import CliRunner

    from headscope.cli import cli
    from headscope.commands import retrieval as retrieval_cmd

    monkeypatch.setattr(retrieval_cmd, "load_or_fail", lambda name, *placement: lm)
    return CliRunner().invoke(cli, ["retrieval", *args])


def test_cli_retrieval_writes_the_table_and_duoattention_pattern(monkeypatch, tmp_path):
    lm = _tiny("llama")
    out, pattern = tmp_path / "heads.csv", tmp_path / "pattern"
    res = _cli(monkeypatch, lm, ["--needles", "2", "--length", "100", "--depth", "0.5", "--random", "1",
                                 "--phrasing", "Key {key}.|Key:", "--phrasing", "Code {key}.|Code:",
                                 "--sink", "2", "--recent", "8", "--fraction", "0.25", "--out", str(out),
                                 "--pattern", str(pattern), "--json", "--quiet"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["plan"]["n_full"] == 1 and len(d["check"]["random"]["accuracies"]) == 1
    table = np.loadtxt(pattern / "full_attention_heads.tsv", delimiter="\t", ndmin=2)  # as DuoAttention loads it
    assert table.shape == (2, 2) and table.sum() == 1
    assert json.loads((pattern / "config.json").read_text()) == {"sink_size": 2, "recent_size": 8}
    frame = pd.read_csv(out)
    assert len(frame) == 8 and {"retrieval_score", "retrieval_low", "kv_retrieval_score", "full"} <= set(frame.columns)
    # a query head's row carries its KV head's place in the plan
    assert frame.groupby(["layer", "kv_head"])["full"].nunique().max() == 1
    again = _cli(monkeypatch, lm, ["--needles", "2", "--length", "100", "--pattern", str(pattern)])
    assert again.exit_code == 2 and "exists" in one_line(again) and (pattern / "config.json").exists()
    for bad in ("no key|Key:", "Key {key}.", "Key {kex}.|Key:"):
        refused = _cli(monkeypatch, lm, ["--phrasing", bad])
        assert refused.exit_code == 2 and "--phrasing" in one_line(refused)


def test_stream_sensitivity_is_each_kv_head_streamed_alone():
    lm = _tiny("llama")
    ids = list(range(1, 41))
    sens = stream_sensitivity(lm, ids, sink=1, recent=4, copies=3)  # 4 KV heads in batches of 3 and 1
    x = torch.tensor([ids])
    with torch.no_grad():
        full = torch.log_softmax(lm.model(input_ids=x).logits[0, 5:], -1)
        for l, k in np.ndindex(2, 2):
            f = np.ones((2, 2), bool)
            f[l, k] = False
            with stream_heads(lm, KVPlan(f, 1, 4)):
                alone = torch.log_softmax(lm.model(input_ids=x).logits[0, 5:], -1)
            kl = float((full.exp() * (full - alone)).sum(-1).mean())  # KL(full ‖ streamed), by hand
            assert sens[l, k] == pytest.approx(kl, rel=1e-4, abs=1e-7)
    assert (sens > 0).all()
    with pytest.raises(ValueError, match="drops no key"):
        stream_sensitivity(lm, ids[:5], sink=1, recent=4)


@pytest.mark.parametrize("kwargs, message", [
    ({"ranking": "sensitivity"}, "needs sensitivity=True"),
    ({"ranking": "gates"}, "ranking must be"),
    ({"top": 1.5}, "share of the heads"),
    ({"n_needles": 1}, "n_needles"),
    ({"lengths": [500]}, "limit of 128"),
])
def test_retrieval_refuses_bad_settings_in_one_line(kwargs, message):
    from headscope.workflows.retrieval import retrieval

    with pytest.raises(ValueError, match=message):
        retrieval(_tiny("llama"), **({"phrasings": [Phrasing("Key {key}.", "Key:")]} | kwargs))


@pytest.mark.parametrize("family", ["gpt2", "bloom", "qwen3_next"])  # plain MHA, ALiBi, a hybrid stack
def test_other_families_stream_in_their_own_attention_path(family):
    lm = _tiny(family)
    layout = kv_layout(lm)
    planned = np.array(layout.planned)
    clean = _logits(lm)
    with stream_heads(lm, KVPlan.all_streaming(layout.shape, sink=6, recent=6, planned=planned)):
        assert torch.equal(_logits(lm), clean)  # sink + recent cover the 12 keys: the model's own numbers
    with stream_heads(lm, KVPlan.all_streaming(layout.shape, sink=1, recent=2, planned=planned)):
        assert not torch.equal(_logits(lm), clean)


def _streamed_mask(lm, n, kv_head, sink, recent, first_row=0):
    """A 4-D additive mask by hand: query heads of `kv_head` see only sink + recent keys on rows >= first_row
    (every layer alike), every other entry causal — the model takes a 4-D mask as given."""
    j, q = torch.arange(n)[None], torch.arange(n)[:, None]
    causal = j <= q
    window = causal & ((j < sink) | (j > q - recent) | (q < first_row))
    g = lm.config.num_attention_heads // lm.config.num_key_value_heads
    allowed = torch.stack([window if h // g == kv_head else causal for h in range(lm.config.num_attention_heads)])
    return torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[None]


def test_question_scope_streams_from_the_question_on_with_the_context_shared():
    from headscope.probe.longcontext import answers, prefill

    lm = _tiny("llama")
    ids, context = IDS[0].tolist(), 7
    plan = KVPlan(np.array([[False, True], [False, True]]), sink=1, recent=3)  # KV head 0 streams in both layers
    pre = prefill(lm, ids[:context])
    with stream_heads(lm, plan):
        got = answer(lm, ids, max_new_tokens=4, prefix=pre)
    whole = list(ids)
    with torch.no_grad():  # greedy by whole-sequence passes under a mask written by hand: rows >= context stream
        for _ in range(4):
            m = _streamed_mask(lm, len(whole), 0, 1, 3, first_row=context)
            whole.append(int(lm.model(input_ids=torch.tensor([whole]), attention_mask=m).logits[0, -1].argmax()))
    assert list(got.ids) == whole[len(ids):]
    # the prefix is the model's own: no plan, the answer is the plain one; a window over every key, the same
    plain = answer(lm, ids, max_new_tokens=4)
    assert answer(lm, ids, max_new_tokens=4, prefix=pre).ids == plain.ids
    with stream_heads(lm, KVPlan.all_streaming((2, 2), sink=4, recent=16)):
        assert answer(lm, ids, max_new_tokens=4, prefix=pre).ids == plain.ids
    # plans decoded together from one copy of the context each answer as alone; the prefix is not changed
    plans = [plan, KVPlan(np.array([[True, False], [True, True]]), sink=0, recent=2), KVPlan.all_full((2, 2), sink=1,
                                                                                                       recent=1)]
    alone = []
    for p in plans:
        with stream_heads(lm, p):
            alone.append(answer(lm, ids, max_new_tokens=4, prefix=pre).ids)
    with stream_heads(lm, plans):
        together = answers(lm, ids, max_new_tokens=4, copies=3, prefix=pre)
    assert [a.ids for a in together] == alone and alone[2] == plain.ids
    with pytest.raises(ValueError, match="not the start of the prompt"):
        answer(lm, [9, 9, 9], max_new_tokens=1, prefix=pre)


def test_prompt_scope_matches_a_mask_written_by_hand():
    lm = _tiny("llama")
    plan = KVPlan(np.array([[True, False], [True, False]]), sink=2, recent=3)
    with torch.no_grad():
        ref = lm.model(input_ids=IDS, attention_mask=_streamed_mask(lm, IDS.shape[1], 1, 2, 3)).logits
    with stream_heads(lm, plan):
        assert torch.equal(_logits(lm), ref)


def test_stream_sensitivity_on_the_last_queries_is_the_whole_run_there():
    lm = _tiny("llama")
    ids = list(range(1, 41))
    whole = stream_sensitivity(lm, ids, sink=1, recent=4, copies=3)
    last = stream_sensitivity(lm, ids, sink=1, recent=4, copies=2, queries=35)  # positions 5.. as the whole run
    np.testing.assert_allclose(last, whole, rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="queries"):
        stream_sensitivity(lm, ids, sink=1, recent=4, queries=36)


def test_the_cost_curve_holds_its_identities():
    from headscope.workflows.retrieval import retrieval

    lm = _tiny("llama")
    # a phrasing tiny-llama copies a token of (with none, no head has a score: nothing ranks the plan)
    r = retrieval(lm, n_needles=6, n_selection=1, lengths=[60], depths=[0.3], n_random=2, sink=2, recent=8,
                  phrasings=[Phrasing("Key {key}. Remember it.", "Key:")], scope="question", curve=(0.5,), n_random_plans=2,
                  perplexity_draws=1)
    c = r.costs.set_index("plan")
    assert list(c.index) == ["all streaming", "retrieval 50%", "random 50% #0", "random 50% #1", "all full"]
    assert (c["needles"] == 5).all() and (c.loc[["random 50% #0", "random 50% #1"], "n_full"] == 2).all()
    # the all-full plan is the model: its needles are the check's clean ones, its perplexity the model's
    assert c.loc["all full", "needle_accuracy"] == sum(r.check.clean) / 5
    assert c.loc["all full", "perplexity_change"] == 0.0 and np.isnan(c.loc["random 50% #1", "perplexity"])
    n = max(r.n_tokens[i] for i, nd in enumerate(r.needles) if nd.split == "held_out")
    per_head = 2 * 8 * 4  # keys and values × head size 8 × 4 bytes
    assert c.loc["all full", "kv_bytes"] == 4 * n * per_head
    assert c.loc["all streaming", "kv_bytes"] == 4 * 10 * per_head
    assert c.loc["retrieval 50%", "kv_bytes"] == (2 * n + 2 * 10) * per_head
    assert len(r.to_dict()["curve_verdicts"]) == 1


def test_curve_verdicts_say_what_a_plan_meets():
    from headscope.analyses.longcontext import curve_verdicts

    rows = [("all full", "all full", 1.0, 0.8, 0.0), ("retrieval 50%", "retrieval", 0.5, 0.72, 0.02),
            ("sensitivity 50%", "sensitivity", 0.5, 0.7, 0.05)]
    rows += [(f"random 50% #{d}", "random", 0.5, a, 0.1) for d, a in enumerate((0.1, 0.2, 0.3))]
    costs = pd.DataFrame([{"plan": p, "kind": k, "fraction_full": f, "needle_accuracy": a, "perplexity_change": c,
                           "n_full": 4, "kv_share": 0.6, "needles": 40} for p, k, f, a, c in rows])
    good, bad = curve_verdicts(costs)
    # 0.72 / 0.8 = 90% kept, +2% perplexity, 52 points over the median 20%
    assert "retrieval 50%" in good and "(90% of" in good and "+52 points" in good and "— meets" in good
    assert "sensitivity 50%" in bad and "+5.0%" in bad and "— misses" in bad
    costs.loc[costs["plan"] == "all full", "needle_accuracy"] = 0.0  # nothing to keep: said, never "nan%"
    none = curve_verdicts(costs)[0]
    assert "the full model retrieves none" in none and "nan" not in none and "— misses" in none


def test_needles_can_keep_most_held_out():
    ns = make_needles(10, lengths=[100], depths=[0.2, 0.4, 0.6, 0.8, 1.0], n_selection=2)
    assert [n.index for n in ns if n.split == "selection"] == [0, 2]
    with pytest.raises(ValueError, match="n_selection"):
        make_needles(10, lengths=[100], depths=[0.5], n_selection=6)


def test_a_shared_context_continues_a_sliding_window_cache():
    from headscope.probe.longcontext import answers, prefill

    lm = _tiny("gemma3")  # layers 0, 1 keep 4 keys in their cache: a copied prefix must continue the same way
    ids = IDS[0].tolist()
    pre = prefill(lm, ids[:8])
    plain = answer(lm, ids, max_new_tokens=4)
    assert [a.ids for a in answers(lm, ids, max_new_tokens=4, copies=2, prefix=pre)] == [plain.ids] * 2


# -- no copy step: the retrieval score is undefined, said so on every surface ---------------------------------

_GPT2_NEEDLES = ["--needles", "2", "--length", "100", "--depth", "0.5", "--phrasing", "Key {key}.|Key:", "--sink",
                 "2", "--recent", "8", "--quiet"]


def test_no_copy_step_is_said_in_one_line_never_nan(monkeypatch, tmp_path):
    """Tiny GPT-2's greedy answers copy no needle token: every score is 0/0. It printed "retrieval score nan
    (0 hits, 95% CI nan–nan)" with exit 0, ranked heads by NaN for the causal check and the plan, and to_dict
    held NaN. Now: nothing to rank is one line and exit 2; planning by streaming alone still runs and says why
    no head has a score (null in JSON, an empty CSV cell, no table of top heads)."""
    from headscope.analyses.longcontext import NO_COPIES
    from headscope.reports.analysis import ModelAnalysis
    from headscope.reports.html import build_report
    from headscope.workflows.retrieval import retrieval

    lm = _tiny("gpt2")
    # the premise, checked independently of the scores: no generated token occurs in its needle
    phr = [Phrasing("Key {key}.", "Key:")]
    [sel, _] = make_needles(2, lengths=[100], depths=[0.5], phrasings=phr)
    from headscope.analyses.corpus import builtin_corpus

    lines = builtin_corpus()[: len(builtin_corpus()) // 2]
    prompt = needle_prompt(lm, sel, lines)
    steps = 2 + len(lm.tokenizer(" " + prompt.key, add_special_tokens=False)["input_ids"])
    made = answer(lm, prompt.ids, max_new_tokens=steps).ids
    assert not set(made) & set(prompt.ids[prompt.span[0]:prompt.span[1]])

    refused = _cli(monkeypatch, lm, [*_GPT2_NEEDLES, "--random", "1"])
    assert refused.exit_code == 2 and one_line(refused).startswith(f"headscope: {NO_COPIES} (")
    assert "--rank-by sensitivity" in one_line(refused) and "nan" not in refused.output

    import headscope

    out, kept = tmp_path / "heads.csv", []  # the command's result, kept to check its other surfaces
    monkeypatch.setattr(headscope, "retrieval", lambda *a, _real=retrieval, **kw: kept.append(_real(*a, **kw)) or kept[0])
    args = [*_GPT2_NEEDLES, "--no-check", "--sensitivity", "--rank-by", "sensitivity", "--out", str(out)]
    text = _cli(monkeypatch, lm, args)
    assert text.exit_code == 0, text.output
    assert NO_COPIES in text.stdout and "nan" not in text.stdout.lower() and "(0 hits" not in text.stdout
    frame = pd.read_csv(out, keep_default_na=False)
    assert (frame["copy_steps"] == 0).all() and (frame["retrieval_hits"] == 0).all()
    assert set(frame["retrieval_score"]) == {""} and set(frame["kv_retrieval_score"]) == {""}  # missing, not "nan"

    [r] = kept
    assert r.scores.copies == 0 and np.isnan(r.scores.score).all()
    d = json.loads(json.dumps(r.to_dict(), allow_nan=False))  # strict JSON as it is, not only after --json's cleaning
    assert d["copy_steps"] == 0 and d["top_heads"] == [] and d["retrieval_note"] == NO_COPIES
    with pytest.raises(ValueError, match="no copy steps"):
        r.scores.top(1)
    rep = build_report([ModelAnalysis(model="tiny-gpt2", long_context=r)])
    section = rep.html.split('<section id="long_context">')[1].split("</section>")[0]
    assert f"{NO_COPIES}." in section and "nan" not in section.lower() and "95% low" not in section
