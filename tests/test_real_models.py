"""The packaged pretrained models: shapes, causality, batch identity, verification, one known fact each."""

import pytest
import torch

from headscope.probe.extract import extract
from headscope.probe.verify import verify

pytestmark = pytest.mark.slow

IT_ANIMAL = "The animal didn't cross the street because it was too tired."
TEXTS = [IT_ANIMAL, "我爱北京天安门", "Short one.", "Mary told John that she would call him tomorrow, and he agreed."]


def _check_maps(lm, causal: bool):
    batched = extract(lm, TEXTS, batch_size=4)
    for text, m in zip(TEXTS, batched):
        L, H = lm.config.num_hidden_layers, lm.config.num_attention_heads
        assert m.attention.shape == (L, H, len(m), len(m))
        torch.testing.assert_close(m.attention.sum(-1), torch.ones(L, H, len(m)), atol=1e-5, rtol=0)
        upper = torch.triu(torch.ones(len(m), len(m), dtype=torch.bool), 1)
        assert (m.attention[..., upper].abs().max() == 0) == causal
        [single] = extract(lm, text, batch_size=1)
        torch.testing.assert_close(m.attention, single.attention, atol=1e-5, rtol=0)
    return batched


def test_minilm(minilm):
    maps = _check_maps(minilm, causal=False)
    assert maps[0].labels[0] == "[CLS]" and maps[0].labels[-1] == "[SEP]" and maps[0].special[0]
    [w] = extract(minilm, "我爱北京天安门", level="word")
    assert [lab for lab, sp in zip(w.labels, w.special) if not sp] == list("我爱北京天安门")
    v = verify(minilm)
    assert v.passed and v.max_abs_err < 1e-5 and len(v.layers) == 6 and v.n_heads == 12


@torch.inference_mode()
def test_minilm_known_fact_sentence_similarity(minilm):
    # all-MiniLM-L6-v2 is a sentence embedder: mean-pooled, normalised states rank a paraphrase first.
    sents = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."]
    batch = minilm.tokenizer(sents, padding=True, return_tensors="pt")
    states = minilm.model(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None]
    emb = torch.nn.functional.normalize((states * mask).sum(1) / mask.sum(1), dim=-1)
    assert emb[0] @ emb[1] > 0.6 > emb[0] @ emb[2]


def test_smollm2(smollm2):
    maps = _check_maps(smollm2, causal=True)
    # byte-level BPE: a CJK character may take several byte tokens; they share one word
    [w] = extract(smollm2, "我爱北京天安门", level="word")
    assert "".join(lab for lab, sp in zip(w.labels, w.special) if not sp) == "我爱北京天安门"
    assert maps[0].labels[:3] == ("The", "animal", "didn")
    v = verify(smollm2)
    assert v.passed and v.max_abs_err < 1e-5 and len(v.layers) == 30 and v.n_heads == 9


@torch.inference_mode()
def test_smollm2_knows_paris(smollm2):
    ids = smollm2.tokenizer("The capital of France is", return_tensors="pt")
    out = smollm2.model.generate(**ids, max_new_tokens=2, do_sample=False)
    assert smollm2.tokenizer.decode(out[0, ids["input_ids"].shape[1]:]).startswith(" Paris")


def test_gemma3_verifies_past_its_sliding_window(gemma3):
    assert gemma3.config.sliding_window == 512
    long = " ".join(f"Sentence {i} says the animal was tired." for i in range(70))  # > 512 tokens
    v = verify(gemma3, [long, IT_ANIMAL, "我爱北京天安门"])
    assert v.n_tokens > 600
    assert v.passed and v.max_abs_err < 1e-5 and len(v.layers) == 18, v.to_frame()
    [m] = extract(gemma3, long, layers=[0, 5])
    assert m.attention[0, :, 600, :80].abs().max() == 0  # layer 0 is local: 512-token window
    assert m.attention[1, :, 600, :80].abs().max() > 0  # layer 5 is global
