"""Writing a model's offloaded weights to disk, in accelerate's offload format, where a full disk is one line.

accelerate's own writer (`accelerate.utils.offload_state_dict`) fills each `.dat` file through a writable
memory map: on a disk that fills up (a tmpfs, a quota) the kernel answers a page it cannot back with SIGBUS,
and the process dies with "Bus error", no message, its half-written folder left behind. Here the files are
written with plain writes instead, after checking that the folder's disk has room for them: a disk too small is
a `PlacementError` before the first byte, one that fills up meanwhile an `OSError` (ENOSPC), never a signal.
The format is accelerate's (one raw C-order file `NAME.dat` per tensor, bfloat16 and float8 as the integers of
their width, and `index.json` of dtype and shape), which its hooks read back.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Mapping

import torch

from .errors import PlacementError

__all__ = ["write_offloaded", "offload_bytes", "free_bytes"]

_BLOCK = 4096  # what a file may take beyond its bytes on most file systems (its last, partly used block)
_SPARE = 1 << 20  # room left over on the disk after the weights (index.json, the file system's own)


def free_bytes(folder: Path) -> int:
    """Bytes a process may still write on the file system holding `folder`."""
    return shutil.disk_usage(folder).free


def offload_bytes(state: Mapping[str, torch.Tensor]) -> int:
    """What `write_offloaded(state)` takes on disk at most: each tensor's bytes, each file's last block, a spare MB."""
    return sum(t.numel() * t.element_size() + _BLOCK for t in state.values()) + _SPARE


def _as_written(tensor: torch.Tensor) -> tuple[str, torch.Tensor]:
    """(accelerate's dtype name, the tensor as the numpy-readable integers or floats it is stored as)."""
    name = str(tensor.dtype).removeprefix("torch.")
    if tensor.dtype == torch.bfloat16:
        return name, tensor.view(torch.int16)
    if name.startswith("float8_"):
        return name, tensor.view(torch.int8)
    return "", tensor


def write_offloaded(folder: Path, state: Mapping[str, torch.Tensor], *, what: str = "offload_folder") -> None:
    """`state` written into `folder` (which exists) as accelerate's offload: `PlacementError` (one line) when the
    disk has no room for it; an `OSError` from a disk that fills up while writing."""
    need, free = offload_bytes(state), free_bytes(folder)
    if free < need:
        raise PlacementError(f"{what} {folder.parent} has {free / 1e6:,.1f} MB free, and the weights that fit in no "
                             f"memory take {need / 1e6:,.1f} MB there: free some space, give a folder on a larger "
                             "disk, or a larger max_memory")
    index = {}
    for name, tensor in state.items():
        dtype, stored = _as_written(tensor.detach().cpu())
        array = stored.contiguous().numpy()
        index[name] = {"dtype": dtype or str(array.dtype), "shape": list(array.shape)}
        with open(folder / f"{name}.dat", "wb") as f:
            f.write(memoryview(array.reshape(-1).view("uint8")))  # a 0-d tensor: its one value, as accelerate
    with open(folder / "index.json", "w", encoding="utf-8") as f:
        json.dump(index, f, indent=2)
