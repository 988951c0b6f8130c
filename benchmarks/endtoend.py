"""Benchmark 6: `headscope run` end to end, cold and warm, and the GGUF cache's effect on load time.

- `headscope run --model M --out DIR --force` (what `make report` runs), in fresh processes: cold with
  empty caches (a new `HEADSCOPE_CACHE`, so a GGUF model is converted first, and a new
  `MPLCONFIGDIR`, so matplotlib rebuilds its font cache), then warm with the same caches again.
- Load time of each GGUF model, each in a fresh process (`python benchmarks/endtoend.py load`):
  cold (an empty cache: reassemble/convert, save, load), warm (from the cache), and without the cache
  (`hs.load(..., use_cache=False)`: transformers dequantises the GGUF on every load).

The temporary caches live in `.bench/` (git-ignored) and are removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from common import REPO, Row, child_output, run_child

__all__ = ["headscope_run", "load_times", "main"]


def _scratch() -> Path:
    (REPO / ".bench").mkdir(exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="e2e-", dir=REPO / ".bench"))


def _run_once(model: str, out: Path, env: dict, extra: Sequence[str]) -> tuple[float, dict]:
    cmd = [sys.executable, "-c", "from headscope.cli import main; main()", "run", "--model", model, "--out", str(out),
           "--force", "--quiet", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, cwd=REPO)
    seconds = time.perf_counter() - t0
    if proc.returncode not in (0, 1):  # 1: the report was written but a model was not verified
        raise RuntimeError(f"headscope run exited {proc.returncode}: {proc.stderr.strip()[-1500:]}")
    record = json.loads((out / "run.json").read_text())
    return seconds, record


def headscope_run(model: str, extra: Sequence[str] = ()) -> list[Row]:
    """Item 6a: wall time of `headscope run` cold (empty caches) and warm, with its stages from run.json."""
    scratch = _scratch()
    try:
        env = {"HEADSCOPE_CACHE": str(scratch / "cache"), "MPLCONFIGDIR": str(scratch / "mpl")}
        cold, rec_cold = _run_once(model, scratch / "report", env, extra)
        warm, rec_warm = _run_once(model, scratch / "report", env, extra)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    rows = []
    for label, secs, rec in (("cold", cold, rec_cold), ("warm", warm, rec_warm)):
        stages = {k: v for m in rec["models"] for k, v in m["seconds"].items()}
        stages["report"] = rec["seconds"]["report"]
        detail = ", ".join(f"{k} {v:.1f}" for k, v in stages.items()) + " s (stages from run.json)"
        setting = "headscope run --model " + model + (" " + " ".join(extra) if extra else "") + (
            ": empty HEADSCOPE_CACHE and MPLCONFIGDIR" if label == "cold" else ": caches from the cold run")
        rows.append(Row("6a", f"headscope run end to end, {label}", model, setting, secs, "s", detail=detail,
                        data={"seconds": secs, "stages": stages, "verified": rec["passed"]}))
    return rows


def load_times(model: str) -> Row:
    """Item 6b: load time of a GGUF model: cold cache (conversion), warm cache, and no cache."""
    scratch = _scratch()
    try:
        env = {"HEADSCOPE_CACHE": str(scratch / "cache")}
        cold = run_child("endtoend.py", ["load", "--model", model], env=env)
        warm = run_child("endtoend.py", ["load", "--model", model], env=env)
        raw = run_child("endtoend.py", ["load", "--model", model, "--no-cache"], env=env)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    speedup = raw["seconds"] / warm["seconds"]
    return Row("6b", "GGUF cache: load without cache / warm cache load", model,
               "load_model in a fresh process each; cold = empty HEADSCOPE_CACHE", speedup, "x",
               detail=(f"cold (convert + save + load) {cold['seconds']:.1f} s, warm {warm['seconds']:.1f} s, "
                       f"no cache (dequantise every load) {raw['seconds']:.1f} s"),
               data={"cold": cold, "warm": warm, "no_cache": raw})


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="time one model load in this fresh process")
    p.add_argument("what", choices=["load"])
    p.add_argument("--model", required=True)
    p.add_argument("--no-cache", action="store_true")
    args = p.parse_args(argv)
    import torch  # noqa: F401  (imports are not load time)
    import transformers  # noqa: F401

    import headscope as hs

    t0 = time.perf_counter()
    lm = hs.load(args.model, use_cache=not args.no_cache)
    seconds = time.perf_counter() - t0
    child_output({"model": lm.name, "seconds": seconds, "converted": bool(lm.timings.get("converted_gguf"))})


if __name__ == "__main__":
    main()
