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


def _vl(model_type: str):
    """The tiny model of a vision–language type: its family's own (shared with the rest of the suite) where the
    type is the family's first, else the type's."""
    family = next(n for n, f in FAMILIES.items() if f.vision_language is not None and model_type in f.model_types)
    return _tiny(family) if FAMILIES[family].model_types[0] == model_type else _tiny_type(model_type)


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
    lm = _vl(model_type)
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
    out = tmp_path / "word"
    result = _cli("run", "--model", "tiny:llava", "--image", picture_file, "--level", "word", "--report", out, "--quiet")
    assert result.exit_code == 0, result.output
    assert '"level": "word"' in json.dumps(json.loads((out / "run.json").read_text()))
    table = pd.read_csv(out / "head_scores.csv")
    [token_map] = extract(_tiny("llava"), images=[picture_file], level="token")
    by_level = {level: score_corpus([token_map], level=level).table for level in ("word", "token")}
    got = table[table["metric"] == "previous_token"]["value"].to_numpy()
    want = {level: t[t["metric"] == "previous_token"]["value"].to_numpy() for level, t in by_level.items()}
    assert np.allclose(got, want["word"]) and not np.allclose(got, want["token"])


# --- 2. one loader: EXIF orientation, modes with a declared rule, one line for what it cannot convert ---------


