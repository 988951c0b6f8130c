"""The family registry: one file per family, found by discovery; rotary types by name; docs from the registry."""

import ast
import io
import json
import math
import pathlib
import re
import sys
import tokenize

import pytest
import torch
from click.testing import CliRunner
from conftest import _tiny_type

import headscope.probe.families as families
from headscope.cli import cli
from headscope.probe.families import FAMILIES, SUPPORTED_TYPES, UnsupportedFeature, family_for, family_of_type
from headscope.probe.model import encoder_only
from headscope.probe.rotary import rope
from headscope.probe.tiny import tiny_model
from headscope.probe.verify import verify

ROOT = pathlib.Path(__file__).resolve().parents[1]
FAMILY_DIR = ROOT / "probe" / "families"


def test_registry_names_are_the_module_files():
    files = {p.stem for p in FAMILY_DIR.glob("*.py") if not p.name.startswith("_")}
    assert set(FAMILIES) == files
    for name, family in FAMILIES.items():
        assert family.name == name and family.model_types
        assert all(SUPPORTED_TYPES[t] is family for t in family.model_types)
    assert len(SUPPORTED_TYPES) == sum(len(f.model_types) for f in FAMILIES.values())  # no type in two families


def test_a_module_dropped_into_the_package_is_registered(tmp_path, monkeypatch):
    (tmp_path / "toy.py").write_text(
        "import dataclasses\n"
        "from headscope.probe.families.gpt2 import FAMILY as _GPT2\n"
        "FAMILY = dataclasses.replace(_GPT2, name='toy', model_types=('toy_type',))\n"
    )
    before = list(FAMILIES)
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(tmp_path)])
    try:
        found = {name: families.FAMILIES[name] for name in families.FAMILIES}
        by_type = families.SUPPORTED_TYPES["toy_type"]
    finally:
        sys.modules.pop("headscope.probe.families.toy", None)
    assert sorted(found) == sorted([*before, "toy"]) and found["toy"].model_types == ("toy_type",)
    assert by_type.name == "toy"


def test_a_module_named_unlike_its_family_is_refused(tmp_path, monkeypatch):
    (tmp_path / "wrongname.py").write_text(
        "import dataclasses\n"
        "from headscope.probe.families.gpt2 import FAMILY as _GPT2\n"
        "FAMILY = dataclasses.replace(_GPT2, model_types=('other_type',))\n"
    )
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(tmp_path)])
    try:
        with pytest.raises(ValueError, match="declares family 'gpt2'; name the file after it"):
            families.FAMILIES["wrongname"]
    finally:
        sys.modules.pop("headscope.probe.families.wrongname", None)


def _string_literals(path: pathlib.Path):
    """(value, is a `family=` keyword argument) for every plain string literal in a Python file."""
    toks = list(tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline))
    for k, tok in enumerate(toks):
        if tok.type != tokenize.STRING:
            continue
        try:
            value = ast.literal_eval(tok.string)
        except ValueError:  # an f-string
            continue
        # `family="bert"` names a family, and so does a Family's own `name="gemma3"` (a family's name may be another
        # family's model type: the gemma3 text family beside Gemma 3 with vision, model type "gemma3")
        yield value, k >= 2 and toks[k - 1].string == "=" and toks[k - 2].string in ("family", "name")


def test_each_model_type_is_named_in_one_file_only():
    # A family name that is also a model type ("bert") may name the family elsewhere (`family="bert"`, `name="bert"`).
    where: dict[str, set[str]] = {t: set() for t in SUPPORTED_TYPES}
    for path in sorted((ROOT / "probe").rglob("*.py")):
        for value, names_family in _string_literals(path):
            if value in where and not names_family:
                where[value].add(path.relative_to(ROOT).as_posix())
    for model_type, family in SUPPORTED_TYPES.items():
        assert where[model_type] == {f"probe/families/{family.name}.py"}, model_type


@pytest.mark.parametrize("model_type", sorted(SUPPORTED_TYPES))
def test_tiny_model_by_model_type_is_its_family_model(model_type):
    family = SUPPORTED_TYPES[model_type]
    lm = _tiny_type(model_type)  # built once per session, shared with the other per-type tests
    assert lm.config.model_type == model_type
    assert lm.name == f"tiny-{family.name}"
    assert family_for(lm.config) is family
    assert lm.is_causal == (family.kind == "decoder")  # an encoder-decoder's one-text view is its encoder
    # CLIP's text tower masks causally but has no next-word head; nor have the Qwen-VL and GLM-4V decoders built alone (their
    # head is the whole vision-language model's)
    if family.name not in ("clip_text", "qwen2_vl", "qwen3_vl", "glm4v_text"):
        assert (family.auto_class == "AutoModel") == (family.kind == "encoder")


