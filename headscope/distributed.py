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
import pickle
from dataclasses import dataclass, replace
from itertools import islice
from typing import Callable, Iterable, Iterator, Literal, Mapping, Sequence, TypeVar

import torch
import torch.distributed as dist

__all__ = [
    "World", "world_from_env", "shard", "shard_length", "all_reduce_sums", "gather_objects", "together",
    "process_group", "merge_head_scores", "merge_attention_record", "sharded_probe_scores", "Backend",
]

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


def shard(items: Iterable[T], world: World) -> list[T] | Iterator[T]:
    """This rank's items: every `size`-th one from `rank` (shards differ in length by at most one).

    A sequence gives a list; any other iterable (a corpus file read line by line) a lazy iterator,
    so a rank never holds the whole corpus. One process gets every item.

    >>> [shard(list("abcde"), World(r, 2)) for r in (0, 1)]
    [['a', 'c', 'e'], ['b', 'd']]
    >>> list(shard(iter("abcde"), World(1, 2)))
    ['b', 'd']
    """
    if isinstance(items, Sequence):
        return list(items[world.rank :: world.size])
    return islice(items, world.rank, None, world.size)


def shard_length(n: int, world: World) -> int:
    """How many of `n` items `shard` gives this rank.

    >>> [shard_length(5, World(r, 2)) for r in (0, 1)], shard_length(1, World(1, 2))
    ([3, 2], 0)
    """
    return len(range(world.rank, n, world.size))


def all_reduce_sums(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each tensor summed over all processes (new tensors; the caller's are left alone).

    Without an initialised process group (one process) the tensors come back as copies, unchanged.
    """
    if not _distributed():
        return tuple(t.detach().clone() for t in tensors)
    # NCCL reduces tensors on the rank's GPU only; gloo takes CPU tensors.
    where = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    out = tuple(t.detach().to(where, copy=True) for t in tensors)
    for t in out:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return tuple(t.to(orig.device) for t, orig in zip(out, tensors))


def gather_objects(obj: T) -> list[T]:
    """Every rank's `obj` (picklable), in rank order; `[obj]` for one process."""
    if not _distributed():
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@contextlib.contextmanager
def together(world: World) -> Iterator[None]:
    """Run this rank's part of a step; if it raised on any rank, every rank raises the first failing rank's error.

    Without it, a rank whose shard holds a bad input would stop while the others wait for it
    forever in the next collective. Each rank says after the block whether it failed (one
    `all_gather_object`), so all of them leave together, with the same error: rank 0 prints it as
    one process would have. One process just runs the block.
    """
    error: Exception | None = None
    try:
        yield
    except Exception as exc:  # KeyboardInterrupt ends the launcher, which ends every rank
        if world.size == 1:
            raise
        error = exc
    if world.size == 1:
        return
    first = next((e for e in gather_objects(_sendable(error)) if e is not None), None)
    if error is not None:
        raise error
    if first is not None:
        raise first


def _sendable(error: Exception | None) -> Exception | None:
    """`error` if it survives pickling (it goes to the other ranks), else a RuntimeError with its message."""
    if error is None:
        return None
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # an exception class whose arguments do not pickle back
        return RuntimeError(f"{type(error).__name__}: {error}")


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


# ---------------------------------------------------------------- what headscope merges


def merge_head_scores(acc):
    """`analyses.heads.HeadScoreAccumulator`'s totals summed over every rank (a new accumulator).

    A rank whose shard was empty saw no map, so it learns the layer and head ids from the others;
    no rank saw one only when there were no texts at all (the one-process error).
    """
    units = [u for u in gather_objects(acc.units) if u is not None]
    if any(u != units[0] for u in units):
        raise ValueError(f"the ranks scored different layers and heads: {sorted(set(units))}")
    return acc.merged(all_reduce_sums, units=units[0] if units else None)


def merge_attention_record(record: dict) -> dict:
    """An attention source's `record()` with the texts each mode served summed over every rank (each
    rank counted its own shard only); the first rank's recompute check, if any rank made one."""
    records = gather_objects(record)
    how = dict(record["attention"])
    for mode in ("eager", "recompute"):
        how[mode] = sum(r["attention"][mode] for r in records)
    checks = [r["check"] for r in records if r["check"] is not None]
    return {"attention": how, "check": checks[0] if checks else None}


def sharded_probe_scores(extract: Callable[[list], object], examples: Sequence, world: World):
    """`extract(examples)` (-> `analyses.coref.ProbeScores`) with each rank scoring its shard, gathered.

    Every rank ends with all examples' scores in the input order, as one process would have them,
    and with the exclusion counts summed.
    """
    from headscope.analyses.coref import concat_scores

    mine = shard(range(len(examples)), world)
    with together(world):
        part = extract([examples[i] for i in mine])
        rest = iter(mine)  # the kept examples are a subsequence of the shard, in its order
        index = [next(i for i in rest if examples[i] is ex) for ex in part.examples]
    gathered = gather_objects((index, part))
    index = [i for idx, _ in gathered for i in idx]
    data = concat_scores([p for _, p in gathered])
    order = sorted(range(len(index)), key=index.__getitem__)
    return replace(data, examples=tuple(examples[index[i]] for i in order), scores=data.scores[order])
