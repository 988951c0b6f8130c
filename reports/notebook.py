"""Notebook views: bertviz's interactive views of any extracted map in one call, and plain tables.

bertviz (Vig 2019) draws `head_view` and `model_view` in Jupyter. Its HTML loads require.js and
d3 from a CDN (cdnjs.cloudflare.com), so those two views need a network connection in the browser
that shows the notebook; everything else here (and the headscope report) works offline.

>>> import torch
>>> from headscope.probe.types import AttentionMap
>>> m = AttentionMap(text="a b", level="word", labels=("a", "b"), spans=((0, 1), (2, 3)),
...                  special=(False, False), attention=torch.tensor([[[[1.0, 0.0], [0.25, 0.75]]]]), causal=True)
>>> attention_frame(m, 0, 0)
key       a     b
query            
a      1.00  0.00
b      0.25  0.75
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Sequence

if TYPE_CHECKING:
    import pandas as pd

    from headscope.probe.types import AttentionMap

__all__ = ["head_view", "model_view", "bertviz_inputs", "attention_frame", "CDN_NOTE"]

CDN_NOTE = ("bertviz's views load require.js and d3 from cdnjs.cloudflare.com: they need a network connection "
            "in the browser showing the notebook. headscope's own report works offline.")


def bertviz_inputs(amap: AttentionMap) -> tuple[tuple, list[str]]:
    """bertviz's arguments: one `(1, head, query, key)` tensor per layer, and the unit labels."""
    att = amap.attention.detach().float().cpu()  # [layer, head, query, key]
    return tuple(att[i].unsqueeze(0) for i in range(att.shape[0])), list(amap.labels)


def _pick(maps: AttentionMap | Sequence[AttentionMap], index: int) -> AttentionMap:
    if isinstance(maps, (list, tuple)):
        if not maps:
            raise ValueError("no attention maps given; pass the result of probe.extract(...)")
        return maps[index]
    return maps


def head_view(maps: AttentionMap | Sequence[AttentionMap], *, index: int = 0, layer: int | None = None,
              heads: Sequence[int] | None = None, html_action: Literal["return", "view"] = "return"):
    """bertviz's head view of one extracted text (a map, or `maps[index]` of a list).

    Returns an `IPython.display.HTML` (shown when it is a cell's last value); `html_action="view"`
    displays it at once. See `CDN_NOTE`: the view needs a network in the browser.
    """
    from bertviz import head_view as _head_view

    from headscope.probe.types import position

    amap = _pick(maps, index)
    attention, tokens = bertviz_inputs(amap)
    layer_pos = None if layer is None else position(amap.layer_ids, layer, "layer")
    head_pos = None if heads is None else [position(amap.head_ids, h, "head") for h in heads]
    return _head_view(attention, tokens, layer=layer_pos, heads=head_pos, prettify_tokens=False,
                      html_action=html_action)


def model_view(maps: AttentionMap | Sequence[AttentionMap], *, index: int = 0,
               html_action: Literal["return", "view"] = "return"):
    """bertviz's model view (every layer and head) of one extracted text; see `head_view`."""
    from bertviz import model_view as _model_view

    attention, tokens = bertviz_inputs(_pick(maps, index))
    return _model_view(attention, tokens, prettify_tokens=False, html_action=html_action)


def attention_frame(amap: AttentionMap, layer: int, head: int) -> pd.DataFrame:
    """One head's attention as a table: rows = query units, columns = key units (model indices)."""
    return amap.to_frame(layer, head)