def test_tiny_model_of_an_unknown_name_lists_the_choices():
    with pytest.raises(ValueError, match=r"unknown family or model type 'nope'; choose a family \((\w+, )*bert, "):
        tiny_model("nope")


def test_encoder_only_from_the_registry_and_from_transformers_for_other_types():
    from transformers import AutoConfig

    for model_type, family in SUPPORTED_TYPES.items():
        assert encoder_only(AutoConfig.for_model(model_type)) == (family.kind == "encoder")
    for model_type, encoder in [("distilbert", True), ("mpnet", True), ("deberta", True), ("t5", False),
                                ("phi3", False), ("bart", False)]:
        assert encoder_only(AutoConfig.for_model(model_type)) == encoder, model_type


def _config(cls: str, **kwargs):
    import transformers

    return getattr(transformers, cls)(**kwargs)


@pytest.mark.parametrize("cls, kwargs, message", [
    ("BertConfig", {"position_embedding_type": "relative_key"}, "relative position scores are not reproduced"),
    ("BertConfig", {"is_decoder": True}, "BERT used as a decoder"),
    ("GPT2Config", {"add_cross_attention": True}, "GPT-2 with cross-attention"),
    ("LlamaConfig", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0,
                                         "partial_rotary_factor": 0.5}}, "applies the rotary angles to the whole head"),
    ("Gemma3TextConfig", {"use_bidirectional_attention": True}, "use_bidirectional_attention=True"),
    ("Gemma3TextConfig", {"attn_logit_softcapping": 50.0}, "softcapping is not reproduced"),
])
def test_each_refused_feature_is_named(cls, kwargs, message):
    with pytest.raises(UnsupportedFeature, match=re.escape(message)):
        family_for(_config(cls, **kwargs))


def test_unknown_rope_type_names_the_supported_ones():
    from transformers import LlamaConfig

    cfg = LlamaConfig(rope_parameters={"rope_type": "mrope", "rope_theta": 1e4})
    with pytest.raises(UnsupportedFeature, match=re.escape("rope_type='mrope' is not reproduced (supported: "
                                                           "default, linear, llama3, dynamic, yarn, longrope, "
                                                           "proportional)")):
        rope(cfg, 8).inv_freq


class _Cfg:
    def __init__(self, **rope):
        self.rope_parameters = rope


def test_rope_frequencies_by_hand():
    # θ^(-2i/d) for θ = 100, d = 4: i = 0, 1 -> 1, 1/10
    torch.testing.assert_close(rope(_Cfg(rope_type="default", rope_theta=100.0), 4).inv_freq, torch.tensor([1.0, 0.1]))
    torch.testing.assert_close(rope(_Cfg(rope_type="linear", rope_theta=100.0, factor=4.0), 4).inv_freq,
                               torch.tensor([0.25, 0.025]))
    # llama3 with original length 64, low 1, high 4: wavelengths under 64/4 = 16 keep their frequency,
    # over 64/1 = 64 are slowed by `factor`, and between them the ramp is (64/λ - 1) / 3.
    p = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
             original_max_position_embeddings=64)
    base = rope(_Cfg(rope_type="default", rope_theta=10000.0), 16).inv_freq
    got = rope(_Cfg(**p), 16).inv_freq
    for f, g in zip(base.tolist(), got.tolist()):
        wavelen = 2 * math.pi / f
        if wavelen < 16:
            assert g == pytest.approx(f)
        elif wavelen > 64:
            assert g == pytest.approx(f / 8)
        else:
            s = (64 / wavelen - 1) / 3
            assert g == pytest.approx((1 - s) * f / 8 + s * f)
    assert (got < base).any() and (got == base).any()  # both regimes occur at this size


def test_linear_rope_scaling_verifies():
    lm = tiny_model("llama", rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})
    assert verify(lm, ["The cat sat on the mat, and the dog sat on the log!"]).passed


def test_docs_table_is_the_registry():
    page = (ROOT / "docs" / "families.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- families:start -->\n(.*?)<!-- families:end -->", page, re.S)
    assert found, "docs/families.md lacks the <!-- families:start --> / <!-- families:end --> markers"
    assert found.group(1) == families.coverage_markdown(), (
        "docs/families.md's family table differs from probe/families/; replace the lines between the markers with "
        "the output of: python -c 'from headscope.probe.families import coverage_markdown; print(coverage_markdown(), end=\"\")'"
    )


