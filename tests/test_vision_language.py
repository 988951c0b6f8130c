"""Vision–language views and metrics from maps alone: hand-built maps whose right answers are worked out by hand.

The map: "<s> look at" (3 text units), a 2 × 3 grid of image tokens (units 3..8, row by row), "a cat" (units 9,
10), causal, 2 layers × 2 heads. Head 0 is uniform over the keys a query sees; head 1 points: "a" (9) puts all
its attention on the image token at row 1, column 1 (unit 7), "cat" (10) on row 0, column 2 (unit 5), the image
tokens half on <s> and half on themselves, the first three units on <s>.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from headscope.analyses.heads import score_corpus
from headscope.analyses.metrics import METRICS
from headscope.analyses.vision_language import (has_images, image_rollout, image_share, image_to_text, text_query,
                                                view_grids, vision_language_heads, visual_sinks)
from headscope.probe.types import AttentionMap, ImagePatch
from headscope.probe.words import to_word_level

T = 11
IMAGE = list(range(3, 9))


def _attention() -> torch.Tensor:
    a = torch.zeros(2, 2, T, T)
    for q in range(T):
        a[:, 0, q, : q + 1] = 1.0 / (q + 1)  # head 0: uniform over what the query sees
        if q in IMAGE:
            a[:, 1, q, 0] += 0.5
            a[:, 1, q, q] += 0.5
        elif q == 9:
            a[:, 1, q, 7] = 1.0
        elif q == 10:
            a[:, 1, q, 5] = 1.0
        else:
            a[:, 1, q, 0] = 1.0
    return a


def vl_map(attention: torch.Tensor | None = None, *, causal: bool = True, patches=None) -> AttentionMap:
    text = "look at a cat"
    spans = ((0, 0), (0, 4), (5, 7)) + ((0, 0),) * 6 + ((8, 9), (10, 13))
    labels = ("<s>", "look", "at") + ("<image>",) * 6 + ("a", "cat")
    special = (True, False, False) + (True,) * 6 + (False, False)
    cells = patches or ((None,) * 3 + tuple(ImagePatch(0, r, c, 2, 3) for r in range(2) for c in range(3))
                        + (None, None))
    picture = np.zeros((20, 30, 3))
    picture[:, :, 1] = 1.0  # a green picture
    return AttentionMap(text=text, level="token", labels=labels, spans=spans, special=special,
                        attention=_attention() if attention is None else attention, causal=causal,
                        word_index=tuple(range(T)), token_ids=tuple(range(T)), meta={"model": "toy-vl"},
                        patches=cells, pictures=(picture,))


def _text_map() -> AttentionMap:
    return AttentionMap(text="a b", level="token", labels=("a", "b"), spans=((0, 1), (2, 3)), special=(False, False),
                        attention=torch.tensor([[[[1.0, 0.0], [0.5, 0.5]]]]), causal=True, word_index=(0, 1))


# ---------------------------------------------------------------- shares

# head 0: text queries that see an image token are "a" (sees 10 keys, 6 of them image) and "cat" (11, 6)
UNIFORM_IMAGE_SHARE = (6 / 10 + 6 / 11) / 2
# head 0: image query q sees q + 1 keys, 3 of them text (<s> look at)
UNIFORM_IMAGE_TO_TEXT = sum(3 / (q + 1) for q in IMAGE) / 6


def test_image_share_and_image_to_text_by_hand():
    m = vl_map()
    share = image_share(m)
    assert share.shape == (2, 2)
    torch.testing.assert_close(share[:, 0], torch.full((2,), UNIFORM_IMAGE_SHARE, dtype=torch.float64))
    torch.testing.assert_close(share[:, 1], torch.ones(2, dtype=torch.float64))  # "a" and "cat" look only at the image
    back = image_to_text(m)
    torch.testing.assert_close(back[:, 0], torch.full((2,), UNIFORM_IMAGE_TO_TEXT, dtype=torch.float64))
    torch.testing.assert_close(back[:, 1], torch.full((2,), 0.5, dtype=torch.float64))  # half on <s>
    # causal: an image token sees no later text
    torch.testing.assert_close(image_to_text(m, later=True), torch.zeros(2, 2, dtype=torch.float64))


def test_image_to_later_text_under_a_prefix_lm_mask():
    a = torch.zeros(1, 1, T, T)
    a[0, 0] = 1.0 / T  # every unit sees every unit: image queries put 2/11 on the text after them
    m = vl_map(a, causal=False)
    torch.testing.assert_close(image_to_text(m, later=True), torch.full((1, 1), 2 / T, dtype=torch.float64))
    torch.testing.assert_close(image_to_text(m), torch.full((1, 1), 5 / T, dtype=torch.float64))
    torch.testing.assert_close(image_share(m), torch.full((1, 1), 6 / T, dtype=torch.float64))


def test_a_text_map_has_no_image_rows():
    t = _text_map()
    assert not has_images(t)
    assert torch.isnan(image_share(t)).all() and torch.isnan(image_to_text(t)).all()
    with pytest.raises(ValueError, match="no image tokens"):
        view_grids(t, [0.5, 0.5])


@pytest.mark.parametrize("level", ["token", "word"])
def test_the_metrics_equal_the_direct_shares_and_are_nan_without_images(level):
    m = vl_map()
    scores = score_corpus([m], level=level)
    for name, direct in (("image_share", image_share(m)), ("image_to_text", image_to_text(m))):
        grid = scores.grid(name).to_numpy()
        np.testing.assert_allclose(grid, direct.numpy(), atol=1e-6)
    rows = scores.table.set_index("metric")["n"]
    assert rows["image_share"].iloc[0] == 2 and rows["image_to_text"].iloc[0] == 6
    plain = score_corpus([_text_map()], level=level).table.set_index("metric")  # one head
    for name in ("image_share", "image_to_text"):
        assert math.isnan(plain.loc[name, "value"]) and plain.loc[name, "n"] == 0
    assert METRICS["image_share"].role == "image-reading head"


def test_word_level_keeps_each_image_token_cell():
    w = to_word_level(vl_map())
    assert w.patches[7] == ImagePatch(0, 1, 1, 2, 3) and w.patches[0] is None and len(w.pictures) == 1


def test_vision_language_heads_pools_rows_over_maps():
    m = vl_map()
    frame = vision_language_heads([m, m, _text_map()])  # the text map has no image rows
    row = frame[(frame["layer"] == 1) & (frame["head"] == 0)].iloc[0]
    assert row["head_name"] == "L1H0" and math.isclose(row["image_share"], UNIFORM_IMAGE_SHARE, rel_tol=1e-6)
    assert row["n_image_share"] == 4 and row["n_image_to_text"] == 12
    with pytest.raises(ValueError, match="no map has image tokens"):
        vision_language_heads([_text_map()])


# ---------------------------------------------------------------- grids, boxes, rollout


def test_a_text_tokens_row_lands_on_its_patch():
    m = vl_map()
    assert text_query(m) == 10 and text_query(m, "a") == 9
    [g] = view_grids(m, m.attention[0, 1, 9])  # "a", head 1 -> the patch at row 1, column 1
    assert (g.image, g.view, g.shape, g.extent) == (0, "base", (2, 3), (0.0, 0.0, 1.0, 1.0))
    np.testing.assert_allclose(g.values, [[0, 0, 0], [0, 1, 0]])
    assert g.units.tolist() == [[3, 4, 5], [6, 7, 8]]
    [g] = view_grids(m, m.attention[:, :, 10])  # every head at once: [layer, head, row, col]
    assert g.values.shape == (2, 2, 2, 3) and g.values[1, 1, 0, 2] == 1.0


def test_tiles_and_a_thumbnail_each_get_their_extent():
    # image tokens: a 1 x 2 tile grid of 1 x 1 tiles (left half, right half), then a 2 x 2 thumbnail... in 6 tokens:
    cells = ((None,) * 3 + (ImagePatch(0, 0, 0, 1, 1, view="tile 0,0", box=(0.0, 0.0, 1.0, 0.5)),
                            ImagePatch(0, 0, 0, 1, 1, view="tile 0,1", box=(0.0, 0.5, 1.0, 1.0)),
                            ImagePatch(0, 0, 0, 2, 2, view="thumbnail"), ImagePatch(0, 0, 1, 2, 2, view="thumbnail"),
                            ImagePatch(0, 1, 0, 2, 2, view="thumbnail"), ImagePatch(0, 1, 1, 2, 2, view="thumbnail"))
             + (None, None))
    m = vl_map(patches=cells)
    grids = view_grids(m, np.arange(T, dtype=float))
    assert [(g.view, g.extent, g.shape) for g in grids] == [("tile 0,0", (0.0, 0.0, 1.0, 0.5), (1, 1)),
                                                            ("tile 0,1", (0.0, 0.5, 1.0, 1.0), (1, 1)),
                                                            ("thumbnail", (0.0, 0.0, 1.0, 1.0), (2, 2))]
    assert grids[2].values.tolist() == [[5.0, 6.0], [7.0, 8.0]]


def test_rollout_from_a_text_token_by_hand():
    # one layer, one head, "cat" all on unit 5: the rollout row is 0.5 on unit 5 and 0.5 on itself (0.5·A + 0.5·I)
    a = torch.zeros(1, 1, T, T)
    for q in range(T):
        a[0, 0, q, 5 if q == 10 else 0] = 1.0
    row = image_rollout(vl_map(a))
    expected = np.zeros(T)
    expected[5] = expected[10] = 0.5
    np.testing.assert_allclose(row, expected)
    # two such layers: 0.25 · itself, 0.25 + 0.25 · (unit 5's own row: 0.5 on <s>, 0.5 on itself) ...
    row2 = image_rollout(vl_map(torch.cat([a, a])))
    expected2 = np.zeros(T)
    expected2[10], expected2[5], expected2[0] = 0.25, 0.25 + 0.25, 0.25
    np.testing.assert_allclose(row2, expected2)


# ---------------------------------------------------------------- visual sinks


def test_visual_sinks_by_hand():
    m = vl_map()
    frame = visual_sinks(m, top=2)
    h1 = frame[(frame["layer"] == 0) & (frame["head"] == 1)]
    # "a" all on unit 7 and "cat" all on unit 5: each takes half of the picture's attention; ties keep unit order
    assert h1["unit"].tolist() == [5, 7] and h1["image_share"].tolist() == [0.5, 0.5] and h1["sink"].all()
    assert h1["received"].tolist() == [0.5, 0.5] and (h1["row"].tolist(), h1["col"].tolist()) == ([0, 1], [2, 1])
    h0 = frame[(frame["layer"] == 0) & (frame["head"] == 0)]
    # uniform head: every patch takes 1/6 of the picture's attention, below epsilon
    np.testing.assert_allclose(h0["image_share"], [1 / 6, 1 / 6])
    assert not h0["sink"].any() and h0["value_norm_ratio"].isna().all()
    np.testing.assert_allclose(h0["received"], [(1 / 10 + 1 / 11) / 2] * 2)


def test_visual_sinks_value_norm_ratio():
    m = vl_map()
    norms = torch.ones(2, 2, T)
    norms[:, :, 5] = 0.25  # the sink patch carries a small value: 0.25 over the others' median 1
    frame = visual_sinks(m, norms, top=1)
    row = frame[(frame["layer"] == 1) & (frame["head"] == 1)].iloc[0]
    assert row["unit"] == 5 and row["value_norm_ratio"] == 0.25
    with pytest.raises(ValueError, match="value_norms must be"):
        visual_sinks(m, torch.ones(2, 2, 3))


def test_inputs_are_not_changed():
    m = vl_map()
    before = m.attention.clone()
    norms = torch.rand(2, 2, T)
    saved = norms.clone()
    visual_sinks(m, norms), image_share(m), image_rollout(m), view_grids(m, m.attention[0, 0, 9])
    assert torch.equal(m.attention, before) and torch.equal(norms, saved)
