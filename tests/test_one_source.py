"""The attention source is the only way to read attention (`probe.sources`): one typed input, one yielded type,
capabilities accepted or refused by name, and no workflow, command, server or API function that reads
attention around it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from headscope.probe.inputs import AttentionInput
from headscope.probe.reading import Fold, Reading
from headscope.probe.sources import CAPABILITIES, source_for
from headscope.probe.tiny import tiny_model

ROOT = Path(__file__).resolve().parents[1]

# The engine's functions that obtain attention from a model: only probe/ may call them.
ENGINE = {
    "iter_extract", "extract", "extract_ids", "extract_encoded", "batches_encoded",  # probe.extract
    "forward_batch", "forward_each_layer", "forward_seq2seq", "forward_one_stream",  # probe.forward
    "EagerLive", "RecomputedLive",  # probe.live
    "norm_attention",  # probe.norms
    "iter_blocks", "iter_blocks_encoded", "streamed_inputs",  # probe.recompute
    "attention_of_ids",  # probe.sinks (was)
}
# Where attention is read for a user: the workflows, the commands, the server and the explorer, the API.
SCANNED = ("headscope/workflows", "headscope/commands", "headscope/common", "headscope/serve.py",
           "headscope/__init__.py", "headscope/cli.py", "headscope/distributed.py", "headscope/guard.py")


def _files(root: Path) -> list[Path]:
    out = []
    for name in SCANNED:
        path = root / name
        out += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return out


def _engine_module(node: ast.ImportFrom) -> bool:
    """An import from probe/ or from the façade (`headscope`, `from .. import x`), not a command module's name."""
    module = node.module or ""
    return "probe" in module.split(".") or module == "headscope" or (node.level > 0 and not module)


def engine_calls(source: str) -> list[str]:
    """Each import of an engine function and each call of one (by its imported name, or as an attribute of any
    object: `hs.extract(...)`, `extract_mod.iter_extract(...)`), as "line: what"."""
    tree = ast.parse(source)
    imported: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _engine_module(node):
            for alias in node.names:
                if alias.name in ENGINE:
                    imported.add(alias.asname or alias.name)
                    found.append(f"{node.lineno}: imports {alias.name} from {node.module}")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in imported:
            found.append(f"{node.lineno}: calls {f.id}")
        elif isinstance(f, ast.Attribute) and f.attr in ENGINE:
            found.append(f"{node.lineno}: calls .{f.attr}")
    return found


def test_no_workflow_command_server_or_api_reads_attention_around_the_source():
    files = _files(ROOT)
    assert len(files) > 40 and any(f.name == "explore.py" for f in files)  # the scan reaches what it names
    found = {str(f.relative_to(ROOT)): hits for f in files if (hits := engine_calls(f.read_text()))}
    assert found == {}, "attention read around probe.sources (ask the source: source.read / maps / live):\n" + \
        "\n".join(f"{path}:{hit}" for path, hits in found.items() for hit in hits)


def test_the_scan_finds_each_way_around_the_source():
    """What the code read before the source was the only way (workflows/run.py, commands/heads.py, explore.py),
    and each spelling of a call: found; a source's own methods, and names that only look alike: not."""
    assert engine_calls("from headscope.probe.extract import extract\nmaps = extract(lm, images=x)\n") == [
        "1: imports extract from headscope.probe.extract", "2: calls extract"]
    assert engine_calls("def f():\n    from headscope.probe.live import EagerLive\n    return EagerLive(lm, s, m)\n") \
        == ["2: imports EagerLive from headscope.probe.live", "3: calls EagerLive"]
    assert engine_calls("import headscope as hs\nhs.iter_extract(lm, t)\n") == ["2: calls .iter_extract"]
    assert engine_calls("from headscope import extract\n") == ["1: imports extract from headscope"]
    assert engine_calls("from .. import norm_attention\n") == ["1: imports norm_attention from None"]
    assert engine_calls("source.maps(t)\nsource.live(t)\nextract_file(lm, t, p)\ndef g(extract): extract(1)\n"
                        "from .commands import extract\n") == []


# -- one input, checked once -------------------------------------------------------------------------


@pytest.mark.parametrize("given, kind", [
    (dict(texts=["a b"]), "texts"),
    (dict(images=["p.png"]), "images"),
    (dict(texts=["a b"], images=["p.png"]), "texts+images"),
    (dict(texts=["a b"], targets=["c"]), "pairs"),
    (dict(sequences=[[1, 2]]), "ids"),
])
def test_an_input_has_one_kind_decided_where_it_is_made(given, kind):
    inp = AttentionInput.of(given.pop("texts", None), **given)
    assert inp.kind == kind and AttentionInput.of(inp) is inp  # passed on, never looked at again


@pytest.mark.parametrize("given, error, match", [
    (dict(), TypeError, "got NoneType; an image model takes images"),
    (dict(texts=["a", "b"], targets=["c"]), ValueError, "2 source texts but 1 targets"),
    (dict(images=["p.png"], targets=["c"]), ValueError, "images are read with no target"),
    (dict(texts=["a"], sequences=[[1]]), ValueError, "sequences are read alone"),
    (dict(images=[]), ValueError, "images is empty"),
])
def test_a_bad_input_is_refused_in_one_line_where_it_is_made(given, error, match):
    with pytest.raises(error, match=match):
        AttentionInput.of(given.pop("texts", None), **given)


