"""The numbers behind "does the head matter?" on the packaged models (CPU).

    python benchmarks/ablation_numbers.py OUT.json top_k:smollm2 top_k:gemma3-270m importance:smollm2 \
        each:smollm2 each:gemma3-270m encoder:minilm

Steps, each `KIND:MODEL`, results written to OUT.json after every step (a partial run keeps its numbers):
- top_k: every head's induction score (repeated random tokens, TransformerLens's score), then the
  induction-task effect (loss on the second copy) of zero-ablating the top-5 and top-10 induction
  heads against random sets of as many heads;
- importance: gradient head importance over the first texts of the built-in corpus;
- each: every head ablated alone on the induction task, and the Spearman ρ across heads between
  the induction score (and the importance, when computed) and that effect, with Fisher-z and
  bootstrap 95% intervals — does looking predict mattering?
- encoder: importance ranking of an encoder and its top-5 heads ablated against random heads
  (sentence-embedding cosine).
- roles: head scores over the corpus, then for each role metric its top-3 heads ablated together
  against random sets of 3, and every head alone, with Spearman ρ (Fisher-z interval,
  `analyses.evidence.spearman_interval`) of each role score against the single-head harm — the
  report's ablation evidence at benchmark sizes.
"""

from __future__ import annotations

import json
import math
import sys
import time
from contextlib import contextmanager

import numpy as np
import torch
from scipy import stats

from headscope.workflows import ablation
from pathlib import Path

import headscope.analyses
from headscope.analyses.corpus import read_corpus
from headscope import heads
from headscope.probe import load_model
from headscope.probe.types import head_name, json_safe

N_RANDOM = 19  # the smallest p is then 0.05
# Sizes that fit two shared CPU cores: induction scores from 10 repeated sequences of 30 tokens,
# the top-K ablations on 5 sequences of 25, every head alone on 2 sequences of 20.
SCORE_SEQS, SCORE_LEN = 10, 30
TOPK_TASK = ablation.InductionTask(n_sequences=5, length=25, seed=0)
EACH_TASK = ablation.InductionTask(n_sequences=2, length=20, seed=0)
IMPORTANCE_TEXTS = 16
# builtin_corpus() finds its file as resources of the top-level name "analyses", which resolves
# only with the repository root on sys.path; read the same file through the installed package.
CORPUS = read_corpus(Path(headscope.analyses.__file__).parent / "data" / "corpus.txt")[:64]


def spearman_with_intervals(x: np.ndarray, y: np.ndarray, *, n_boot: int = 2000, seed: int = 0) -> dict:
    rho = float(stats.spearmanr(x, y).statistic)
    n = len(x)
    z, se = math.atanh(rho), 1.06 / math.sqrt(n - 3)  # Fieller et al. 1957 variance for Spearman's ρ
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot):
        i = rng.integers(0, n, n)
        boots.append(stats.spearmanr(x[i], y[i]).statistic)
    lo, hi = np.nanpercentile(boots, [2.5, 97.5])
    return {"rho": rho, "n_heads": n, "fisher_z_95": [math.tanh(z - 1.96 * se), math.tanh(z + 1.96 * se)],
            "bootstrap_95": [float(lo), float(hi)], "p_value": float(stats.spearmanr(x, y).pvalue)}


_MODELS: dict = {}


def _model(name: str):
    if name not in _MODELS:
        _MODELS[name] = load_model(name)
    return _MODELS[name]


@contextmanager
def _step(name: str, out: dict, save, seconds: str):
    """One measurement of model `name`: its model and its results dict `out[name]`; the seconds the
    measurement took are recorded under `seconds` and the results saved at the end."""
    t0 = time.time()
    res = out.setdefault(name, {})
    yield _model(name), res
    res[seconds] = time.time() - t0
    save()


def _induction_scores(lm, res: dict, save) -> None:
    """Every head's induction score into `res` (and the 10 highest), once."""
    scores = heads(lm, CORPUS[:2], induction_sequences=SCORE_SEQS, induction_length=SCORE_LEN, seed=0)
    grid = scores.grid("induction")  # layer x head
    res["induction_scores"] = {head_name(int(l), int(h)): float(grid.loc[l, h]) for l in grid.index for h in grid.columns}
    res["top_induction_heads"] = sorted(res["induction_scores"].items(), key=lambda kv: -kv[1])[:10]
    save()


