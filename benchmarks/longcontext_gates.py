"""DuoAttention's gate optimisation on a packaged decoder (CPU), through the public API, against the retrieval score.

    nice -n 10 python benchmarks/longcontext_gates.py OUT.json smollm2 [STEPS] [LENGTH] [N_SELECTION] [THREADS] [REFERENCE.json]

One pass of `hs.retrieval` (results go to OUT.json, with the seconds it took): N_SELECTION (default 4) selection
needles of LENGTH (default 1000) tokens over the first half of the built-in corpus, depths 0.15 … 0.75 (as
many held-out needles are drawn and left unused: no check, no curve); Wu et al.'s retrieval score on them, and
STEPS (default 20) steps of DuoAttention's gate optimisation on the same prompts with their keys as answers
(Adam, lr 0.1, λ 0.05, the default sink and recent sizes). Written: the learned gates, the loss per step, the
top KV heads by gate, and Spearman's rank correlation and the overlap of the 50% plans between the gates and
the retrieval score pooled per KV head (this run's, and with REFERENCE.json — a `longcontext_numbers.py`
output — that run's retrieval score and streaming sensitivity).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import pandas as pd
import torch

import headscope as hs
from common import kv_grid
from headscope.probe.types import json_safe

DEPTHS = (0.15, 0.3, 0.45, 0.6, 0.75)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ok = np.isfinite(a) & np.isfinite(b)
    return float(pd.Series(a[ok]).rank().corr(pd.Series(b[ok]).rank()))


def overlap(a: np.ndarray, b: np.ndarray, fraction: float = 0.5) -> int:
    plan = lambda s: hs.KVPlan.from_ranking(s, fraction, sink=1, recent=1).full  # noqa: E731
    return int((plan(a) & plan(b)).sum())


def main() -> None:
    path, name = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    length = int(sys.argv[4]) if len(sys.argv) > 4 else 1000
    n_sel = int(sys.argv[5]) if len(sys.argv) > 5 else 4
    threads = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    reference = sys.argv[7] if len(sys.argv) > 7 else None
    torch.set_num_threads(threads)
    lm = hs.load(name)
    start = time.time()
    r = hs.retrieval(lm, n_needles=2 * n_sel, n_selection=n_sel, lengths=[length], depths=DEPTHS, check=False,
                     gate_steps=steps, ranking="gate", seed=0, progress=True)
    seconds = time.time() - start
    gates, kv = r.gates, r.scores.kv_score()
    order = sorted(np.ndindex(gates.shape), key=lambda c: (-gates[c], -c[0], c[1]))
    out = {"model": name, "steps": steps, "length": length, "selection": n_sel, "threads": threads,
           "seconds": seconds, "prompt_tokens": [n for n, d in zip(r.n_tokens, r.needles) if d.split == "selection"],
           "selection_correct": list(r.selection_correct), "settings": r.settings,
           "gates": gates.tolist(),
           "top_gates": [{"kv_head": f"L{l}K{h}", "gate": float(gates[l, h]), "kv_retrieval_score": float(kv[l, h])}
                         for l, h in order[:15]],
           "gates_at_zero": int((gates == 0).sum()), "gates_at_one": int((gates == 1).sum()),
           "spearman_vs_retrieval": spearman(gates, kv), "plan_overlap_50_vs_retrieval": overlap(gates, kv),
           "n_kv_heads": int(np.isfinite(gates).sum())}
    if reference:
        ref = json.load(open(reference))
        for col in ("kv_retrieval_score", "stream_sensitivity"):
            other = kv_grid(ref, col, gates.shape)
            out[f"reference_spearman_{col}"] = spearman(gates, other)
            out[f"reference_plan_overlap_50_{col}"] = overlap(gates, other)
    with open(path, "w") as f:
        json.dump(json_safe(out), f, indent=1)
    print(json.dumps({k: v for k, v in json_safe(out).items() if k not in ("gates", "settings")}, indent=1))


if __name__ == "__main__":
    main()
