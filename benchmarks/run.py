"""headscope's benchmarks from one command: `make bench`, i.e. `.venv/bin/python benchmarks/run.py`.

Every figure is a ratio or a size measured in this run, on the same inputs, median of several
repeats (see benchmarks/README.md). A full run writes the table to `benchmarks/results.md` (and
`results.json`; a README with results markers gets it too, benchmarks/README.md has none: the
figures live in docs/performance.md); a run of some items (`--only`)
writes to `.bench/partial/`. `--quick` is a smoke run on tiny random models with tiny sizes (its
figures mean nothing) that writes to `.bench/quick/`.

Exit status: 0 when every target is met or missed by less than its wide margin; 1 when a target is
missed by a wide margin (full runs only) or a benchmark failed to run. Skipped items (a model or
the optional peer not installed) say why and do not fail the run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))  # sibling modules, also when imported by tests

from common import MB, REPO, Row, corpus, load, machine_info  # noqa: E402

__all__ = ["Plan", "FULL", "QUICK", "run", "render", "exit_code", "main"]

ITEMS = ("1", "2", "3", "4", "5", "6", "7")


@dataclass(frozen=True)
class Plan:
    """What a run measures, and on how much."""

    repeats: int
    heads: tuple[tuple[str, int], ...]  # item 1: (model, texts), `headscope heads`' defaults (induction too)
    naive: tuple[tuple[str, int], ...]  # item 2
    verify: tuple[tuple[str, int], ...]  # item 3
    memory: tuple[str, tuple[int, ...], int]  # item 4: model, corpus sizes, batch size
    scaling: tuple[tuple[str, tuple[int, ...]], ...]  # item 5: (model, lengths)
    run_model: str | None  # item 6a
    load_models: tuple[str, ...]  # item 6b
    peer: tuple[str, int, int]  # item 7: model, sequences, tokens per half
    quick: bool = False


FULL = Plan(
    repeats=3,
    heads=(("minilm", 2_000), ("smollm2", 200)),  # issue 26: minilm, 2,000 UD EWT sentences
    naive=(("minilm", 200), ("smollm2", 32)),
    verify=(("minilm", 32), ("smollm2", 32), ("gemma3-270m", 32)),
    memory=("minilm", (300, 3_000, 30_000), 32),
    scaling=(("minilm", (64, 128, 256, 512)), ("gemma3-270m", (64, 128, 256, 512, 1024, 2048))),
    run_model="minilm",
    load_models=("smollm2", "gemma3-270m"),
    peer=("smollm2", 8, 20),
)
QUICK = Plan(
    repeats=1,
    heads=(("tiny-bert", 16), ("tiny-llama", 16)),
    naive=(("tiny-bert", 16),),
    verify=(("tiny-llama", 8),),
    memory=("tiny-bert", (8, 16, 32), 8),
    scaling=(("tiny-llama", (16, 32, 64)),),
    run_model=None,
    load_models=(),
    peer=("tiny-llama", 2, 6),
    quick=True,
)


def _available(name: str) -> str | None:
    """None when `name` can be loaded here, else the reason and the install command."""
    if name.startswith("tiny-"):
        return None
    from headscope.probe.registry import KNOWN_MODELS, is_available

    spec = KNOWN_MODELS.get(name)
    if spec is None or is_available(spec):
        return None
    return f"{name} is not installed: {spec.install}"


class _Models:
    """Loads each model once for the in-process benchmarks."""

    def __init__(self) -> None:
        self._cache: dict = {}

    def get(self, name: str):
        if name not in self._cache:
            self._cache[name] = load(name)
        return self._cache[name]


def _sections(plan: Plan, models: _Models, peer_python: str | None) -> list[tuple[str, str, str, Callable[[], list[Row]]]]:
    """(item, title, model, thunk) for every benchmark of the plan, in the order they run."""
    import endtoend
    import memory
    import peer_tl
    import scaling
    import speed

    out: list = []
    r = plan.repeats
    for name, n in plan.heads:
        out.append(("1", f"head analyses vs bare loop, {name}", name, lambda name=name, n=n: [speed.heads_vs_bare(
            models.get(name), *speed.short_texts(n, ewt=not plan.quick), repeats=r)]))
    for name, n in plan.naive:
        out.append(("2", f"naive loop vs head analyses, {name}", name,
                    lambda name=name, n=n: [speed.heads_vs_naive(models.get(name), corpus(n), repeats=r)]))
    for name, n in plan.verify:
        out.append(("3", f"verification vs forward, {name}", name,
                    lambda name=name, n=n: [speed.verify_vs_forward(models.get(name), corpus(n), repeats=r)]))
    m_name, sizes, batch = plan.memory
    out.append(("4", f"peak RSS over corpus sizes, {m_name}", m_name,
                lambda: [memory.memory_flat(m_name, sizes, batch_size=batch)]))
    for name, lengths in plan.scaling:
        out.append(("5", f"scaling with T, {name}", name,
                    lambda name=name, lengths=lengths: scaling.scaling(name, lengths, repeats=r)))
    if plan.run_model:
        out.append(("6", f"headscope run cold/warm, {plan.run_model}", plan.run_model,
                    lambda: endtoend.headscope_run(plan.run_model)))
    for name in plan.load_models:
        out.append(("6", f"GGUF cache and load time, {name}", name, lambda name=name: [endtoend.load_times(name)]))
    p_model, p_seqs, p_len = plan.peer
    out.append(("7", f"TransformerLens side by side, {p_model}", p_model, lambda: peer_tl.peer_side_by_side(
        p_model, python=peer_python, sequences=p_seqs, length=p_len, repeats=r)))
    return out


def run(plan: Plan, *, only: Sequence[str] = ITEMS, peer_python: str | None = None, log=print) -> list[Row]:
    """Every benchmark of `plan` whose item is in `only`; a failing one becomes an error row."""
    models = _Models()
    rows: list[Row] = []
    todo = [s for s in _sections(plan, models, peer_python) if s[0] in only]
    for i, (item, title, model, thunk) in enumerate(todo, 1):
        t0 = time.perf_counter()
        log(f"[{i}/{len(todo)}] item {item}: {title} ...")
        missing = _available(model)
        if missing:
            rows.append(Row(item, title, model, "", None, "", status="skipped", detail=missing))
        else:
            try:
                rows += thunk()
            except Exception as exc:  # one broken benchmark must not hide the others
                rows.append(Row(item, title, model, "", None, "", status="error",
                                detail=f"{type(exc).__name__}: {str(exc).strip()[-600:]}"))
        log(f"      {time.perf_counter() - t0:.0f} s")
    return rows


# ------------------------------------------------------------------ rendering


def _figure(row: Row) -> str:
    if row.status != "ok" or row.figure is None or (isinstance(row.figure, float) and math.isnan(row.figure)):
        return row.status if row.status != "ok" else "—"
    v = row.figure
    return {"x": f"{v:.2f}x", "%": f"{v:.1f}%", "s": f"{v:.1f} s", "MB peak": f"{v:.0f} MB",
            "max|Δ|": f"{v:.1e}", "b": f"T^{v:.2f}"}.get(row.unit, f"{v:.3g} {row.unit}")


def _met(row: Row) -> str:
    if row.met is None:
        return "—"
    if row.met:
        return "yes"
    return "**NO — wide miss**" if row.wide_miss else "**no**"


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def render(rows: Sequence[Row], machine: dict, *, started: str, seconds: float, quick: bool, command: str) -> str:
    """The results as markdown: the machine, one table of every figure, and the scaling detail."""
    lines = [
        "# headscope benchmark results" + (" (--quick smoke run: tiny random models, figures mean nothing)" if quick else ""),
        "",
        f"`{command}` — {started}, {seconds / 60:.1f} min.",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['ram_gib']} GiB RAM; {machine['os']}; "
        f"Python {machine['python']}, torch {machine['torch']} ({machine['torch_threads']} threads), "
        f"transformers {machine['transformers']}; GPU: {machine['gpu']}. Load average (1 min) at start "
        f"{machine['load_average_1min']}, at end {machine.get('load_average_end', '?')} — other processes shared "
        "the cores when this is well above 0.",
        "",
        "| # | benchmark | model | figure | target | met | setting; detail |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r.key} | {_cell(r.benchmark)} | {r.model} | {_figure(r)} | {_cell(r.target)} | {_met(r)} | "
                     f"{_cell(r.setting)}{'; ' if r.setting and r.detail else ''}{_cell(r.detail)} |")
    for r in rows:
        if r.key == "5a" and r.status == "ok":
            lines += ["", f"## Extraction vs sequence length, {r.model}", "",
                      "| T | option | seconds | peak RSS over the loaded model | attention kept |", "|---|---|---|---|---|"]
            lines += [f"| {x['T']} | {x['option']} | {x['seconds']:.3f} | {x['peak_delta'] / MB:.1f} MB | "
                      f"{x['kept'] / MB:.2f} MB |" for x in r.data["records"]]
    return "\n".join(lines) + "\n"


_BEGIN, _END = "<!-- results:begin -->", "<!-- results:end -->"


def _update_readme(readme: Path, table_md: str) -> None:
    """Put the results between the README's result markers (left alone when they are missing)."""
    if not readme.exists():
        return
    text = readme.read_text(encoding="utf-8")
    if _BEGIN not in text or _END not in text:
        return
    head, rest = text.split(_BEGIN, 1)
    _, tail = rest.split(_END, 1)
    body = table_md.split("\n", 2)[2]  # without the title line
    readme.write_text(f"{head}{_BEGIN}\n{body.strip()}\n{_END}{tail}", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("--quick", action="store_true", help="smoke run: tiny random models, tiny sizes, one repeat")
    p.add_argument("--only", default=",".join(ITEMS), help="comma-separated benchmark numbers to run (default: all)")
    p.add_argument("--repeats", type=int, default=None, help="repeats per timing (default 3; 1 with --quick)")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for results.md/results.json (default: benchmarks/ for a full run, .bench/quick "
                        "with --quick, .bench/partial with --only)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads here and OMP_NUM_THREADS in the child processes (default: torch's own choice, "
                        "one per core); 1 keeps figures sane on cores shared with other busy processes")
    p.add_argument("--peer-python", default=None,
                   help="interpreter with transformer-lens for item 7 (default: this one, else .venv-bench)")
    args = p.parse_args(argv)
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    bad = sorted(set(only) - set(ITEMS))
    if bad:
        p.error(f"--only: unknown items {bad}; choose from {', '.join(ITEMS)}")
    plan = QUICK if args.quick else FULL
    if args.repeats:
        plan = replace(plan, repeats=args.repeats)
    full = not plan.quick and set(only) == set(ITEMS)
    out = args.out or (REPO / "benchmarks" if full else REPO / ".bench" / ("quick" if plan.quick else "partial"))
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # packaged weights only; never wait on a network
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)

    import peer_tl

    peer = peer_tl.peer_python(args.peer_python) if "7" in only else None
    machine = machine_info()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    rows = run(plan, only=only, peer_python=peer, log=log)
    seconds = time.perf_counter() - t0
    machine["load_average_end"] = round(os.getloadavg()[0], 2)
    command = "benchmarks/run.py" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    md = render(rows, machine, started=started, seconds=seconds, quick=plan.quick, command=command)
    (out / "results.md").write_text(md, encoding="utf-8")
    (out / "results.json").write_text(json.dumps({
        "started": started, "seconds": seconds, "quick": plan.quick, "command": command, "machine": machine,
        "rows": [r.to_dict() for r in rows]}, indent=1, default=str) + "\n", encoding="utf-8")
    if full and args.out is None:
        _update_readme(REPO / "benchmarks" / "README.md", md)
    print(md)
    return exit_code(rows, quick=plan.quick, log=log)


def exit_code(rows: Sequence[Row], *, quick: bool, log=print) -> int:
    """1 when a target is missed by its wide margin (not in a quick run) or a benchmark failed; else 0."""
    wide = [r for r in rows if r.wide_miss] if not quick else []
    errors = [r for r in rows if r.status == "error"]
    for r in wide:
        log(f"bench: target missed by a wide margin: {r.key} {r.benchmark} ({r.model}): {_figure(r)}, target {r.target}")
    for r in errors:
        log(f"bench: {r.key} {r.benchmark} ({r.model}) failed: {r.detail}")
    return 1 if wide or errors else 0


if __name__ == "__main__":
    sys.exit(main())
