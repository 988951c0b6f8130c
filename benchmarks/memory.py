"""Benchmark 4: peak memory of the streaming head analyses for growing corpora.

Each corpus size runs in a fresh process (`python benchmarks/memory.py --n N`), so the figures do not
lean on each other. The child loads the model, warms up on a few texts, then streams N texts (the
built-in corpus cycled, from a generator: nothing per text is kept) through `headscope.heads` while a
thread samples RSS. Its peak during that phase is the figure; the anonymous part of it (`RssAnon`: not
the file pages the kernel can drop) and the whole process's peak (VmHWM, which also holds the model
load) are reported beside it.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from typing import Sequence

from common import MB, PeakRss, Row, child_output, corpus, cycled, judge, load, run_child

__all__ = ["memory_flat", "flat_row", "main"]

FLAT_TARGET, FLAT_WIDE = 10.0, 25.0  # percent: peak RSS of the largest corpus over the smallest


def memory_flat(model: str, sizes: Sequence[int], *, batch_size: int = 32, window: int = 4) -> Row:
    """Item 4: (largest - smallest) / smallest peak RSS over `sizes`, each size in a fresh process."""
    runs = [run_child("memory.py", ["--model", model, "--n", n, "--batch-size", batch_size, "--window", window])
            for n in sizes]
    return flat_row(model, runs, batch_size=batch_size, window=window)


def flat_row(model: str, runs: Sequence[dict], *, batch_size: int, window: int) -> Row:
    """The item-4 row from the children's results (`peak_rss`, `baseline_rss`, `process_peak_rss`, `n`, `seconds`)."""
    sizes = [r["n"] for r in runs]
    peaks = [r["peak_rss"] for r in runs]
    spread = (max(peaks) - min(peaks)) / min(peaks) * 100
    met, wide = judge(spread, FLAT_TARGET, FLAT_WIDE)
    maxrss = " / ".join(f"{r['process_peak_rss'] / MB:.0f}" for r in runs)
    cells = "; ".join(f"{r['n']:,}: {r['peak_rss'] / MB:.0f} MB (+{(r['peak_rss'] - r['baseline_rss']) / MB:.0f} over "
                      f"the loaded model{_anon(r)}, {r['n'] / r['seconds']:.0f} texts/s)" for r in runs)
    return Row("4", "peak RSS spread over corpus sizes", model,
               f"{' / '.join(f'{n:,}' for n in sizes)} texts (built-in corpus cycled), batch {batch_size}, "
               f"window {window}, fresh process each", spread, "%", f"<= {FLAT_TARGET:g}%", met, wide,
               f"peak RSS while streaming — {cells}; whole-process peak (VmHWM) incl. model load "
               f"{maxrss} MB",
               data={"runs": runs})


def _anon(run: dict) -> str:
    """", anonymous A MB (+D)": the part of the peak the kernel cannot drop (not file pages); "" where unknown."""
    if not run.get("peak_anon"):
        return ""
    return f", anonymous {run['peak_anon'] / MB:.0f} MB (+{(run['peak_anon'] - run['baseline_anon']) / MB:.0f})"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="minilm")
    p.add_argument("--n", type=int, required=True, help="texts to stream")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--window", type=int, default=4)
    args = p.parse_args(argv)
    import headscope as hs

    lm = load(args.model)
    hs.heads(lm, corpus(min(args.n, 2 * args.batch_size)), batch_size=args.batch_size, window=args.window,
              induction_sequences=0)  # first-call allocations and lazy caches happen here, not below
    with PeakRss(0.02) as rss:
        t0 = time.perf_counter()
        scores = hs.heads(lm, cycled(args.n), batch_size=args.batch_size, window=args.window, induction_sequences=0)
        seconds = time.perf_counter() - t0
    assert scores.n_texts == args.n, (scores.n_texts, args.n)
    child_output({
        "model": lm.name, "n": args.n, "batch_size": args.batch_size, "seconds": seconds,
        "baseline_rss": rss.baseline, "peak_rss": rss.peak, "baseline_anon": rss.baseline_anon, "peak_anon": rss.peak_anon,
        "process_peak_rss": max(_process_peak(), rss.peak),  # the kernel updates VmHWM lazily
    })


def _process_peak() -> int:
    """Peak RSS of this process so far, model load included.

    Linux's `ru_maxrss` is not used there: exec keeps the parent's high-water mark in it, so a child
    of a large parent reports the parent's peak. /proc's VmHWM belongs to this process's own memory.
    """
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


if __name__ == "__main__":
    main()
