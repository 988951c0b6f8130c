"""Data parallel with torch.distributed: 2 gloo processes give the sums one process gives."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from headscope.distributed import World, all_reduce_sums, process_group, shard, world_from_env

N_ITEMS = 7  # odd: the two shards differ in length


def _item(seed: int) -> torch.Tensor:
    """One text's attention-like map [layer, head, query, key], rows summing to 1; lengths vary."""
    g = torch.Generator().manual_seed(seed)
    t = 3 + seed % 4
    return torch.softmax(torch.randn(2, 3, t, t, generator=g) * 2, -1)


def _sums(seeds) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head: sums over query rows of attention to self and of entropy (float64), and the row count."""
    sums, rows = torch.zeros(2, 3, 2, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    for s in seeds:
        a = _item(s)
        sums[..., 0] += a.diagonal(0, -2, -1).sum(-1).double()
        sums[..., 1] += torch.special.entr(a).sum((-2, -1)).double()
        rows += a.shape[-2]
    return sums, rows


def _worker(rank: int, size: int, init: str, out: str) -> None:
    world = World(rank=rank, size=size)
    with process_group(world, backend="gloo", init_method=init):
        mine = _sums(shard(range(N_ITEMS), world))
        merged = all_reduce_sums(*mine)
        assert all(torch.equal(a, b) for a, b in zip(mine, _sums(shard(range(N_ITEMS), world))))  # inputs untouched
        torch.save(merged, f"{out}/rank{rank}.pt")


def test_two_gloo_processes_merge_to_one_process_sums(tmp_path):
    mp.spawn(_worker, args=(2, f"file://{tmp_path}/init", str(tmp_path)), nprocs=2, join=True)
    one_sums, one_rows = _sums(range(N_ITEMS))
    for rank in (0, 1):
        sums, rows = torch.load(tmp_path / f"rank{rank}.pt")
        torch.testing.assert_close(sums, one_sums, atol=1e-12, rtol=0)
        assert rows.item() == one_rows.item() == sum(3 + s % 4 for s in range(N_ITEMS))


def test_one_process_is_as_without_distributed():
    sums = torch.arange(4.0)
    (out,) = all_reduce_sums(sums)
    assert torch.equal(out, sums) and out is not sums
    with process_group(World()) as world:
        assert world.is_main and world.size == 1


def test_shards_cover_every_item_once():
    items = list(range(11))
    parts = [shard(items, World(r, 3)) for r in range(3)]
    assert sorted(sum(parts, [])) == items and max(map(len, parts)) - min(map(len, parts)) <= 1


def test_world_from_env_rejects_a_bad_environment():
    assert world_from_env({"RANK": "2", "WORLD_SIZE": "4"}) == World(2, 4, 2)
    with pytest.raises(ValueError, match="do not describe"):
        world_from_env({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(ValueError, match="must be integers"):
        world_from_env({"RANK": "x"})
