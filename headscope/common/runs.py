"""A command run by torchrun (or accelerate launch): this process's place in the run, its group joined."""

from __future__ import annotations

import click

from .exits import fail

__all__ = ["join_run"]


def join_run(device: str):
    """This process's `headscope.distributed.World` in a torchrun / accelerate launch run, its group joined.

    One process (no RANK / WORLD_SIZE in the environment) gets `World()` and joins nothing. The
    processes talk over gloo with --device cpu and over NCCL with --device cuda, each on the GPU of
    its LOCAL_RANK; the group is left when the command ends.
    """
    from headscope.distributed import process_group, world_from_env

    try:
        world = world_from_env()
    except ValueError as exc:
        fail(str(exc))
    if world.size == 1:
        return world
    if device not in ("cpu", "cuda"):
        fail(f"--device {device}: a torchrun run takes --device cpu (gloo) or cuda (NCCL, one GPU per process)")
    if device == "cuda":
        import torch

        if torch.cuda.is_available():  # otherwise loading the model says that CUDA is missing
            torch.cuda.set_device(world.local_rank)
    try:
        click.get_current_context().with_resource(process_group(world, backend="nccl" if device == "cuda" else "gloo"))
    except (RuntimeError, ValueError) as exc:
        fail(f"rank {world.rank} of {world.size} could not join the torchrun process group: {exc}")
    return world
