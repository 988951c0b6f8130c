"""What every benchmark shares: the machine, timing, memory sampling, corpora, models and result rows.

Timing is the median of several repeats, the contenders interleaved (A B, B A, ...) after a warm-up,
so that a burst of load from another process hits both sides alike. Memory is resident set size
(RSS): sampled by a thread while a block runs (`PeakRss`), or `ru_maxrss` of a fresh process; beside it
anonymous memory (`RssAnon`, Linux): RSS also counts the pages of memory-mapped files (a safetensors
checkpoint the load maps, the libraries), which the kernel drops when memory is short; anonymous memory
is what it cannot drop (`memwatch.py` watches a whole command the same way).
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from itertools import cycle, islice
from pathlib import Path
from typing import Callable, Iterator, Literal, Mapping, Sequence

__all__ = [
    "REPO", "Row", "judge", "interleaved", "median", "PeakRss", "rss_bytes", "anon_bytes", "corpus", "cycled",
    "load", "machine_info", "run_child", "child_output", "MB",
]

REPO = Path(__file__).resolve().parents[1]
MB = 2**20
Status = Literal["ok", "skipped", "error"]


@dataclass(frozen=True)
class Row:
    """One figure of the results table: what ran, the number, its target and whether it was met.

    `met` is None where no target is set (a figure to report) or the benchmark did not run;
    `wide_miss` marks a target missed by the wide margin that makes the run exit non-zero.
    """

    key: str  # the benchmark's number and a letter: "1a", "4", ...
    benchmark: str
    model: str
    setting: str  # sizes, batch size, options: enough to rerun it
    figure: float | None
    unit: str  # "x", "%", "s", "MB", "max|Δ|"
    target: str = "report"
    met: bool | None = None
    wide_miss: bool = False
    detail: str = ""  # the medians behind the figure, notes
    status: Status = "ok"
    data: dict = field(default_factory=dict)  # raw numbers for results.json

    def to_dict(self) -> dict:
        return asdict(self)


def judge(figure: float, limit: float, wide_limit: float) -> tuple[bool, bool]:
    """(met, wide_miss) for a figure that must stay at or under `limit`; `wide_limit` is the wide margin.

    >>> judge(1.1, 1.25, 1.6), judge(1.3, 1.25, 1.6), judge(2.0, 1.25, 1.6)
    ((True, False), (False, False), (False, True))
    """
    return figure <= limit, figure > wide_limit


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def interleaved(contenders: Mapping[str, Callable[[], object]], repeats: int, *, warmup: int = 1,
                clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """Seconds of each contender per repeat, run alternately (forward, then reversed order) after `warmup`;
    `clock=time.process_time` counts this process's CPU seconds instead of wall time (one thread: the
    figure then does not grow when other processes share the cores)."""
    names = list(contenders)
    for _ in range(warmup):
        for name in names:
            contenders[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            gc.collect()
            t0 = clock()
            contenders[name]()
            times[name].append(clock() - t0)
    return times


def rss_bytes() -> int:
    """Resident set size of this process now."""
    import psutil

    return psutil.Process().memory_info().rss


def anon_bytes() -> int:
    """Anonymous resident memory of this process now (`RssAnon`: what the kernel cannot drop); 0 without /proc."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return 0


class PeakRss:
    """Peak RSS of this process while a `with` block runs, sampled every `interval` seconds by a thread.

    `baseline` is the RSS when the block starts, `peak` the largest sample, `delta` their difference;
    `baseline_anon` and `peak_anon` the same for anonymous memory (0 without /proc).
    A short spike between two samples can be missed; 5 ms is far below a forward pass.
    """

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.baseline = self.peak = self.baseline_anon = self.peak_anon = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "PeakRss":
        gc.collect()
        self.baseline = self.peak = rss_bytes()
        self.baseline_anon = self.peak_anon = anon_bytes()
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_bytes())
            self.peak_anon = max(self.peak_anon, anon_bytes())

    def __exit__(self, *exc) -> None:
        self.peak = max(self.peak, rss_bytes())
        self.peak_anon = max(self.peak_anon, anon_bytes())
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @property
    def delta(self) -> int:
        return self.peak - self.baseline


def corpus(n: int) -> list[str]:
    """`n` texts: the built-in corpus (`analyses.corpus.builtin_corpus`, short English sentences) cycled."""
    return list(cycled(n))


def cycled(n: int) -> Iterator[str]:
    """The built-in corpus cycled to `n` texts, lazily (a generator keeps a 30,000-text run flat)."""
    from headscope import builtin_corpus

    return islice(cycle(builtin_corpus()), n)


def load(name: str):
    """A `probe.LoadedModel`: `tiny-<family>` is `probe.tiny.tiny_model(family)`, anything else `probe.load_model`."""
    if name.startswith("tiny-"):
        from headscope.probe.tiny import tiny_model

        return tiny_model(name.removeprefix("tiny-"))
    import headscope as hs

    return hs.load(name)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict:
    """The machine the figures come from: CPU, cores, RAM, library versions, torch threads, load."""
    import psutil
    import torch
    import transformers

    gpu = (torch.cuda.get_device_name(0) if torch.cuda.is_available()
           else "none (no GPU machine was lent for this run; all figures are CPU)")
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "gpu": gpu,
        "load_average_1min": round(os.getloadavg()[0], 2),
    }


def run_child(script: str, args: Sequence[str], *, python: str | None = None, env: Mapping[str, str] | None = None,
              timeout: float = 1800) -> dict:
    """Run `benchmarks/<script>` in a fresh interpreter; its last stdout line is a JSON object, returned.

    A failing child raises RuntimeError with the tail of its stderr.
    """
    cmd = [python or sys.executable, str(REPO / "benchmarks" / script), *map(str, args)]
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, cwd=REPO, timeout=timeout)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"{script} {' '.join(map(str, args))} exited {proc.returncode}:\n{tail}")
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"{script} printed no JSON result; stderr tail:\n{proc.stderr[-2000:]}")
    return json.loads(lines[-1])


def child_output(result: Mapping) -> None:
    """What a child prints last: one JSON line for `run_child`."""
    print(json.dumps(result), flush=True)


def kv_grid(run: Mapping, column: str, shape: tuple[int, int]):
    """One column of a `longcontext_numbers.py` output's per-KV-head table as a [layer, kv_head] array (NaN where
    the run has no value: a layer not planned, a head never scored)."""
    import numpy as np

    grid = np.full(shape, np.nan)
    for row in run["kv_table"]:
        grid[row["layer"], row["kv_head"]] = np.nan if row[column] is None else row[column]
    return grid
