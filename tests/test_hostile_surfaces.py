"""A hostile pass over the surfaces added since the last hardening (issue 35): patch (and attribution patching),
dla, qk, composition, sinks, generate and image inputs. Each bad input is one clear error from the API (a CLI
line, exit 2), never a crash deep inside, a silent wrong answer or a lost file; each test failed on the code
before its fix. Tiny models are built once per session (conftest's `_tiny`); nothing here runs a sweep."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from conftest import _tiny, one_line

import headscope as hs
from headscope.analyses.patching import PatchPair
from headscope.cli import cli

NO_MODEL = "no-such-model-h35"  # a command that reached the model would fail on this name instead




@pytest.fixture(scope="module")
def llama():
    return _tiny("llama")


@pytest.fixture(scope="module")
def vit():
    return _tiny("vit")


# ------------------------------------------------------------------ --figure: checked before the model loads


@pytest.mark.parametrize("command", [["patch"], ["dla", "--prompt", "The cat", "--answer", " mat"], ["composition"]])
def test_a_figure_that_could_not_be_written_is_refused_before_the_model(command, tmp_path):
    # Was: the compute ran, then "unexpected ValueError: give a file name ending in ..." (exit 1) or "could not write".
    (tmp_path / "gone.png").symlink_to(tmp_path / "nowhere.png")  # a dangling link: exists() is False
    for figure, said in ((tmp_path / "grid.txt", "ending in .png, .svg, .pdf"),
                         ("/proc/headscope-h35/grid.png", "cannot write"),
                         (tmp_path / "gone.png", "symbolic link")):
        result = CliRunner().invoke(cli, [*command, "--model", NO_MODEL, "--figure", str(figure)])
        line = one_line(result)
        assert result.exit_code == 2 and line.startswith(f"headscope: --figure {figure}") and said in line, line
    assert not (tmp_path / "nowhere.png").exists()


# ------------------------------------------------------------------ text-only decompositions on the wrong inputs


def test_dla_and_qk_refuse_an_empty_text_and_an_image_model(llama, vit):
    # Was: "Expected tensor for argument #1 'indices' ... FloatTensor" (empty) and "'NoneType' object is not callable".
    for text in ("", "   "):
        with pytest.raises(ValueError, match="is empty"):
            hs.dla(llama, text, " mat")
        with pytest.raises(ValueError, match="is empty"):
            hs.qk(llama, text, layer=0, head=0, query=0, key=0)
    with pytest.raises(TypeError, match="one str, got list"):
        hs.dla(llama, ["The cat", "A dog"], " mat")
    calls = (lambda: hs.dla(vit, "a cat", " mat"), lambda: hs.qk(vit, "a cat", layer=0, head=0, query=1, key=0),
             lambda: hs.composition(vit), lambda: hs.patch(vit, "ioi"), lambda: hs.attribution_patch(vit, "ioi"),
             lambda: hs.sinks(vit, ["a cat sat"], ablation=False))
    for call in calls:
        with pytest.raises(ValueError, match="tiny-vit .*image model"):
            call()


def test_dla_refuses_answers_of_one_token_and_names_the_token_it_scored(llama):
    tok = llama.tokenizer
    with pytest.raises(ValueError, match="same token"):
        hs.dla(llama, "The cat sat on the", " mat", " mat")  # was a table of zeros
    long = next(w for w in (" dogs", " matter", " Johnny", " sitting")
                if len(tok(w, add_special_tokens=False)["input_ids"]) > 1)
    first = tok.decode(tok(long, add_special_tokens=False)["input_ids"][:1])
    r = hs.dla(llama, "The cat sat on the", long)
    assert r.what == f"logit({first!r} (first token of {long!r}))" and r.answer == long  # was "logit(' matter')"
    with pytest.raises(ValueError, match="same token"):
        hs.dla(llama, "The cat sat on the", long, first)
    with pytest.raises(TypeError, match="a str or a token id"):
        hs.dla(llama, "The cat", True)


def test_qk_refuses_an_empty_or_ambiguous_token_and_non_integer_indices(llama):
    text = "The cat sat on the mat."  # tiny llama: The cat sat on the mat . (the = token 0 and 4)
    with pytest.raises(ValueError, match="is empty"):
        hs.qk(llama, text, layer=0, head=0, query=5, key="")  # was token 0, silently
    with pytest.raises(ValueError, match="is empty"):
        hs.qk(llama, text, layer=0, head=0, query=" ", key=0)
    with pytest.raises(ValueError, match=r"the key 'the' matches tokens 0, 4 .*its index"):
        hs.qk(llama, text, layer=0, head=0, query=5, key="the")  # was token 0, silently
    assert hs.qk(llama, text, layer=0, head=0, query=5, key=4).key == 4
    for bad in (dict(layer=True), dict(head=1.5), dict(query=True), dict(query=5.0), dict(occurrence=0.5)):
        with pytest.raises(TypeError):
            hs.qk(llama, text, **{"layer": 0, "head": 0, "query": 5, "key": 1, **bad})
    with pytest.raises(ValueError, match="occurrence must be at least 0"):
        hs.qk(llama, text, layer=0, head=0, query="the", key=0, occurrence=-1)


def test_composition_refuses_no_random_matrices_and_a_negative_seed(llama):
    for bad, err in ((dict(n_random=0), ValueError), (dict(n_random=-1), ValueError), (dict(seed=-1), ValueError),
                     (dict(layers=True), TypeError)):
        with pytest.raises(err):
            hs.composition(llama, **bad)  # n_random=0: a nan baseline, -1: a RuntimeError, seed -1 was taken


# ------------------------------------------------------------------ patching


PAIR = PatchPair("The cat sat on the", "The dog sat on the", " mat", " dog")


def test_built_in_pairs_whose_answers_share_a_first_token_are_left_out(llama):
    from headscope.probe.attribution import answer_token
    from headscope.workflows.mechanisms import patch_pairs

    kept, dropped = patch_pairs(llama, "ioi")  # before: 16 kept, 10 of them ' '-vs-' ' under the tiny tokenizer
    assert kept and all(answer_token(llama, p.right) != answer_token(llama, p.wrong) for p in kept)
    assert len(kept) + dropped == 40


def test_patch_refuses_pairs_and_settings_that_can_only_give_nan_or_crash(llama):
    for pairs, said in (([PatchPair(PAIR.clean, PAIR.corrupt, " mat", " mat")] * 4, "same token"),
                        ([PatchPair(PAIR.clean, PAIR.clean, " mat", " dog")] * 4, "same tokens"),
                        ([PatchPair("", "", " mat", " dog")], "the clean prompt is ''")):
        for call in (hs.patch, hs.attribution_patch):
            with pytest.raises(ValueError, match=said):
                call(llama, pairs)  # were: a table of nan, nan, and a RuntimeError in a reshape
    with pytest.raises(TypeError, match="pair 0 is a str"):
        hs.patch(llama, ["The cat", "The dog"])
    with pytest.raises(TypeError, match="no order|got set"):
        hs.patch(llama, {"ioi"})
    with pytest.raises(ValueError, match=r"k = 5 \(CLI: --top\): .*8 heads allow at most 4"):
        hs.patch(llama, [PAIR] * 4, k=5)  # was "cannot draw 5 random heads from the 3 heads outside the chosen set"
    for bad, said in ((dict(seed=-1), r"seed must be a whole number in 0..2\*\*63-1, got -1"),
                      (dict(seed=2**64), r"0..2\*\*63-1"),
                      (dict(n_random=-1), "n_random must be at least 0"), (dict(batch_rows=0), "at least 1")):
        with pytest.raises(ValueError, match=said):
            hs.patch(llama, [PAIR] * 4, **bad)  # seed -1 was numpy's "expected non-negative integer"
    with pytest.raises(TypeError, match="k must be a whole number"):
        hs.patch(llama, [PAIR] * 4, k=1.5)


# ------------------------------------------------------------------ sinks


def test_sinks_refuse_a_length_past_the_models_positions_and_zero_counts(llama):
    texts = ["The cat sat on the mat and the dog sat on the log."] * 4
    with pytest.raises(ValueError, match=r"length 129 is more than tiny-llama's 128 positions"):
        hs.sinks(llama, texts, length=129, ablation=False)  # rotary: ran silently past the limit (bert: a crash)
    for bad, err in ((dict(n_boot=0), ValueError), (dict(head_texts=0), ValueError), (dict(k=1.5), TypeError),
                     (dict(seed=-1), ValueError), (dict(massive_sequences=0), ValueError)):
        with pytest.raises(err):
            hs.sinks(llama, texts, ablation=False, **bad)  # IndexError, a table of nan, IndexError, numpy, torch.cat


def test_streaming_refuses_a_window_or_keep_that_reaches_every_key(llama):
    text = "The cat sat on the mat. " * 4  # 28 tokens under the tiny tokenizer: take the first 12
    with pytest.raises(ValueError, match="covers all 3 tokens"):
        hs.streaming(llama, "The cat.", window=256, keep=1)  # equal perplexities that looked like a finding
    with pytest.raises(ValueError, match=r"reach every key .* keep at most 5"):
        hs.streaming(llama, text, window=5, keep=999_999, max_tokens=12)  # was a million forward passes
    r = hs.streaming(llama, text, window=5, keep=5, max_tokens=12)
    assert sorted(r.sink_window) == [1, 2, 3, 4, 5]


# ------------------------------------------------------------------ generate


def test_sampling_at_extreme_settings_takes_the_argmax_instead_of_crashing():
    import torch

    from headscope.probe.generate import _pick

    logits = torch.tensor([0.1, 2.0, -1.0, 1.9])
    g = torch.Generator().manual_seed(0)
    assert _pick(logits, 1e-45, 1.0, g) == 1  # was inf / inf = nan: "probability tensor contains inf, nan"
    assert _pick(logits, 1.0, 1e-300, g) == 1  # top_p compared as float32 0: nothing kept, 0 / 0


def test_generate_refuses_top_p_without_sampling_and_seeds_it_cannot_take(llama):
    with pytest.raises(ValueError, match="needs a temperature above 0"):
        hs.generate_attention(llama, "hi", max_new_tokens=1, top_p=0.5)  # was greedy, top_p silently unused
    with pytest.raises(ValueError, match=r"0..2\*\*63-1"):
        hs.generate_attention(llama, "hi", max_new_tokens=1, temperature=1.0, seed=2**70)  # "Overflow ... long long"
    with pytest.raises(TypeError, match="max_new_tokens must be a whole number"):
        hs.generate_attention(llama, "hi", max_new_tokens=True)  # was one token
    with pytest.raises(TypeError, match="prompt must be one str"):
        hs.generate_attention(llama, ["hi"], max_new_tokens=1)


# ------------------------------------------------------------------ images


def test_a_decompression_bomb_is_one_clear_error(tmp_path, monkeypatch, vit):
    # Was "unexpected DecompressionBombError" (not an OSError). PIL's limit is lowered so a 32 x 32 image is a bomb.
    import numpy as np
    from PIL import Image

    path = tmp_path / "big.png"
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(ValueError, match=r"image 0: .*big\.png' is too large to decode safely"):
        hs.extract(vit, images=[str(path)])


def test_image_text_refuses_more_than_one_image(vit):
    import numpy as np

    from headscope.probe.towers import image_text

    picture = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(ValueError, match="one .image, caption. pair, got 2 images"):
        image_text(vit, [picture, picture], "a cat")  # the second was dropped without a word


# ------------------------------------------------------------------ the CLI: one line, exit 2, no model work


def test_the_cli_says_each_refusal_in_one_line(monkeypatch, llama, tmp_path):
    for module in ("qk", "sinks", "generate"):
        monkeypatch.setattr(f"headscope.commands.{module}.load_or_fail", lambda *a: llama)
    text = tmp_path / "long.txt"
    text.write_text("The cat sat on the mat. " * 4)
    runs = [
        (["qk", "The cat sat on the mat.", "--head", "L1H2", "--query", "5", "--key", ""], "is empty"),
        (["sinks", "--streaming", "--text-file", str(text), "--max-tokens", "10", "--window", "2", "--keep", "999999"],
         "keep at most"),
        (["generate", "--prompt", "hi", "--temperature", "1", "--top-p", "1e-300", "--max-new-tokens", "1", "--json"],
         None),
    ]
    for args, said in runs:
        result = CliRunner().invoke(cli, [*args, "--model", "tiny:llama"])
        if said is None:  # the extreme nucleus is the argmax, not "unexpected RuntimeError" (exit 1)
            assert result.exit_code == 0, result.output
            continue
        assert result.exit_code == 2 and said in one_line(result), result.output


def test_whole_numbers_and_seeds_have_one_check():
    from headscope.probe.types import SEED_MAX, seed_value, whole_number

    assert seed_value(SEED_MAX) == SEED_MAX and whole_number(-3, "layer", minimum=None) == -3
    for bad in (True, 1.0, "1", None):
        with pytest.raises(TypeError):
            whole_number(bad, "k")
        with pytest.raises(ValueError, match="seed must be a whole number in 0..2"):
            seed_value(bad)
