"""The cost curve of plans by DuoAttention's learned gates, on the held-out needles of a curve run (CPU).

    nice -n 10 python benchmarks/longcontext_gate_plans.py RUN.json GATES.json OUT.json [THREADS] [prompt N]

RUN.json is `longcontext_numbers.py`'s output (its needles, window and curve fractions), GATES.json
`longcontext_gates.py`'s (the gates learned on its selection needles). The run's needles are made again from
its settings (the same seed, counts, lengths and depths: `hs.retrieval`'s own `make_needles` and
`needle_prompt`, the haystack from the built-in corpus's first half) and checked against the run's prompt
lengths; the needles the gates were learned on must not be among the held-out ones (checked by key). Each
fraction of the run's curve gets the plan by gate (`KVPlan.from_ranking` of the gates, as `ranking="gate"`
builds it), costed by `hs.plan_cost` on the held-out needles with the run's scope and the perplexity of the
run's held-out text (the corpus's second half, its first LENGTH tokens) — the same columns as the run's curve,
so the rows sit beside it.

With `prompt N`: the masks at every token (DuoAttention streams the prefill too; scope "prompt") on the first N
held-out needles, for the plans at 50% by gate and by retrieval score, the run's first 3 random plans at 50%
(the same seeds, `curve_plans`), all streaming and all full — each plan its own prefill, so a fraction of the
question-scope curve's plans.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import torch

import headscope as hs
from common import kv_grid
from headscope.probe.kvplan import make_needles
from headscope.probe.longcontext import kv_layout, needle_prompt
from headscope.probe.types import json_safe
from headscope.workflows.retrieval import curve_plans


def main() -> None:
    run, gates_run, path = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
    torch.set_num_threads(int(sys.argv[4]) if len(sys.argv) > 4 else 1)
    scope = sys.argv[5] if len(sys.argv) > 5 else None
    settings, result = run["result"]["settings"], run["result"]
    lm = hs.load(run["model"])
    layout = kv_layout(lm)
    lines = hs.builtin_corpus()
    half = len(lines) // 2
    n_needles = run["held_out"] + run["selection"]
    needles = make_needles(n_needles, lengths=settings["lengths"], depths=settings["depths"], seed=settings["seed"],
                           n_lines=half, n_selection=run["selection"])
    prompts = [needle_prompt(lm, n, lines[:half]) for n in needles]
    if [p.n_tokens for p in prompts] != list(result["prompt_tokens"]):
        raise SystemExit("the needles made again do not match the run's prompt lengths: another corpus or code")
    held = [p for p in prompts if p.needle.split == "held_out"]
    g_settings = gates_run["settings"]
    trained = make_needles(2 * gates_run["selection"], lengths=g_settings["lengths"], depths=g_settings["depths"],
                           seed=g_settings["seed"], n_lines=half, n_selection=gates_run["selection"])
    trained_keys = {n.key for n in trained if n.split == "selection"}
    leaked = trained_keys & {p.key for p in held}
    if leaked:
        raise SystemExit(f"the gates were learned on held-out needles {sorted(leaked)}")
    gates = np.array(gates_run["gates"], dtype=float)
    if scope == "prompt":
        plans = curve_plans(layout, {"gate": gates, "retrieval": kv_grid(run, "kv_retrieval_score", layout.shape)}, [0.5], 3, sink=settings["sink"],
                            recent=settings["recent"], seed=settings["seed"], random_fractions=(0.5,))
        held = held[: int(sys.argv[6])]
    else:
        plans = [hs.KVPlan.from_ranking(gates, f, sink=settings["sink"], recent=settings["recent"],
                                        planned=np.array(layout.planned), own_window=layout.own_window,
                                        name=f"gate {f:.0%}") for f in settings["curve"]]
    text = list(lm.tokenizer(" ".join(lines[half:]))["input_ids"])[: settings["held_out_text_tokens"]]
    start = time.time()
    frame = hs.plan_cost(lm, plans, held, text, scope=scope or settings["scope"], progress=True)
    out = {"model": run["model"], "run": sys.argv[1], "gates": sys.argv[2], "held_out": len(held),
           "gate_training_keys_in_run_selection": sorted(trained_keys & {p.key for p in prompts}),
           "gate_settings": {k: g_settings["gates"][k] for k in ("steps", "tokens", "l1", "lr")},
           "seconds": time.time() - start, "curve": frame.to_dict(orient="records")}
    with open(path, "w") as f:
        json.dump(json_safe(out), f, indent=2)
    print(frame.to_string())


if __name__ == "__main__":
    main()
