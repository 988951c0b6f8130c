"""Profile one benchmarked path, to see where its time goes before changing anything.

    .venv-bench/bin/python benchmarks/profiling.py heads --model minilm --n 371
    .venv-bench/bin/python benchmarks/profiling.py verify --model smollm2 --n 16

`heads` is `headscope.heads` over the built-in corpus (item 1), `verify` is `probe.verify.verify` (item 3),
`extract` is `probe.extract` of one text of `--tokens` tokens (item 5). Uses pyinstrument when this
interpreter has it (`benchmarks/setup_peer.sh` puts it in .venv-bench), else cProfile. A warm-up run
comes first, so first-call costs stay out of the profile.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import corpus, load  # noqa: E402


def _target(what: str, lm, n: int, tokens: int) -> Callable[[], object]:
    if what == "heads":
        import headscope as hs

        texts = corpus(n)
        return lambda: hs.heads(lm, texts)
    if what == "verify":
        from headscope import verify

        texts = corpus(n)
        return lambda: verify(lm, texts)
    from headscope.probe.extract import extract
    from scaling import text_of_tokens

    text = text_of_tokens(lm, tokens)
    return lambda: extract(lm, text)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["heads", "verify", "extract"])
    p.add_argument("--model", default="minilm")
    p.add_argument("--n", type=int, default=200, help="texts (heads, verify)")
    p.add_argument("--tokens", type=int, default=512, help="tokens of the one text (extract)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    p.add_argument("--html", type=Path, default=None, help="also write pyinstrument's HTML view here")
    args = p.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    lm = load(args.model)
    fn = _target(args.what, lm, args.n, args.tokens)
    fn()  # warm-up
    try:
        from pyinstrument import Profiler
    except ImportError:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.runcall(fn)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
        return
    prof = Profiler(interval=0.001)
    prof.start()
    fn()
    prof.stop()
    print(prof.output_text(unicode=True, color=False))
    if args.html:
        args.html.write_text(prof.output_html(), encoding="utf-8")


if __name__ == "__main__":
    main()
