"""The report's figures drawn on several processes (`reports.drawing`): the same bytes as drawn here, in order."""

from __future__ import annotations

import functools
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

import pytest

from headscope import RunSettings, analyse_model, builtin_set
from headscope.probe.tiny import TINY_CORPUS, tiny_model
from headscope.reports import drawing
from headscope.reports.figures import verification_plot
from headscope.reports.html import _figure_jobs, build_report


@functools.lru_cache(maxsize=None)
def _analysis():
    settings = RunSettings(corpus="c", coref="p", texts=("The cat sat on the mat.", "我爱北京天安门"), permutations=50,
                           induction_sequences=0, ablation=False)
    return analyse_model(tiny_model("bert"), list(TINY_CORPUS[:6]), [("t", builtin_set("agreement")[:12])], settings)


def _jobs():
    return [(spec.draw, panel.args) for spec, panel in _figure_jobs(_analysis())]


def test_a_figure_drawn_in_a_spawned_process_is_the_same_bytes():
    jobs = _jobs()
    assert len(jobs) >= drawing.PARALLEL_FROM and len({fn for fn, _ in jobs}) >= 5  # grids, maps, probes ...
    here = [drawing.draw(fn, args) for fn, args in jobs]
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        there = list(pool.map(drawing.draw, *zip(*jobs)))
    assert [d.png for d in there] == [d.png for d in here]
    assert [d.inline for d in there] == [d.inline for d in here]


def test_a_report_drawn_on_several_processes_is_the_serial_one():
    serial = build_report([_analysis()], workers=1)
    parallel = build_report([_analysis()], workers=3)
    assert [f.name for f in parallel.figures] == [f.name for f in serial.figures]
    assert [f.png for f in parallel.figures] == [f.png for f in serial.figures]
    assert [f.inline for f in parallel.figures] == [f.inline for f in serial.figures]


def test_draw_all_keeps_the_order_and_raises_a_drawing_error(monkeypatch):
    jobs = _jobs()[:5]
    assert [d.png for d in drawing.draw_all(jobs, workers=2)] == [drawing.draw(f, a).png for f, a in jobs]
    bad = [*jobs, (verification_plot, ("not a verification",))]  # drawn in a worker or here: the error reaches the caller
    with pytest.raises(AttributeError):
        drawing.draw_all(bad, workers=2)
    [args] = [a for f, a in jobs if f is verification_plot]
    local = lambda v: verification_plot(v)  # noqa: E731 — a function that cannot be sent to another process
    assert [d.png for d in drawing.draw_all([(local, args)] * 4, workers=2)] == [drawing.draw(verification_plot, args).png] * 4


