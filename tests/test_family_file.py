"""A family is its file: the registry loads a family file only when its name or one of its model types is asked for,
and a new family is one file dropped into the package, verified with nothing else touched."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import pytest

import headscope.probe.families as families

# Loads in a fresh interpreter and prints which family files were imported after each step.
_PROBE = textwrap.dedent("""
    import sys
    import headscope.probe.families as f
    print(sorted(m for m in sys.modules if m.startswith("headscope.probe.families.")))
    f.family_of_type("llava")
    print(f.loaded_families())
    f.family_of_type("qwen3_vl_text")
    print(f.loaded_families())
    "siglip2" in f.TOWERS and f.TOWERS["siglip2"]
    print(f.loaded_families())
""")


def test_importing_the_registry_loads_no_family_and_a_lookup_loads_only_its_file():
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "[]"  # not one family file, nor the families' shared helpers
    assert eval(out[1]) == ("llava",)
    # qwen3_vl names its bases: qwen2_vl (which names llama) and qwen3
    assert eval(out[2]) == ("llama", "llava", "qwen2_vl", "qwen3", "qwen3_vl")
    assert eval(out[3]) == ("clip_vision", "llama", "llava", "qwen2_vl", "qwen3", "qwen3_vl")  # a composite: its tower's


# A new family for a type headscope does not cover (Helium: Llama's attention with its rotary on interleaved pairs,
# (x0, x1), (x2, x3), ...), written as a user would: one file, one FAMILY.
_TOY = textwrap.dedent('''
    import dataclasses

    from headscope.probe.families.llama import FAMILY as LLAMA

    FAMILY = dataclasses.replace(
        LLAMA,
        name="toy_helium",
        model_types=("helium",),
        features=("Llama's attention, rotary on interleaved pairs",),
        layer_spec=lambda base, i, cfg: dataclasses.replace(LLAMA.layer_spec(base, i, cfg), rotary_interleaved=True),
    )
''')


@pytest.fixture
def toy_family(tmp_path, monkeypatch):
    (tmp_path / "toy_helium.py").write_text(_TOY)
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(tmp_path)])
    yield
    sys.modules.pop("headscope.probe.families.toy_helium", None)


def test_a_type_no_file_covers_is_refused():
    from headscope.probe.families import UnsupportedArchitecture

    with pytest.raises(UnsupportedArchitecture, match="'helium'"):
        families.family_of_type("helium")


def test_a_new_family_in_one_file_is_found_built_and_verified(toy_family):
    from headscope.probe.loading import load_model
    from headscope.probe.verify import verify

    assert families.family_of_type("helium").name == "toy_helium"
    lm = load_model("tiny:helium")  # the loader knows the new type from the file alone
    assert type(lm.model).__name__.startswith("Helium")
    texts = ["The cat sat on the mat.", "Attention is all you need."]
    result = verify(lm, texts)
    assert result.family == "toy_helium" and result.passed
    assert len(result.layers) == 2 and result.max_abs_err <= 1e-5
    # what the file declares is what makes it right: Llama's own spec (rotary on halves) misses Helium's pairs
    llama = families.FAMILIES["llama"]
    assert not verify(lm, texts, family=dataclasses.replace(llama, model_types=("helium",))).passed


def test_a_family_whose_source_hides_its_types_is_refused_with_what_to_write(tmp_path, monkeypatch):
    (tmp_path / "hidden.py").write_text("from headscope.probe.families.gpt2 import FAMILY as _G\n"
                                        "TYPES = ('hidden_type',)\n"
                                        "FAMILY = _G.__class__(**{**_G.__dict__, 'name': 'hidden', 'model_types': TYPES})\n")
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(tmp_path)])
    with pytest.raises(ValueError, match=r"hidden.py: a family file declares FAMILY = \.\.\.\(model_types="):
        families.family_index()


def test_a_type_two_files_declare_is_refused(tmp_path, monkeypatch):
    (tmp_path / "again.py").write_text("import dataclasses\n"
                                       "from headscope.probe.families.gpt2 import FAMILY as _G\n"
                                       "FAMILY = dataclasses.replace(_G, name='again', model_types=('gpt2',))\n")
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(tmp_path)])
    with pytest.raises(ValueError, match=r"'gpt2' is declared by both \S*again.py and \S*families/gpt2.py"):
        families.family_index()


def test_a_family_that_covers_other_types_than_its_source_says_is_refused(tmp_path, monkeypatch):
    (tmp_path / "drift.py").write_text("import dataclasses\n"
                                       "from headscope.probe.families.gpt2 import FAMILY as _G\n"
                                       "FAMILY = dataclasses.replace(_G, name='drift', model_types=('drift_type',))\n"
                                       "FAMILY = dataclasses.replace(FAMILY, model_types=('other_type',))\n")
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(tmp_path)])
    try:
        with pytest.raises(ValueError, match=r"covers \('other_type',\).*its source declares \('drift_type',\)"):
            families.SUPPORTED_TYPES["drift_type"]
    finally:
        sys.modules.pop("headscope.probe.families.drift", None)