def test_pixel_values_travel_in_their_own_field_never_in_the_ids():
    from headscope.probe.encoding import encode, model_batch, pad_batch
    from headscope.probe.images import encode_images

    vit = tiny_model("vit")
    image = torch.rand(vit.config.image_size, vit.config.image_size, 3).numpy()
    [enc] = encode_images(vit, [image])
    batch = model_batch([enc], vit.device)
    assert batch.ids is None and batch.pixels.shape == (1, 3, vit.config.image_size, vit.config.image_size)
    assert batch.mask.shape == (1, len(enc.ids)) and bool(batch.mask.all())
    with pytest.raises(ValueError, match="images have pixel values, not token ids"):
        pad_batch([enc], vit.device)
    bert = tiny_model("bert")
    text = model_batch([encode(bert, "a cat")], bert.device)
    assert text.pixels is None and text.ids.dtype == torch.long


# -- capabilities, accepted or refused by name ---------------------------------------------------------


@pytest.mark.parametrize("capability, instead", [
    ("norm", "norm-based weights .* use attention='auto' or attention='eager'$"),
    ("images", "images are read by the eager forward pass: use attention='auto' or attention='eager'"),
    ("pairs", "pairs \\(cross-attention\\) come from the eager forward pass: use attention='auto' or attention='eager'"),
])
def test_recompute_refuses_each_capability_in_one_line_naming_what_to_use(capability, instead):
    lm = tiny_model("gpt2")
    recompute = source_for(lm, "recompute")
    assert not recompute.accepts(capability)
    with pytest.raises(ValueError, match=f"^attention='recompute' .*{instead}") as exc:
        recompute.require(capability)
    assert "\n" not in str(exc.value)
    assert all(source_for(lm, name).accepts(capability) for name in ("eager", "auto"))


def test_a_refusal_comes_before_the_model_runs(monkeypatch):
    """Reading what a source refuses fails at once, naming the way out, with no forward pass."""
    import headscope.probe.extract as extract

    lm = tiny_model("gpt2")
    monkeypatch.setattr(extract, "forward_batch", lambda *a, **kw: pytest.fail("the model ran"))
    recompute = source_for(lm, "recompute")
    for call in (lambda: recompute.read(["a cat"], weight="norm"),
                 lambda: recompute.maps(AttentionInput.of(["a cat"], targets=["b"])),
                 lambda: recompute.maps(AttentionInput.of(images=["x.png"])),
                 lambda: recompute.live("a cat", images=["x.png"]),
                 lambda: recompute.live("a cat", weight="norm")):
        with pytest.raises(ValueError, match="use attention='auto' or attention='eager'"):
            call()
    with pytest.raises(ValueError, match="a capability is one of 'norm', 'images', 'pairs'"):
        recompute.accepts("kernels")
    assert CAPABILITIES == ("norm", "images", "pairs")


# -- one yielded type ----------------------------------------------------------------------------------


class _Collected(Fold):
    def __init__(self):
        self.maps = []

    def map(self, amap):
        self.maps.append(amap)


@pytest.mark.parametrize("attention, batched", [("eager", True), ("eager", False), ("recompute", False),
                                                ("auto", True)])
def test_every_reading_collects_into_the_maps_extract_gives(attention, batched):
    """Whatever form a reading takes (a padded batch, a text's recomputed blocks, whole maps), a fold that only
    collects maps gets each text's own map, equal to `extract`'s (recomputed: within 1e-5), in the order read."""
    from headscope.probe.extract import extract

    lm = tiny_model("llama")
    texts = ["The cat sat.", "A dog ran away quickly!", "Hi"]
    budget = 10**4 if attention == "auto" else None  # auto: some texts recomputed
    source = source_for(lm, attention, budget=budget, batch_size=2)
    readings = list(source.read(texts, batched=batched))
    assert all(isinstance(r, Reading) for r in readings)
    forms = {r.form for r in readings}
    assert forms <= {"layers", "blocks", "maps"} and (attention != "recompute" or forms == {"blocks"})
    got = _Collected()
    for reading in readings:
        reading.fold(got)
    expected = {m.text: m for m in extract(lm, texts)}
    assert sorted(m.text for m in got.maps) == sorted(texts)
    for m in got.maps:
        torch.testing.assert_close(m.attention, expected[m.text].attention, atol=1e-5, rtol=0)
        assert m.labels == expected[m.text].labels


def test_images_pairs_and_norm_weights_come_as_readings_of_maps(picture_file):
    from headscope.probe.extract import extract

    llava, bart, bert = tiny_model("llava"), tiny_model("bart"), tiny_model("bert")
    for lm, inp, weight in ((llava, AttentionInput.of(images=[picture_file]), "attention"),
                            (bart, AttentionInput.of(["a cat"], targets=["the dog"]), "attention"),
                            (bert, AttentionInput.of(["a cat sat"]), "norm")):
        [reading] = source_for(lm, "auto").read(inp, weight=weight)
        assert reading.form == "maps" and reading.mode == "eager"
        [amap] = reading.maps()
        [direct] = extract(lm, inp, weight=weight)
        whole = getattr(amap, "cross", amap)
        torch.testing.assert_close(whole.attention, getattr(direct, "cross", direct).attention, atol=0, rtol=0)


def test_the_cli_says_a_refusal_in_one_line_with_the_flag_to_use(picture_file):
    """`headscope heads --image` with `--attention recompute`: exit 2, one line naming `--attention auto`, instead
    of the images read eagerly behind the user's back (as before: the command extracted them itself)."""
    from click.testing import CliRunner

    from headscope.cli import cli

    result = CliRunner().invoke(cli, ["heads", "--model", "tiny:llava", "--image", picture_file, "--attention",
                                      "recompute", "--no-verify", "--quiet"])
    assert result.exit_code == 2, result.output
    [line] = result.output.strip().splitlines()
    assert line.startswith("headscope: --attention recompute recomputes") and \
        line.endswith("use --attention auto or --attention eager"), line
