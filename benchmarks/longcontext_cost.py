"""What scoring a long prompt's heads costs against one generation of its answer (CPU, one thread).

    nice -n 10 python benchmarks/longcontext_cost.py OUT.json smollm2 [LENGTH]

One needle prompt of LENGTH (default 4000) tokens over the built-in corpus: its answer generated greedily
(`probe.longcontext.answer`), then generated again with every head's top-attended key recorded at each step
and Wu et al.'s retrieval hits counted (`answer(..., top_keys=True)` + `retrieval_hits`: what `hs.retrieval`
does per selection needle), then the plain generation once more (the two plain runs bracket the scored one, so
a machine that slows or speeds up during the run shows). The issue's bound: scored / generation ≤ 2.
"""

from __future__ import annotations

import json
import sys
import time

import torch

import headscope as hs
from headscope.probe.kvplan import make_needles
from headscope.probe.longcontext import answer, needle_prompt, retrieval_hits


def main() -> None:
    path, name = sys.argv[1], sys.argv[2]
    length = int(sys.argv[3]) if len(sys.argv) > 3 else 4000
    torch.set_num_threads(1)
    lm = hs.load(name)
    lines = hs.builtin_corpus()
    needle = make_needles(2, lengths=[length], depths=[0.3], seed=0, n_lines=len(lines))[0]
    prompt = needle_prompt(lm, needle, lines)
    steps = 2 + len(lm.tokenizer(" " + prompt.key, add_special_tokens=False)["input_ids"])
    times = {}
    t = time.perf_counter()
    plain = answer(lm, prompt.ids, max_new_tokens=steps)
    times["generation_s"] = time.perf_counter() - t
    t = time.perf_counter()
    scored = answer(lm, prompt.ids, max_new_tokens=steps, top_keys=True)
    hits, copies = retrieval_hits(prompt, scored)
    times["scored_s"] = time.perf_counter() - t
    t = time.perf_counter()
    answer(lm, prompt.ids, max_new_tokens=steps)
    times["generation_again_s"] = time.perf_counter() - t
    out = {"model": name, "prompt_tokens": prompt.n_tokens, "new_tokens": len(plain.ids), "threads": 1, **times,
           "ratio": times["scored_s"] / ((times["generation_s"] + times["generation_again_s"]) / 2),
           "same_answer": plain.ids == scored.ids, "retrieved": plain.retrieved(prompt.key), "copy_steps": copies,
           "top_head_hits": int(hits.max())}
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
