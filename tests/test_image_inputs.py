"""Images in and word units out (issue 45): a causal map stays causal at word level, head scores are finite or
not applicable, every image goes through one loader (orientation, modes), and an unfilled image slot is an error."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ONE_STACK, _tiny, _tiny_type
from headscope.analyses.heads import score_corpus
from headscope.probe.extract import extract
from headscope.probe.families import FAMILIES
from headscope.probe.words import assign_words, to_word_level

# every model type a vision–language family reads with image tokens in the text (Mllama: cross-attention)
VL_TYPES = sorted(t for f in FAMILIES.values() if f.vision_language is not None and f.vision_language.cross is None
                  for t in f.model_types)


def _picture(seed: int = 0, shape=(40, 52, 3)) -> np.ndarray:
    return np.random.default_rng(seed).random(shape)


def _above_diagonal(a: torch.Tensor) -> float:
    """The largest weight any row gives a later key."""
    return float(torch.triu(a, 1).abs().max()) if a.shape[-1] > 1 else 0.0


def _assert_scores_sound(scores) -> None:
    """Every value finite, or NaN where no row counts (not applicable); never inf."""
    t = scores.table
    assert np.isfinite(t["value"]).sum() + t["value"].isna().sum() == len(t), t[np.isinf(t["value"])]
    assert (t.loc[t["value"].isna(), "n"] == 0).all()
    ranged = t[t["metric"] == "normalized_entropy"]["value"].dropna()
    assert ((ranged >= -1e-6) & (ranged <= 1 + 1e-6)).all(), ranged.max()


# --- 1. a causal map is causal at every level, and its scores are finite or not applicable ---------------------


@pytest.mark.parametrize("model_type", VL_TYPES)
def test_every_vision_language_map_flagged_causal_is_causal(model_type):
    """Both levels: the words are the token maps pooled (`to_word_level`, what extract(level="word") returns)."""
    lm = _tiny_type(model_type)
    tokens = extract(lm, images=[_picture(0), _picture(1)], level="token")
    for level, maps in (("token", tokens), ("word", [to_word_level(m) for m in tokens])):
        for m, t in zip(maps, tokens):
            if m.causal:
                assert _above_diagonal(m.attention) < 1e-6, (model_type, level, m.labels)
            # image tokens are units of their own at both levels, never merged into a word
            cells = [(lab, p) for lab, p in zip(m.labels, m.patches) if p is not None]
            assert cells == [(lab, p) for lab, p in zip(t.labels, t.patches) if p is not None] and cells
        _assert_scores_sound(score_corpus(maps, level=level))


def test_a_space_before_a_special_token_joins_the_word_before_it():
    """The chat template's " " before an image token used to join the word after the image (non-causal)."""
    text = "user: X\nWhat"
    # u s e r : ␠ [IMG] [IMG] \n What  (the image tokens replace "X", special, span (0, 0))
    spans = [(0, 4), (4, 5), (5, 6), (0, 0), (0, 0), (7, 8), (8, 12)]
    special = [False, False, False, True, True, False, False]
    units, _, _ = assign_words(text, spans, special)
    assert units == [0, 1, 1, 2, 3, 4, 4]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["ab", "c", " ", "  ", "d'e", "!", "\n", "北京"]), st.booleans()),
                min_size=1, max_size=12))
def test_every_word_unit_is_one_run_of_consecutive_tokens(pieces):
    """Whatever the tokens and wherever special ones stand, a unit's tokens are consecutive and the units come in
    the tokens' order: so pooling a causal map over them leaves nothing above the diagonal."""
    text, spans, special = "", [], []
    for piece, is_special in pieces:
        if is_special:
            spans.append((0, 0))
        else:
            spans.append((len(text), len(text) + len(piece)))
            text += piece
        special.append(is_special)
    units, _, _ = assign_words(text, spans, special)
    assert units[0] == 0 and all(b - a in (0, 1) for a, b in zip(units, units[1:])), units


@pytest.mark.parametrize("tiny", ONE_STACK, indirect=True)
def test_every_text_map_flagged_causal_is_causal_at_word_level(tiny):
    """Text families, with a typed special token and runs of spaces (orphan tokens beside a special one)."""
    tok = tiny.tokenizer
    typed = next((t for t in (tok.sep_token, tok.eos_token, tok.bos_token, tok.unk_token) if t), "")
    maps = extract(tiny, [f"The cat  {typed}  sat.\n\n  {typed}dog ran ."], level="word")
    for m in maps:
        if m.causal:
            assert _above_diagonal(m.attention) < 1e-6, m.labels
    _assert_scores_sound(score_corpus(maps, level="word"))


def _cli(*args):
    from click.testing import CliRunner

    from headscope.cli import cli

    return CliRunner().invoke(cli, [str(a) for a in args])


def test_cli_heads_on_an_image_writes_no_inf_and_names_why_induction_is_absent(picture_file, tmp_path):
    import pandas as pd

    out = tmp_path / "heads.csv"
    result = _cli("heads", "--model", "tiny:llava", "--image", picture_file, "--out", out, "--quiet")
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out)
    assert not np.isinf(table["value"]).any() and (table.loc[table["value"].isna(), "n"] == 0).all()
    assert "not applicable to an encoder" not in result.output and "not scored on images" in result.output
    assert "next-token head" not in result.output  # a decoder's next_token: no row counts it


def test_run_on_an_image_scores_at_the_level_it_records(picture_file, tmp_path, draw_only):
    """`run --image --level word` scored the heads at token level while run.json said word."""
    import json

    import pandas as pd

    draw_only()
    by_level = {}
    for level in ("word", "token"):
        out = tmp_path / level
        result = _cli("run", "--model", "tiny:llava", "--image", picture_file, "--level", level, "--out", out, "--quiet")
        assert result.exit_code == 0, result.output
        record = json.loads((out / "run.json").read_text())
        assert f'"level": "{level}"' in json.dumps(record)
        by_level[level] = pd.read_csv(out / "head_scores.csv")
    lm = _tiny("llava")
    [token_map] = extract(lm, images=[picture_file], level="token")
    for level, table in by_level.items():
        expected = score_corpus([token_map], level=level).table  # the word map pooled from the token one
        got = table[table["metric"] == "previous_token"]["value"].to_numpy()
        want = expected[expected["metric"] == "previous_token"]["value"].to_numpy()
        assert np.allclose(got, want), level
    assert not np.allclose(by_level["word"]["value"].fillna(0), by_level["token"]["value"].fillna(0))
