"""A model placed by accelerate (`--max-memory`, `--offload-folder`): refused in one line where it cannot be
placed, and, with some layers offloaded to disk (accelerate's hooks bring their weights in per layer), every
workflow gives the in-memory run's numbers.

The tiny models get a cpu budget smaller than themselves: accelerate keeps the embeddings (and for llama the
first layer) in memory and offloads the rest to the folder, so both kinds of layer are exercised.
"""

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import headscope as hs
from headscope.cli import cli
from headscope.common.options import parse_max_memory
from headscope.probe.errors import PlacementError
from headscope.probe.device_placement import Placement
from headscope.probe.loading import is_offloaded, load_model
from headscope.probe.tiny import TINY_CORPUS
from headscope.workflows.explore import Explorer

TEXTS = list(TINY_CORPUS[:3])
TOL = 1e-6


def _size(lm) -> int:
    return sum(p.numel() * p.element_size() for p in lm.model.parameters())


@pytest.fixture(scope="module", params=["llama", "bert"])
def pair(request, tmp_path_factory):
    """(in memory, offloaded) copies of one tiny model, built once for the module."""
    ref = load_model(f"tiny:{request.param}")
    off = load_model(f"tiny:{request.param}", placement=Placement(max_memory={"cpu": int(_size(ref) * 0.9)},
                                                                  offload_folder=tmp_path_factory.mktemp("offload")))
    return ref, off


def _frames_close(a, b):
    num = a.select_dtypes("number").columns
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    np.testing.assert_allclose(a[num].to_numpy(float), b[num].to_numpy(float), atol=TOL, rtol=0, equal_nan=True)


def test_offloaded_for_real(pair):
    ref, off = pair
    placed = off.model.hf_device_map
    assert "disk" in placed.values() and "cpu" in placed.values() and is_offloaded(off.model)
    assert not is_offloaded(ref.model) and off.device == torch.device("cpu")
    assert any(p.device.type == "meta" for p in off.model.parameters())  # weights really left memory


def test_extract_and_verify(pair):
    ref, off = pair
    for a, b in zip(hs.extract(ref, TEXTS), hs.extract(off, TEXTS)):
        assert a.attention.shape == b.attention.shape
        assert (a.attention - b.attention).abs().max() <= TOL
    va, vb = hs.verify(ref, TEXTS), hs.verify(off, TEXTS)
    assert va.passed and vb.passed


@pytest.mark.parametrize("attention", ["eager", "recompute"])
def test_heads(pair, attention):
    ref, off = pair
    _frames_close(hs.heads(ref, TEXTS, progress=False, attention=attention).table,
                  hs.heads(off, TEXTS, progress=False, attention=attention).table)


def test_ablation(pair):
    ref, off = pair
    a, b = (hs.ablate(lm, [(0, 0), (1, 1)], corpus=TEXTS, n_random=2) for lm in (ref, off))
    assert abs(a.effect - b.effect) <= TOL and abs(a.baseline - b.baseline) <= TOL
    np.testing.assert_allclose(a.random_effects, b.random_effects, atol=TOL, rtol=0)


def test_dla_and_patching(pair):
    ref, off = pair
    if not ref.is_causal:
        pytest.skip("direct logit attribution and patching read a decoder's next-token logits")
    _frames_close(hs.dla(ref, "The cat sat on the", " mat").table, hs.dla(off, "The cat sat on the", " mat").table)
    a, b = hs.patch(ref, "ioi", n_random=2), hs.patch(off, "ioi", n_random=2)
    for field in ("values", "clean", "corrupt"):
        np.testing.assert_allclose(getattr(a, field), getattr(b, field), atol=TOL, rtol=0)


@pytest.mark.parametrize("attention", ["eager", "recompute"])
def test_explorer(pair, attention):
    ref, off = pair
    a = Explorer({"m": ref}, attention=attention).attention("m", TEXTS[0], 1, 0)
    b = Explorer({"m": off}, attention=attention).attention("m", TEXTS[0], 1, 0)
    assert a.keys() == b.keys()
    np.testing.assert_allclose(np.asarray(a["weights"], float), np.asarray(b["weights"], float), atol=TOL, rtol=0)


def test_whole_model_on_disk(tmp_path):
    """A budget that holds nothing: every weight on disk, still the in-memory numbers, and the offloaded
    weights go with the model (the folder itself stays: headscope did not make it)."""
    import gc

    ref = load_model("tiny:llama")
    off = load_model("tiny:llama", placement=Placement(max_memory={"cpu": 1000}, offload_folder=tmp_path))
    assert set(off.model.hf_device_map.values()) == {"disk"} and any(tmp_path.iterdir())
    assert (hs.extract(ref, TEXTS[0])[0].attention - hs.extract(off, TEXTS[0])[0].attention).abs().max() <= TOL
    del off
    gc.collect()
    assert tmp_path.is_dir() and not any(tmp_path.iterdir())


