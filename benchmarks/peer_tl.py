"""Benchmark 7: TransformerLens's `head_detector.detect_head` side by side with ours.

TransformerLens (`transformer-lens` on PyPI) is an optional benchmark dependency, never a runtime
one: this file runs as a child process in whichever interpreter has it (this one, or the
`.venv-bench` that `benchmarks/setup_peer.sh` makes). There it

1. loads the model with `probe.load_model` and wraps a deep copy of it (and of its tokenizer) in a
   `TransformerBridge` (`boot_transformers(..., hf_model=copy)`): the bridge rewires the HF model it
   wraps, which then returns no attention weights, so ours must stay untouched;
2. draws repeated random sequences `r + r` of word tokens, writes each as text, and lets the peer
   tokenise it (`to_tokens`: TransformerLens prepends the tokenizer's BOS); only sequences whose
   tokens come back as exactly `BOS + r + r` are kept, and ours runs on those very token ids;
3. scores previous-token, duplicate-token and induction heads both ways — the peer's
   `detect_head(model, texts, name)` ("mul": Σ A⊙P / Σ A per sequence, averaged) and ours
   (`probe.extract_ids` in batches, `HeadScoreAccumulator.update_repeated`, and
   `analyses.induction.pattern_score` for previous-token) — and compares them head by head;
4. times both, interleaved: the peer as documented (one call per pattern over the list of texts,
   which runs the model once per text per pattern) and the peer with one shared cache per text.

Our corpus-level `previous_token` metric is a different average (over the T - 1 rows that have a
previous token, pooled over texts); the comparison uses the peer's definition, which
`analyses.induction` implements.
"""

from __future__ import annotations

import argparse
import copy
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from common import REPO, Row, child_output, interleaved, judge, load, median, run_child

__all__ = ["PATTERNS", "peer_python", "peer_side_by_side", "main"]

PATTERNS = {"previous_token": "previous_token_head", "duplicate_token": "duplicate_token_head",
            "induction": "induction_head"}
AGREE_TARGET, AGREE_WIDE = 1e-4, 1e-3
SETUP_HINT = "bash benchmarks/setup_peer.sh (a .venv-bench beside .venv with transformer-lens)"


def peer_python(explicit: str | None = None) -> str | None:
    """An interpreter that can import transformer_lens: `explicit`, this one, or .venv-bench's; else None."""
    candidates = [explicit] if explicit else [sys.executable, str(REPO / ".venv-bench" / "bin" / "python")]
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('transformer_lens') is None)"
    for py in candidates:
        if py and Path(py).exists() and subprocess.run([py, "-c", probe], capture_output=True).returncode == 0:
            return py
    return None


def peer_side_by_side(model: str, *, python: str | None, sequences: int = 8, length: int = 20,
                      repeats: int = 3) -> list[Row]:
    """Item 7: agreement with the peer's "mul" scores (max |Δ| over heads) and the time ratio."""
    if python is None:
        return [Row("7", "TransformerLens head_detector side by side", model, "", None, "", status="skipped",
                    detail=f"transformer-lens is not installed; run {SETUP_HINT}, or pass --peer-python")]
    out = run_child("peer_tl.py", ["--model", model, "--sequences", sequences, "--length", length,
                                   "--repeats", repeats], python=python)
    setting = (f"{out['n_sequences']} sequences {out['bos']!r} + r + r, |r| = {length} word tokens "
               f"(T = {out['T']}), transformer-lens {out['tl_version']}, TransformerBridge(hf_model=copy)")
    rows = []
    for metric, diff in out["max_abs_diff"].items():
        met, wide = judge(diff, AGREE_TARGET, AGREE_WIDE)
        rows.append(Row("7a", f"agreement with detect_head '{PATTERNS[metric]}' (mul)", out["model"], setting, diff,
                        "max|Δ|", f"<= {AGREE_TARGET:g}", met, wide,
                        f"peer with a shared cache: max|Δ| {out['max_abs_diff_cached'][metric]:.1e}; top head ours "
                        f"{out['top_ours'][metric]}, peer {out['top_tl'][metric]}", data={"metric": metric}))
    t_ours, t_tl, t_cached = (median(out[k]) for k in ("seconds_ours", "seconds_tl", "seconds_tl_cached"))
    rows.append(Row("7b", "peer detect_head time / ours (3 patterns)", out["model"], setting + f", median of {repeats}",
                    t_tl / t_ours, "x", detail=(f"peer {t_tl:.2f} s as documented (model run per text per pattern), "
                                                f"{t_cached:.2f} s with one cache per text ({t_cached / t_ours:.2f}x); "
                                                f"ours {t_ours:.2f} s (batched, one pass)"),
                    data=out))
    return rows


# ------------------------------------------------------------------ the child


def _load(name: str, scratch: str):
    """The model; a tiny random one is saved to `scratch` and loaded back from there, because the peer
    reloads the tokenizer by its `name_or_path` (to switch on BOS), which an in-memory one lacks."""
    lm = load(name)
    if not name.startswith("tiny-"):
        return lm
    import headscope as hs

    lm.model.save_pretrained(scratch)
    lm.tokenizer.save_pretrained(scratch)
    return hs.load(scratch)


def _bridge(lm):
    from transformer_lens.model_bridge import TransformerBridge

    name = getattr(lm.model.config, "_name_or_path", "") or lm.name
    return TransformerBridge.boot_transformers(name, hf_model=copy.deepcopy(lm.model),
                                               tokenizer=copy.deepcopy(lm.tokenizer), device="cpu")


