"""Smoke tests of the benchmark suite (benchmarks/): its code paths on tiny random models and tiny sizes.

No timing assertions — on shared cores the seconds are noise. What is checked: each benchmark runs
and writes its row; the known-size answers (attention bytes kept under each option, a text of
exactly T tokens); the verdict logic (targets, wide misses, exit status); and the correctness
checks inside the benchmarks (the naive loop and ours give the same scores; ours and
TransformerLens agree, where it is installed).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from conftest import ONE_STACK

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
import memory  # noqa: E402
import memwatch  # noqa: E402
import peer_tl  # noqa: E402
import recompute as bench_recompute  # noqa: E402
import run as bench_run  # noqa: E402
import scaling  # noqa: E402

MB = 2**20


def test_judge_marks_met_missed_and_wide_misses():
    assert common.judge(1.25, 1.25, 1.6) == (True, False)
    assert common.judge(1.4, 1.25, 1.6) == (False, False)
    assert common.judge(1.7, 1.25, 1.6) == (False, True)


def _row(key="1", **kw):
    base = dict(key=key, benchmark="b", model="m", setting="s", figure=1.0, unit="x")
    return common.Row(**(base | kw))


def test_exit_code_fails_only_on_wide_misses_and_errors():
    ok = _row(target="<= 1.25x", met=False)  # a near miss: reported, not fatal
    wide = _row(target="<= 1.25x", met=False, wide_miss=True)
    broken = _row(status="error", figure=None, detail="boom")
    quiet = dict(log=lambda *_: None)
    assert bench_run.exit_code([ok], quick=False, **quiet) == 0
    assert bench_run.exit_code([ok, wide], quick=False, **quiet) == 1
    assert bench_run.exit_code([ok, wide], quick=True, **quiet) == 0  # tiny models: figures mean nothing
    assert bench_run.exit_code([broken], quick=True, **quiet) == 1


def test_render_shows_machine_verdicts_and_escapes_cells():
    machine = {"cpu": "CPU X", "cores": 2, "ram_gib": 8.0, "os": "os", "python": "3", "torch": "t",
               "torch_threads": 1, "transformers": "tf", "gpu": "none", "load_average_1min": 0.1,
               "load_average_end": 0.2}
    rows = [_row(target="<= 1.25x", met=True, figure=1.1), _row(key="3", met=False, wide_miss=True, figure=2.0),
            _row(key="7", status="skipped", figure=None, detail="pip install x|y")]
    md = bench_run.render(rows, machine, started="now", seconds=60, quick=False, command="benchmarks/run.py")
    assert "CPU X, 2 cores, 8.0 GiB RAM" in md and "(1 threads)" in md
    assert "| 1 | b | m | 1.10x | <= 1.25x | yes |" in md
    assert "**NO — wide miss**" in md
    assert "| skipped |" in md and "pip install x\\|y" in md  # a | inside a cell does not split it


def test_readme_block_is_replaced_between_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- results:begin -->\nold\n<!-- results:end -->\nafter\n")
    bench_run._update_readme(readme, "# title\n\nnew table\n")
    assert readme.read_text() == "intro\n<!-- results:begin -->\nnew table\n<!-- results:end -->\nafter\n"
    plain = tmp_path / "PLAIN.md"
    plain.write_text("no markers\n")
    bench_run._update_readme(plain, "# title\n\nnew\n")
    assert plain.read_text() == "no markers\n"


def test_quick_run_of_items_1_to_3_writes_the_table(tmp_path, monkeypatch):
    import torch

    threads = torch.get_num_threads()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, str(threads))  # main() sets them; monkeypatch puts them back
    try:  # one thread: tiny ops on busy shared cores otherwise wait on each other
        rc = bench_run.main(["--quick", "--only", "1,2,3", "--out", str(tmp_path), "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    result = json.loads((tmp_path / "results.json").read_text())
    rows = result["rows"]
    assert [r["key"] for r in rows] == ["1", "1", "2", "3"]
    assert all(r["status"] == "ok" and r["figure"] > 0 for r in rows), rows
    naive = rows[2]["data"]
    assert naive["max_abs_diff_scores"] < 1e-6  # the naive loop and ours compute the same scores
    assert naive["kept_bytes"] > 0
    assert rows[3]["data"]["passed"] is True
    md = (tmp_path / "results.md").read_text()
    assert "--quick smoke run" in md and "| 3 | verification extra time / plain forward | tiny-llama |" in md
    assert result["machine"]["cores"] >= 1 and result["machine"]["torch_threads"] == 1


def test_unknown_item_is_refused():
    with pytest.raises(SystemExit):
        bench_run.main(["--only", "8"])


def test_memory_child_streams_and_reports(capsys):
    memory.main(["--model", "tiny-bert", "--n", "12", "--batch-size", "4"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["n"] == 12 and out["peak_rss"] >= out["baseline_rss"] > 0
    assert out["process_peak_rss"] >= out["peak_rss"]
    if sys.platform.startswith("linux"):  # anonymous memory is part of the resident set, not more
        assert 0 < out["baseline_anon"] <= out["peak_anon"] <= out["peak_rss"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_memwatch_reports_a_commands_anonymous_and_resident_peaks(tmp_path, capsys):
    """A child that holds a bytearray it wrote (anonymous) and reads a file through a mapping (file pages): both
    are resident, only the first is anonymous; the exit status passes through."""
    data = tmp_path / "data"
    data.write_bytes(b"x" * (64 << 20))
    code = ("import mmap, sys, time\n"
            "held = bytearray(b'y') * (32 << 20)\n"
            f"f = open({str(data)!r}, 'rb')\n"
            "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)\n"
            "total = sum(m[i] for i in range(0, len(m), 4096))\n"
            "time.sleep(0.5)\n"
            "sys.exit(3)\n")
    rc = memwatch.main(["--interval", "0.01", "--json", str(tmp_path / "out.json"), "--", sys.executable, "-c", code])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == out["rc"] == 3 and json.loads((tmp_path / "out.json").read_text()) == out
    mb = 1 << 20
    assert out["peak_anon"] >= 32 * mb  # the bytearray
    assert out["peak_rss"] >= out["peak_anon"] + 60 * mb  # and the mapped file's pages beside it
    assert out["hwm"] >= out["peak_rss"] and out["cpu_seconds"] > 0
    assert memwatch.status_fields(2**22 + 7) is None  # no such process


def test_flat_row_spread_and_verdict():
    def runs(*peaks_mb):
        return [{"n": 10**i, "peak_rss": p * MB, "baseline_rss": 90 * MB, "process_peak_rss": 120 * MB, "seconds": 1.0}
                for i, p in enumerate(peaks_mb, 2)]

    flat = memory.flat_row("m", runs(100, 105, 110), batch_size=8, window=4)
    assert flat.figure == pytest.approx(10.0) and flat.met and not flat.wide_miss
    grows = memory.flat_row("m", runs(100, 130), batch_size=8, window=4)
    assert grows.figure == pytest.approx(30.0) and not grows.met and grows.wide_miss


@pytest.mark.parametrize("family", ONE_STACK)  # the benchmarks run single-stack models
def test_text_of_tokens_is_exact(family):
    lm = common.load(f"tiny-{family}")
    for n in (20, 57):
        text = scaling.text_of_tokens(lm, n)
        assert len(lm.tokenizer(text)["input_ids"]) == n


def test_scaling_child_keeps_what_each_option_asks(capsys):
    scaling.main(["--model", "tiny-llama", "--lengths", "16,32", "--repeats", "1"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    n_layers, n_heads = out["layers"], out["heads"]
    kept = {(r["T"], r["option"]): r["kept"] for r in out["records"]}
    for t in (16, 32):
        full, half, one_layer, one_head = (kept[(t, o)] for o in scaling.OPTIONS)
        assert full == n_layers * n_heads * t * t * 4  # [layer, head, query, key] float32
        assert half == full // 2  # float16 kept
        assert one_layer == n_heads * t * t * 4
        assert one_head == t * t * 2
    assert out["skipped"] == []


def test_slope_recovers_a_power_law():
    recs = [{"T": t, "seconds": 3e-6 * t**2} for t in (64, 128, 256, 512, 1024)]
    assert scaling._slope(recs, "seconds") == pytest.approx(2.0)
    assert math.isnan(scaling._slope(recs[:1], "seconds"))


def test_peer_agrees_with_transformerlens_on_a_tiny_model():
    python = peer_tl.peer_python()
    if python is None:
        pytest.skip(f"transformer-lens is not installed (optional benchmark dependency): {peer_tl.SETUP_HINT}")
    rows = peer_tl.peer_side_by_side("tiny-llama", python=python, sequences=2, length=6, repeats=1)
    agreement = [r for r in rows if r.key == "7a"]
    assert len(agreement) == 3 and all(r.met for r in agreement), [(r.benchmark, r.figure) for r in agreement]
    assert [r.key for r in rows][-1] == "7b" and rows[-1].figure > 0


def test_recompute_children_measure_a_tiny_model():
    # The code paths of the long-text benchmark in-process: the same text through SDPA, recompute and eager.
    notes = {}
    for mode in ("sdpa", "recompute", "eager"):
        r = bench_recompute._child(mode, "tiny-llama", 40, 2_000)
        assert (r["mode"], r["tokens"]) == (mode, 40) and r["seconds"] > 0 and r["peak_rss"] > 0
        notes[mode] = r["note"]
    assert "1 text recomputed, prefix check passed" in notes["recompute"]
    words = bench_recompute._child("recompute", "tiny-llama", 40, 10**9)["note"]
    assert words.split(";")[1] == notes["recompute"].split(";")[1]
    # what it measures is the product: hs.heads's own scores of that text (eager here, to 1e-4)
    import headscope as hs

    lm = common.load("tiny-llama")
    eager = hs.heads(lm, [bench_recompute._text_of_tokens(lm, 40)], induction_sequences=0)
    assert abs(float(words.split("mean self ")[1]) - float(eager.grid("self").to_numpy().mean())) <= 1e-4


def test_the_explorer_child_times_the_first_overview_of_its_head():
    r = bench_recompute._child("explorer", "tiny-llama", 40, 2_000, layer=1, head=3)
    assert (r["mode"], r["tokens"]) == ("explorer", 40) and r["seconds"] > 0 and r["peak_rss_after"] >= r["peak_rss"] > 0
    assert r["note"].startswith("overview of L1H3 in 64 x 64 tiles") and "checked against eager" in r["note"]
    runs = [{"mode": "sdpa", "model": "g", "tokens": 100, "seconds": 10.0, "peak_rss": 200 * MB},
            {**r, "model": "g", "tokens": 100, "seconds": 8.0, "peak_rss": 300 * MB}]
    md = bench_recompute.render(runs, long_model="", scaling_model="g", skipped={})
    assert "| g | 100 | 10.0 | 8.0 | 0.80x | 300 MB | 200 MB | 1.50x |" in md
    assert "time and peak RSS against T" not in md  # an SDPA run beside the explorer is no scaling point


def test_recompute_tables_fit_the_exponents_and_mark_eager_not_run():
    runs = [{"mode": m, "model": "g", "tokens": t, "seconds": c * t**2, "peak_rss": 100 * MB * t}
            for t in (1024, 2048, 4096) for m, c in (("sdpa", 1e-6), ("recompute", 2e-6))]
    runs += [{"mode": "eager", "model": "g", "tokens": 1024, "seconds": 3.0, "peak_rss": 5 * MB},
             {"mode": "sdpa", "model": "s", "tokens": 6000, "seconds": 10.0, "peak_rss": MB},
             {"mode": "recompute", "model": "s", "tokens": 6000, "error": "killed: RSS passed the 6.0 GB cap"},
             {"mode": "corpus", "model": "m", "tokens": 0, "ratio": 1.1, "setting": "2000 texts", "detail": "d"}]
    md = bench_recompute.render(runs, long_model="s", scaling_model="g", skipped={4096: "not run: needs 9.7 GB"})
    assert "- recompute: time ~ T^2.00, peak RSS ~ T^1.00 (T = 1024, 2048, 4096)" in md
    assert "| 4,096 | 16.8 | 33.6 | 2.00x | not run: needs 9.7 GB |" in md
    assert "killed: RSS passed the 6.0 GB cap" in md and "| m | 1.10x | 2000 texts | d |" in md
    assert "eager: time" not in md  # one eager point: no exponent


def test_eager_need_counts_both_copies():
    assert bench_recompute.eager_need(18, 4, 4096) == 2 * 18 * 4 * 4096**2 * 4


def test_capped_child_is_killed_past_its_memory_cap():
    hog = [sys.executable, "-c", "import time; x = bytearray(400 * 2**20); x[::4096] = b'1' * len(x[::4096]); "
           "time.sleep(60)"]
    r = bench_recompute.run_capped(hog, cap=100 * MB, timeout=60)
    assert "cap" in r["error"] and r["sampled_peak_rss"] > 100 * MB
    fine = bench_recompute.run_capped([sys.executable, "-c", "import json; print(json.dumps({'a': 1}))"], cap=10**10, timeout=60)
    assert fine == {"a": 1}


def test_recompute_corpus_child_times_both_contenders():
    r = bench_recompute._child("corpus", "tiny-bert", 0, 0, n_texts=16, repeats=1)
    assert r["texts"] == 16 and r["ratio"] == pytest.approx(r["seconds_ours"][0] / r["seconds_bare"][0])
