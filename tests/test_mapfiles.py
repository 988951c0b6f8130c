"""Attention maps in a file and back (`probe.mapfiles`, `hs.extract_file`, `headscope extract`).

Every format of `MAP_FORMATS` round-trips text maps (labels, spans, special marks, word indices), an image's
map (its grid and each patch's position) and a vision–language text's (its image tokens' cells); plain numpy,
torch, safetensors and pandas read the same numbers; a request too large is refused before any forward pass.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import headscope as hs
from headscope.cli import cli
from headscope.probe.mapfiles import MAP_FORMATS, is_map_file

from conftest import _tiny


@pytest.fixture(scope="module")
def llama():
    return _tiny("llama")


@pytest.fixture(scope="module")
def maps(picture_file):
    """Text maps at word level (a subset of layers and heads), an image's, and a vision–language text's."""
    text = hs.extract(_tiny("bert"), ["The cat sat.", "A dog barked at the mailman."], level="word", layers=[1],
                      heads=[0, 2])
    [image] = hs.extract(_tiny("vit"), images=[picture_file])
    [vl] = hs.extract(_tiny("llava"), "A <image> cat", images=[np.random.default_rng(0).random((40, 52, 3))])
    return [*text, image, vl]


def _fields(m):
    return (m.text, m.level, m.labels, m.spans, m.special, m.causal, m.word_index, m.word_spans, m.token_ids,
            m.layers, m.heads, m.layer_ids, m.head_ids, m.grid, m.positions, m.patches, m.sinks, m.no_attention)


@pytest.mark.parametrize("suffix", list(MAP_FORMATS))
def test_every_format_round_trips_labels_special_marks_and_image_positions(maps, suffix, tmp_path):
    path = hs.save_maps(maps, tmp_path / f"attention{suffix}")
    back = hs.load_maps(path)
    assert len(back) == len(maps)
    for a, b in zip(maps, back):
        assert _fields(b) == _fields(a)
        assert torch.equal(b.attention, a.attention.float())
    image, vl = back[2], back[3]
    assert image.grid is not None and image.special[0] and image.positions[0] is None
    assert image.positions[1] == (0, 0) and image.positions[-1] == (image.grid[0] - 1, image.grid[1] - 1)
    assert any(p is not None for p in vl.patches)


def test_plain_numpy_torch_and_pandas_read_the_files(maps, tmp_path):
    import pandas as pd
    from safetensors.torch import load_file

    for suffix in MAP_FORMATS:
        hs.save_maps(maps, tmp_path / f"a{suffix}")
    with np.load(tmp_path / "a.npz", allow_pickle=False) as z:
        assert np.array_equal(z["map0"], maps[0].attention.numpy())
        assert json.loads(str(z["headscope"]))["maps"][2]["positions"][1] == [0, 0]
    assert torch.equal(load_file(tmp_path / "a.safetensors")["map2"], maps[2].attention)
    assert torch.equal(torch.load(tmp_path / "a.pt", weights_only=True)["map1"], maps[1].attention)
    frame = pd.read_parquet(tmp_path / "a.parquet")
    m = maps[1]
    rows = frame[frame["map"] == 1]
    assert set(rows["layer"]) == {1} and set(rows["head"]) == {0, 2}  # the model's ids, not the tensor's places
    assert np.allclose(rows.groupby(["layer", "head", "query"])["weight"].sum(), 1, atol=1e-5)  # rows sum to 1
    cell = rows[(rows["head"] == 2) & (rows["query"] == 1) & (rows["key"] == 2)].iloc[0]
    assert cell["weight"] == pytest.approx(m.attention[0, 1, 1, 2].item())
    assert (cell["query_label"], cell["key_label"], cell["text"]) == (m.labels[1], m.labels[2], m.text)


@pytest.mark.parametrize("level", ["token", "word"])
def test_a_recomputed_text_is_written_layer_by_layer_with_the_eager_numbers(llama, level, tmp_path):
    texts = ["The cat sat on the mat because it was tired.", "A dog."]
    eager = hs.extract(llama, texts, level=level, layers=[0, 1], heads=[1, 3])
    done = hs.extract_file(llama, texts, tmp_path / "r.safetensors", level=level, layers=[0, 1], heads=[1, 3],
                           attention="recompute")
    assert done.meta["attention"]["recompute"] == 2 and done.meta["check"]["passed"]
    for a, b in zip(eager, hs.load_maps(done.path)):
        assert b.labels == a.labels and b.special == a.special and b.meta["attention"] == "recompute"
        assert torch.allclose(b.attention, a.attention, atol=1e-5)


def test_the_command_writes_what_extract_gives(llama, tmp_path):
    out = tmp_path / "sub" / "attention.npz"
    result = CliRunner().invoke(cli, ["extract", "--model", "tiny:llama", "The cat sat.", "A dog barked.",
                                      "--level", "token", "--head-indices", "0,2", "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("wrote 2 maps (token level") and str(out) in result.output
    want = hs.extract(llama, ["The cat sat.", "A dog barked."], level="token", heads=[0, 2])
    for a, b in zip(want, hs.load_maps(out)):
        assert b.labels == a.labels and torch.equal(b.attention, a.attention)


def test_an_existing_file_is_replaced_only_when_headscope_wrote_it(tmp_path):
    theirs, ours = tmp_path / "theirs.safetensors", tmp_path / "ours.safetensors"
    theirs.write_bytes(b"someone's weights")
    args = ["extract", "--model", "tiny:llama", "The cat.", "--quiet", "--out"]
    for extra, said in (([], "already exists; pass --force"), (["--force"], "is not an attention file headscope wrote")):
        result = CliRunner().invoke(cli, [*args, str(theirs), *extra])
        assert result.exit_code == 2 and said in result.output, result.output
    assert theirs.read_bytes() == b"someone's weights"
    assert CliRunner().invoke(cli, [*args, str(ours)]).exit_code == 0 and is_map_file(ours)
    assert CliRunner().invoke(cli, [*args, str(ours)]).exit_code == 2
    assert CliRunner().invoke(cli, [*args, str(ours), "--force"]).exit_code == 0


def _no_forward(monkeypatch):
    """Any forward pass of the extraction fails the test: a refusal must come before one."""
    from headscope.probe.sources import AttentionSource

    def forward(*a, **k):
        raise AssertionError("a forward pass ran before the refusal")

    monkeypatch.setattr(AttentionSource, "iter_maps", forward)
    monkeypatch.setattr(AttentionSource, "blocks", forward)


@pytest.mark.parametrize("case", ["layer over the budget", ".pt over the budget", "larger than the disk"])
def test_a_request_too_large_is_refused_up_front_in_one_line(case, tmp_path, monkeypatch):
    # Before the fix there was no command at all; the refusal must come before any forward pass, in one line.
    _no_forward(monkeypatch)
    text = "The cat sat on the mat because it was tired and the dog did not care at all."
    args = {"layer over the budget": ["--attention", "recompute", "--memory-budget", "2000"],  # 4 heads × T² × 4 B
            ".pt over the budget": ["--memory-budget", "20000"],  # 2 layers × 4 heads × T² × 4 B, eager fits per text
            "larger than the disk": []}[case]
    suffix = ".pt" if case.startswith(".pt") else ".npz"
    if case == "larger than the disk":
        import shutil

        monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 100, 100))
    out = tmp_path / f"a{suffix}"
    result = CliRunner().invoke(cli, ["extract", "--model", "tiny:llama", text, "--level", "token", "--out", str(out),
                                      "--quiet", *args])
    said = {"layer over the budget": "one layer of its attention takes",
            ".pt over the budget": "written from memory", "larger than the disk": "100 B free"}[case]
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1 and said in result.output, \
        result.output
    assert not out.exists() and not list(tmp_path.iterdir())


def test_the_command_asks_for_something_to_extract_and_a_known_suffix(tmp_path):
    result = CliRunner().invoke(cli, ["extract", "--model", "tiny:llama", "--out", str(tmp_path / "a.npz")])
    assert result.exit_code == 2 and "give one or more TEXT" in result.output
    result = CliRunner().invoke(cli, ["extract", "--model", "tiny:llama", "x", "--out", str(tmp_path / "a.h5")])
    assert result.exit_code == 2 and all(s in result.output for s in MAP_FORMATS)
    help_text = CliRunner().invoke(cli, ["extract", "--help"]).output
    assert all(s in help_text for s in MAP_FORMATS)  # the help lists every format of the registry
    with pytest.raises(ValueError, match="not an attention file headscope wrote"):
        (tmp_path / "b.npz").write_bytes(b"PK\x05\x06" + b"\0" * 18)
        hs.load_maps(tmp_path / "b.npz")


def test_texts_eager_only_alone_are_extracted_alone(llama, tmp_path, monkeypatch):
    # A batch of two whose eager attention exceeds the budget while each text's alone fits: each is run alone,
    # never together in one batch (which would take the memory the budget refused).
    from headscope.probe.sources import AttentionSource, eager_bytes

    texts = ["The cat sat on the mat.", "The dog sat on the rug."]
    n = max(len(llama.tokenizer(t)["input_ids"]) for t in texts)
    budget = eager_bytes(llama, n)  # one text fits exactly, two do not
    batches, read = [], AttentionSource.iter_maps
    monkeypatch.setattr(AttentionSource, "iter_maps", lambda self, t, **k: batches.append(len(t)) or read(self, t, **k))
    done = hs.extract_file(llama, texts, tmp_path / "a.npz", level="token", budget=budget)
    assert batches == [1, 1] and done.meta["attention"]["eager"] == 2
    for a, b in zip(hs.extract(llama, texts, level="token"), hs.load_maps(done.path)):
        assert torch.allclose(a.attention, b.attention, atol=1e-6)


def _small_map():
    from headscope.probe.types import AttentionMap

    return AttentionMap(text="hi you", level="word", labels=("hi", "you"), spans=((0, 2), (3, 6)),
                        special=(False, False), attention=torch.full((1, 1, 2, 2), 0.5), causal=False)


@pytest.mark.parametrize("suffix", list(MAP_FORMATS))
@pytest.mark.parametrize("damage", ["cut in half", "junk", "empty"])
def test_a_damaged_file_is_one_value_error_naming_it(suffix, damage, tmp_path):
    path = hs.save_maps([_small_map()], tmp_path / f"a{suffix}")
    raw = path.read_bytes()
    path.write_bytes({"cut in half": raw[: len(raw) // 2], "junk": b"not a file of maps at all", "empty": b""}[damage])
    with pytest.raises(ValueError, match="damaged") as err:
        hs.load_maps(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("tamper", ["version '2'", "maps of ints", "no labels", "level 'sentence'", "a missing map",
                                    "spans a number"])
@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_a_header_tampered_with_is_one_value_error_never_a_wrong_map(tamper, suffix, tmp_path):
    from safetensors.torch import save_file

    path = hs.save_maps([_small_map()], tmp_path / f"a{suffix}")
    header = torch.load(hs.save_maps([_small_map()], tmp_path / "h.pt"), weights_only=True)["headscope"]
    entry = header["maps"][0]
    {"version '2'": lambda: header.update(version="2"), "maps of ints": lambda: header.update(maps=[1, 2]),
     "no labels": lambda: entry.pop("labels"), "level 'sentence'": lambda: entry.update(level="sentence"),
     "a missing map": lambda: entry.update(name="map7"), "spans a number": lambda: entry.update(spans=5)}[tamper]()
    tensors = {"map0": torch.full((1, 1, 2, 2), 0.5)}
    if suffix == ".pt":
        torch.save({"headscope": header, **tensors}, path)
    else:
        save_file(tensors, str(path), metadata={"headscope": json.dumps(header)})
    with pytest.raises(ValueError, match="damaged") as err:
        hs.load_maps(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("where", ["inside a file", "a name too long"])
def test_a_path_no_file_can_have_is_one_value_error_before_any_work(where, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    path = {"inside a file": tmp_path / "notes.txt" / "a.npz", "a name too long": tmp_path / ("a" * 300 + ".npz")}[where]
    with pytest.raises(ValueError, match="a file, not a folder|longer than"):
        hs.save_maps([_small_map()], path)
    assert (tmp_path / "notes.txt").read_text() == "mine"
