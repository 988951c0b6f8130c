"""The mechanisms' cost on smollm2 (docs/performance.md rows M2 and the patching row): one process, one thread.

Each workflow of docs/mechanisms.md' worked examples is timed once (wall and CPU seconds of this process), and
one clean forward pass of the same pairs is timed for scale, so "patching costs N forwards" is a ratio of
two figures of one run:

    python benchmarks/mechanisms.py                         # every part, the pair counts of the worked examples
    python benchmarks/mechanisms.py --only patch,forward    # some parts
    python benchmarks/mechanisms.py --pairs 20 --small-pairs 2 --json out.json

Not part of `make bench` (about 20 minutes on a 2-core CPU); its figures are the rows M2 and "activation
patching of every head" of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Callable

import torch

from common import load

PARTS = ("forward", "patch", "pattern", "path", "attribution", "copying", "composition")


def timed(fn: Callable[[], object]) -> dict:
    """Wall and CPU seconds of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return {"wall_s": round(time.perf_counter() - wall, 2), "cpu_s": round(time.process_time() - cpu, 2)}


def clean_forward(lm, pairs) -> None:
    """One clean forward of the pairs' prompts, batched as the patching does (the base model and its LM head)."""
    tok = lm.tokenizer
    enc = tok([p.clean for p in pairs], return_tensors="pt", padding=True)
    with torch.inference_mode():
        lm.model(**enc, use_cache=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--pairs", type=int, default=20, help="ioi pairs for head-output patching and the forward")
    ap.add_argument("--small-pairs", type=int, default=2, help="ioi pairs for pattern, path and attribution patching")
    ap.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {', '.join(PARTS)}")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", dest="json_path", default=None)
    args = ap.parse_args(argv)
    only = args.only.split(",")
    unknown = sorted(set(only) - set(PARTS))
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    torch.set_num_threads(args.threads)
    import headscope as hs
    from headscope.probe.composition import copying_scores

    lm = load(args.model)
    pairs, small = hs.builtin_pairs("ioi")[:args.pairs], hs.builtin_pairs("ioi")[:args.small_pairs]
    sender = "L17H4"
    work = {
        "forward": lambda: clean_forward(lm, pairs),
        "patch": lambda: hs.patch(lm, pairs, what="head_out"),
        "pattern": lambda: hs.patch(lm, small, what="pattern"),
        "path": lambda: hs.patch(lm, small, what="path", sender=sender, receivers="q"),
        "attribution": lambda: hs.attribution_patch(lm, small, what="head_out"),
        "copying": lambda: copying_scores(lm),
        "composition": lambda: hs.composition(lm),
    }
    results = {"model": args.model, "pairs": len(pairs), "small_pairs": len(small), "threads": args.threads}
    for part in PARTS:
        if part in only:
            results[part] = timed(work[part])
            print(part, results[part], flush=True)
    if "forward" in results and "patch" in results:
        results["patch_over_forward"] = round(results["patch"]["cpu_s"] / results["forward"]["cpu_s"], 1)
        print("patch / forward (CPU s):", results["patch_over_forward"])
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
