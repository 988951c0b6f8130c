"""Issue 16: recompute-mode extraction of long texts, time and peak memory against T.

Every measurement runs in a fresh process (`python benchmarks/recompute.py --child MODE ...`) whose
peak RSS (`ru_maxrss`, the model included) is the memory figure; the parent collects the children's
JSON lines and prints the table. Modes, each on one text of exactly T tokens:

- `sdpa`: a plain forward of the base model with SDPA attention — the time baseline.
- `recompute`: `probe.recompute.iter_blocks` over every layer and head, each block reduced at once
  (`analyses.blocks.row_quantities` over word blocks, with two key sets, summed per head in float64):
  the streaming head analyses' work, nothing per text kept.
- `eager`: `probe.extract` (eager, `output_attentions=True`), only where layers × heads × T² × 4 B
  (kept twice: the model's output and the extracted map) fits in `--eager-limit-gb`.

    python benchmarks/recompute.py                       # smollm2 at 6,000; gemma3-270m at 1k .. 16k
    python benchmarks/recompute.py --gemma-lengths 1024 2048 --skip-smollm2

The time exponent is the slope of log(time) against log(T) over the measured lengths (least squares).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time
from pathlib import Path

from common import MB, REPO, child_output, load, run_child

__all__ = ["main", "fitted_exponent"]

_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}  # freed tensors go back to the system: RSS follows live memory
GEMMA_LENGTHS = (1024, 2048, 4096, 8192, 16384)
SMOLLM2_TOKENS = 6000


def fitted_exponent(lengths, seconds) -> float:
    """Least-squares slope of log(seconds) against log(T).

    >>> round(fitted_exponent([1, 2, 4], [3, 12, 48]), 6)
    2.0
    """
    xs, ys = [math.log(t) for t in lengths], [math.log(s) for s in seconds]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def _child(mode: str, model: str, n_tokens: int, budget: int) -> dict:
    import torch

    from headscope.probe.extract import base_model, encode, pad_batch

    lm = load(model)
    text = _text_of_tokens(lm, n_tokens)
    enc = encode(lm, text)
    t0 = time.perf_counter()
    if mode == "sdpa":
        from headscope.probe.recompute import fast_attention

        ids, mask = pad_batch([enc], lm.device)
        with torch.inference_mode(), fast_attention(lm.model, "sdpa") as impl:
            base_model(lm)(input_ids=ids, attention_mask=mask, use_cache=False)
        note = impl
    elif mode == "eager":
        from headscope.probe import extract

        [m] = extract(lm, text)
        note = f"{tuple(m.attention.shape)}"
    elif mode == "recompute":
        note = _recompute(lm, enc, budget)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"mode": mode, "model": model, "tokens": len(enc.ids), "seconds": seconds, "peak_rss": peak,
            "budget": budget, "note": note}


def _recompute(lm, enc, budget: int) -> str:
    import torch

    from headscope.analyses.blocks import row_quantities, word_blocks
    from headscope.probe.recompute import iter_blocks_encoded
    from headscope.probe.words import assign_words

    word_index, _, _ = assign_words(enc.text, enc.spans, enc.special)
    n_words = max(word_index) + 1
    key_sets = torch.zeros(n_words, 2)
    key_sets[0, 0] = 1  # first unit
    key_sets[-1, 1] = 1  # last unit
    L, H = lm.config.num_hidden_layers, lm.config.num_attention_heads
    sums = torch.zeros(L, H, 7, dtype=torch.float64)  # [layer, head, quantity]
    n_blocks = 0
    token_blocks = (block for _, block in iter_blocks_encoded(lm, [enc], budget=budget))
    for wb in word_blocks(token_blocks, word_index):
        rq = row_quantities(wb, key_sets)
        per_row = torch.stack([rq.previous, rq.self_, rq.next, rq.entropy, rq.max_weight], -1)  # (H, R, 5)
        sums[wb.layer] += torch.cat([per_row, rq.key_sets], -1).sum(1).double()
        n_blocks += 1
    return f"{n_blocks} word blocks, {n_words} words; mean self {float(sums[..., 1].sum() / (L * H * n_words)):.4f}"


def _text_of_tokens(lm, n_tokens: int) -> str:
    """The repository's README, repeated and cut after about `n_tokens` tokens (plain English prose)."""
    prose = (REPO / "README.md").read_text()
    text = prose
    while len(lm.tokenizer(text)["input_ids"]) < n_tokens + 8:
        text += "\n\n" + prose
    offsets = lm.tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)["offset_mapping"]
    n_special = len(lm.tokenizer("a")["input_ids"]) - len(lm.tokenizer("a", add_special_tokens=False)["input_ids"])
    return text[: offsets[n_tokens - n_special - 1][1]]


