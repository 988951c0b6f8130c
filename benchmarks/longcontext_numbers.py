"""The numbers behind "heads for long context" on a packaged decoder (CPU), through the public API.

    nice -n 10 python benchmarks/longcontext_numbers.py OUT.json smollm2 [N_NEEDLES] [LENGTH]

Results go to OUT.json after every step (a partial run keeps its numbers):
- retrieval: `hs.retrieval` on N_NEEDLES (default 12) needle prompts of LENGTH (default 1200) tokens over the
  first half of the built-in corpus, depths 0.1 … 0.9: every head's retrieval score on the selection half, and
  the causal check on the held-out half (the top 5% of heads zeroed against 10 random sets of as many);
- timing: one held-out needle answered greedily, and answered with every head's top key recorded (the
  retrieval score's cost against one generation of the answer);
- plans: `hs.plan_cost` on the held-out needles and the second half of the built-in corpus (LENGTH tokens):
  the plans by retrieval score at 25 / 50 / 75% full KV heads, 10 random plans at 50%, all streaming and
  all full, with the default sink and recent sizes.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import torch

import headscope as hs
from headscope.probe.kvplan import KVPlan, default_window
from headscope.probe.longcontext import answer, kv_layout, needle_prompt
from headscope.probe.types import json_safe

N_RANDOM_PLANS = 10


def main() -> None:
    path, name = sys.argv[1], sys.argv[2]
    n_needles = int(sys.argv[3]) if len(sys.argv) > 3 else 12
    length = int(sys.argv[4]) if len(sys.argv) > 4 else 1200
    torch.set_num_threads(1)
    out: dict = {"model": name, "needles": n_needles, "length": length}

    def save() -> None:
        with open(path, "w") as f:
            json.dump(json_safe(out), f, indent=2)

    lm = hs.load(name)
    t0 = time.time()
    r = hs.retrieval(lm, n_needles=n_needles, lengths=[length], n_random=10)
    out["retrieval"] = r.to_dict() | {"seconds": time.time() - t0}
    save()
    lines = hs.builtin_corpus()
    half = len(lines) // 2
    held = [needle_prompt(lm, n, lines[:half]) for n in r.needles if n.split == "held_out"]
    steps = r.settings["max_new_tokens"]
    t0 = time.time()
    answer(lm, held[0].ids, max_new_tokens=steps)
    t1 = time.time()
    answer(lm, held[0].ids, max_new_tokens=steps, top_keys=True)
    out["timing"] = {"answer_s": t1 - t0, "scored_answer_s": time.time() - t1, "prompt_tokens": held[0].n_tokens}
    save()
    layout = kv_layout(lm)
    sink, recent = default_window(lm.max_length)
    common = dict(sink=sink, recent=recent, planned=np.array(layout.planned), own_window=layout.own_window)
    n_half = int(round(0.5 * sum(layout.planned) * layout.n_kv_heads))
    plans = [KVPlan.from_ranking(r.scores.kv_score(), f, name=f"retrieval {f:.0%}", **common) for f in (0.25, 0.5, 0.75)]
    plans += [KVPlan.random(layout.shape, n_half, seed=s, **common) for s in range(N_RANDOM_PLANS)]
    plans += [KVPlan.all_streaming(layout.shape, **common), KVPlan.all_full(layout.shape, **common)]
    text_ids = list(lm.tokenizer(" ".join(lines[half:]))["input_ids"])[:length]
    costs = hs.plan_cost(lm, plans, held, text_ids)
    out["plans"] = costs.to_dict(orient="records")
    save()


if __name__ == "__main__":
    main()
