"""`torchrun -m headscope ...` in miniature: 2 gloo processes run the real commands and give what one gives.

The processes are spawned with torch.multiprocessing and given the environment torchrun gives
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); a deadline kills them if anything hangs.
The tiny model is saved to a folder first and loaded from there by every process: each process
that trains a tiny tokenizer itself may get another vocabulary (the trainer breaks ties in an
order that varies between processes).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.multiprocessing as mp

from headscope.distributed import World, process_group

RANKS = 2
CORPUS = ["The cat sat on the mat.", "A dog ran home quickly.", "Birds fly south in winter.",
          "She reads a book.", "It rained all day long."]  # odd: the shards differ in length
TOO_LONG = "cat " * 3000


def _commands(model: str, out: Path) -> dict[str, list[str]]:
    return {
        "heads": ["heads", "--model", model, "--corpus", str(out.parent / "corpus.txt"), "--induction-seqs", "3",
                  "--induction-length", "5", "--quiet", "--out", str(out / "heads.csv")],
        # both at once: each process places its own copy, its layers on disk in the shared offload folder
        "offloaded": ["heads", "--model", model, "--corpus", str(out.parent / "corpus.txt"), "--induction-seqs", "3",
                      "--induction-length", "5", "--max-memory", "cpu=150kB", "--offload-folder",
                      str(out.parent / "offload"), "--quiet", "--out", str(out / "offloaded.csv")],
        "probe": ["relations", "--model", model, "--data", "verb-subject", "--limit", "25", "--permutations", "200",
                  "--quiet", "--out", str(out / "probe.csv")],
    }


def _run_cli(args: list[str], stdout: Path, stderr: Path) -> int:
    from headscope.cli import main

    with open(stdout, "w") as out, open(stderr, "w") as err, redirect_stdout(out), redirect_stderr(err):
        try:
            main(args)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else 1
    return 0


def _worker(rank: int, model: str, root: str, ports: dict[str, int]) -> None:
    root = Path(root)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(RANKS), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1")
    mine = root / f"rank{rank}"
    mine.mkdir()
    codes = {}
    for name, args in _commands(model, mine).items():
        os.environ["MASTER_PORT"] = str(ports[name])
        codes[name] = _run_cli(args, mine / f"{name}.stdout", mine / f"{name}.stderr")
    # The API on inputs that test the edges: a rank with an empty shard, a bad text on rank 1 only.
    from headscope import heads, load

    lm = load(model)
    with process_group(World(rank, RANKS), init_method=f"file://{root}/init") as world:
        one = heads(lm, CORPUS[:1], world=world).table
        try:
            heads(lm, [CORPUS[0], TOO_LONG], world=world)
            error = None
        except ValueError as exc:
            error = str(exc)
    torch.save({"codes": codes, "one_text": one, "error": error}, root / f"api{rank}.pt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from headscope.probe.tiny import tiny_model

    root = tmp_path_factory.mktemp("dist")
    tiny = tiny_model("llama")
    model = root / "tiny-llama"
    # saved in bfloat16 and run in float32, so that offloading holds less than the load in memory and happens
    # (float32 safetensors are mapped in place: `probe.loading.mapped_in_place`)
    tiny.model.to(torch.bfloat16).save_pretrained(model)
    tiny.tokenizer.save_pretrained(model)
    (root / "corpus.txt").write_text("\n".join(CORPUS) + "\n")
    ports = {name: _free_port() for name in ("heads", "offloaded", "probe")}
    ctx = mp.start_processes(_worker, args=(str(model), str(root), ports), nprocs=RANKS, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + 300
    while not ctx.join(timeout=2):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the 2-process run did not finish in 300 s (a rank waits for another forever?)")
    one = root / "one"
    one.mkdir()
    codes = {name: _run_cli(args, one / f"{name}.stdout", one / f"{name}.stderr")
             for name, args in _commands(str(model), one).items()}
    return root, codes, {r: torch.load(root / f"api{r}.pt", weights_only=False) for r in range(RANKS)}


def test_two_processes_give_the_heads_table_of_one(runs):
    root, codes, api = runs
    assert codes["heads"] == api[0]["codes"]["heads"] == api[1]["codes"]["heads"] == 0
    one, two = (pd.read_csv(root / d / "heads.csv") for d in ("one", "rank0"))
    pd.testing.assert_frame_equal(one.drop(columns="value"), two.drop(columns="value"))
    assert (one["value"] - two["value"]).abs().max() <= 1e-6
    assert one.loc[one["metric"] == "induction", "n"].iloc[0] > 0  # the induction sequences were sharded too
    lines = [(root / d / "heads.stdout").read_text().splitlines()[:-1] for d in ("one", "rank0")]  # last: the path
    assert lines[0] == lines[1]


def test_two_processes_with_offloaded_layers_give_the_heads_table_of_one_in_memory(runs):
    """torchrun and accelerate placement at once: every process offloads its copy's layers to disk."""
    root, codes, api = runs
    assert codes["offloaded"] == api[0]["codes"]["offloaded"] == api[1]["codes"]["offloaded"] == 0
    one, two = (pd.read_csv(root / d / f) for d, f in (("one", "heads.csv"), ("rank0", "offloaded.csv")))
    pd.testing.assert_frame_equal(one.drop(columns="value"), two.drop(columns="value"))
    assert (one["value"] - two["value"]).abs().max() <= 1e-6


def test_two_processes_give_the_probe_table_of_one(runs):
    root, codes, api = runs
    assert codes["probe"] == api[0]["codes"]["probe"] == api[1]["codes"]["probe"] == 0
    one, two = (pd.read_csv(root / d / "probe.csv") for d in ("one", "rank0"))
    assert len(one) == 2 * 4  # one row per head of the tiny llama (2 layers × 4 heads), one set
    numbers = one.select_dtypes("number").columns
    pd.testing.assert_frame_equal(one.drop(columns=numbers), two.drop(columns=numbers))
    assert ((one[numbers] - two[numbers]).abs().fillna(0) <= 1e-6).all().all()


def test_rank_one_writes_and_prints_nothing(runs):
    root, _, _ = runs
    rank1 = root / "rank1"
    assert sorted(p.name for p in rank1.iterdir() if p.suffix in (".csv", ".parquet", ".json")) == []
    assert all(p.read_text() == "" for p in rank1.glob("*.std*"))
    assert (root / "rank0" / "heads.stdout").read_text().strip()


def test_a_rank_with_an_empty_shard_adds_nothing(runs):
    from headscope import heads, load

    root, _, api = runs
    expected = heads(load(str(root / "tiny-llama")), CORPUS[:1]).table
    for rank in range(RANKS):
        got = api[rank]["one_text"]
        pd.testing.assert_frame_equal(got.drop(columns="value"), expected.drop(columns="value"))
        assert (got["value"] - expected["value"]).abs().max() <= 1e-6


def test_a_bad_text_on_one_rank_ends_every_rank_with_its_error(runs):
    _, _, api = runs
    errors = [api[rank]["error"] for rank in range(RANKS)]
    assert errors[0] is not None and errors[0] == errors[1]
    assert "context" in errors[0] or "tokens" in errors[0]
