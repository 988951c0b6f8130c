"""Benchmark 5: time and peak memory of extraction as the sequence grows, T = 64 ... 2,048.

Attention is O(T²) per head, and `probe.extract` can keep only what is asked: chosen `layers`/`heads`
and a `store_dtype` for what it keeps. One text of exactly T tokens (the built-in corpus joined and
cut) goes through `probe.extract` under each option, in a child process started with
`MALLOC_MMAP_THRESHOLD_` set low, so freed tensors go back to the system and RSS follows live memory
from one measurement to the next. A length whose full attention would not fit comfortably in the
free memory is skipped and said so.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Sequence

from common import MB, PeakRss, Row, child_output, load, median, run_child

__all__ = ["OPTIONS", "scaling", "text_of_tokens", "main"]

LENGTHS = (64, 128, 256, 512, 1024, 2048)
OPTIONS = ("all layers+heads, float32", "all layers+heads, float16 kept", "last layer, float32",
           "last layer, head 0, float16 kept")
_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def _option_kwargs(lm, option: str) -> dict:
    import torch

    last = lm.config.num_hidden_layers - 1
    return {
        OPTIONS[0]: {},
        OPTIONS[1]: {"store_dtype": torch.float16},
        OPTIONS[2]: {"layers": [last]},
        OPTIONS[3]: {"layers": [last], "heads": [0], "store_dtype": torch.float16},
    }[option]


def text_of_tokens(lm, n_tokens: int) -> str:
    """A text from the built-in corpus that `lm` tokenises into exactly `n_tokens` tokens (specials included)."""
    from headscope import builtin_corpus

    from transformers.utils import logging as hf_logging

    tok = lm.tokenizer
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "longer than the maximum sequence length": we cut it below
    try:
        text = " ".join(builtin_corpus())
        while len(tok(text)["input_ids"]) < n_tokens + 8:
            text = text + " " + text
        enc = tok(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    finally:
        hf_logging.set_verbosity(verbosity)
    n_special = sum(tok("a", return_special_tokens_mask=True)["special_tokens_mask"])
    offsets = [o for o, s in zip(enc["offset_mapping"], enc["special_tokens_mask"]) if not s]
    k = n_tokens - n_special
    while k > 0:
        cut = text[: offsets[k - 1][1]]
        got = len(tok(cut)["input_ids"])
        if got == n_tokens:
            return cut
        k += -1 if got > n_tokens else 1
    raise ValueError(f"could not cut a text of exactly {n_tokens} tokens for {lm.name}")


def _fits(lm, n_tokens: int) -> tuple[bool, float]:
    """Whether about three copies of every layer's attention (the model's, the stack, the kept one) fit
    in half the memory available now; and that estimate in bytes."""
    import psutil

    cfg = lm.config
    need = 3 * cfg.num_hidden_layers * cfg.num_attention_heads * n_tokens**2 * 4
    return need < 0.5 * psutil.virtual_memory().available, need


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    p.add_argument("--repeats", type=int, default=3, help="timed runs per length and option (1 from T >= 512)")
    args = p.parse_args(argv)
    from headscope.probe.extract import extract

    lm = load(args.model)
    records, skipped = [], []
    for n_tokens in (int(x) for x in args.lengths.split(",")):
        if n_tokens > lm.max_length:
            skipped.append(f"T={n_tokens}: over {lm.name}'s limit of {lm.max_length}")
            continue
        ok, need = _fits(lm, n_tokens)
        if not ok:
            skipped.append(f"T={n_tokens}: needs about {need / 2**30:.1f} GiB, over half the free memory")
            continue
        text = text_of_tokens(lm, n_tokens)
        if not records:
            extract(lm, text)  # warm-up: first-call costs stay out of the figures
        for option in OPTIONS:
            kwargs = _option_kwargs(lm, option)
            seconds, peak, kept = [], 0, 0
            for _ in range(args.repeats if n_tokens < 512 else 1):
                with PeakRss() as rss:
                    t0 = time.perf_counter()
                    [amap] = extract(lm, text, **kwargs)
                    seconds.append(time.perf_counter() - t0)
                kept = amap.attention.numel() * amap.attention.element_size()
                peak = max(peak, rss.delta)
                del amap
            records.append({"T": n_tokens, "option": option, "seconds": median(seconds), "peak_delta": peak,
                            "kept": kept})
    child_output({"model": lm.name, "layers": lm.config.num_hidden_layers, "heads": lm.config.num_attention_heads,
                  "records": records, "skipped": skipped})


def _slope(records: list[dict], key: str) -> float:
    """Least-squares exponent b of `key` ~ T^b over the longer half of the lengths (where fixed costs fade)."""
    lengths = sorted({r["T"] for r in records})
    start = lengths[len(lengths) // 2 - (len(lengths) % 2 == 0)] if lengths else 0
    pts = [(math.log(r["T"]), math.log(max(r[key], 1e-9))) for r in records if r["T"] >= start]
    if len(pts) < 2:
        return math.nan
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def scaling(model: str, lengths: Sequence[int] = LENGTHS, *, repeats: int = 3) -> list[Row]:
    """Item 5: rows for the longest T each option reached, the fitted exponents, and the full table."""
    out = run_child("scaling.py", ["--model", model, "--lengths", ",".join(map(str, lengths)), "--repeats", repeats],
                    env=_ENV)
    recs = out["records"]
    if not recs:
        return [Row("5", "extraction scaling with T", model, "", None, "", status="skipped",
                    detail="; ".join(out["skipped"]))]
    t_max = max(r["T"] for r in recs)
    full = [r for r in recs if r["option"] == OPTIONS[0]]
    at_max = {r["option"]: r for r in recs if r["T"] == t_max}
    base = at_max[OPTIONS[0]]
    note = f"; skipped: {'; '.join(out['skipped'])}" if out["skipped"] else ""
    setting = (f"{out['layers']} layers x {out['heads']} heads, one text of T tokens, "
               f"T = {', '.join(str(t) for t in sorted({r['T'] for r in recs}))}")
    rows = [Row("5a", "extraction time ~ T^b (longer half of T), all layers+heads", model, setting, _slope(full, "seconds"),
                "b", detail=f"T={t_max}: {base['seconds']:.2f} s; peak memory ~ T^{_slope(full, 'peak_delta'):.2f}{note}",
                data={"records": recs, "skipped": out["skipped"]})]
    for option in OPTIONS:
        r = at_max[option]
        rows.append(Row("5b", f"T={t_max}: {option}", model, f"one text of {t_max} tokens", r["peak_delta"] / MB, "MB peak",
                        detail=(f"{r['seconds']:.2f} s ({r['seconds'] / base['seconds']:.2f}x of all/float32); "
                                f"kept {r['kept'] / MB:.1f} MB ({r['kept'] / base['kept']:.3f}x); peak is RSS over the "
                                f"loaded model"),
                        data=r))
    return rows


if __name__ == "__main__":
    main()
