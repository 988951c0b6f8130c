"""Issue 16: recompute-mode extraction of long texts and the short-sentence corpus ratio, in one run.

Every measurement runs in a fresh process (`python benchmarks/recompute.py --child MODE ...`) whose
peak RSS (VmHWM, the model included) is the memory figure; the parent samples each child's RSS and
kills it past a cap (`--cap-gb`, `--eager-cap-gb`), collects the children's JSON lines and writes the
tables to `.bench/recompute/results.md` (every child's line also to `runs.jsonl`). Modes:

- `sdpa`: a plain forward of the base model with SDPA attention on one text of exactly T tokens — the
  time baseline.
- `recompute`: the product on that text, `hs.heads(lm, [text], attention="recompute", budget=...,
  induction_sequences=0)`: the eager check of the text's prefix (`probe.recompute.check_prefix`),
  then `probe.recompute.iter_blocks_encoded` over every layer and head, each block folded at once by
  `HeadScoreAccumulator.update_blocks` (word blocks, then every corpus metric of
  `analyses.metrics.METRICS`, summed per head in float64), nothing per text kept — the code
  `headscope heads --attention recompute` runs.
- `eager`: `probe.extract` (eager, `output_attentions=True`), only where its estimated need, layers ×
  heads × T² × 4 B kept twice (the model's output and the extracted map), fits in `--eager-limit-gb`.
- `explorer`: the live explorer's first view of that text (`headscope serve`'s logic, `Explorer` with
  `attention="recompute"` and the server's default memory budget): the overview of head `--head` of layer
  `--layer` in 64 × 64 tiles, the prefix check and the forward pass up to that layer included — timed
  against the `sdpa` child of the same text (`--explorer-tokens`); peak RSS is read right after it.
  Then, outside the figures, a zoom (the last 64 rows) and the overview of the last layer.
- `relations`: `hs.coref` (built-in agreement + winograd) and `hs.syntax` (N UD EWT dev sentences) with
  `attention="eager"` and `"recompute"`: the other product paths that have the option.
- `corpus`: `hs.heads` over N short sentences (the built-in corpus cycled) / a bare batched eager loop
  with `output_attentions=True` over the same batches (benchmark item 1's `speed.heads_vs_bare`).

    python benchmarks/recompute.py       # smollm2 at 6,000; gemma3-270m at 1k .. 16k; minilm, smollm2 on 2,000 texts
    python benchmarks/recompute.py --long-model "" --lengths 1024 2048 --corpus-models
    python benchmarks/recompute.py --long-model "" --lengths --corpus-models --relations-models --explorer-tokens 4096

Time is the child's CPU time (`time.process_time`, one torch thread): on cores shared with other
busy processes wall time measures the others' load; wall seconds are kept beside it in runs.jsonl.
The exponents are least-squares slopes of log(time) and log(peak RSS) against log(T).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))  # sibling modules, also when imported by tests

from common import MB, REPO, child_output, load  # noqa: E402

__all__ = ["main", "fitted_exponent", "eager_need", "run_capped", "render"]

_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072",  # freed tensors go back to the system: RSS follows live memory
        # one thread: CPU seconds are then the work itself, not OpenMP spinning on cores other processes hold
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
GEMMA_LENGTHS = (1024, 2048, 4096, 8192, 16384)
SMOLLM2_TOKENS = 6000
EXPLORER_HEAD = (12, 2)  # issue 38: the explorer's first overview of gemma3-270m's L12H2


def fitted_exponent(lengths, seconds) -> float:
    """Least-squares slope of log(seconds) against log(T).

    >>> round(fitted_exponent([1, 2, 4], [3, 12, 48]), 6)
    2.0
    """
    xs, ys = [math.log(t) for t in lengths], [math.log(s) for s in seconds]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def _child(mode: str, model: str, n_tokens: int, budget: int, n_texts: int = 0, repeats: int = 1,
           layer: int = EXPLORER_HEAD[0], head: int = EXPLORER_HEAD[1]) -> dict:
    import torch

    from headscope.probe.encoding import encode, pad_batch
    from headscope.probe.forward import base_model

    lm = load(model)
    if mode == "corpus":
        return _corpus(lm, n_texts, repeats)
    if mode == "relations":
        return _relations(lm, n_texts)
    text = _text_of_tokens(lm, n_tokens)
    enc = encode(lm, text)
    if mode == "recompute":
        from headscope.workflows import heads  # noqa: F401  (imported before the clock starts)
    if mode == "explorer":
        return _explorer(lm, text, layer, head)
    t0, c0 = time.perf_counter(), time.process_time()
    if mode == "sdpa":
        from headscope.probe.recompute import fast_attention

        ids, mask = pad_batch([enc], lm.device)
        with torch.inference_mode(), fast_attention(lm.model, "sdpa") as impl:
            base_model(lm)(input_ids=ids, attention_mask=mask, use_cache=False)
        note = impl
    elif mode == "eager":
        from headscope.probe.extract import extract

        [m] = extract(lm, text)
        note = f"{tuple(m.attention.shape)}"
    elif mode == "recompute":
        note = _recompute(lm, text, budget)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"mode": mode, "model": model, "tokens": len(enc.ids), "seconds": cpu, "wall_seconds": seconds,
            "peak_rss": _process_peak(),
            "budget": budget, "note": note, "layers": lm.config.num_hidden_layers,
            "heads": lm.config.num_attention_heads}


def _corpus(lm, n_texts: int, repeats: int) -> dict:
    """`hs.heads` over `n_texts` short sentences vs the bare batched eager loop over the very same padded
    batches (benchmark item 1's contenders, `speed.same_batches` and `speed.bare_loop`), timed in CPU
    seconds, alternating, after a warm-up on a few texts."""
    import headscope as hs
    from common import corpus, median
    from speed import bare_loop, id_batches, same_batches

    texts, n_ind, length = corpus(n_texts), (10 if lm.is_causal else 0), 30
    batches = same_batches(lm, texts, batch_size=8, window=4)
    if n_ind:
        batches += id_batches(lm, hs.induction_inputs(lm, n_sequences=n_ind, length=length)[0], batch_size=8)
    contenders = {"ours": lambda t: hs.heads(lm, t, batch_size=8, window=4, induction_sequences=n_ind,
                                             induction_length=length),
                  "bare": lambda t: bare_loop(lm, batches if t is texts else batches[:2])}
    for run in contenders.values():  # first-call costs out of the figures
        run(texts[:16])
    times: dict[str, list[float]] = {"ours": [], "bare": []}
    for r in range(repeats):
        for name in ("ours", "bare") if r % 2 == 0 else ("bare", "ours"):
            c0 = time.process_time()
            contenders[name](texts)
            times[name].append(time.process_time() - c0)
    ours, bare = median(times["ours"]), median(times["bare"])
    tokens = sum(int(m.sum()) for _, m in batches)
    return {"mode": "corpus", "model": lm.name, "tokens": 0, "texts": n_texts, "ratio": ours / bare,
            "setting": f"{n_texts} texts{f' + {n_ind} induction seqs of 2x{length}' if n_ind else ''}, batch 8, "
                       f"window 4, {tokens} tokens, median of {repeats}, CPU seconds on one thread",
            "detail": f"ours {ours:.1f} s, bare model(**batch, output_attentions=True) {bare:.1f} s",
            "peak_rss": _process_peak(), "seconds_ours": times["ours"], "seconds_bare": times["bare"]}


def _relations(lm, n_sentences: int) -> dict:
    """`hs.coref` (the built-in agreement and winograd sets) and `hs.syntax` (the first `n_sentences`
    sentences of UD EWT dev, 100 permutations) with `attention="eager"` and `"recompute"`, the product
    paths that have the option, in CPU seconds: recompute's cost on short texts, where the prefix
    check and the per-text blocks are all overhead."""
    import headscope as hs

    conllu = REPO.parent / "shared" / "data" / "ud-english-ewt" / "en_ewt-ud-dev.conllu"
    examples = [*hs.builtin_set("agreement"), *hs.builtin_set("winograd")]
    runs = {"coref": lambda a: hs.coref(lm, examples, attention=a, n_perm=100),
            "syntax": lambda a: hs.syntax(lm, conllu, limit=n_sentences, n_perm=100, trees=False, attention=a)}
    out = {}
    for name, run in runs.items():
        if name == "syntax" and not conllu.exists():
            out[name] = {"error": f"{conllu} not found"}
            continue
        run("eager")  # first-call costs out of the figures
        for attention in ("eager", "recompute"):
            c0 = time.process_time()
            run(attention)
            out[name + "_" + attention] = time.process_time() - c0
    return {"mode": "relations", "model": lm.name, "tokens": 0, "texts": n_sentences, **out, "peak_rss": _process_peak()}


def _recompute(lm, text: str, budget: int) -> str:
    """`hs.heads` on the one text in recompute mode, every layer and head, every corpus metric: the
    product's own path (`headscope.workflows.heads`), the prefix check against eager attention included."""
    import headscope as hs

    s = hs.heads(lm, [text], attention="recompute", budget=budget, induction_sequences=0)
    n_words = int(s.table.loc[s.table["metric"] == "self", "n"].iloc[0])  # word level: one row per word
    return (f"{s.meta['attention']['recompute']} text recomputed, prefix check "
            f"{'passed' if s.meta['check']['passed'] else 'FAILED'}, {n_words} words; "
            f"mean self {float(s.grid('self').to_numpy().mean()):.4f}")


def _explorer(lm, text: str, layer: int, head: int) -> dict:
    """The explorer's first overview of `layer`.`head` (what a browser asks for first), CPU s and the peak
    RSS right after it; then a zoom into the same layer and the overview of the last layer, timed apart."""
    from headscope.workflows.explore import Explorer

    explorer = Explorer({lm.name: lm}, attention="recompute")  # the server's default budget (a quarter of RAM)

    def timed(fn):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        return out, time.process_time() - c0, time.perf_counter() - t0

    first, cpu, wall = timed(lambda: explorer.overview(lm.name, text, layer, head, tiles=64))
    peak, n = _process_peak(), first["n_tokens"]
    _, zoom, _ = timed(lambda: explorer.attention(lm.name, text, layer, head, rows=[max(0, n - 64), n], keys=[0, n]))
    last = lm.config.num_hidden_layers - 1
    _, later, _ = timed(lambda: explorer.overview(lm.name, text, last, head, tiles=64))
    return {"mode": "explorer", "model": lm.name, "tokens": n, "seconds": cpu, "wall_seconds": wall,
            "peak_rss": peak, "peak_rss_after": _process_peak(), "zoom_seconds": zoom, "later_seconds": later,
            "note": f"overview of L{layer}H{head} in 64 x 64 tiles, prefix check {first['check']['summary']}; "
                    f"then a zoom (last 64 rows) {zoom:.1f} s, overview of L{last}H{head} {later:.1f} s",
            "layers": lm.config.num_hidden_layers, "heads": lm.config.num_attention_heads}


def _process_peak() -> int:
    """This process's own peak RSS (VmHWM, the model included); `ru_maxrss` would keep a parent's
    high-water mark across exec."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _text_of_tokens(lm, n_tokens: int) -> str:
    """The repository's README, repeated and cut after about `n_tokens` tokens (plain English prose)."""
    prose = (REPO / "README.md").read_text()
    text = prose
    while len(lm.tokenizer(text)["input_ids"]) < n_tokens + 8:
        text += "\n\n" + prose
    offsets = lm.tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)["offset_mapping"]
    n_special = len(lm.tokenizer("a")["input_ids"]) - len(lm.tokenizer("a", add_special_tokens=False)["input_ids"])
    return text[: offsets[n_tokens - n_special - 1][1]]


