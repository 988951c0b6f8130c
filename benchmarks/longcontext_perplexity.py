"""The cost curve's perplexity on a second held-out text, apart from the one the sensitivity ranking was made on.

    nice -n 10 python benchmarks/longcontext_perplexity.py RUN.json OUT.json [question|prompt] [TEXT_FILE [TOKENS]]

RUN.json is `longcontext_numbers.py`'s output. Its sensitivity ranking streamed each KV head over the last 64
positions of the first LENGTH tokens of the corpus's second half, and its perplexities were of the last 256 of
those same tokens: the sensitivity plans were scored on the text they were ranked on. Here the same plans
(rebuilt from RUN.json's per-KV-head scores by `workflows.retrieval.curve_plans`, the same seeds) are scored on
the tokens after those (the rest of the corpus's second half): with "question" (the default) its last 256
tokens under each plan, the text before them run once by the full model (as in the run); with "prompt" the
plan over the whole text (DuoAttention's streaming from the first token), for the plans at 50%, 3 of the
random ones and all streaming only (a forward over the whole text each; all full is the model's own).

TEXT_FILE: score a long coherent document instead (its first TOKENS tokens, default the run's needle length):
the built-in corpus is short unrelated passages, where far keys barely help prediction, so every plan keeps
its perplexity; a document that refers back to itself (a licence's defined terms, a chapter's names) is where
streaming heads should cost something. The GNU GPL v3 text (https://www.gnu.org/licenses/gpl-3.0.txt, about
7,500 tokens) is one such public document.
"""

from __future__ import annotations

import json
import math
import sys

import torch

import headscope as hs
from common import kv_grid
from headscope.analyses.longcontext import combined_rank
from headscope.probe.longcontext import kv_layout, prefill, token_losses
from headscope.probe.types import json_safe
from headscope.workflows.retrieval import PPL_TOKENS, curve_plans


def main() -> None:
    run, path = json.load(open(sys.argv[1])), sys.argv[2]
    scope = sys.argv[3] if len(sys.argv) > 3 else "question"
    torch.set_num_threads(1)
    lm = hs.load(run["model"])
    layout = kv_layout(lm)
    settings = run["result"]["settings"]
    grid = {k: kv_grid(run, k, layout.shape) for k in ("kv_retrieval_score", "stream_sensitivity")}
    rankings = {"retrieval": grid["kv_retrieval_score"], "sensitivity": grid["stream_sensitivity"],
                "combined": combined_rank(grid["kv_retrieval_score"], grid["stream_sensitivity"])}
    plans = curve_plans(layout, rankings, settings["curve"], settings["n_random_plans"], sink=settings["sink"],
                        recent=settings["recent"], seed=settings["seed"], random_fractions=(0.5,))
    if len(sys.argv) > 4:
        tokens = int(sys.argv[5]) if len(sys.argv) > 5 else settings["lengths"][0]
        with open(sys.argv[4], encoding="utf-8") as f:
            document = " ".join(f.read().split())  # one paragraph: the file's line breaks are layout, not text
        text = list(lm.tokenizer(document)["input_ids"])[:tokens]
    else:
        lines = hs.builtin_corpus()
        text = list(lm.tokenizer(" ".join(lines[len(lines) // 2:]))["input_ids"])[settings["held_out_text_tokens"]:]
    pre = prefill(lm, text[: len(text) - PPL_TOKENS]) if scope == "question" else None
    if scope == "prompt":
        keep = ["retrieval 50%", "sensitivity 50%", "combined 50%", "all streaming",
                *(f"random 50% #{d}" for d in range(3))]  # in this order (a cut run keeps the first)
        plans = sorted((p for p in plans if p.name in keep), key=lambda p: keep.index(p.name))
    dense = math.exp(float(token_losses(lm, text, prefix=pre).mean()))
    rows = []
    for plan in plans:
        ppl = math.exp(float(token_losses(lm, text, plan, prefix=pre).mean()))
        rows.append({"plan": plan.name, "n_full": plan.n_full, "perplexity": ppl, "perplexity_change": ppl / dense - 1})
        with open(path, "w") as f:
            json.dump(json_safe({"model": run["model"], "scope": scope, "text_tokens": len(text),
                                 "text": sys.argv[4] if len(sys.argv) > 4 else "built-in corpus, second half, after the run's",
                                 "scored_tokens": PPL_TOKENS if pre is not None else len(text) - 1,
                                 "dense": dense, "plans": rows}), f, indent=2)
        print(rows[-1], flush=True)


if __name__ == "__main__":
    main()
