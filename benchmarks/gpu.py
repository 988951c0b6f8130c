"""Issue 26: the GPU figures, prepared — run by `benchmarks/gpu.sh` on a CUDA machine; one results file.

Four measurements, each on `device="cuda"`, written to `--out` (JSON: every row, the machine) and
`--out` with `.md` (one table):

1. verification at float32 and bfloat16 (`probe.verify.verify` on 32 built-in texts) for each
   packaged model: max |Δ| of the attention, the tolerance, passed, seconds;
2. the corpus ratio: `hs.heads` over N built-in texts / a bare batched eager loop over the same padded
   batches (`speed.same_batches`, `speed.bare_loop`), median of 3, CUDA synchronised;
3. the long-text table on gemma3-270m: one text of T tokens (1,024 … 32,768), a plain SDPA forward
   against `hs.heads(attention="recompute")` (the product path), seconds and peak CUDA memory;
4. patching throughput: `hs.patch(lm, "ioi")` (every head's output, denoising) on smollm2, pairs/s;
5. one model split over 2 GPUs (issue 37): smollm2 placed by accelerate with `max_memory={0: ..., 1: ...}` so
   that its layers sit on both, against the same model on `cuda:0` alone: the blocks on each GPU, max |Δ| of
   the attention (`hs.extract`) and of the `hs.heads` table over 32 texts, verification passed. On a machine
   with fewer than 2 GPUs the row says so and why (skipped, not an error).

A measurement that fails (out of memory, a model that will not load) is a row with its error; the
others still run.

    python benchmarks/gpu.py --out .bench/gpu/results.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, corpus, machine_info, median  # noqa: E402

MODELS = ("minilm", "smollm2", "gemma3-270m")
LONG_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768)


def _sync():
    import torch

    torch.cuda.synchronize()


def _timed(fn):
    _sync()
    t0 = time.perf_counter()
    out = fn()
    _sync()
    return time.perf_counter() - t0, out


def _load(name: str, dtype: str = "float32"):
    import headscope as hs

    return hs.load(name, placement=hs.Placement(device="cuda", dtype=dtype))


def verification(rows: list) -> None:
    from headscope.probe.verify import verify

    for name in MODELS:
        for dtype in ("float32", "bfloat16"):
            lm = _load(name, dtype)
            seconds, v = _timed(lambda: verify(lm, corpus(32)))
            rows.append({"what": "verification", "model": name, "dtype": dtype, "seconds": seconds,
                         "max_abs_err": v.max_abs_err, "passed": v.passed, "summary": v.summary()})


def corpus_ratio(rows: list, n_texts: int) -> None:
    import headscope as hs
    from speed import bare_loop, same_batches

    for name in MODELS:
        lm = _load(name)
        texts = corpus(n_texts)
        batches = same_batches(lm, texts, batch_size=8, window=4)
        run = {"ours": lambda: hs.heads(lm, texts, batch_size=8, window=4, induction_sequences=0),
               "bare": lambda: bare_loop(lm, batches)}
        for f in run.values():
            f()  # warm-up
        times = {k: [] for k in run}
        for r in range(3):
            for k in ("ours", "bare") if r % 2 == 0 else ("bare", "ours"):
                times[k].append(_timed(run[k])[0])
        ours, bare = median(times["ours"]), median(times["bare"])
        rows.append({"what": "corpus ratio", "model": name, "texts": n_texts, "ours": ours, "bare": bare,
                     "ratio": ours / bare})


def long_texts(rows: list, lengths) -> None:
    import torch

    import headscope as hs
    from headscope.probe.encoding import encode, pad_batch
    from headscope.probe.forward import base_model
    from headscope.probe.recompute import fast_attention
    from recompute import _text_of_tokens

    lm = _load("gemma3-270m")
    for t in lengths:
        text = _text_of_tokens(lm, t)
        ids, mask = pad_batch([encode(lm, text)], lm.device)

        def sdpa():
            with torch.inference_mode(), fast_attention(lm.model, "sdpa"):
                base_model(lm)(input_ids=ids, attention_mask=mask, use_cache=False)

        for mode, fn in (("sdpa", sdpa), ("recompute", lambda: hs.heads(lm, [text], attention="recompute",
                                                                         induction_sequences=0))):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            try:
                seconds, _ = _timed(fn)
                rows.append({"what": "long text", "model": lm.name, "tokens": t, "mode": mode, "seconds": seconds,
                             "peak_cuda_bytes": torch.cuda.max_memory_allocated()})
            except torch.OutOfMemoryError as exc:
                rows.append({"what": "long text", "model": lm.name, "tokens": t, "mode": mode,
                             "error": f"out of memory: {str(exc).splitlines()[0]}"})


def patching(rows: list) -> None:
    import headscope as hs

    lm = _load("smollm2")
    hs.patch(lm, "ioi")  # warm-up
    seconds, r = _timed(lambda: hs.patch(lm, "ioi"))
    n = r.values.shape[-1]
    rows.append({"what": "patching", "model": lm.name, "pairs": n, "sites": r.values.shape[0], "seconds": seconds,
                 "pairs_per_s": n / seconds})


def two_gpus(rows: list) -> None:
    import headscope as hs
    import torch

    if torch.cuda.device_count() < 2:
        rows.append({"what": "two gpus", "model": "smollm2",
                     "skipped": f"this machine has {torch.cuda.device_count()} GPU(s); splitting one model needs 2"})
        return
    texts = corpus(32)
    one = hs.load("smollm2", placement=hs.Placement(device="cuda:0"))
    size = sum(p.numel() * p.element_size() for p in one.model.parameters())
    # GPU 0 takes about half of the weights, GPU 1 the rest: accelerate fills 0 first, then 1
    split = hs.load("smollm2", placement=hs.Placement(device="auto", max_memory={0: size // 2, 1: 4 * size}))
    on = {}
    for where in split.model.hf_device_map.values():
        on[str(where)] = on.get(str(where), 0) + 1
    attention = max((a.attention - b.attention).abs().max().item()
                    for a, b in zip(hs.extract(one, texts), hs.extract(split, texts)))
    a, b = (hs.heads(lm, texts).table for lm in (one, split))
    heads = (a["value"] - b["value"]).abs().max()
    v = hs.verify(split, texts)
    rows.append({"what": "two gpus", "model": "smollm2", "blocks": on, "attention_max_abs_diff": attention,
                 "heads_max_abs_diff": float(heads), "passed": bool(v.passed and set(on) >= {"0", "1"}),
                 "summary": v.summary()})


def render(rows: list, machine: dict) -> str:
    out = [f"GPU benchmark (`bash benchmarks/gpu.sh`) — {machine.get('gpu')}; torch {machine.get('torch')}", "",
           "| what | model | setting | figure | detail |", "|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['what']} | {r.get('model', '')} | {r.get('dtype', r.get('tokens', ''))} | error | {r['error']} |")
        elif r["what"] == "verification":
            out.append(f"| verification | {r['model']} | {r['dtype']} | max abs err {r['max_abs_err']:.1e} | "
                       f"{'passed' if r['passed'] else 'FAILED'}, {r['seconds']:.2f} s |")
        elif r["what"] == "corpus ratio":
            out.append(f"| heads / bare loop | {r['model']} | {r['texts']} texts | {r['ratio']:.2f}x | "
                       f"ours {r['ours']:.2f} s, bare {r['bare']:.2f} s, median of 3 |")
        elif r["what"] == "long text":
            out.append(f"| long text | {r['model']} | T={r['tokens']:,} {r['mode']} | {r['seconds']:.2f} s | "
                       f"peak CUDA {r['peak_cuda_bytes'] / 2**20:.0f} MiB |")
        elif "skipped" in r:
            out.append(f"| {r['what']} | {r.get('model', '')} | | skipped | {r['skipped']} |")
        elif r["what"] == "two gpus":
            out.append(f"| one model over 2 GPUs vs cuda:0 | {r['model']} | blocks {r['blocks']} | attention max "
                       f"abs diff {r['attention_max_abs_diff']:.1e}, heads {r['heads_max_abs_diff']:.1e} | "
                       f"{'passed' if r['passed'] else 'FAILED'} |")
        elif r["what"] == "patching":
            out.append(f"| patching (head_out, ioi) | {r['model']} | {r['pairs']} pairs × {r['sites']} heads | "
                       f"{r['pairs_per_s']:.1f} pairs/s | {r['seconds']:.2f} s |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(REPO / ".bench" / "gpu" / "results.json"))
    p.add_argument("--corpus-texts", type=int, default=2000)
    p.add_argument("--lengths", type=int, nargs="*", default=list(LONG_LENGTHS))
    a = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu.py: no CUDA device here; run it on a machine with one (benchmarks/gpu.sh)", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine, rows = machine_info(), []
    steps = (("verification", lambda: verification(rows)), ("corpus ratio", lambda: corpus_ratio(rows, a.corpus_texts)),
             ("long text", lambda: long_texts(rows, a.lengths)), ("patching", lambda: patching(rows)),
             ("two gpus", lambda: two_gpus(rows)))
    for what, step in steps:
        try:
            step()
        except Exception as exc:  # one failed measurement is a row; the others still run
            rows.append({"what": what, "error": f"{type(exc).__name__}: {exc}"[:300]})
            traceback.print_exc()
        out.write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))  # kept after every step
        out.with_suffix(".md").write_text(render(rows, machine))
        print(f"{what}: done", file=sys.stderr, flush=True)
    print(render(rows, machine))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