def _halves(width: int = 64, height: int = 32) -> np.ndarray:
    """Left half red, right half blue, as stored in the file."""
    a = np.zeros((height, width, 3), np.uint8)
    a[:, : width // 2, 0] = 255
    a[:, width // 2 :, 2] = 255
    return a


def _rotated_jpeg(path, orientation: int = 6):
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = orientation  # Orientation
    Image.fromarray(_halves()).save(path, quality=100, exif=exif.tobytes())
    return path


def test_exif_orientation_is_applied(tmp_path):
    """Orientation 6: the stored picture is shown turned 90° clockwise, so its left half (red) is on top."""
    from headscope.probe.images import load_image

    shown = np.rot90(_halves(), k=-1)  # clockwise
    got = np.asarray(load_image(0, _rotated_jpeg(tmp_path / "phone.jpg")), dtype=float)
    assert got.shape == shown.shape and np.abs(got - shown).mean() < 4
    from PIL import Image

    with Image.open(tmp_path / "phone.jpg") as img:  # a PIL image the caller opened: turned too, left unchanged
        got = np.asarray(load_image(0, img), dtype=float)
        assert img.size == (64, 32) and np.abs(got - shown).mean() < 4


def test_an_image_model_sees_the_photo_upright(tmp_path):
    """The picture the model saw (the map's `picture`): red on top, blue below, not red on the left."""
    [m] = extract(_tiny("vit"), images=[_rotated_jpeg(tmp_path / "phone.jpg")])
    seen = m.image
    top, bottom = seen[: seen.shape[0] // 3], seen[-seen.shape[0] // 3 :]
    assert top[..., 0].mean() > 0.8 > top[..., 2].mean() and bottom[..., 2].mean() > 0.8 > bottom[..., 0].mean()


def test_sixteen_bit_images_are_scaled_by_their_depth_not_clipped(tmp_path):
    from PIL import Image

    from headscope.probe.images import load_image

    raw = np.linspace(0, 32767, 48 * 64).reshape(48, 64).astype(np.uint16)  # a dark half-range gradient
    Image.fromarray(raw).save(tmp_path / "deep.png")  # PIL opens it as I;16
    for item in (tmp_path / "deep.png", raw):
        got = np.asarray(load_image(0, item), dtype=float) / 255
        assert np.abs(got - (raw / 65535.0)[..., None]).max() <= 0.5 / 255 + 1e-9  # was 0.998 white (clipped)


def test_transparent_images_are_composited_on_white():
    from PIL import Image

    from headscope.probe.images import load_image

    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[..., 0] = 200  # red, transparent in the left half and opaque in the right
    rgba[:, 2:, 3] = 255
    for item in (Image.fromarray(rgba, mode="RGBA"), rgba, Image.fromarray(rgba, mode="RGBA").convert("PA")):
        got = np.asarray(load_image(0, item))
        assert (got[:, :2] == 255).all(), type(item)
    assert (np.asarray(load_image(0, rgba))[:, 2:] == (200, 0, 0)).all()


def test_a_mode_pil_cannot_convert_is_one_line(tmp_path, monkeypatch):
    from PIL import Image

    from headscope.probe.images import load_image

    img = Image.new("YCbCr", (4, 4))
    real = Image.Image.convert
    monkeypatch.setattr(Image.Image, "convert", lambda self, mode=None, *a, **k: (
        (_ for _ in ()).throw(ValueError(f"conversion from {self.mode} to {mode} not supported"))
        if self.mode == "YCbCr" else real(self, mode, *a, **k)))
    with pytest.raises(ValueError, match=r"^image 3: PIL cannot convert its mode 'YCbCr' to RGB .*8-bit RGB"):
        load_image(3, img)


# --- 3. an image slot no image fills is an error everywhere ----------------------------------------------------

_UNFILLED = r"holds an image slot \(.+\) but no image fills it; give one image per slot"


@pytest.mark.parametrize("model_type", VL_TYPES + ["mllama"])
def test_a_slot_without_an_image_is_refused_by_every_family(model_type):
    """`encode_many`: every text read without images is tokenised there (extract, heads, explain, generate, run,
    the explorer), Mllama's included."""
    from headscope.probe.encoding import encode_many

    lm = _vl(model_type)
    slot = lm.processor.image_token
    with pytest.raises(ValueError, match=r"^text 1 .*" + _UNFILLED):
        encode_many(lm, ["A cat.", f"A {slot} b"])
    image_id = lm.tokenizer.convert_ids_to_tokens(_image_id(lm.model.config))  # the image token typed as text
    with pytest.raises(ValueError, match=_UNFILLED):
        encode_many(lm, [f"A {image_id} b"])
    assert len(encode_many(lm, ["A cat."])) == 1  # a text without a slot still reads alone


def _image_id(cfg) -> int:
    found = getattr(cfg, "image_token_id", None)
    return int(found if found is not None else cfg.image_token_index)


def test_a_slot_without_an_image_is_refused_by_the_api_and_the_explorer():
    from headscope.probe.explain import explain
    from headscope.probe.generate import generate_attention
    from headscope.workflows.explore import Explorer, ExplorerError
    from headscope.workflows.heads import heads

    lm = _tiny("llava")
    for call in (lambda: explain(lm, "A <image> b", token="b", layer=0, head=0),
                 lambda: generate_attention(lm, "A <image> b", max_new_tokens=1),
                 lambda: heads(lm, ["A cat.", "A <image> b"], induction_sequences=0)):
        with pytest.raises(ValueError, match=_UNFILLED):
            call()
    explorer = Explorer({"m": lm})
    with pytest.raises(ExplorerError, match=_UNFILLED) as caught:
        explorer.attention("m", "Look <image> here", 0, 0, images=[])
    assert caught.value.status == 400


@pytest.mark.parametrize("args", [
    ["explain", "--model", "tiny:llava", "--token", "b", "--head", "L0H0", "A <image> b"],
    ["generate", "--model", "tiny:llava", "--prompt", "A <image> b", "--max-new-tokens", "1"],
    ["run", "--model", "tiny:llava", "--text", "A <image> b", "--quiet"],
])
def test_the_cli_refuses_a_slot_without_an_image_in_one_line(args, tmp_path):
    from conftest import one_line

    if args[0] == "run":
        args = [*args, "--report", tmp_path / "report"]
    result = _cli(*args)
    assert result.exit_code == 2 and "holds an image slot (<image>) but no image fills it" in one_line(result)
    assert not (tmp_path / "report").exists()


# --- smaller: iterators, names, cross maps in show, split words in plot, a refused shape named ------------------


def test_images_may_be_an_iterator_everywhere():
    """An iterator was read twice (default prompts, then the images): "images is empty"."""
    from headscope.probe.explain import explain
    from headscope.probe.generate import generate_attention

    lm = _tiny("llava")
    assert len(extract(lm, images=iter([_picture()]))) == 1
    assert verify_passed(lm, iter([_picture()]))
    assert generate_attention(lm, "Hi", images=iter([_picture()]), max_new_tokens=1).prompt.patches
    assert explain(lm, "a cat", images=iter([_picture()]), token="cat", layer=0, head=0).query == "cat"
    assert len(extract(_tiny("vit"), images=iter([_picture()]))) == 1


def verify_passed(lm, images) -> bool:
    from headscope.probe.verify import verify

    return verify(lm, images=images).passed


def test_explain_takes_images_and_image_is_deprecated():
    from headscope.probe.explain import explain

    lm = _tiny("llava")
    new = explain(lm, "a cat", images=[_picture()], token="img0:r0c1", layer=1, head=0)
    with pytest.warns(DeprecationWarning, match="use images="):
        old = explain(lm, "a cat", image=[_picture()], token="img0:r0c1", layer=1, head=0)
    assert new.query == old.query == "img0:r0c1" and new.table.equals(old.table)
    with pytest.raises(TypeError, match="images= only"):
        explain(lm, "a cat", images=[_picture()], image=[_picture()], token="cat", layer=0, head=0)
    with pytest.raises(ValueError, match="is a text model .* not images"):  # not "give exactly one of them"
        explain(_tiny("llama"), "a cat", images=[_picture()], token="cat", layer=0, head=0)


def test_show_draws_a_cross_attention_map_and_names_what_it_cannot_draw():
    from headscope.reports.inline import show

    [pair] = extract(_tiny("bart"), "a cat sat", target="the dog")
    html = show(pair.cross)._repr_html_()
    assert '"key_name":"key (attended to, other sequence)"' in html and '"text":"the dog"' in html
    assert '"causal":false' in html
    with pytest.raises(TypeError, match=r"not Seq2SeqAttention; show one of its maps: \.encoder, \.decoder, \.cross"):
        show(pair)


def test_a_word_split_into_pieces_is_found_where_it_starts():
    from headscope.reports.figures import plot

    [m] = extract(_tiny("llava"), "What is it?", images=[_picture()])
    start = m.find("What")
    assert m.spans[start][0] == m.text.index("What") and not m.special[start]
    assert plot(m, layer=0, head=0, query="What") is not None
    with pytest.raises(KeyError, match="'Wha' occurs 0 time"):  # a prefix is not the word
        m.find("Wha")
    with pytest.raises(ValueError, match="'zebra' occurs 0 time"):
        plot(m, layer=0, head=0, query="zebra")


def test_an_image_the_processor_refuses_is_named_with_what_to_do(tmp_path):
    from PIL import Image

    from conftest import one_line

    thin = tmp_path / "thin.png"
    Image.fromarray(np.zeros((3, 2000, 3), np.uint8)).save(thin)
    with pytest.raises(ValueError, match=r"^image 1 \(thin\.png\), 2000 × 3 pixels: .* refuses it \(absolute aspect "
                                         r"ratio .*\); crop or pad it"):
        extract(_vl("qwen2_vl"), images=[_picture(), thin])
    result = _cli("verify", "--model", "tiny:qwen2_5_vl", "--image", thin)
    assert result.exit_code == 2 and "image 0 (thin.png), 2000 × 3 pixels" in one_line(result)
