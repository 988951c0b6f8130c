"""Syntactic heads: the CoNLL-U reader and alignment, per-relation scoring, trees, clusters, figures, CLI."""

import json
import math
import re

import numpy as np
import pytest
import torch

from headscope.analyses.syntax.clusters import head_clusters, head_distances
from headscope.analyses.syntax.relations import (
    ALL_RELATIONS,
    NOT_IN_MAP,
    SHARED_UNIT,
    SentenceAttention,
    best_offset,
    collect_arcs,
    score_relations,
    summarise,
    top_units,
    unit_of_words,
    word_scores,
)
from headscope.analyses.syntax.result import score_syntax
from headscope.analyses.syntax.trees import (
    choose_tree_head,
    decode_tree,
    offset_tree,
    right_branching,
    undirected_matches,
)
from headscope.analyses.stats import holm
from headscope.analyses.treebank import Sentence, TreebankError, parse_conllu, read_conllu
from headscope.probe.types import AttentionMap


def row(i, form, head, deprel, misc="_"):
    return f"{i}\t{form}\t_\t_\t_\t_\t{head}\t{deprel}\t_\t{misc}"


def conllu(*sentences):
    """CoNLL-U text from (text or None, rows) pairs."""
    out = []
    for k, (text, rows) in enumerate(sentences):
        out.append(f"# sent_id = s{k}")
        if text is not None:
            out.append(f"# text = {text}")
        out += rows
        out.append("")
    return "\n".join(out) + "\n"


# The cat sat. / The big cat sat. : the determiner's governor is 1 or 2 words to the right.
SHORT = ("The cat sat.", [row(1, "The", 2, "det"), row(2, "cat", 3, "nsubj"), row(3, "sat", 0, "root"),
                          row(4, ".", 3, "punct", "_")])
LONG = ("The big cat sat.", [row(1, "The", 3, "det"), row(2, "big", 3, "amod"), row(3, "cat", 4, "nsubj"),
                             row(4, "sat", 0, "root"), row(5, ".", 4, "punct")])


def _fix_space(rows):
    # "sat." : no space between the verb and the full stop
    return [r.replace("\tsat\t_\t_\t_\t_\t3\troot\t_\t_", "\tsat\t_\t_\t_\t_\t3\troot\t_\tSpaceAfter=No") for r in rows]


# --------------------------------------------------------------------------------------------
# reading and alignment


def test_reader_splits_multiword_tokens_skips_empty_nodes_and_folds_subtypes():
    text = conllu(("I don't know her dog.", [
        row(1, "I", 4, "nsubj"),
        "2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_",
        row(2, "do", 4, "aux"),
        row(3, "n't", 4, "advmod"),
        row(4, "know", 0, "root"),
        "4.1\tknow\t_\t_\t_\t_\t_\t_\t4:conj\t_",
        row(5, "her", 6, "nmod:poss"),
        row(6, "dog", 4, "obj", "SpaceAfter=No"),
        row(7, ".", 4, "punct"),
    ]))
    [s] = parse_conllu(text).sentences
    assert s.forms == ("I", "do", "n't", "know", "her", "dog", ".")
    assert [s.text[a:b] for a, b in s.segments] == ["I", "do", "n't", "know", "her", "dog", "."]
    assert s.heads == (3, 3, 3, -1, 5, 3, 3) and s.root == 3
    assert s.arcs()[3] == (4, 5, "nmod") and s.arcs(subtypes=True)[3] == (4, 5, "nmod:poss")


def test_reader_shares_a_segment_when_words_do_not_spell_the_token_and_handles_cjk_and_missing_text():
    spanish = ("Vino del mar", [row(1, "Vino", 0, "root"), "2-3\tdel\t_\t_\t_\t_\t_\t_\t_\t_",
                                row(2, "de", 4, "case"), row(3, "el", 4, "det"), row(4, "mar", 1, "obl")])
    chinese = ("我爱北京。", [row(1, "我", 2, "nsubj", "SpaceAfter=No"), row(2, "爱", 0, "root", "SpaceAfter=No"),
                          row(3, "北京", 2, "obj", "SpaceAfter=No"), row(4, "。", 2, "punct", "SpaceAfter=No")])
    no_text = (None, [row(1, "Hi", 0, "root", "SpaceAfter=No"), row(2, "!", 1, "punct")])
    es, zh, hi = parse_conllu(conllu(spanish, chinese, no_text)).sentences
    assert es.segment == (0, 1, 1, 2) and [es.text[a:b] for a, b in es.segments] == ["Vino", "del", "mar"]
    assert [zh.text[a:b] for a, b in zh.segments] == ["我", "爱", "北京", "。"]
    assert hi.text == "Hi!" and hi.segments == ((0, 2), (2, 3))