def top_k(name: str, out: dict, save, ks=(5, 10)) -> None:
    """Induction scores, then the top-K induction heads ablated against random sets of K."""
    from headscope.probe.types import parse_head

    with _step(name, out, save, "seconds_top_k") as (lm, res):
        res["settings"] = {"score_sequences": SCORE_SEQS, "score_length": SCORE_LEN, "topk_task": vars(TOPK_TASK),
                           "each_task": vars(EACH_TASK), "n_random": N_RANDOM, "importance_texts": IMPORTANCE_TEXTS}
        _induction_scores(lm, res, save)
        ranked = sorted(res["induction_scores"].items(), key=lambda kv: -kv[1])
        order = [parse_head(k) for k, _ in ranked]
        for k in ks:
            r = ablation.ablate(lm, order[:k], method="zero", task=TOPK_TASK, n_random=N_RANDOM, seed=1, batch_size=5)
            res[f"ablate_top{k}_zero"] = r.to_dict()
            print(name, r.verdict, flush=True)
            save()


def importance(name: str, out: dict, save) -> None:
    with _step(name, out, save, "seconds_importance") as (lm, res):
        imp = ablation.importance(lm, CORPUS[:IMPORTANCE_TEXTS], batch_size=4)
        res["importance"] = {head_name(r.layer, r.head): r.importance for r in imp.to_frame().itertuples()}
        res["importance_top10"] = list(res["importance"].items())[:10]
        res["importance_loss"] = imp.loss


def each(name: str, out: dict, save) -> None:
    """Every head ablated alone; Spearman ρ of its induction score (and importance) with that effect."""
    with _step(name, out, save, "seconds_each") as (lm, res):
        frame = ablation.ablate_each(lm, method="zero", task=EACH_TASK, batch_size=2, progress=True)
        eff = {head_name(int(r.layer), int(r.head)): float(r.effect) for r in frame.itertuples()}
        res["single_head_effect"] = eff
        res["single_head_effect_top10"] = sorted(eff.items(), key=lambda kv: -kv[1])[:10]
        keys = sorted(eff)
        y = np.array([eff[k] for k in keys])
        x = np.array([res["induction_scores"][k] for k in keys])
        res["spearman_induction_score_vs_single_ablation"] = spearman_with_intervals(x, y)
        if "importance" in res:
            imp = np.array([res["importance"][k] for k in keys])
            res["spearman_importance_vs_single_ablation"] = spearman_with_intervals(imp, y)