def _run(mode: str, model: str, n_tokens: int, budget: int, log) -> dict | None:
    t0 = time.perf_counter()
    try:
        r = run_child("recompute.py", ["--child", mode, "--model", model, "--tokens", n_tokens, "--budget", budget],
                      env=_ENV, timeout=3600)
    except Exception as e:  # a run that fails is reported, the others go on
        r = {"mode": mode, "model": model, "tokens": n_tokens, "error": str(e).splitlines()[-1][:300]}
    r["wall"] = time.perf_counter() - t0
    print(json.dumps(r), file=log, flush=True)
    print(_line(r), flush=True)
    return r


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['model']:12} T={r['tokens']:>6} {r['mode']:9} ERROR {r['error']}"
    return (f"{r['model']:12} T={r['tokens']:>6} {r['mode']:9} {r['seconds']:8.1f} s  "
            f"peak RSS {r['peak_rss'] / MB:8.0f} MB  {r['note']}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", choices=("sdpa", "eager", "recompute"))
    p.add_argument("--model", default="smollm2")
    p.add_argument("--tokens", type=int, default=SMOLLM2_TOKENS)
    p.add_argument("--budget", type=int, default=256 * MB)
    p.add_argument("--gemma-lengths", type=int, nargs="*", default=list(GEMMA_LENGTHS))
    p.add_argument("--skip-smollm2", action="store_true")
    p.add_argument("--eager-limit-gb", type=float, default=6.0)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "recompute_results.jsonl"))
    a = p.parse_args(argv)
    if a.child:
        child_output(_child(a.child, a.model, a.tokens, a.budget))
        return 0

    runs = []
    with open(a.out, "a") as log:
        if not a.skip_smollm2:
            sdpa = _run("sdpa", "smollm2", SMOLLM2_TOKENS, a.budget, log)
            rec = _run("recompute", "smollm2", SMOLLM2_TOKENS, a.budget, log)
            if "error" not in sdpa and "error" not in rec:
                print(f"smollm2 T={SMOLLM2_TOKENS}: recompute / SDPA forward = {rec['seconds'] / sdpa['seconds']:.2f}x, "
                      f"peak RSS {rec['peak_rss'] / MB:.0f} MB (target <= 4096 MB)", flush=True)
        for t in a.gemma_lengths:  # shortest first: what is measured before a deadline is kept
            runs.append(_run("sdpa", "gemma3-270m", t, a.budget, log))
            runs.append(_run("recompute", "gemma3-270m", t, a.budget, log))
            eager_gb = 2 * 18 * 4 * t * t * 4 / 2**30
            if eager_gb <= a.eager_limit_gb:
                runs.append(_run("eager", "gemma3-270m", t, a.budget, log))
            else:
                print(f"gemma3-270m T={t:>6} eager     skipped: would keep about {eager_gb:.0f} GB", flush=True)
    for mode in ("sdpa", "recompute", "eager"):
        ok = [r for r in runs if r.get("mode") == mode and "error" not in r]
        if len(ok) >= 2:
            print(f"gemma3-270m {mode}: time ~ T^{fitted_exponent([r['tokens'] for r in ok], [r['seconds'] for r in ok]):.2f}"
                  f" over T = {', '.join(str(r['tokens']) for r in ok)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