def test_one_core_or_few_figures_start_no_process(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("no pool expected")

    monkeypatch.setattr("concurrent.futures.ProcessPoolExecutor", refuse)
    jobs = _jobs()
    assert len(drawing.draw_all(jobs, workers=1)) == len(jobs)
    assert len(drawing.draw_all(jobs[: drawing.PARALLEL_FROM - 1], workers=8)) == drawing.PARALLEL_FROM - 1


def test_the_pages_copy_is_made_from_the_drawn_pixels():
    for fn, args in _jobs()[:3]:
        d = drawing.draw(fn, args)
        assert d.inline == drawing.compact_png(d.png)  # the same as decoding the PNG again


def test_a_started_pool_draws_a_report_like_the_serial_one_and_stays_open(monkeypatch):
    serial = build_report([_analysis()], workers=1)
    from headscope.reports import canvas

    here = []
    real = canvas.to_png
    monkeypatch.setattr(canvas, "to_png", lambda *a, **k: here.append(1) or real(*a, **k))  # this process's draws
    with drawing.DrawingPool(2) as pool:
        for _ in range(2):  # a second report uses the same workers
            for _ in range(600):
                if pool.warm:
                    break
                time.sleep(0.1)
            assert pool.warm
            here.clear()
            pooled = build_report([_analysis()], pool=pool)
            assert [f.png for f in pooled.figures] == [f.png for f in serial.figures]
            assert [f.inline for f in pooled.figures] == [f.inline for f in serial.figures]
            assert 0 < len(here) < len(serial.figures)  # the worker drew the rest


def test_a_pool_of_one_starts_no_process(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("no pool expected")

    monkeypatch.setattr("concurrent.futures.ProcessPoolExecutor", refuse)
    with drawing.DrawingPool(1) as pool:
        assert pool.executor is None and pool.warm
        assert len(drawing.draw_all(_jobs()[:5], pool=pool)) == 5


def test_a_pools_worker_ends_when_the_process_that_started_it_is_killed(tmp_path):
    # Killed outright, the starter closes nothing: its worker must notice on its own, or it would live on holding
    # the run's output pipes (a caller reading them to their end would wait forever).
    import os
    import signal
    import subprocess
    import sys

    script = ("import os, time\n"
              "from headscope.reports.drawing import DrawingPool\n"
              "pool = DrawingPool(2)\n"
              "while not pool.warm:\n"
              "    time.sleep(0.05)\n"
              "print(*[p.pid for p in pool.executor._processes.values()], flush=True)\n"
              "time.sleep(600)\n")
    starter = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        [worker] = map(int, starter.stdout.readline().split())
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait()
        for _ in range(600):  # a liveness check, not a timing: at most a minute
            try:
                os.kill(worker, 0)
            except ProcessLookupError:
                break
            with open(f"/proc/{worker}/stat") as stat:  # a zombie has ended (its parent, killed, cannot reap it)
                if stat.read().split(") ")[1].startswith("Z"):
                    break
            time.sleep(0.1)
        else:
            os.kill(worker, signal.SIGKILL)
            raise AssertionError("the drawing worker outlived the process that started it")
    finally:
        starter.kill()


_SCRIPT = '''
import os, sys
with open(sys.argv[1], "a") as f:  # a line each time this script's top level runs
    f.write(f"started {os.getpid()}\\n")
import headscope as hs
from headscope.probe.tiny import TINY_CORPUS
from headscope.reports import drawing
drawing.drawing_workers = lambda: 2  # as on any machine with two cores: the old default spawned workers here
lm = hs.load("tiny:llama")
settings = hs.RunSettings(corpus="c", coref="p", permutations=20, texts=("The cat sat on the mat.",), induction_sequences=0,
                          ablation=False)
analysis = hs.analyse_model(lm, list(TINY_CORPUS[:2]), [("t", hs.builtin_set("agreement")[:8])], settings)
folder = hs.report([analysis], sys.argv[2])
print(len(folder.figures))
'''


def test_a_script_without_a_main_guard_calling_hs_report_runs_once(tmp_path):
    # Was: each spawned drawing worker imported the script again as __mp_main__, so the model was loaded again and
    # the report written again (a ReportFolderError traceback from the worker, exit 0).
    import os
    import subprocess
    import sys

    script, marks = tmp_path / "snippet.py", tmp_path / "marks.txt"
    script.write_text(_SCRIPT, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, str(script), str(marks), str(tmp_path / "report")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert int(done.stdout.split()[-1]) >= drawing.PARALLEL_FROM  # enough figures that workers would be started
    assert len(marks.read_text().splitlines()) == 1, marks.read_text()


def test_a_library_call_starts_workers_only_where_they_would_not_rerun_the_script(monkeypatch):
    import sys
    import types

    main = types.ModuleType("__main__")
    main.__file__, main.__spec__ = "/somewhere/snippet.py", None
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(drawing, "drawing_workers", lambda: 4)
    assert drawing.spawn_reruns_main() and drawing.default_workers() == 1
    del main.__file__  # the interactive interpreter, python -c
    assert not drawing.spawn_reruns_main() and drawing.default_workers() == 4
