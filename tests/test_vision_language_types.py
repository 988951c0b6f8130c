"""Vision–language types added in issue 49, each on what its own processor does (the tests every reading family
shares are in tests/test_vision_language_decoders.py): image-token counts worked out by hand from the tiny
config, and the picture each token's cell lies on."""

from __future__ import annotations

import numpy as np

from conftest import _tiny
from headscope.probe.extract import extract


def _picture(seed: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).random(shape)


def test_deepseek_vl_reads_the_picture_padded_to_a_square():
    """A 30 x 100 picture: its longer side resized to the tower's 32, its shorter one padded, centred, with the mean
    colour (127 of 255) to a 32 x 32 square; one image token per 8 x 8 patch of the square: 4 x 4 = 16."""
    lm = _tiny("deepseek_vl")
    [m] = extract(lm, "A <image_placeholder> wide one", images=[_picture(4, (30, 100, 3))])
    cells = [p for p in m.patches if p is not None]
    assert len(cells) == 16 and {(p.rows, p.cols, p.view) for p in cells} == {(4, 4, "base")}
    seen = m.pictures[0]
    assert seen.shape == (32, 32, 3)
    np.testing.assert_allclose(seen[[0, -1]], 127 / 255, atol=1e-6)  # the padding above and below
    assert seen[16].std() > 0.05  # the picture itself in the middle
