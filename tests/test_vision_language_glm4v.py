"""GLM-4V types (issue 49: glm4v, glm4v_moe, glm46v, glm_ocr), on what their own processor and layers do (the tests
every reading family shares are in tests/test_vision_language_decoders.py): image-token counts worked out by hand
from the tiny processor's pixel budget, and the parts of the recomputation that are GLM's own — the rotary pairs
(every two in GLM-4.1V, half-split in GLM-4.5V), the 3-D positions of image tokens, GLM-OCR's vision QK norm."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conftest import _tiny, _tiny_type
from headscope.probe.extract import extract
from headscope.probe.families import family_for
from headscope.probe.verify import verify

TEXT = "Two <|begin_of_image|><|image|><|end_of_image|> and <|begin_of_image|><|image|><|end_of_image|> here"


def _picture(seed: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).random(shape)


def _pictures():
    return [_picture(1, (40, 52, 3)), _picture(2, (64, 16, 3))]


def test_glm4v_tokens_follow_the_resized_picture():
    """The tiny processor's budget is 2 frames of 16 x 16 pixels (512), in whole 4-pixel cells (2-pixel patches
    merged 2 x 2). 40 x 52 (2 x 40 x 52 = 4160 > 512) shrinks by sqrt(4160 / 512) = 2.85: floor(40 / 2.85 / 4) x 4
    = 12 by floor(52 / 2.85 / 4) x 4 = 16, 3 x 4 tokens; 64 x 16 (2048) by 2: 32 x 8, 8 x 2 tokens. Each image's
    tokens stand between the <|begin_of_image|> and <|end_of_image|> around its slot, row by row."""
    lm = _tiny("glm4v")
    [m] = extract(lm, TEXT, images=_pictures())
    for k, (rows, cols) in enumerate([(3, 4), (8, 2)]):
        mine = [i for i, p in enumerate(m.patches) if p is not None and p.image == k]
        assert [(m.patches[i].row, m.patches[i].col, m.patches[i].rows, m.patches[i].cols) for i in mine] == [
            (r, c, rows, cols) for r in range(rows) for c in range(cols)]
        assert m.labels[mine[0] - 1] == "<|begin_of_image|>" and m.labels[mine[-1] + 1] == "<|end_of_image|>"
        assert mine == list(range(mine[0], mine[0] + rows * cols))  # no marker between rows
    assert m.pictures[0].shape == (12, 16, 3) and m.pictures[1].shape == (32, 8, 3)


@pytest.mark.parametrize("model_type", ["glm4v", "glm4v_moe"])
@pytest.mark.parametrize("broken", ["rotary pairs of the other kind", "1-D positions on image tokens"])
def test_glm4v_rotary_pairs_and_3d_positions_are_part_of_the_recomputation(model_type, broken):
    """GLM-4.1V turns pairs (x0, x1), (x2, x3), ...; GLM-4.5V the half-split pairs (x_i, x_{i+d/2}) of its rotated
    half; both read (time, row, column) in M-RoPE sections. The decoder recomputed with the other pairing, or at
    1-D positions with images in the text, fails; the vision layers do not."""
    lm = _tiny_type(model_type)
    family = family_for(lm.config)
    vl = family.vision_language
    if broken == "1-D positions on image tokens":
        family = dataclasses.replace(family, vision_language=dataclasses.replace(vl, decoder_at=None))
    else:
        spec = family.layer_spec
        family = dataclasses.replace(family, layer_spec=lambda base, i, cfg: dataclasses.replace(
            spec(base, i, cfg), rotary_interleaved=not spec(base, i, cfg).rotary_interleaved))
    assert verify(lm, [TEXT], images=_pictures()).passed
    v = verify(lm, [TEXT], images=_pictures(), family=family)
    assert not any(c.passed for c in v.layers if c.kind == "decoder")
    assert all(c.passed for c in v.layers if c.kind == "vision")


def test_glm_ocr_vision_qk_norm_is_part_of_the_recomputation():
    """GLM-OCR's vision heads RMS-normalise each query and key head before the rotary: recomputed without those
    norms its vision layers fail, its decoder's do not."""
    lm = _tiny_type("glm_ocr")
    family = family_for(lm.config)
    vl = family.vision_language
    plain = dataclasses.replace(vl.vision, layer_spec=lambda base, i, cfg: dataclasses.replace(
        vl.vision.layer_spec(base, i, cfg), q_norm=None, k_norm=None))
    broken = dataclasses.replace(family, vision_language=dataclasses.replace(vl, vision=plain))
    assert verify(lm, [TEXT], images=_pictures()).passed
    v = verify(lm, [TEXT], images=_pictures(), family=broken)
    assert not any(c.passed for c in v.layers if c.kind == "vision")
    assert all(c.passed for c in v.layers if c.kind == "decoder")


def test_the_glm_hub_relations_fail_where_the_checkpoints_relation_is_lost():
    """The fixtures' checks can fail: sections of the same sum in another ratio, a whole-head rotary where GLM-4.1V
    rotates half, a merge the processor does not share."""
    import copy
    from types import SimpleNamespace

    from hub_fixtures import HUB

    lm = _tiny("glm4v")
    relations = HUB["glm4v"].relations
    sections, merge = relations["M-RoPE sections [8, 12, 12] on half of each head"], relations[
        "2 x 2 merge of 2-frame patches, the processor's"]
    assert sections(lm) and merge(lm)

    def with_rope(**changes):
        text = copy.deepcopy(lm.config.text_config)
        text.rope_parameters = {**text.rope_parameters, **changes}
        return SimpleNamespace(config=SimpleNamespace(text_config=text))

    assert not sections(with_rope(mrope_section=[4, 2, 2]))  # the same 8 frequencies, t : h : w = 2 : 1 : 1
    assert not sections(with_rope(partial_rotary_factor=1.0, mrope_section=[4, 6, 6]))  # whole heads (GLM-OCR's)
    processor = copy.deepcopy(lm.processor)
    processor.image_processor.merge_size = 1
    assert not merge(SimpleNamespace(config=lm.model.config, processor=processor))