def _sequences(lm, bridge, n: int, length: int, seed: int) -> list[tuple[str, list[int]]]:
    """(text, the peer's token ids) of `n` repeated random word sequences that tokenise back exactly."""
    import torch

    tok = lm.tokenizer
    words = sorted(i for t, i in tok.get_vocab().items()
                   if t[:1] in ("Ġ", "▁") and t[1:].isascii() and t[1:].isalpha() and len(t) >= 4)
    if len(words) < 2:
        raise ValueError(f"{lm.name}: its vocabulary has too few word tokens to draw sequences from")
    gen = torch.Generator().manual_seed(seed)
    out: list[tuple[str, list[int]]] = []
    for _ in range(50 * n):
        r = [words[j] for j in torch.randint(len(words), (length,), generator=gen).tolist()]
        text = tok.decode(r + r)
        ids = bridge.to_tokens(text)[0].tolist()
        if ids[-2 * length :] == r + r and len(ids) <= 2 * length + 1:
            out.append((text, ids))
            if len(out) == n:
                return out
    raise ValueError(f"{lm.name}: only {len(out)} of {n} random sequences tokenised back to themselves")


def _ours(lm, seqs, batch_size: int) -> dict:
    import torch

    from headscope.analyses.heads import HeadScoreAccumulator
    from headscope.analyses.induction import detection_pattern, pattern_score
    from headscope.probe import extract_ids

    acc = HeadScoreAccumulator(model=lm.name, level="token")
    prev = None
    for start in range(0, len(seqs), batch_size):
        for amap in extract_ids(lm, [ids for _, ids in seqs[start : start + batch_size]], batch_size=batch_size):
            acc.update_repeated(amap)
            p = pattern_score(amap.attention, detection_pattern(amap.token_ids, "previous_token"))
            prev = p if prev is None else prev + p
    scores = acc.result()
    out = {"previous_token": prev / len(seqs)}
    for metric in ("duplicate_token", "induction"):
        out[metric] = torch.tensor(scores.grid(metric).to_numpy())  # [layer, head]
    return out


def _peer(bridge, seqs) -> dict:
    from transformer_lens.head_detector import detect_head

    texts = [text for text, _ in seqs]
    return {metric: detect_head(bridge, texts, name) for metric, name in PATTERNS.items()}


def _peer_cached(bridge, seqs) -> dict:
    from transformer_lens.head_detector import detect_head

    sums: dict = {}
    for text, _ in seqs:
        _, cache = bridge.run_with_cache(bridge.to_tokens(text), remove_batch_dim=True)
        for metric, name in PATTERNS.items():
            s = detect_head(bridge, text, name, cache=cache)
            sums[metric] = s if metric not in sums else sums[metric] + s
    return {m: s / len(seqs) for m, s in sums.items()}


def _top(grid) -> str:
    from headscope.probe.types import head_name

    flat = int(grid.argmax())
    layer, head = divmod(flat, grid.shape[1])
    return f"{head_name(layer, head)} {float(grid[layer, head]):.3f}"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="TransformerLens detect_head vs headscope on the same sequences")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--sequences", type=int, default=8)
    p.add_argument("--length", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        out = _compare(_load(args.model, scratch), args)
    child_output(out)


def _compare(lm, args) -> dict:
    from importlib import metadata

    if not lm.is_causal:
        raise SystemExit(f"{lm.name} is an encoder; the peer's duplicate/induction detectors are for decoders")
    bridge = _bridge(lm)
    seqs = _sequences(lm, bridge, args.sequences, args.length, args.seed)
    results: dict = {}

    def run(key, fn, *a):
        def go():
            results[key] = fn(*a)
        return go

    for fn, *a in ((_ours, lm, seqs[:1], 1), (_peer, bridge, seqs[:1]), (_peer_cached, bridge, seqs[:1])):
        fn(*a)  # warm-up on one sequence: first-call costs, not a full extra round of the slow peer
    times = interleaved({"ours": run("ours", _ours, lm, seqs, args.batch_size), "tl": run("tl", _peer, bridge, seqs),
                         "tl_cached": run("tl_cached", _peer_cached, bridge, seqs)}, args.repeats, warmup=0)
    ours, tl, cached = results["ours"], results["tl"], results["tl_cached"]
    diff = {m: float((ours[m].double() - tl[m].double()).abs().max()) for m in PATTERNS}
    diff_cached = {m: float((ours[m].double() - cached[m].double()).abs().max()) for m in PATTERNS}
    bos = seqs[0][1][0] if len(seqs[0][1]) == 2 * args.length + 1 else None
    return {
        "model": args.model, "tl_version": metadata.version("transformer-lens"), "n_sequences": len(seqs),
        "T": len(seqs[0][1]), "bos": lm.tokenizer.convert_ids_to_tokens(bos) if bos is not None else "(none)",
        "max_abs_diff": diff, "max_abs_diff_cached": diff_cached,
        "top_ours": {m: _top(ours[m]) for m in PATTERNS}, "top_tl": {m: _top(tl[m]) for m in PATTERNS},
        "seconds_ours": times["ours"], "seconds_tl": times["tl"], "seconds_tl_cached": times["tl_cached"],
    }


if __name__ == "__main__":
    main()
