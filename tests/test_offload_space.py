"""Offloading to a disk without room (issue 45): one line, exit 2, the temporary folder removed — never SIGBUS.

accelerate wrote the offloaded weights through writable memory maps, which die of SIGBUS ("Bus error",
rc 135) when a tmpfs fills up. `probe.offload` checks the room first and writes with plain writes. The tests
fake the free-space query and a failing write (no mount needed), and, where this process may mount a small
tmpfs (root), run the issue's own command on one.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from headscope.probe import offload
from headscope.probe.errors import PlacementError
from headscope.probe.device_placement import Placement
from headscope.probe.loading import load_model

ROOT = Path(__file__).resolve().parents[1]


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_the_files_are_accelerate_s_own_byte_for_byte(tmp_path):
    """The same files and index as accelerate's writer, for every dtype it treats apart, read back by its hooks."""
    from accelerate.utils import offload_state_dict
    from accelerate.utils.offload import load_offloaded_weight

    g = torch.Generator().manual_seed(0)
    state = {"w.f32": torch.randn(3, 5, generator=g), "w.bf16": torch.randn(4, 2, generator=g).bfloat16(),
             "w.f16": torch.randn(7, generator=g).half(), "scalar": torch.tensor(2.5),
             "ids": torch.arange(6).reshape(2, 3), "strided": torch.randn(4, 6, generator=g)[:, ::2]}
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    offload.write_offloaded(ours, state)
    offload_state_dict(str(theirs), {k: v.contiguous() for k, v in state.items()})
    assert _left(ours) == _left(theirs)
    for name in _left(ours):
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
    index = json.loads((ours / "index.json").read_text())
    for name, tensor in state.items():
        back = load_offloaded_weight(str(ours / f"{name}.dat"), index[name])
        assert back.dtype == tensor.dtype and torch.equal(back, tensor), name


def test_a_disk_too_small_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    (tmp_path / "mine.txt").write_text("the user's")
    monkeypatch.setattr(offload, "free_bytes", lambda folder: 100_000)
    with pytest.raises(PlacementError) as exc:
        load_model("tiny:llama", placement=Placement(max_memory={"cpu": 150_000}, offload_folder=tmp_path))
    line = str(exc.value)
    assert "offload_folder" in line and "0.1 MB free" in line and "\n" not in line
    assert _left(tmp_path) == ["mine.txt"] and (tmp_path / "mine.txt").read_text() == "the user's"


def test_a_disk_that_fills_up_while_writing_is_one_line_and_its_folder_goes(tmp_path, monkeypatch):
    """The room was there when checked, then another process took it: the write's ENOSPC, not a signal."""
    real_open, written = open, []

    def filling(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        written.append(path)
        if len(written) == 4 and "w" in mode:
            f.close()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return f

    monkeypatch.setattr(offload, "open", filling, raising=False)
    with pytest.raises(PlacementError, match="No space left on device"):
        load_model("tiny:llama", placement=Placement(max_memory={"cpu": 150_000}, offload_folder=tmp_path))
    assert len(written) == 4 and _left(tmp_path) == []


@pytest.fixture()
def full_disk(tmp_path):
    """A 64 kB tmpfs, mounted for this test (root only; skipped where mounting is not permitted)."""
    mount = tmp_path / "full"
    mount.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True, timeout=30)


_CHILD = """
import sys
from headscope.cli import main
from headscope.probe import offload
from headscope.probe.errors import PlacementError
from headscope.probe.device_placement import Placement
from headscope.probe.loading import load_model

folder = sys.argv[1]
try:  # the issue's command
    main(["verify", "--model", "tiny:llama", "--max-memory", "cpu=150kB", "--offload-folder", folder])
except SystemExit as exc:
    print("EXIT", exc.code, flush=True)
offload.free_bytes = lambda folder: 1 << 40  # the check fooled, as by another process filling the disk after it
try:
    load_model("tiny:llama", placement=Placement(max_memory={"cpu": 150_000}, offload_folder=folder))
except PlacementError as exc:
    print("REFUSED", exc, flush=True)
"""


def test_the_issue_s_full_tmpfs_is_one_line_exit_2_no_folder_left_and_no_signal(full_disk):
    """On a 64 kB tmpfs: the issue's command, then a load whose room check is fooled so that the writes themselves
    meet the full disk, where accelerate's memory maps died of SIGBUS. In a child process, so that a signal cannot
    take the test run with it."""
    done = subprocess.run([sys.executable, "-c", _CHILD, str(full_disk)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # -7: SIGBUS
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headscope: --offload-folder") and "MB free" in lines[0], lines
    exit_line, refused = done.stdout.strip().splitlines()
    assert exit_line == "EXIT 2"
    assert refused.startswith("REFUSED offload_folder") and "No space left on device" in refused
    assert _left(full_disk) == []
    (full_disk / f"{uuid.uuid4().hex}.txt").write_bytes(b"x" * 30_000)  # its space was given back