def attrib(name: str, out: dict, save) -> None:
    """Every head's single-head zero-ablation effect to first order, from one backward pass per batch.

    With the head mask ξ (all ones), zeroing head h changes the loss by about −∂L/∂ξ_h
    (attribution patching): one gradient gives all heads, where ablating them one by one costs one
    forward pass each. A few heads are then ablated for real to check the estimate.
    """
    import torch.nn.functional as F

    from headscope import induction_inputs
    from headscope.probe.encoding import Encoded, pad_batch
    from headscope.probe.interventions import head_mask

    with _step(name, out, save, "seconds_attrib") as (lm, res):
        if "induction_scores" not in res:
            _induction_scores(lm, res, save)
        task = TOPK_TASK
        seqs, prefix = induction_inputs(lm, n_sequences=task.n_sequences, length=task.length, seed=task.seed)
        start = len(prefix) + task.length
        L, H = lm.config.num_hidden_layers, lm.config.num_attention_heads
        total = torch.zeros(L, H, dtype=torch.float64)
        for first in range(0, len(seqs), 1):
            chunk = [Encoded("", s, ((0, 0),) * len(s), (False,) * len(s)) for s in seqs[first : first + 1]]
            ids, mask = pad_batch(chunk, lm.device)
            xi = torch.ones(len(chunk), L, H, requires_grad=True)
            with torch.enable_grad(), head_mask(lm, xi):
                logits = lm.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
                nll = F.cross_entropy(logits[:, start - 1 : -1].float().transpose(1, 2), ids[:, start:], reduction="none")
                (grad,) = torch.autograd.grad(nll.mean(1).sum(), xi)
            total += grad.sum(0).double()
        est = {head_name(l, h): float(-total[l, h] / len(seqs)) for l in range(L) for h in range(H)}
        res["attribution_effect"] = est
        res["attribution_effect_top10"] = sorted(est.items(), key=lambda kv: -kv[1])[:10]
        keys = sorted(est)
        x = np.array([res["induction_scores"][k] for k in keys])
        y = np.array([est[k] for k in keys])
        res["spearman_induction_score_vs_attribution_effect"] = spearman_with_intervals(x, y)
        save()
        from headscope.probe.types import parse_head

        check = [k for k, _ in res["attribution_effect_top10"][:3]] + keys[:: max(1, len(keys) // 3)][:3]
        real = {}
        for k in check:
            r = ablation.ablate(lm, [parse_head(k)], method="zero", task=task, n_random=0, batch_size=5)
            real[k] = {"estimated": est[k], "ablated": r.effect}
            res["attribution_check"] = real
            save()


def encoder(name: str, out: dict, save) -> None:
    with _step(name, out, save, "seconds") as (lm, res):
        imp = ablation.importance(lm, CORPUS)
        frame = imp.to_frame()
        res["importance_loss"] = imp.loss
        res["importance_top10"] = [[head_name(r.layer, r.head), r.importance] for r in frame.head(10).itertuples()]
        save()
        top = [(int(r.layer), int(r.head)) for r in frame.head(5).itertuples()]
        r = ablation.ablate(lm, top, method="zero", corpus=CORPUS, n_random=N_RANDOM, seed=1)
        res["ablate_top5_importance_zero"] = r.to_dict()
        print(r.verdict, flush=True)


def roles(name: str, out: dict, save, k: int = 3) -> None:
    from headscope.analyses.evidence import role_grids, spearman_interval
    from headscope.analyses.metrics import METRICS

    t0 = time.time()
    with _step(name, out, save, "seconds_roles") as (lm, res):
        scores = heads(lm, CORPUS, induction_sequences=SCORE_SEQS, induction_length=SCORE_LEN, seed=0)
        grids = role_grids(scores)
        res["role_top_heads_ablated"] = {}
        for metric in grids:
            top = [(int(r.layer), int(r.head)) for r in scores.top(metric, k=k).itertuples()]
            r = ablation.ablate(lm, top, method="zero", corpus=CORPUS, n_random=N_RANDOM, seed=1)
            res["role_top_heads_ablated"][f"{METRICS[metric].role} ({metric})"] = r.to_dict()
            print(name, metric, r.verdict, flush=True)
            save()
        res["seconds_roles_topk"] = time.time() - t0
        frame = ablation.ablate_each(lm, method="zero", corpus=CORPUS[:32])
        single = frame["effect"].to_numpy().reshape(lm.config.num_hidden_layers, lm.config.num_attention_heads)
        harm = single if lm.is_causal else -single  # larger = hurt more (loss up, cosine down)
        res["single_head_effect_32_texts"] = {head_name(int(r.layer), int(r.head)): float(r.effect)
                                              for r in frame.itertuples()}
        res["spearman_role_score_vs_single_harm"] = {
            m: spearman_interval(g.ravel(), harm.ravel(), score=m).to_dict() for m, g in grids.items()}


def main() -> None:
    path, names = sys.argv[1], sys.argv[2:]
    torch.set_num_threads(2)
    out: dict = {}

    def save() -> None:
        with open(path, "w") as f:
            json.dump(json_safe(out), f, indent=2)

    for step in names:  # e.g. top_k:smollm2 top_k:gemma3-270m importance:smollm2 each:smollm2 encoder:minilm
        kind, name = step.split(":")
        {"top_k": top_k, "importance": importance, "each": each, "encoder": encoder, "attrib": attrib, "roles": roles,
         "top_5": lambda name, out, save: top_k(name, out, save, ks=(5,))}[kind](name, out, save)


if __name__ == "__main__":
    main()