def test_budget_without_folder_is_refused():
    with pytest.raises(PlacementError, match="give offload_folder"):  # the API names its argument, the CLI its flag
        load_model("tiny:llama", placement=Placement(max_memory={"cpu": 1000}))


def test_parse_max_memory():
    assert parse_max_memory("0=20GiB,1=20GiB,cpu=60GiB") == {0: 20 * 2**30, 1: 20 * 2**30, "cpu": 60 * 2**30}
    assert parse_max_memory("cuda:1=1kb") == {1: 1000}
    for bad in ("cpu", "gpu=1GB", "cpu=1GB,cpu=2GB", "cpu=lots"):
        with pytest.raises(ValueError):
            parse_max_memory(bad)


@pytest.mark.parametrize("args, says", [
    (["--device", "tpu"], "is not a device"),
    (["--device", "cuda:0"], "no CUDA GPU"),
    (["--max-memory", "gpu=3GB"], "is not DEVICE=SIZE"),
    (["--max-memory", "3=1GB"], "GPU 3"),
    (["--max-memory", "cpu=1kb"], "--offload-folder"),
    (["--offload-folder", "FILE"], "is a file"),
    (["--offload-folder", "FILE/sub"], "cannot be written"),
    (["--device", "mps", "--offload-folder", "DIR"], None),
])
def test_cli_refuses_a_placement_in_one_line(tmp_path, args, says):
    if torch.cuda.device_count() > 3 and "3=1GB" in args:
        pytest.skip("this machine has that GPU")
    (tmp_path / "FILE").write_text("mine")
    args = [a.replace("FILE", str(tmp_path / "FILE")).replace("DIR", str(tmp_path / "d")) for a in args]
    res = CliRunner().invoke(cli, ["verify", "--model", "tiny:llama", *args])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("headscope: "), lines
    assert says is None or says in lines[0]
    assert (tmp_path / "FILE").read_text() == "mine"


def test_cli_runs_offloaded(tmp_path):
    res = CliRunner().invoke(cli, ["verify", "--model", "tiny:llama", "--max-memory", "cpu=150kB",
                                   "--offload-folder", str(tmp_path / "off"), "--json", "--quiet"])
    assert res.exit_code == 0, res.output
    assert '"passed": true' in res.stdout.replace(" ", "").replace('"passed":true', '"passed": true')


def test_verify_streams_one_layer_at_a_time(pair, monkeypatch):
    """Verification of an offloaded model brings in one layer's attention weights at a time, from the layer
    inputs it caught, never the model: at most one layer's weights are in memory for it at once."""
    from contextlib import contextmanager

    from headscope.probe import placement

    ref, off = pair
    real, depth, loads = placement.onloaded, [0], []

    @contextmanager
    def counting(*modules):
        depth[0] += 1
        loads.append((depth[0], sum(p.numel() for m in modules for p in m.parameters() if p.device.type == "meta")))
        try:
            with real(*modules):
                yield
        finally:
            depth[0] -= 1

    monkeypatch.setattr(placement, "onloaded", counting)
    assert hs.verify(off, TEXTS).passed
    layer = max(sum(p.numel() for p in block.parameters()) for block in ref.model.modules()
                if type(block).__name__ in off.model._no_split_modules and "Embeddings" not in type(block).__name__)
    assert loads and max(d for d, _ in loads) == 1  # never two at once
    assert 0 < max(n for _, n in loads) <= layer  # an offloaded layer's weights, no more


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_is_checked_against_float32(dtype):
    """A half-precision model is verified against a float32 recomputation of the same layer inputs, with a
    tolerance of HALF_ROUNDOFFS unit roundoffs (stated in the result); the dtype is in the JSON."""
    from headscope.probe.verify import HALF_ROUNDOFFS

    u = torch.finfo(getattr(torch, dtype)).eps / 2
    v = hs.verify(load_model("tiny:llama", placement=Placement(dtype=dtype)), TEXTS)
    assert v.passed and v.dtype == dtype and v.tolerance == pytest.approx(HALF_ROUNDOFFS * u)
    # recomputing in the model's own dtype left errors of a whole roundoff (the last bit of the probabilities);
    # against float32 only the model's own rounding is left
    assert max(c.max_abs_err for c in v.layers) < u
    res = CliRunner().invoke(cli, ["verify", "--model", "tiny:llama", "--dtype", dtype, "--json", "--quiet"])
    assert res.exit_code == 0 and f'"dtype": "{dtype}"' in res.stdout