def run_capped(argv: Sequence[str], *, cap: int, timeout: float, env: dict | None = None) -> dict:
    """Run `argv` (a child printing one JSON line last), killed when its RSS passes `cap` bytes or it
    runs past `timeout` seconds; an `error` entry says which. The parent samples the child's RSS
    every 0.2 s, so no measurement can take the machine's memory (the shared machine comes first)."""
    import psutil

    proc = subprocess.Popen(list(map(str, argv)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env={**os.environ, **_ENV, **(env or {})})
    child, seen, why = psutil.Process(proc.pid), 0, None
    t0 = time.perf_counter()
    while proc.poll() is None:
        try:
            seen = max(seen, child.memory_info().rss)
        except psutil.Error:
            pass
        if seen > cap:
            why = f"killed: RSS passed the {cap / 2**30:.1f} GB cap"
        elif time.perf_counter() - t0 > timeout:
            why = f"killed: ran past {timeout:.0f} s"
        if why:
            proc.kill()
            break
        time.sleep(0.2)
    out, err = proc.communicate()
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if why or proc.returncode != 0 or not lines:
        tail = (err.strip().splitlines() or ["no output"])[-1][:300]
        return {"error": why or f"exited {proc.returncode}: {tail}", "sampled_peak_rss": seen}
    return json.loads(lines[-1])


def _run(mode: str, model: str, log, *, cap: int, timeout: float, tokens: int = 0, budget: int = 256 * MB,
         texts: int = 0, repeats: int = 1, layer: int = EXPLORER_HEAD[0], head: int = EXPLORER_HEAD[1]) -> dict:
    argv = [sys.executable, Path(__file__).resolve(), "--child", mode, "--model", model, "--tokens", tokens,
            "--budget", budget, "--texts", texts, "--repeats", repeats, "--layer", layer, "--head", head]
    t0 = time.perf_counter()
    r = {"mode": mode, "model": model, "tokens": tokens, **run_capped(argv, cap=cap, timeout=timeout)}
    r["wall"] = time.perf_counter() - t0
    print(json.dumps(r), file=log, flush=True)
    print(_line(r), file=sys.stderr, flush=True)
    return r


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['model']:12} T={r['tokens']:>6} {r['mode']:9} ERROR {r['error']}"
    if r["mode"] == "relations":
        return f"{r['model']:12} relations " + json.dumps({k: v for k, v in r.items() if k.startswith(("coref", "syntax"))})
    if r["mode"] == "corpus":
        return f"{r['model']:12} {r['texts']} texts corpus {r['ratio']:.2f}x  {r['detail']}"
    return (f"{r['model']:12} T={r['tokens']:>6} {r['mode']:9} {r['seconds']:8.1f} s  "
            f"peak RSS {r['peak_rss'] / MB:8.0f} MB  {r['note']}")


