"""The explorer's needle view (POST /api/needle): a head's top-attended key at each answer step of a needle prompt,
checked against the copy-paste test computed here by hand from `answer(top_keys=True)`, and its refusals."""

import json

import numpy as np
import pytest

from conftest import _tiny
from headscope.analyses.corpus import builtin_corpus
from headscope.probe.kvplan import make_needles, typed_needle
from headscope.probe.longcontext import answer, needle_prompt, retrieval_hits
from headscope.workflows.explore import Explorer, Limits

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from starlette.testclient import TestClient  # noqa: E402

from headscope.serve import app  # noqa: E402

# tiny-llama, 120 tokens, the needle at the end, seed 2: two of its greedy steps copy a needle token (checked below)
ASK = {"model": "m", "length": 120, "depth": 1.0, "seed": 2}


@pytest.fixture(scope="module")
def client():
    return TestClient(app(Explorer({"m": _tiny("llama"), "enc": _tiny("bert"), "gpt2": _tiny("gpt2")},
                                   limits=Limits(max_needle_tokens=124))), base_url="http://127.0.0.1:8765")


def _by_hand(lm, needle, lines):
    """The prompt, and per step whether it copied and each head's hit, by Wu et al.'s definition, from the raw
    answer: a copy step writes a token of the needle; a head hits when its top key is in the needle and holds it."""
    prompt = needle_prompt(lm, needle, lines)
    steps = 2 + len(lm.tokenizer(" " + needle.key, add_special_tokens=False)["input_ids"]) if needle.key else 8
    ans = answer(lm, prompt.ids, max_new_tokens=steps, top_keys=True)
    seq = list(prompt.ids) + list(ans.ids)
    start, stop = prompt.span
    copied, hit = [], np.zeros(ans.top_keys.shape, bool)
    for t, w in enumerate(ans.ids):
        copied.append(w in prompt.ids[start:stop])
        for l, h in np.ndindex(ans.top_keys.shape[1:]):
            k = ans.top_keys[t, l, h]
            hit[t, l, h] = copied[-1] and start <= k < stop and seq[k] == w
    return prompt, ans, copied, hit


def test_each_head_s_top_keys_hits_and_score_are_the_copy_paste_test(client):
    lm = _tiny("llama")
    lines = builtin_corpus()[: len(builtin_corpus()) // 2]  # retrieval's haystack half
    [needle, _] = make_needles(2, lengths=[120], depths=[1.0], seed=2, n_lines=len(lines))
    prompt, ans, copied, hit = _by_hand(lm, needle, lines)
    assert sum(copied) >= 1 and hit.any()  # the case shows something: a copy step and a head that hit
    hits, copies = retrieval_hits(prompt, ans)
    assert copies == sum(copied) and (hits == hit.sum(0)).all()
    for layer, head in np.ndindex(hit.shape[1:]):
        r = client.post("/api/needle", json={**ASK, "layer": layer, "head": head})
        assert r.status_code == 200, r.text
        j = r.json()
        assert j["labels"] == list(prompt.labels) and j["span"] == list(prompt.span)
        assert len(j["labels"]) == len(prompt.ids) and needle.key in "".join(j["labels"][slice(*j["span"])])
        assert j["needle"]["key"] == needle.key and j["needle"]["generated"] is True
        assert [s["top"] for s in j["steps"]] == ans.top_keys[:, layer, head].tolist()
        assert [s["copied"] for s in j["steps"]] == copied
        assert [s["hit"] for s in j["steps"]] == hit[:, layer, head].tolist()
        assert [s["in_needle"] for s in j["steps"]] == [prompt.span[0] <= k < prompt.span[1]
                                                        for k in ans.top_keys[:, layer, head]]
        assert (j["hits"], j["copies"]) == (int(hit[:, layer, head].sum()), sum(copied))
        assert j["score"] == pytest.approx(j["hits"] / j["copies"]) and j["note"] is None
        assert j["scores"] == (hit.sum(0) / sum(copied)).tolist()
        assert j["retrieved"] is (needle.key in ans.text.replace(" ", ""))


def test_a_typed_needle_is_highlighted_where_it_was_put(client):
    lm = _tiny("llama")
    body = {"model": "m", "layer": 1, "head": 0, "needle": "Its code is 4711.", "question": "Code:", "key": "4711",
            "length": 110, "depth": 0.0, "seed": 0}
    j = client.post("/api/needle", json=body).json()
    lines = builtin_corpus()[: len(builtin_corpus()) // 2]
    needle = typed_needle("Its code is 4711.", "Code:", length=110, depth=0.0, key="4711")
    prompt, ans, copied, hit = _by_hand(lm, needle, lines)
    assert j["span"] == list(prompt.span) and j["span"][0] <= 1  # depth 0: the needle opens the prompt
    shown = "".join(j["labels"][slice(*j["span"])])
    assert shown.startswith("Its") and shown.endswith("4711.") and "".join(j["labels"]).count("4711") == 1
    assert [s["copied"] for s in j["steps"]] == copied and [s["hit"] for s in j["steps"]] == hit[:, 1, 0].tolist()
    assert j["needle"] == {"sentence": "Its code is 4711.", "question": "Code:", "key": "4711", "length": 110,
                           "depth": 0.0, "generated": False}


def test_no_copy_step_is_null_and_said_never_nan(client):
    """Tiny GPT-2 copies nothing from this needle (nor from any of seeds 0-2 at depths 0.5 and 1): hits 0 of 0, the score null (Starlette refuses NaN in JSON: this
    was a 500) and the note says why."""
    r = client.post("/api/needle", json={**ASK, "model": "gpt2", "layer": 0, "head": 1})
    assert r.status_code == 200, r.text
    j = r.json()
    assert (j["hits"], j["copies"], j["score"], j["interval"]) == (0, 0, None, [None, None])
    assert "no copy steps" in j["note"] and not any(s["copied"] or s["hit"] for s in j["steps"])
    assert {v for row in j["scores"] for v in row} == {None} and "NaN" not in r.text


@pytest.mark.parametrize("body, status, words", [
    ({"model": "enc"}, 400, "needs a decoder"),
    ({"length": 500}, 400, "ask for a length of at most 120"),
    ({"length": 121}, 400, "limit of 128"),
    ({"length": 125}, 413, "at most 124"),
    ({"length": 40}, 400, "ask for a length above that"),
    ({"length": 1.5}, 400, "length must be a whole number"),
    ({"depth": 1.5}, 400, "in [0, 1], got 1.5"),
    ({"depth": -0.1}, 400, "in [0, 1]"),
    ({"depth": "half"}, 400, "in [0, 1]"),
    ({"needle": ""}, 400, "the needle sentence is empty"),
    ({"needle": "   ", "question": "Q:"}, 400, "the needle sentence is empty"),
    ({"needle": "Its code is 4711.", "question": ""}, 400, "the question is empty"),
    ({"needle": "Its code is 4711.", "question": "Code:", "key": "99"}, 400, "not in the needle sentence"),
    ({"needle": 7}, 400, "needle must be a string"),
    ({"key": "4711"}, 400, "give the sentence too"),
    ({"head": 4}, 400, "head must be a whole number in 0..3"),
    ({"model": "x"}, 404, "not served"),
    ({"text": "a"}, 400, "takes no field text"),
])
def test_bad_needle_requests_get_a_4xx_and_one_line(client, body, status, words):
    r = client.post("/api/needle", json={"model": "m", "layer": 0, "head": 0, "length": 110} | body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in error and "\n" not in error and "unexpected" not in error
    json.dumps(r.json())