def test_run_records_the_placement_and_dtype(pair, tmp_path):
    """run.json and the page say where the weights were (blocks per device) and which dtype ran; the settings
    name --max-memory / --offload-folder only when given (a run without them records what it always did)."""
    from dataclasses import replace

    from headscope.commands.run import shown_settings
    from headscope.workflows.run import RunSettings, _model_info

    ref, off = pair
    plain = RunSettings(corpus="c", coref="p", texts=("The cat sat.",))
    assert not {"max_memory", "offload_folder"} & set(shown_settings(plain))
    placed = shown_settings(replace(plain, max_memory={"cpu": 150_000_000}, offload_folder=str(tmp_path)))
    assert placed["max_memory"] == {"cpu": 150_000_000} and placed["offload_folder"] == str(tmp_path)
    info, ref_info = _model_info(off, None, {}), _model_info(ref, None, {})
    where = list(off.model.hf_device_map.values())
    assert info["placement"] == {"cpu": where.count("cpu"), "disk": where.count("disk")} and info["dtype"] == "float32"
    assert "placement" not in ref_info and ref_info["dtype"] == "float32"


def test_offloaded_layers_hand_freed_memory_back(pair):
    """Each layer accelerate brings in from disk gives the allocator's free pages back once it has run
    (`probe.heap`): one trim per disk module call, none for a model held in memory, numbers unchanged."""
    from headscope.probe.heap import malloc_trim, trim_after_offloaded

    ref, off = pair
    on_disk = [name for name, where in off.model.hf_device_map.items() if where == "disk"]
    assert trim_after_offloaded(ref.model, trim=lambda: 0) == []  # nothing on disk: nothing hooked
    calls = []
    before = hs.extract(off, TEXTS[:1])[0].attention
    hooked = trim_after_offloaded(off.model, trim=lambda: calls.append(1) or 0)
    modules = dict(off.model.named_modules())
    try:
        assert hooked and all(any(not d or h == d or h.startswith(d + ".") for d in on_disk) for h in hooked)
        ran = []
        handles = [modules[name].register_forward_hook(lambda *_: ran.append(1)) for name in hooked]
        after = hs.extract(off, TEXTS[:1])[0].attention
        for h in handles:
            h.remove()
        assert len(calls) == len(ran) > 0  # one trim per offloaded module call
        assert torch.equal(before, after)
    finally:  # the extra counting hooks go: the shared fixture keeps only the loader's own
        for name in hooked:
            hooks = modules[name]._forward_hooks
            del hooks[next(reversed(hooks))]
    if malloc_trim() is not None:  # glibc: the loader hooked every offloaded module itself
        assert sum(len(modules[name]._forward_hooks) > 0 for name in hooked) == len(hooked)


def test_a_model_wholly_on_disk_trims_after_each_layer(tmp_path):
    """Placed wholly on disk, a model's device map is one entry, "" (the whole model), whose forward never runs
    when the base model is called: the trims follow accelerate's hooks instead, one block per decoder layer
    (the model's `_no_split_modules`), so each layer that brought weights in gives them back after it ran."""
    from headscope.probe.heap import trim_after_offloaded

    off = load_model("tiny:llama", placement=Placement(max_memory={"cpu": 1000}, offload_folder=tmp_path))
    assert off.model.hf_device_map == {"": "disk"}
    calls = []
    hooked = trim_after_offloaded(off.model, trim=lambda: calls.append(1) or 0)
    layers = [f"model.layers.{i}" for i in range(off.config.num_hidden_layers)]
    assert set(layers) <= set(hooked) and not any(h.startswith(tuple(n + "." for n in layers)) for h in hooked)
    hs.extract(off, TEXTS[0], layers=[len(layers) - 1])
    assert len(calls) >= len(layers)  # every layer ran (the embedding too), each trimmed after


