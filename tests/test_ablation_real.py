"""The ablation engine on the packaged models (slow): a known ablation result, and the model left untouched."""

import hashlib

import pytest
import torch

import headscope as hs
from headscope.workflows import ablation
from headscope import heads as run_heads

pytestmark = pytest.mark.slow


def _weights_hash(model) -> str:
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def test_top_induction_heads_matter_far_more_than_random_heads_on_smollm2(smollm2):
    """Olsson et al. 2022: without its induction heads the model cannot copy the second half."""
    scores = run_heads(smollm2, ["The cat sat."], induction_sequences=6, induction_length=25)
    top = [(int(r.layer), int(r.head)) for r in scores.top("induction", 5).itertuples()]
    before = _weights_hash(smollm2.model)
    r = ablation.ablate(smollm2, top, method="zero", task=ablation.InductionTask(n_sequences=3, length=20),
                        n_random=9, seed=1, batch_size=3)
    assert _weights_hash(smollm2.model) == before
    assert r.p_value == pytest.approx(0.1)  # stronger than all 9 random sets: the smallest p for 9 draws
    # "Far more": above every random set, and more than three times their mean effect (a random set of 5
    # of 270 heads can still hit an important early head, so the largest draw is not the yardstick).
    assert r.effect > 1.0 and r.effect > max(r.random_effects) and r.effect > 3 * r.random_mean


def test_uniform_ablation_on_minilm_keeps_the_model_and_moves_the_embedding(minilm):
    before = _weights_hash(minilm.model)
    texts = ["The animal didn't cross the street because it was too tired.", "Mary told John."]
    r = ablation.ablate(minilm, [(0, 0), (1, 3)], method="uniform", corpus=texts, n_random=2)
    assert _weights_hash(minilm.model) == before
    assert r.effect_metric == "sentence_cosine" and 0.5 < r.effect < 1.0
    [m] = hs.norm_attention(minilm, texts[1])
    assert m.per_head.shape[:2] == (6, 12) and torch.isfinite(m.per_layer).all()
