"""Peak memory of a command, anonymous and resident: `python benchmarks/memwatch.py [--interval S] -- CMD ...`.

Resident set size (RSS) counts the pages of memory-mapped files too — a safetensors checkpoint that
the load maps, the libraries — which the kernel drops when memory is short and reads again when
touched. Anonymous memory (`RssAnon`: heap, tensors the process allocated) is what it cannot drop;
an offloaded model is judged by that. The command runs as a child; a thread reads its
`/proc/PID/status` every `interval` seconds (50 ms by default) and keeps the largest `RssAnon` and
`VmRSS`; `hwm` is the kernel's own RSS high-water mark, which sees every spike: the child's `ru_maxrss`
(this small parent's peak is what exec would carry over into it) or its last `VmHWM`, the larger. Linux only. One JSON line goes to stdout (or `--json FILE`):
`{"peak_anon", "peak_rss", "hwm", "seconds", "cpu_seconds", "rc"}` in bytes and seconds (wall; the
child's user + system CPU); the command's own output
passes through (stdout to stderr, so the JSON line stays apart).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Sequence

__all__ = ["status_fields", "watch", "main"]

_FIELDS = ("RssAnon", "VmRSS", "VmHWM")


def status_fields(pid: int) -> dict[str, int] | None:
    """`RssAnon`, `VmRSS`, `VmHWM` of `pid` in bytes, or None once it has gone (or on a system without /proc)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in _FIELDS:
                    out[key] = int(rest.split()[0]) * 1024  # kB
    except (OSError, ValueError):
        return None
    return out if len(out) == len(_FIELDS) else None


def watch(argv: Sequence[str], *, interval: float = 0.05, env: dict | None = None) -> dict:
    """Run `argv` and sample its memory every `interval` seconds until it exits: the peaks, in bytes."""
    peak = {"peak_anon": 0, "peak_rss": 0, "hwm": 0}
    t0 = time.perf_counter()
    proc = subprocess.Popen(list(argv), stdout=2, env=env)  # its output to stderr (fd 2): stdout keeps the JSON
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            fields = status_fields(proc.pid)
            if fields:
                peak["peak_anon"] = max(peak["peak_anon"], fields["RssAnon"])
                peak["peak_rss"] = max(peak["peak_rss"], fields["VmRSS"])
                peak["hwm"] = max(peak["hwm"], fields["VmHWM"])
            done.wait(interval)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    _, status, usage = os.wait4(proc.pid, 0)
    done.set()
    thread.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    peak["hwm"] = max(peak["hwm"], usage.ru_maxrss * 1024)  # kB on Linux
    return {**peak, "seconds": time.perf_counter() - t0, "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "rc": proc.returncode}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--interval", type=float, default=0.05, help="seconds between samples (default 0.05)")
    p.add_argument("--json", help="write the result here as well as to stdout")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS ...")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the command to watch after --")
    result = {"command": command, **watch(command, interval=args.interval)}
    line = json.dumps(result)
    print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    return result["rc"]


if __name__ == "__main__":
    sys.exit(main())