def test_reader_counts_unaligned_sentences_and_rejects_a_broken_file(tmp_path):
    wrong = ("The dog sat.", [row(1, "The", 2, "det"), row(2, "cat", 0, "root"), row(3, "sat", 2, "dep")])
    two_roots = ("a b", [row(1, "a", 0, "root"), row(2, "b", 0, "root")])
    tb = parse_conllu(conllu(wrong, two_roots, SHORT))
    assert len(tb) == 1 and tb.skipped == {"a form is not where the sentence's # text has it": 1,
                                           "not exactly one root": 1}
    bad = tmp_path / "bad.conllu"
    bad.write_text("1\tonly\tthree\n\n")
    with pytest.raises(TreebankError, match="bad.conllu"):
        read_conllu(bad)
    with pytest.raises(TreebankError, match="missing.conllu"):
        read_conllu(tmp_path / "missing.conllu")


def test_reader_skips_sentences_that_are_not_trees_or_have_extra_columns():
    # Each is skipped and counted by its reason; none is scored against a non-tree.
    cycle = ("a b c", [row(1, "a", 3, "x"), row(2, "b", 0, "root"), row(3, "c", 1, "y")])  # 1 -> 3 -> 1
    long_cycle = ("a b c d", [row(1, "a", 0, "root"), row(2, "b", 4, "x"), row(3, "c", 2, "y"), row(4, "d", 3, "z")])
    self_loop = ("a b", [row(1, "a", 1, "x"), row(2, "b", 0, "root")])
    twelve = ("a b", [row(1, "a", 2, "x") + "\textra\tmore", row(2, "b", 0, "root")])
    eleven_last = ("a b", [row(1, "a", 2, "x"), row(2, "b", 0, "root") + "\tone"])
    tb = parse_conllu(conllu(cycle, SHORT, long_cycle, self_loop, twelve, eleven_last))
    assert [s.text for s in tb.sentences] == [SHORT[0]]
    assert tb.skipped == {"the arcs form a cycle (not a tree)": 2, "a word is its own governor (HEAD = its ID)": 1,
                          "a line has more than the 10 columns": 2}
    # CoNLL-U Plus: a declared 12th column is not an extra one
    plus = "# global.columns = ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC A B\n" + conllu(
        ("a b", [row(1, "a", 2, "x") + "\t_\t_", row(2, "b", 0, "root") + "\t_\t_"]))
    assert len(parse_conllu(plus)) == 1


# --------------------------------------------------------------------------------------------
# from attention to picks


def test_top_units_excludes_special_tokens_the_word_itself_and_ties():
    a = torch.tensor([[[[0.1, 0.2, 0.3, 0.4],     # [CLS] row: a special query still gets a pick
                        [0.7, 0.1, 0.1, 0.1],     # 'a': 0.7 on [CLS] ignored; tie between b and c -> -1
                        [0.5, 0.1, 0.3, 0.1],     # 'b': itself ignored -> a (0.1) vs c (0.1) tie -> -1
                        [0.2, 0.3, 0.1, 0.4]]]])  # 'c': a
    before = a.clone()
    assert top_units(a, [True, False, False, False]).tolist() == [[[3, -1, -1, 1]]]
    assert torch.equal(a, before)


def _word_map(sentence, targets, *, causal=False):
    """A word-level map over [CLS] + the sentence's words; head k's query word q puts 0.6 on word
    targets[k][q] (if any), 0.3 on [CLS] and the rest spread evenly."""
    n = len(sentence) + 1
    att = torch.zeros(1, len(targets), n, n)
    for k, tgt in enumerate(targets):
        for q in range(n):
            att[0, k, q] = 0.1 / n
            att[0, k, q, 0] += 0.3
            t = tgt[q - 1] if q > 0 else None
            if t is not None:
                att[0, k, q, t + 1] += 0.6
    spans = ((0, 0), *sentence.segments)
    labels = ("[CLS]", *(sentence.text[a:b] for a, b in sentence.segments))
    return AttentionMap(text=sentence.text, level="word", labels=labels, spans=spans,
                        special=(True,) + (False,) * (n - 1), attention=att, causal=causal)