def test_onloaded_weights_leave_the_heap_with_them(pair, monkeypatch):
    """Weights that `onloaded` brings in for code outside a forward pass are put back, then the heap trimmed once."""
    from headscope.probe import placement

    ref, off = pair
    name = next(n for n, where in off.model.hf_device_map.items() if where == "disk")
    layer, kept = off.model.get_submodule(name), ref.model.get_submodule(name)
    seen = []
    monkeypatch.setattr(placement, "malloc_trim",
                        lambda: lambda: seen.append(any(p.device.type == "meta" for p in layer.parameters())) or 0)
    with placement.onloaded(layer):
        assert not any(p.device.type == "meta" for p in layer.parameters())
        assert seen == []
    assert seen == [True]  # once, after every weight went back
    with placement.onloaded(kept):  # held in memory: nothing to give back
        pass
    assert seen == [True]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny llama saved as safetensors twice: in float32 and in bfloat16."""
    from headscope.probe.tiny import tiny_model

    root = tmp_path_factory.mktemp("saved")
    for dtype in (torch.float32, torch.bfloat16):
        tiny = tiny_model("llama")
        folder = root / str(dtype).removeprefix("torch.")
        tiny.model.to(dtype).save_pretrained(folder)
        tiny.tokenizer.save_pretrained(folder)
    return root


def _all_meta_free(model) -> bool:
    return not any(p.device.type == "meta" for p in model.parameters())


def test_a_checkpoint_mapped_in_the_runs_dtype_is_loaded_in_place(saved, tmp_path):
    """float32 safetensors run in float32 are mapped by the load, not copied: offloading them would hold more,
    so the placement is dropped with one line that says so, and the numbers are the in-memory ones."""
    folder = str(saved / "float32")
    ref = load_model(folder)
    with pytest.warns(UserWarning, match=r"^headscope: .* float32 safetensors, .* gain nothing here") as caught:
        lm = load_model(folder, placement=Placement(max_memory={"cpu": 1000}, offload_folder=tmp_path))
    assert len(caught) == 1 and len(str(caught[0].message).splitlines()) == 1
    assert not is_offloaded(lm.model) and not getattr(lm.model, "hf_device_map", None) and _all_meta_free(lm.model)
    assert not any(tmp_path.iterdir())  # nothing was written to the offload folder
    assert torch.equal(hs.extract(ref, TEXTS[0])[0].attention, hs.extract(lm, TEXTS[0])[0].attention)


def test_a_checkpoint_converted_on_load_is_offloaded(saved, tmp_path, recwarn):
    """bfloat16 safetensors run in float32 are converted on load (a float32 copy of each weight): offloading
    keeps those copies out of memory, so the placement stands, and so does a run in bfloat16 of float32 weights."""
    from headscope.probe.loading import mapped_in_place

    assert mapped_in_place(saved / "float32", torch.float32) and mapped_in_place(saved / "bfloat16", torch.bfloat16)
    assert not mapped_in_place(saved / "bfloat16", torch.float32) and not mapped_in_place(saved / "float32", torch.bfloat16)
    assert not mapped_in_place(tmp_path, torch.float32)  # no checkpoint there
    for folder, dtype in (("bfloat16", "float32"), ("float32", "bfloat16")):
        lm = load_model(str(saved / folder),
                        placement=Placement(dtype=dtype, max_memory={"cpu": 1000}, offload_folder=tmp_path))
        assert is_offloaded(lm.model) and lm.model.hf_device_map == {"": "disk"}
    assert not [w for w in recwarn if "in place" in str(w.message)]


def test_a_model_whose_weights_are_built_on_load_is_not_said_to_map(tmp_path):
    """A model type whose weights transformers builds anew on load (Mixtral's experts fused into one tensor) is
    copied by the in-memory load too: offloading may hold less, so `mapped_in_place` does not claim it."""
    import json

    from safetensors.torch import save_file

    from headscope.probe.loading import mapped_in_place

    save_file({"w": torch.zeros(2, 2)}, str(tmp_path / "model.safetensors"))
    for model_type, maps in (("llama", True), ("mixtral", False)):
        (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
        assert mapped_in_place(tmp_path, torch.float32) is maps


def test_only_weights_brought_through_cpu_memory_are_trimmed_after():
    """A module runs on the cpu with its weights brought in, or on a GPU with them read from disk through the cpu:
    both churn this heap; one whose weights wait in cpu memory for a GPU, or that holds its own, does not."""
    from accelerate.hooks import AlignDevicesHook
    from accelerate.utils import OffloadedWeightsLoader, PrefixedDataset

    from headscope.probe.heap import cpu_churning

    disk = OffloadedWeightsLoader(index={"a.weight": {"dtype": "float32", "shape": [2, 2]}}, save_folder="unused")
    held = OffloadedWeightsLoader(state_dict={"b.weight": torch.zeros(2, 2)})

    def module(device, weights, prefix):
        m = torch.nn.Linear(2, 2, bias=False)
        m._hf_hook = AlignDevicesHook(execution_device=device, offload=True, weights_map=PrefixedDataset(weights, prefix))
        return m

    assert cpu_churning(module("cpu", held, "b.")) and cpu_churning(module("cpu", disk, "a."))
    assert cpu_churning(module(0, disk, "a.")) and cpu_churning(module("cuda:0", disk, "a."))
    assert not cpu_churning(module(0, held, "b.")) and not cpu_churning(torch.nn.Linear(2, 2))
