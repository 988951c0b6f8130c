"""Data parallel over processes with torch.distributed: shard a corpus by rank, merge sums exactly.

Launched by `torchrun --nproc-per-node N ...` (or `accelerate launch`), every process finds its rank
and the world size in the environment (RANK, WORLD_SIZE, LOCAL_RANK), streams its own shard of the
texts, and keeps its accumulators as sums and counts. `all_reduce_sums` adds them over the
processes (sums of sums, never averages of averages), so every rank ends with the totals one process
would have; rank 0 writes the outputs. Gloo on CPU, NCCL on GPUs. A single process, or a run
without an initialised process group, behaves exactly as without this module.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Iterator, Literal, Mapping, Sequence, TypeVar

import torch
import torch.distributed as dist

__all__ = ["World", "world_from_env", "shard", "all_reduce_sums", "process_group", "Backend"]

T = TypeVar("T")
Backend = Literal["gloo", "nccl"]


@dataclass(frozen=True)
class World:
    """Where this process stands: its rank among `size` processes, and its rank on this machine."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """The process that writes outputs."""
        return self.rank == 0


def world_from_env(env: Mapping[str, str] | None = None) -> World:
    """The `World` torchrun / accelerate describe in RANK, WORLD_SIZE and LOCAL_RANK (one process if unset).

    >>> world_from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    World(rank=1, size=2, local_rank=1)
    >>> world_from_env({})
    World(rank=0, size=1, local_rank=0)
    """
    env = os.environ if env is None else env
    try:
        rank, size = int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1))
        local = int(env.get("LOCAL_RANK", rank))
    except ValueError as e:
        raise ValueError(f"RANK, WORLD_SIZE and LOCAL_RANK must be integers: {e}") from None
    if size < 1 or not 0 <= rank < size or local < 0:
        raise ValueError(f"RANK={rank} and WORLD_SIZE={size} do not describe a process of the run")
    return World(rank=rank, size=size, local_rank=local)


def shard(items: Sequence[T], world: World) -> list[T]:
    """This rank's items: every `size`-th one from `rank` (shards differ in length by at most one).

    >>> [shard(list("abcde"), World(r, 2)) for r in (0, 1)]
    [['a', 'c', 'e'], ['b', 'd']]
    """
    return list(items[world.rank :: world.size])


def all_reduce_sums(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each tensor summed over all processes (new tensors; the caller's are left alone).

    Without an initialised process group (one process) the tensors come back as copies, unchanged.
    """
    out = tuple(t.detach().clone() for t in tensors)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        for t in out:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return out


@contextlib.contextmanager
def process_group(world: World, *, backend: Backend = "gloo", init_method: str | None = None) -> Iterator[World]:
    """Join the run's process group for the block (nothing to join for one process); leave it after.

    `init_method` defaults to torchrun's `env://` (MASTER_ADDR/MASTER_PORT); tests use `file://`.
    """
    if world.size == 1 or dist.is_initialized():
        yield world
        return
    dist.init_process_group(backend, init_method=init_method or "env://", rank=world.rank, world_size=world.size)
    try:
        yield world
    finally:
        dist.destroy_process_group()