def eager_need(n_layers: int, n_heads: int, n_tokens: int) -> int:
    """Bytes eager extraction keeps of one text: the model's float32 attentions and the extracted copy.

    >>> eager_need(18, 4, 1024) / 2**30
    0.5625
    """
    return 2 * n_layers * n_heads * n_tokens**2 * 4


# ------------------------------------------------------------------ tables


def _ok(runs, mode, model=None):
    return [r for r in runs if r["mode"] == mode and "error" not in r and (model is None or r["model"] == model)]


def _cell(r: dict | None, key: str, fmt: str) -> str:
    if r is None:
        return "—"
    if "error" in r:
        return r["error"]
    return fmt.format(r[key] / (MB if key == "peak_rss" else 1))


def render(runs: Sequence[dict], *, long_model: str, scaling_model: str, skipped: dict[int, str]) -> str:
    """Markdown: the long text (time ratio to SDPA, peak RSS), the scaling table with fitted
    exponents, and the corpus ratios."""
    out = []
    by = {(r["mode"], r["model"], r.get("tokens")): r for r in runs}
    long_runs = [r for r in runs if r["model"] == long_model and r["mode"] in ("sdpa", "recompute")]
    if long_runs:
        t = long_runs[0]["tokens"]
        sdpa, rec = by.get(("sdpa", long_model, t)), by.get(("recompute", long_model, t))
        ratio = (f"{rec['seconds'] / sdpa['seconds']:.2f}x" if sdpa and rec and "error" not in sdpa
                 and "error" not in rec else "—")
        out += [f"### {long_model}, one text of {t:,} tokens, every head, every corpus metric", "",
                "| SDPA forward, CPU s | recompute, CPU s | recompute / SDPA | peak RSS recompute (target ≤ 4096 MB) | peak RSS SDPA |",
                "|---|---|---|---|---|",
                f"| {_cell(sdpa, 'seconds', '{:.1f} s')} | {_cell(rec, 'seconds', '{:.1f} s')} | {ratio} | "
                f"{_cell(rec, 'peak_rss', '{:.0f} MB')} | {_cell(sdpa, 'peak_rss', '{:.0f} MB')} |", ""]
    lengths = sorted({r["tokens"] for r in runs if r["model"] == scaling_model and r["mode"] in ("recompute", "eager")})
    if lengths:
        out += [f"### {scaling_model}: time and peak RSS against T", "",
                "| T | SDPA CPU s | recompute CPU s | recompute / SDPA | eager CPU s | recompute peak RSS | eager peak RSS |",
                "|---|---|---|---|---|---|---|"]
        for t in lengths:
            sdpa, rec, eag = (by.get((m, scaling_model, t)) for m in ("sdpa", "recompute", "eager"))
            ratio = (f"{rec['seconds'] / sdpa['seconds']:.2f}x" if sdpa and rec and "error" not in sdpa
                     and "error" not in rec else "—")
            eager_s = skipped[t] if t in skipped else _cell(eag, "seconds", "{:.1f}")
            eager_m = skipped[t] if t in skipped else _cell(eag, "peak_rss", "{:.0f} MB")
            out.append(f"| {t:,} | {_cell(sdpa, 'seconds', '{:.1f}')} | {_cell(rec, 'seconds', '{:.1f}')} | {ratio} | "
                       f"{eager_s} | {_cell(rec, 'peak_rss', '{:.0f} MB')} | {eager_m} |")
        out += ["", "Fitted exponents b (least squares of log y on log T over the lengths measured):", ""]
        for mode in ("sdpa", "recompute", "eager"):
            ok = _ok(runs, mode, scaling_model)
            if len(ok) >= 2:
                ts = [r["tokens"] for r in ok]
                out.append(f"- {mode}: time ~ T^{fitted_exponent(ts, [r['seconds'] for r in ok]):.2f}, "
                           f"peak RSS ~ T^{fitted_exponent(ts, [r['peak_rss'] for r in ok]):.2f} "
                           f"(T = {', '.join(map(str, ts))})")
        out.append("")
    explorer = [r for r in runs if r["mode"] == "explorer"]
    if explorer:
        out += ["### The explorer's first view of a long text: first overview / SDPA forward (target ≤ 1.5x, peak ≤ 1.5x)",
                "", "| model | T | SDPA CPU s | first overview CPU s | ratio | peak RSS overview | peak RSS SDPA | ratio | detail |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in explorer:
            sdpa = by.get(("sdpa", r["model"], r.get("tokens")))
            ok = sdpa is not None and "error" not in sdpa and "error" not in r
            t_ratio = f"{r['seconds'] / sdpa['seconds']:.2f}x" if ok else "—"
            m_ratio = f"{r['peak_rss'] / sdpa['peak_rss']:.2f}x" if ok else "—"
            out.append(f"| {r['model']} | {r['tokens']:,} | {_cell(sdpa, 'seconds', '{:.1f}')} | "
                       f"{_cell(r, 'seconds', '{:.1f}')} | {t_ratio} | {_cell(r, 'peak_rss', '{:.0f} MB')} | "
                       f"{_cell(sdpa, 'peak_rss', '{:.0f} MB')} | {m_ratio} | {r.get('note', '')} |")
        out.append("")
    rel = [r for r in runs if r["mode"] == "relations"]
    if rel:
        out += ["### Short texts: coref and syntax, recompute / eager (the product paths, CPU s)", "",
                "| model | coref eager | coref recompute | ratio | syntax eager | syntax recompute | ratio |",
                "|---|---|---|---|---|---|---|"]
        for r in rel:
            if "error" in r:
                out.append(f"| {r['model']} | {r['error']} |||||| ")
                continue
            cells = []
            for w in ("coref", "syntax"):
                e, c = r.get(w + "_eager"), r.get(w + "_recompute")
                cells += ([f"{e:.1f}", f"{c:.1f}", f"{c / e:.2f}x"] if e and c else ["—", "—", "—"])
            out.append(f"| {r['model']} | " + " | ".join(cells) + " |")
        out.append("")
    corpus_runs = [r for r in runs if r["mode"] == "corpus"]
    if corpus_runs:
        out += ["### Short sentences: `hs.heads` / bare batched eager loop (target ≤ 1.25x)", "",
                "| model | ratio | setting | detail |", "|---|---|---|---|"]
        out += [f"| {r['model']} | {r['error'] if 'error' in r else format(r['ratio'], '.2f') + 'x'} | "
                f"{r.get('setting', '')} | {r.get('detail', '')} |" for r in corpus_runs]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", choices=("sdpa", "eager", "recompute", "explorer", "corpus", "relations"))
    p.add_argument("--model", default="smollm2")
    p.add_argument("--tokens", type=int, default=SMOLLM2_TOKENS)
    p.add_argument("--texts", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--budget", type=int, default=256 * MB)
    p.add_argument("--long-model", default="smollm2", help="'' to skip the long text")
    p.add_argument("--long-tokens", type=int, default=SMOLLM2_TOKENS)
    p.add_argument("--scaling-model", default="gemma3-270m")
    p.add_argument("--lengths", type=int, nargs="*", default=list(GEMMA_LENGTHS))
    p.add_argument("--corpus-models", nargs="*", default=["minilm", "smollm2"])
    p.add_argument("--corpus-texts", type=int, default=2000)
    p.add_argument("--corpus-repeats", type=int, default=1)
    p.add_argument("--layer", type=int, default=EXPLORER_HEAD[0], help="the explorer child's head: its layer")
    p.add_argument("--head", type=int, default=EXPLORER_HEAD[1])
    p.add_argument("--explorer-model", default="gemma3-270m")
    p.add_argument("--explorer-tokens", type=int, nargs="*", default=[16384],
                   help="the explorer's first overview against an SDPA forward at these lengths ('' skips)")
    p.add_argument("--relations-models", nargs="*", default=["smollm2"], help="coref and syntax, eager vs recompute")
    p.add_argument("--relations-sentences", type=int, default=200, help="UD EWT dev sentences for syntax")
    p.add_argument("--eager-limit-gb", type=float, default=6.0, help="eager runs only where its estimated need fits")
    p.add_argument("--cap-gb", type=float, default=6.0, help="any child is killed past this RSS")
    p.add_argument("--eager-cap-gb", type=float, default=10.0, help="the RSS cap of eager children")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per child")
    p.add_argument("--out", default=str(REPO / ".bench" / "recompute"))
    a = p.parse_args(argv)
    if a.child:
        child_output(_child(a.child, a.model, a.tokens, a.budget, a.texts, a.repeats, a.layer, a.head))
        return 0

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cap, timeout = int(a.cap_gb * 2**30), a.timeout
    runs, skipped = [], {}

    def table() -> str:  # rewritten after every child: a run stopped at a deadline keeps its tables
        md = render(runs, long_model=a.long_model, scaling_model=a.scaling_model, skipped=skipped)
        (out / "results.md").write_text(md, encoding="utf-8")
        return md

    with open(out / "runs.jsonl", "a") as log:
        if a.long_model:
            for mode in ("sdpa", "recompute"):
                runs.append(_run(mode, a.long_model, log, cap=cap, timeout=timeout, tokens=a.long_tokens,
                                 budget=a.budget))
                table()
        for t in a.lengths:  # shortest first: what is measured before a deadline is kept
            for mode in ("sdpa", "recompute"):
                runs.append(_run(mode, a.scaling_model, log, cap=cap, timeout=timeout, tokens=t, budget=a.budget))
                table()
            shape = next((r for r in runs[-2:] if "layers" in r), None)  # the children say the model's size
            need = eager_need(shape["layers"], shape["heads"], t) if shape else None
            if need is not None and need <= a.eager_limit_gb * 2**30:
                runs.append(_run("eager", a.scaling_model, log, cap=int(a.eager_cap_gb * 2**30), timeout=timeout,
                                 tokens=t))
            elif need is not None:
                skipped[t] = f"not run: needs {need / 2**30:.1f} GB"
            table()
        for t in a.explorer_tokens:  # the explorer's first view, beside an SDPA forward of the same text
            for mode in ("sdpa", "explorer"):
                if mode == "sdpa" and _ok(runs, "sdpa", a.explorer_model) and any(
                        r["tokens"] == t for r in _ok(runs, "sdpa", a.explorer_model)):
                    continue  # measured above, in the scaling table
                runs.append(_run(mode, a.explorer_model, log, cap=cap, timeout=timeout, tokens=t,
                                 layer=a.layer, head=a.head))
                table()
        for m in a.relations_models:
            runs.append(_run("relations", m, log, cap=cap, timeout=timeout, texts=a.relations_sentences))
            table()
        for m in a.corpus_models:
            runs.append(_run("corpus", m, log, cap=cap, timeout=timeout, texts=a.corpus_texts,
                             repeats=a.corpus_repeats))
            table()
    print(table())
    return 1 if any("error" in r for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