def _records(sentences):
    """Head 0 looks at each word's governor (the root at nothing), head 1 at the previous word."""
    out = []
    for s in sentences:
        gov = [g if g >= 0 else None for g in s.heads]
        prev = [i - 1 if i > 0 else None for i in range(len(s))]
        out.append(summarise(_word_map(s, [gov, prev]), s, keep=[0], match_trees=True))
    return out


def test_summarise_keeps_picks_units_and_tree_scores():
    s = parse_conllu(conllu(SHORT)).sentences[0]
    rec = _records([s])[0]
    assert rec.units == (1, 2, 3, 4)
    assert rec.top[0, 0].tolist() == [-1, 2, 3, -1, 3] and rec.top[0, 1, 2:].tolist() == [1, 2, 3]
    assert rec.scores.shape == (1, 4, 4) and rec.kept == (0,)
    # head 0 decodes the gold tree (3 arcs); head 1 the chain, which holds the-cat and cat-sat only
    assert rec.tree_matches.tolist() == [3, 2]


def test_unit_of_words_and_word_scores_when_a_token_spans_two_words():
    s = parse_conllu(conllu(("I don't", [row(1, "I", 2, "nsubj"), "2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_",
                                         row(2, "do", 0, "root"), row(3, "n't", 2, "advmod")]))).sentences[0]
    # the model saw "don" + "'t": one unit for both words
    m = AttentionMap(text=s.text, level="word", labels=("[CLS]", "I", "don't"), spans=((0, 0), (0, 1), (2, 7)),
                     special=(True, False, False), attention=torch.full((1, 1, 3, 3), 1 / 3), causal=False)
    assert unit_of_words(m, s) == (1, 2, 2)
    ws = word_scores(m.attention[0], unit_of_words(m, s))[0]
    assert torch.equal(ws, torch.tensor([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    rec = SentenceAttention(sentence=s, units=(1, 2, 2), top=top_units(m.attention, m.special))
    arcs = collect_arcs([rec])
    assert arcs.excluded == {SHARED_UNIT: 2}  # do <- n't in both directions
    rec = SentenceAttention(sentence=s, units=(1, -1, -1), top=top_units(m.attention, m.special))
    assert collect_arcs([rec]).excluded == {NOT_IN_MAP: 4}


def test_text_without_spaces_through_a_sentencepiece_model():
    from headscope.analyses.treebank import segmenter_for
    from headscope.probe.extract import extract
    from headscope.probe.tiny import tiny_model

    chinese = ("我爱北京天安门。", [row(1, "我", 2, "nsubj", "SpaceAfter=No"), row(2, "爱", 0, "root", "SpaceAfter=No"),
                             row(3, "北京", 4, "nmod", "SpaceAfter=No"), row(4, "天安门", 2, "obj", "SpaceAfter=No"),
                             row(5, "。", 2, "punct", "SpaceAfter=No")])
    [s] = parse_conllu(conllu(chinese)).sentences
    [m] = extract(tiny_model("gemma3"), [s.text], level="word", segmenter=segmenter_for([s]))
    units = unit_of_words(m, s)
    assert min(units) >= 0
    for (a, b), u in zip((s.segments[k] for k in s.segment), units):  # every word lies inside its unit
        ua, ub = m.spans[u]
        assert ua <= a < b <= ub and not m.special[u]
    assert len(set(units)) == len(m) - sum(m.special)  # and every non-special unit holds a gold word


def test_head_to_dependent_is_right_on_any_dependent_of_that_relation():
    s = parse_conllu(conllu(("a b c", [row(1, "a", 0, "root"), row(2, "b", 1, "conj"), row(3, "c", 1, "conj")]))
                     ).sentences[0]
    top = torch.tensor([[[-1, 3, 1, 1]]])  # [layer, head, unit]: 'a' looks at 'c'
    arcs = collect_arcs([SentenceAttention(sentence=s, units=(1, 2, 3), top=top)])
    h2d = arcs.where("conj", "head->dependent")
    assert len(h2d) == 1 and arcs.offsets[h2d[0]] == frozenset({1, 2}) and bool(arcs.correct[h2d[0], 0, 0])
    d2h = arcs.where("conj", "dependent->head")
    assert arcs.correct[d2h, 0, 0].tolist() == [True, True] and not arcs.after[d2h].any()


# --------------------------------------------------------------------------------------------
# per-relation scores


def test_best_offset_and_holm_against_a_reference():
    assert best_offset([frozenset({1}), frozenset({2}), frozenset({2, -1})]) == 2
    assert best_offset([frozenset({1}), frozenset({-1})]) == -1  # tie: same distance, the leftward one
    assert best_offset([]) is None
    rng = np.random.default_rng(0)
    p = list(rng.random(12) ** 3)
    adj = holm(p)
    order = np.argsort(p)
    ref = np.maximum.accumulate([min(1.0, (12 - i) * p[j]) for i, j in enumerate(order)])  # textbook Holm
    assert np.allclose([adj[j] for j in order], ref)


def _split(n_each):
    tb = parse_conllu(conllu(*[SHORT, LONG] * n_each))
    return tb.sentences


def test_score_relations_known_answers():
    select, test = _records(_split(20)), _records(_split(20))
    relations, heads = score_relations(collect_arcs(select), collect_arcs(test), [0], [0, 1], n_perm=999)
    det = next(r for r in relations if (r.relation, r.direction) == ("det", "dependent->head"))
    # head 0 always finds the governor; the offset is +1 on SHORT and +2 on LONG: the tie goes to +1
    assert det.best_head == (0, 0) and det.n == 40 and det.heldout_correct == 40
    assert det.baseline_offset == 1 and det.baseline_correct == 20
    assert det.p_value == pytest.approx(1 / 1000) and det.beats_baseline
    assert det.ci95[0] > 0.9 and det.ci95[1] == 1.0
    amod = next(r for r in relations if (r.relation, r.direction) == ("amod", "dependent->head"))
    assert amod.n == 20 and amod.heldout_correct == 20 and amod.baseline_correct == 20  # offset +1 always right
    assert amod.p_value == 1.0 and not amod.beats_baseline and "no head beats" in amod.verdict
    # head->dependent of det: 'cat' looks at 'sat' with head 0; head 1 finds the det only on SHORT
    det_h2d = next(r for r in relations if (r.relation, r.direction) == ("det", "head->dependent"))
    assert det_h2d.best_head == (0, 1) and det_h2d.heldout_correct == 20 and det_h2d.baseline_offset == -1
    # the tidy table: one row per relation x direction x head, and the chosen head marked
    assert len(heads) == len(relations) * 2
    chosen = heads[heads.chosen & (heads.relation == "det") & (heads.direction == "dependent->head")]
    assert chosen[["layer", "head", "correct", "n"]].values.tolist() == [[0, 0, 40, 40]]
    punct = heads[(heads.relation == "punct") & (heads.direction == "dependent->head")]
    assert punct.accuracy.tolist() == [1.0, 1.0]  # the full stop's governor is the previous word
    assert relations[0].relation == ALL_RELATIONS and relations[0].n == sum(
        r.n for r in relations if r.direction == "dependent->head" and r.relation != ALL_RELATIONS)


def test_too_few_examples_are_reported_as_such():
    select, test = _records(_split(3)), _records(_split(3))
    relations, _ = score_relations(collect_arcs(select), collect_arcs(test), [0], [0, 1], n_perm=200)
    det = next(r for r in relations if r.relation == "det")
    assert det.best_head is None and det.p_value is None and "too few examples" in det.verdict
    assert det.to_dict()["best_head"] is None and det.to_dict()["heldout_accuracy"] is None


# --------------------------------------------------------------------------------------------
# trees


def _networkx_tree(scores, root):
    import networkx as nx

    n = len(scores)
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_weighted_edges_from((gov, d, float(scores[d, gov])) for d in range(n) if d != root
                              for gov in range(n) if gov != d)
    heads = [-1] * n
    for gov, d in nx.maximum_spanning_arborescence(g).edges():
        heads[d] = gov
    return heads


def test_decode_tree_finds_the_same_optimum_as_networkx():
    rng = np.random.default_rng(0)
    for trial in range(60):
        n = int(rng.integers(2, 12))
        s = rng.random((n, n))
        if trial % 2:
            s = np.tril(s, -1)  # a decoder: no attention to later words
        root = int(rng.integers(n))
        ours, ref = decode_tree(s, root), _networkx_tree(s, root)
        assert ours[root] == -1 and sorted(ours).count(-1) == 1
        # a valid tree: following governors from any word reaches the root
        for d in range(n):
            seen, w = set(), d
            while w != root:
                assert w not in seen
                seen.add(w)
                w = ours[w]
        total = lambda h: sum(s[d, g] for d, g in enumerate(h) if g >= 0)  # noqa: E731
        assert total(ours) == pytest.approx(total(ref), abs=1e-12)


def test_uuas_baselines_known():
    gold = [1, -1, 1, 2]  # w0 <- w1 -> w2 -> w3
    assert undirected_matches(right_branching(4), gold) == 3
    assert offset_tree(4, 1, -1) == [-1, -1, 1, 2] and undirected_matches(offset_tree(4, 1, -1), gold) == 2
    assert undirected_matches([2, -1, 1, 1], gold) == 1


def test_tree_head_selection_and_scores():
    select, test = _records(_split(5)), _records(_split(10))
    choice = choose_tree_head(select, torch.tensor([0.0, 1.0]))
    assert choice.head == 0 and choice.uuas == 1.0 and choice.n_sentences == 10
    # head 1 (previous word): 'The' has no previous word, so of the gold arcs it keeps only the
    # full stop's and the one joining the two words before the verb: 2 per sentence
    assert choice.matches.tolist() == [35, 20]
    result = score_syntax(select, test, model="m", treebank="t", selection="s", layer_ids=[0], head_ids=[0, 1],
                          tree_selection=choice, n_perm=999)
    t = result.trees
    assert t.best_head == (0, 0) and t.uuas == 1.0 and t.n_edges == 70
    # the chain misses only LONG's det arc (The-cat); "each word to the next" also misses the full stop
    assert t.right_branching_uuas == pytest.approx(60 / 70)
    assert t.offset == 1 and t.offset_uuas == pytest.approx(40 / 70)
    # 10 sentences where the head has one arc more than the chain: p about 2^-10, floored by 1/1000
    assert t.baseline == "right-branching" and t.p_value < 0.01
    assert t.example is not None and len(t.example_heads) == len(t.example)


# --------------------------------------------------------------------------------------------
# the workflow on tiny models, the CLI, clusters, figures


def _sentences_file(tmp_path, name, n):
    path = tmp_path / name
    long = ("Cat " * 200 + "sat", [row(i + 1, "Cat", 201, "nsubj") for i in range(200)] + [row(201, "sat", 0, "root")])
    path.write_text(conllu(*[SHORT, LONG] * n, long))
    return path


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_workflow_on_tiny_models(tmp_path, family):
    from headscope.probe.tiny import tiny_model
    from headscope.workflows.syntax import syntax

    lm = tiny_model(family)
    test, dev = _sentences_file(tmp_path, "test.conllu", 12), _sentences_file(tmp_path, "dev.conllu", 11)
    r = syntax(lm, test, select_on=dev, n_perm=200, tree_sample=5)
    assert r.n_sentences == 24 and r.n_select_sentences == 22
    assert r.n_skipped == 1 and list(r.skipped) == ["longer than the model's context (128 tokens)"]
    assert r.causal == (family == "gpt2") and bool(r.notes) == (family == "gpt2")
    assert re.search(r"tree head chosen on [45] sampled with seed 0 from the 22 selection sentences", r.selection)
    obj = json.loads(json.dumps(r.to_dict()))
    assert list(obj)[:6] == ["model", "n_sentences", "n_skipped", "relations", "trees", "treebank"]
    keys = ["relation", "direction", "n", "best_head", "heldout_accuracy", "ci95", "baseline_offset",
            "baseline_accuracy", "p_value", "verdict"]
    assert all(list(rel)[:10] == keys for rel in obj["relations"])
    assert list(obj["trees"])[:5] == ["best_head", "uuas", "right_branching_uuas", "offset_uuas", "p_value"]
    n_heads = lm.config.num_hidden_layers * lm.config.num_attention_heads
    assert len(r.to_frame()) == len(r.relations) * n_heads
    # without --select-on: a seeded half of the one file chooses, the other half is scored
    half = syntax(lm, test, n_perm=200, trees=False)
    assert half.n_select_sentences + half.n_sentences == 24 and half.trees is None and "random half" in half.selection


def test_cli_json_csv_and_bad_inputs(monkeypatch, tmp_path):
    from click.testing import CliRunner

    import headscope.commands.syntax as syntax_cmd
    from headscope.cli import cli
    from headscope.probe.tiny import tiny_model

    lm = tiny_model("bert")
    monkeypatch.setattr(syntax_cmd, "load_or_fail", lambda name, *placement: lm)
    test, dev = _sentences_file(tmp_path, "test.conllu", 12), _sentences_file(tmp_path, "dev.conllu", 11)
    out = tmp_path / "heads.csv"
    res = CliRunner().invoke(cli, ["syntax", "--model", "tiny", "--conllu", str(test), "--select-on", str(dev),
                                   "--permutations", "200", "--tree-sample", "4", "--json", "--out", str(out)])
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)  # progress goes to stderr unless --quiet
    assert obj["model"] == "tiny-bert" and obj["n_sentences"] == 24 and obj["n_skipped"] == 1
    header = out.read_text().splitlines()[0]
    assert header.startswith("model,relation,direction,layer,head,")
    res = CliRunner().invoke(cli, ["syntax", "--conllu", str(test), "--permutations", "200", "--no-trees"])
    assert res.exit_code == 0 and "det" in res.output and "random half" in res.output
    for args, message in ((["--conllu", str(tmp_path / "nope.conllu")], "no such file"),
                          (["--conllu", str(test), "--select-on", str(tmp_path / "x")], "no such file")):
        res = CliRunner().invoke(cli, ["syntax", *args])
        assert res.exit_code != 0 and message in res.output and "Traceback" not in res.output
    bad = tmp_path / "bad.conllu"
    bad.write_text("1\tonly\tthree\n\n")
    res = CliRunner().invoke(cli, ["syntax", "--conllu", str(bad)])
    assert res.exit_code == 2 and "not valid CoNLL-U" in res.output and len(res.output.strip().splitlines()) == 1


def _map(att, labels=("[CLS]", "a", "b"), model="m"):
    n = len(labels)
    return AttentionMap(text="a b", level="word", labels=labels, spans=((0, 0), (0, 1), (2, 3))[:n],
                        special=(True, False, False)[:n], attention=att, causal=False, meta={"model": model})


def test_head_distances_known_values_and_mismatched_units():
    eye = torch.eye(3)
    shifted = eye[[1, 2, 0]]
    att = torch.stack([eye, eye, shifted])[None]  # [layer=1, head=3, query, key]
    dist, heads = head_distances([[_map(att), _map(att)]])
    assert np.allclose(dist, [[0, 0, 1], [0, 0, 1], [1, 1, 0]])  # same rows: 0; disjoint one-hot rows: 1
    assert heads.name.tolist() == ["L0H0", "L0H1", "L0H2"]
    half = torch.full((3, 3), 1 / 3)
    dist2, heads2 = head_distances([[_map(att)], [_map(half[None, None], model="other")]])
    assert dist2.shape == (4, 4) and heads2.model.tolist() == ["m", "m", "m", "other"]
    # one-hot vs uniform over 3: JS = H(m) - (H(p) + H(q)) / 2 with m = (2/3, 1/6, 1/6)
    h = lambda v: -sum(x * math.log2(x) for x in v if x > 0)  # noqa: E731
    js = math.sqrt(h([2 / 3, 1 / 6, 1 / 6]) - (0 + math.log2(3)) / 2)
    assert dist2[0, 3] == pytest.approx(js)
    with pytest.raises(ValueError, match="units differ"):
        head_distances([[_map(att)], [_map(att, labels=("<bos>", "a", "b"))]])
    table = head_clusters(dist, heads, roles={"L0H2": "previous token"})
    assert table.role.tolist() == ["", "", "previous token"] and {"x", "y"} <= set(table.columns)
    xy = table[["x", "y"]].to_numpy()
    assert np.linalg.norm(xy[0] - xy[1]) < 0.1 < np.linalg.norm(xy[0] - xy[2])


def test_figures_from_hand_built_results():
    from headscope.reports.syntax import cluster_plot, relation_bars, relation_grid, tree_figure

    select, test = _records(_split(15)), _records(_split(20))
    choice = choose_tree_head(select, torch.tensor([0.0, 1.0]))
    r = score_syntax(select, test, model="m", treebank="t", selection="s", layer_ids=[0], head_ids=[0, 1],
                     tree_selection=choice, n_perm=200)
    fig = relation_bars(r)
    ax = fig.axes[0]
    crowned = [x for x in r.relations if x.direction == "dependent->head" and x.best_head is not None]
    assert len(ax.patches) == 2 * len(crowned) and any("det *" in t.get_text() for t in ax.get_yticklabels())
    grid = relation_grid(r, "det")
    assert grid.axes[0].images[0].get_array().shape == (1, 2)
    with pytest.raises(ValueError, match="no relation"):
        relation_grid(r, "nope")
    tree = tree_figure(r.trees)
    assert [t.get_text() for t in tree.axes[0].texts][: len(r.trees.example)] == list(r.trees.example.forms)
    import pandas as pd

    clusters = pd.DataFrame({"model": ["m"] * 3, "layer": [0, 1, 1], "head": [0, 0, 1], "name": ["a", "b", "c"],
                             "x": [0.0, 1.0, 2.0], "y": [0.0, 1.0, 0.0], "role": ["", "previous token", ""]})
    fig = cluster_plot(clusters)
    assert [t.get_text() for t in fig.axes[0].texts] == ["previous token"]


@pytest.mark.slow
def test_minilm_on_a_slice_of_ewt(minilm, shared_data):
    from headscope.workflows.syntax import syntax

    ewt = shared_data / "ud-english-ewt"
    r = syntax(minilm, ewt / "en_ewt-ud-test.conllu", select_on=ewt / "en_ewt-ud-dev.conllu", limit=60,
               n_perm=500, tree_sample=10)
    assert r.n_sentences == 60 and r.n_skipped == 0
    det = r.relation("det")
    assert det.n > 50 and det.best_head is not None and det.heldout_accuracy > det.baseline_accuracy
    assert r.trees.uuas > r.trees.right_branching_uuas


def test_syntax_clusters_on_tiny_models(tmp_path):
    import pandas as pd

    from headscope.probe.tiny import tiny_model
    from headscope.workflows.syntax import syntax_clusters

    path = _sentences_file(tmp_path, "t.conllu", 3)
    bert, gpt2 = tiny_model("bert"), tiny_model("gpt2")
    roles = pd.DataFrame({"model": ["tiny-bert", "tiny-bert"], "layer": [1, 1], "head": [2, 2],
                          "role": ["previous token", "broad"], "metric": ["a", "b"], "value": [0.9, 0.5]})
    table = syntax_clusters([bert], path, n_sentences=4, roles=roles)
    assert len(table) == 8 and table.set_index("name").role["L1H2"] == "previous token"
    assert table.drop(columns="role").notna().all().all()
    with pytest.raises(ValueError, match="units differ"):  # [CLS] ... [SEP] vs the decoder's bare words
        syntax_clusters([bert, gpt2], path, n_sentences=2)


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_syntax_recompute_equals_eager(tmp_path, family):
    from headscope.probe.tiny import tiny_model
    from headscope.workflows.syntax import syntax

    lm = tiny_model(family)
    test = _sentences_file(tmp_path, "test.conllu", 4)
    kw = dict(n_perm=200, tree_sample=4)
    eager = syntax(lm, test, **kw).to_frame()
    got = syntax(lm, test, attention="recompute", budget=2_000, **kw).to_frame()
    assert list(got.columns) == list(eager.columns) and len(got) == len(eager)
    numeric = eager.select_dtypes("number").columns
    np.testing.assert_allclose(got[numeric].to_numpy(float), eager[numeric].to_numpy(float), atol=1e-5, rtol=0)