def test_models_families_cli():
    res = CliRunner().invoke(cli, ["models", "--families", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert {r["model_type"] for r in rows} == set(SUPPORTED_TYPES)
    for r in rows:
        family = family_of_type(r["model_type"])
        assert r == {"model_type": r["model_type"], "family": family.name, "file": f"probe/families/{family.name}.py",
                     "kind": family.kind, "features": list(family.features)}
        assert (ROOT / r["file"]).is_file()
    table = CliRunner().invoke(cli, ["models", "--families"])
    assert table.exit_code == 0
    lines = table.output.splitlines()
    assert lines[0].split()[:3] == ["model", "type", "family"] and len(lines) == 1 + len(SUPPORTED_TYPES)
    assert any(line.split()[:3] == ["gemma3_text", "gemma3", "decoder"] for line in lines)


@pytest.mark.parametrize("model_type", sorted(SUPPORTED_TYPES))
def test_tiny_prefix_builds_every_verified_type_and_verify_json_is_clean(model_type):
    from click.testing import CliRunner

    from headscope.cli import cli

    result = CliRunner().invoke(cli, ["verify", "--model", f"tiny:{model_type}", "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)  # nothing but the JSON object on stdout
    assert record["model"] == f"tiny:{model_type}" and record["passed"] is True
    assert record["max_abs_err"] <= record["tolerance"]


def test_tiny_prefix_refuses_an_unknown_type_in_one_line():
    from click.testing import CliRunner

    from headscope.cli import cli

    result = CliRunner().invoke(cli, ["verify", "--model", "tiny:no-such-type"])
    assert result.exit_code == 2 and "tiny: takes a verified model type" in result.output
    assert "Traceback" not in result.output



_DIGEST = """
import hashlib, json
from headscope.probe.tiny import tiny_tokenizer
h = hashlib.sha256()
for kind in ("wordpiece", "bytebpe", "sentencepiece"):
    tok = tiny_tokenizer(kind)
    h.update(json.dumps(tok.get_vocab(), sort_keys=True).encode())
    h.update(str(tok("The animal didn't cross the street, unbelievably.")["input_ids"]).encode())
print(h.hexdigest())
"""


def test_tiny_tokenizers_are_the_same_in_every_process_and_call():
    # Issue 24 item 14: the trained WordPiece vocabulary differed between processes and calls (hash-ordered ties),
    # so two identical `heads --model tiny:bert` runs differed and `compare tiny:bert tiny:bert` saw other
    # tokenisations. The weights are seeded, so the same vocabulary gives the same tiny model.
    import contextlib
    import os
    import subprocess

    def here() -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(_DIGEST, {})
        return out.getvalue()

    other = subprocess.run([sys.executable, "-c", _DIGEST], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "12345"}).stdout
    first = here()
    assert len(first.strip()) == 64 and here() == first == other


def _unverified_in_docs() -> dict[str, str]:
    """Each model type the "not verified" tables of docs/families.md name, and its row's marker."""
    page = (ROOT / "docs" / "families.md").read_text(encoding="utf-8")
    named: dict[str, str] = {}
    for marker, types in re.findall(r"^\| <!-- unverified:([\w-]+) --> ([^|]+) \|", page, re.M):
        for t in types.split(","):
            assert t.strip() not in named, f"{t.strip()} is named twice"
            named[t.strip()] = marker
    return named


def test_every_image_reading_type_is_verified_or_named_with_its_reason():
    # issue 49: no image-reading decoder of the installed transformers is skipped silently
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    named = _unverified_in_docs()
    assert named and not set(named) & set(SUPPORTED_TYPES), set(named) & set(SUPPORTED_TYPES)
    missing = sorted(set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES) - set(SUPPORTED_TYPES) - set(named))
    assert not missing, f"docs/families.md names neither verification nor a reason for {missing}"


def test_the_types_named_as_needing_timm_cannot_be_built_without_it():
    import importlib.util

    from transformers import AutoConfig, AutoModelForImageTextToText

    if importlib.util.find_spec("timm") is not None:
        pytest.skip("timm is installed here")
    for model_type, marker in _unverified_in_docs().items():
        if marker == "timm":
            with pytest.raises(ImportError), torch.device("meta"):
                AutoModelForImageTextToText.from_config(AutoConfig.for_model(model_type))


def test_the_types_named_as_needing_torchvision_have_no_image_path_without_it():
    import importlib.util

    import transformers
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here")
    named = _unverified_in_docs()
    for model_type in (t for t, marker in named.items() if marker == "torchvision-images"):
        assert "pil" not in IMAGE_PROCESSOR_MAPPING_NAMES[model_type], model_type
    for model_type in (t for t, marker in named.items() if marker == "torchvision"):
        with pytest.raises(ImportError, match="(?i)torchvision"):
            getattr(transformers, PROCESSOR_MAPPING_NAMES[model_type])()
