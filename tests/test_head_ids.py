"""A head is written one way (`head_name`, read back by `parse_head`) and a model's layer or head number finds its
row or column of a tensor one way (`probe.types.position`), whatever reads it: a map, a generation, probe
scores, the figures, the notebook views."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from headscope.probe.types import AttentionMap, head_name, parse_head, position

numbers = st.integers(min_value=0, max_value=10_000)
ids = st.lists(st.integers(min_value=0, max_value=200), unique=True, min_size=1, max_size=40)


@given(numbers, numbers)
def test_a_head_name_reads_back(layer, head):
    assert parse_head(head_name(layer, head)) == (layer, head)
    assert parse_head(head_name(layer, head).lower()) == (layer, head)


@given(ids, st.data())
def test_position_finds_each_number_and_names_the_others(layer_ids, data):
    wanted = data.draw(st.sampled_from(layer_ids))
    i = position(layer_ids, wanted)
    assert layer_ids[i] == wanted
    assert position(tuple(layer_ids), np.int64(wanted)) == i  # numbers read from numpy or pandas
    missing = data.draw(st.integers(min_value=0, max_value=300).filter(lambda n: n not in layer_ids))
    with pytest.raises(ValueError, match=rf"^head {missing} is not among the heads of these scores: ") as err:
        position(layer_ids, missing, "head", where="these scores")
    shown = str(err.value).rsplit(": ", 1)[1]
    if ".." in shown:  # a run of numbers is written as its ends
        assert layer_ids == list(range(layer_ids[0], layer_ids[-1] + 1)) and shown == f"{layer_ids[0]}..{layer_ids[-1]}"
    else:
        assert [int(n) for n in shown.split(", ")] == layer_ids


def test_position_refuses_what_is_not_a_number_and_names_a_layer_without_attention():
    for bad in (True, 1.0, "1", None):
        with pytest.raises(ValueError, match="is not among the layers of this map"):
            position((0, 1, 2), bad)
    with pytest.raises(ValueError, match=r"^layer 2 of m has no softmax attention \(a hybrid stack's layer\); layers "
                                         r"0, 1, 3 have$"):
        position((0, 1, 3), 2, where="m", no_attention=(2,))


def test_every_reader_of_a_map_addresses_it_by_model_numbers():
    """A map that kept layers 4 and 9 only: layer 9 is its second row wherever it is read."""
    att = torch.stack([torch.full((1, 2, 2), 0.5), torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])])  # [layer, head, q, k]
    amap = AttentionMap(text="a b", level="word", labels=("a", "b"), spans=((0, 1), (2, 3)), special=(False, False),
                        attention=att, causal=False, layers=(4, 9))
    assert amap.to_frame(9, 0).to_numpy().tolist() == [[1.0, 0.0], [0.0, 1.0]]
    with pytest.raises(ValueError, match=r"layer 5 is not among the layers of this map: 4, 9"):
        amap.to_frame(5, 0)
    from headscope.reports.figures import attention_heatmap

    with pytest.raises(ValueError, match=r"layer 5 is not among the layers of this map: 4, 9"):
        attention_heatmap(amap, 5, 0)
