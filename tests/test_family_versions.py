"""What the families read off a model where transformers versions differ (5.24 vs 5.25): each is read by what the
loaded module exposes, never by the version string, so both versions verify (the family tests run the whole
verification under whichever transformers is installed)."""

from __future__ import annotations

import pytest
import torch

from headscope.probe.errors import UnsupportedArchitecture
from headscope.probe.families import norm_eps
from headscope.probe.families.falcon import _alibi, _layer_adds_alibi


class _Named(torch.nn.Module):
    def __init__(self, **attrs):
        super().__init__()
        for name, value in attrs.items():
            setattr(self, name, value)


@pytest.mark.parametrize("attrs, expected", [
    ({"variance_epsilon": 1e-6}, 1e-6),  # Llama's norms; Gemma 3n / Gemma 4 / Llama 4 from 5.25
    ({"eps": 3e-5}, 3e-5),  # those three up to 5.24, Gemma 3, Qwen3-Next
    ({"variance_epsilon": 2e-6, "weight": torch.nn.Parameter(torch.ones(2))}, 2e-6),
])
def test_norm_eps_reads_either_name(attrs, expected):
    assert norm_eps(_Named(**attrs)) == expected


def test_norm_eps_without_either_name_names_the_module():
    with pytest.raises(UnsupportedArchitecture, match="_Named has no epsilon"):
        norm_eps(_Named(epsilon_renamed_again=1e-6))


class _LayerWithAlibi(torch.nn.Module):  # transformers <= 5.24: the layer takes the bias and adds it itself
    def forward(self, hidden_states, alibi, attention_mask, **kwargs):
        return hidden_states


class _LayerWithoutAlibi(torch.nn.Module):  # transformers >= 5.25: the bias arrives in the mask only
    def forward(self, hidden_states, attention_mask, **kwargs):
        return hidden_states


def test_falcon_alibi_count_is_read_off_the_layer():
    assert _layer_adds_alibi(_LayerWithAlibi())
    assert not _layer_adds_alibi(_LayerWithoutAlibi())
    layer = _LayerWithoutAlibi()
    layer.forward = lambda hidden_states, alibi=None: hidden_states  # an instance patch does not change the class
    assert not _layer_adds_alibi(layer)


def test_falcon_alibi_twice_is_two_of_once_by_hand():
    once, twice = _alibi(4, 0.5)(3, 3), _alibi(4, 0.5, times=2)(3, 3)
    # slope_h × key position, scaled by 0.5; head 0's slope for 4 heads is 2^-2 (exact in bfloat16)
    torch.testing.assert_close(once[0, 2], torch.tensor([0.0, 0.125, 0.25]))
    assert torch.equal(twice, once * 2)
