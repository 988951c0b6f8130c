"""Where a model's weights go and in which dtype: one value, `Placement`, made once and handed to `hs.load`.

    >>> Placement()
    Placement(device='cpu', dtype='float32', max_memory=None, offload_folder=None)
    >>> Placement(device="cuda:0", dtype="bfloat16").device
    'cuda:0'
    >>> Placement(device="cpu", max_memory="cpu=300MB").max_memory
    {'cpu': 300000000}

Built from the CLI's one option group (`--device`, `--dtype`, `--max-memory`, `--offload-folder`,
`common.options.device`) or by an API user; the checks that need torch (is there a CUDA GPU? is the
folder writable?) happen when a model is loaded (`probe.loading.load_model`). This module imports no torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from .errors import PlacementError
from .names import DType, device_spec
from .sizes import parse_max_memory

__all__ = ["Placement"]


@dataclass(frozen=True)
class Placement:
    """Where a model's weights go: one `device` (`cpu`, `cuda`, `cuda:N`, `mps`, or `auto`: accelerate spreads the
    layers), their `dtype`, and for accelerate's placement `max_memory` (bytes per GPU number, `cpu`, `mps`; or the
    CLI's `"0=20GiB,cpu=60GiB"`) with what fits nowhere in `offload_folder`, read from disk one layer at a time.

    Values are read as the CLI reads them (a bad one is a `PlacementError`, a `ValueError`, naming the argument)."""

    device: str = "cpu"
    dtype: DType = "float32"
    max_memory: dict | None = None
    offload_folder: Path | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "device", device_spec(self.device))
        except ValueError:
            raise PlacementError(f"device must be auto, cpu, cuda, cuda:N (GPU number N) or mps, "
                                 f"got {self.device!r}") from None
        if self.dtype not in get_args(DType):
            raise PlacementError(f"dtype must be one of {', '.join(get_args(DType))}, got {self.dtype!r}")
        if self.max_memory is not None:
            try:
                object.__setattr__(self, "max_memory", parse_max_memory(self.max_memory))
            except ValueError as exc:
                raise PlacementError(f"max_memory {exc}") from None
        if self.offload_folder is not None:
            object.__setattr__(self, "offload_folder", Path(os.fspath(self.offload_folder)).expanduser())

    @property
    def spread(self) -> bool:
        """Whether accelerate places the layers (`device_map="auto"`) rather than one `.to(device)`."""
        return self.device == "auto" or self.max_memory is not None or self.offload_folder is not None

    def budget(self) -> dict | None:
        """accelerate's `max_memory`: the one given, else (on the cpu) the memory free now, else accelerate's own."""
        if self.max_memory is None and self.device == "cpu":
            import psutil

            return {"cpu": psutil.virtual_memory().available}
        return self.max_memory
