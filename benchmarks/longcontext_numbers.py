"""The numbers behind "heads for long context" on a packaged decoder (CPU), through the public API.

    nice -n 10 python benchmarks/longcontext_numbers.py OUT.json smollm2 [N_HELD_OUT] [LENGTH] [N_SELECTION] [THREADS]

One pass of `hs.retrieval` (results go to OUT.json, with the seconds it took):
- needles: N_SELECTION (default 6) selection and N_HELD_OUT (default 40) held-out needle prompts of LENGTH
  (default 1500) tokens over the first half of the built-in corpus, depths 0.15 … 0.75 (every needle further
  back than the default recent window of 256 keys);
- retrieval scores on the selection needles; the causal check on the held-out ones: the top 5% of heads
  zeroed against 10 random sets of as many, from the question on (scope "question": each needle's context
  is prefilled once by the full model and shared by every condition);
- streaming sensitivity: each KV head streamed alone, the KL divergence over the last 64 positions of
  LENGTH tokens of the corpus's second half (the held-out text);
- the cost curve: plans by retrieval score, by sensitivity and by both combined at 25 / 50 / 75% full KV heads,
  10 random plans at 50%, all streaming and all full, with the default sink and recent sizes (DuoAttention's
  128 / 256): held-out needle accuracy and the perplexity of the held-out text's last 256 tokens (scope
  "question"), KV bytes at each point.
"""

from __future__ import annotations

import json
import sys
import time

import torch

import headscope as hs
from headscope.probe.types import json_safe

DEPTHS = (0.15, 0.3, 0.45, 0.6, 0.75)


def main() -> None:
    path, name = sys.argv[1], sys.argv[2]
    n_held = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    length = int(sys.argv[4]) if len(sys.argv) > 4 else 1500
    n_sel = int(sys.argv[5]) if len(sys.argv) > 5 else 6
    threads = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    torch.set_num_threads(threads)
    lm = hs.load(name)
    t0 = time.time()
    r = hs.retrieval(lm, n_needles=n_sel + n_held, n_selection=n_sel, lengths=[length], depths=DEPTHS,
                     n_random=10, sensitivity=True, sensitivity_queries=64, scope="question",
                     curve=(0.25, 0.5, 0.75), n_random_plans=10, random_fractions=(0.5,), progress=True)
    out = {"model": name, "held_out": n_held, "selection": n_sel, "length": length, "threads": threads,
           "seconds": time.time() - t0, "result": r.to_dict(),
           "kv_table": r.kv_frame().to_dict(orient="records")}
    with open(path, "w") as f:
        json.dump(json_safe(out), f, indent=2)
    if r.check is not None:
        print(r.check.verdict)
    for line in r.to_dict()["curve_verdicts"]:
        print(line)


if __name__ == "__main__":
    main()
