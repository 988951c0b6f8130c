"""Issue 26: scale-out, measured on the command users run (`headscope heads` over a corpus file).

- torchrun: `torchrun --nproc-per-node 2 -m headscope heads ...` (one thread per process) against one
  process with the same total threads (`OMP_NUM_THREADS=2`), on the same corpus of `--texts` sentences:
  speed-up = the one process's wall time / torchrun's; with `--single` also one process on one thread,
  and the parallel efficiency = its time / (2 × torchrun's).
- streaming: `headscope heads` over `--stream-small` and `--stream-large` sentences in fresh processes,
  one thread each: peak RSS (the process's VmHWM, model load included) of both; flat memory means
  the two peaks are about equal.
- throughput: sentences/s and tokens/s of `hs.heads` (what `headscope heads` runs) for each packaged
  model over `--throughput-texts` sentences, one thread, timed in the child after loading the model.

The corpus is UD English EWT's sentences (`/work/shared/data/ud-english-ewt`, the `# text =` lines
of dev and test, 4,078 sentences) cycled to the size asked, written to a file in `--out`. Wall times
are whole processes (model load included: stated beside); the load average is recorded with each.

    python benchmarks/scaleout.py --out .bench/scaleout            # everything
    python benchmarks/scaleout.py --skip-stream --skip-throughput  # torchrun only
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import MB, REPO, machine_info  # noqa: E402

__all__ = ["ewt_sentences", "write_corpus", "run_measured", "main"]

EWT = REPO.parent / "shared" / "data" / "ud-english-ewt"


def ewt_sentences(folder: Path = EWT) -> list[str]:
    """The `# text = ...` lines of every CoNLL-U file in `folder`, in file order."""
    out = []
    for path in sorted(Path(folder).glob("*.conllu")):
        out += [line[len("# text = "):].strip() for line in path.read_text(encoding="utf-8").splitlines()
                if line.startswith("# text = ")]
    return [s for s in out if s]


def write_corpus(path: Path, n: int, sentences: list[str]) -> Path:
    """`n` sentences (cycled), one a line."""
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(sentences[i % len(sentences)] + "\n")
    return path


def run_measured(argv: list[str], *, threads: int, timeout: float = 7200) -> dict:
    """Run `argv`, sampling the RSS of its whole process tree every 0.2 s: wall seconds, the tree's
    peak RSS (sum over the processes), the exit status and the 1-minute load average before and after."""
    import psutil

    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        if time.perf_counter() - t0 > timeout:
            proc.kill()
        time.sleep(0.2)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    return {"argv": " ".join(map(str, argv)), "threads": threads, "wall": wall, "peak_rss": peak,
            "rc": proc.returncode, "load_before": load0, "load_after": os.getloadavg()[0],
            "stderr_tail": err.strip().splitlines()[-1:] if proc.returncode else [], "stdout": out}


def _heads(model: str, corpus: Path, *, torchrun: int = 0) -> list[str]:
    args = ["heads", "--model", model, "--corpus", str(corpus), "--quiet", "--json", "--no-verify",
            "--induction-seqs", "0"]
    if torchrun:
        launcher = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
        return [launcher, "--standalone", "--nproc-per-node", str(torchrun), "-m", "headscope", *args]
    return [sys.executable, "-m", "headscope", *args]


def _n_tokens(model: str, corpus: Path) -> int:
    from common import load

    lm = load(model)
    lines = corpus.read_text(encoding="utf-8").splitlines()
    return sum(len(ids) for ids in lm.tokenizer(lines)["input_ids"])


def _throughput_child(model: str, corpus: Path) -> dict:
    """`hs.heads` (no induction sequences) over the corpus file in this process, after loading and a
    warm-up on 8 texts: its wall and CPU seconds."""
    import headscope as hs
    from common import load

    lm = load(model)
    texts = corpus.read_text(encoding="utf-8").splitlines()
    hs.heads(lm, texts[:8], induction_sequences=0)
    t0, c0 = time.perf_counter(), time.process_time()
    hs.heads(lm, texts, induction_sequences=0)
    return {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}


def main(argv=None) -> int:
    if argv is None and len(sys.argv) == 4 and sys.argv[1] == "--child-throughput":
        print(json.dumps(_throughput_child(sys.argv[2], Path(sys.argv[3]))))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="minilm")
    p.add_argument("--texts", type=int, default=20000)
    p.add_argument("--single", action="store_true", help="also one process with one thread (efficiency)")
    p.add_argument("--stream-small", type=int, default=10000)
    p.add_argument("--stream-large", type=int, default=100000)
    p.add_argument("--throughput-texts", type=int, default=1000)
    p.add_argument("--throughput-models", nargs="*", default=["minilm", "smollm2", "gemma3-270m"])
    p.add_argument("--skip-torchrun", action="store_true")
    p.add_argument("--skip-stream", action="store_true")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--out", default=str(REPO / ".bench" / "scaleout"))
    p.add_argument("--data", default=str(EWT), help="UD English EWT's folder (CoNLL-U files)")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    sentences = ewt_sentences(Path(a.data))
    if not sentences:
        p.error(f"no '# text =' lines in {a.data}/*.conllu; pass --data with UD English EWT's folder")
    rows: list[dict] = []
    log = open(out / "runs.jsonl", "a")

    def record(what: str, model: str, texts: int, r: dict, tokens: int | None = None) -> dict:
        r = {"what": what, "model": model, "texts": texts, "tokens": tokens, **{k: v for k, v in r.items() if k != "stdout"}}
        rows.append(r)
        print(json.dumps(r), file=log, flush=True)
        print(f"{what:28} {model:12} {texts:>7} texts  {r['wall']:8.1f} s  peak {r['peak_rss'] / MB:7.0f} MB  "
              f"rc {r['rc']}  load {r['load_before']:.1f}->{r['load_after']:.1f}", file=sys.stderr, flush=True)
        return r

    if not a.skip_torchrun:
        corpus = write_corpus(out / f"ewt-{a.texts}.txt", a.texts, sentences)
        tokens = _n_tokens(a.model, corpus)
        record("1 process, 2 threads", a.model, a.texts, run_measured(_heads(a.model, corpus), threads=2), tokens)
        record("torchrun 2 x 1 thread", a.model, a.texts, run_measured(_heads(a.model, corpus, torchrun=2), threads=1),
               tokens)
        if a.single:
            record("1 process, 1 thread", a.model, a.texts, run_measured(_heads(a.model, corpus), threads=1), tokens)
    if not a.skip_stream:
        for n in (a.stream_small, a.stream_large):
            corpus = write_corpus(out / f"ewt-{n}.txt", n, sentences)
            record("streamed, 1 thread", a.model, n, run_measured(_heads(a.model, corpus), threads=1))
    if not a.skip_throughput:
        corpus = write_corpus(out / f"ewt-{a.throughput_texts}.txt", a.throughput_texts, sentences)
        for m in a.throughput_models:
            r = run_measured([sys.executable, __file__, "--child-throughput", m, str(corpus)], threads=1)
            if r["rc"] == 0:  # the child's own clock: `hs.heads` after the model is loaded, load left out
                r.update(json.loads(r["stdout"].strip().splitlines()[-1]))
            record("throughput (hs.heads), 1 thread", m, a.throughput_texts, r, _n_tokens(m, corpus))
    (out / "results.json").write_text(json.dumps({"machine": machine_info(), "runs": rows}, indent=1))
    print(render(rows))
    (out / "results.md").write_text(render(rows))
    return 0 if all(r["rc"] == 0 for r in rows) else 1


def render(rows: list[dict]) -> str:
    """The runs as a markdown table, with torchrun's speed-up over one process with the same threads."""
    lines = ["| run | model | texts | wall s | texts/s | tokens/s | peak RSS (tree) | load 1-min |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tps = f"{r['tokens'] / r['wall']:.0f}" if r.get("tokens") else "—"  # throughput rows: hs.heads alone
        lines.append(f"| {r['what']} | {r['model']} | {r['texts']:,} | {r['wall']:.1f} | {r['texts'] / r['wall']:.1f} | "
                     f"{tps} | {r['peak_rss'] / MB:.0f} MB | {r['load_before']:.1f}→{r['load_after']:.1f} |")
    by = {r["what"]: r for r in rows}
    one, tr = by.get("1 process, 2 threads"), by.get("torchrun 2 x 1 thread")
    if one and tr:
        s = one["wall"] / tr["wall"]
        lines += ["", f"torchrun 2 × 1 thread vs 1 process × 2 threads (the same total threads): speed-up {s:.2f}×"]
        single = by.get("1 process, 1 thread")
        if single:
            lines.append(f"against 1 process × 1 thread: speed-up {single['wall'] / tr['wall']:.2f}×, parallel efficiency "
                         f"{single['wall'] / tr['wall'] / 2:.0%}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
