"""Vision–language decoders, from their maps alone: where the words look in the picture.

A decoder that reads images (LLaVA, Qwen2-VL, Gemma 3, PaliGemma, ...) puts image tokens among its text
tokens; its `AttentionMap` says which units they are (`patches`: an `ImagePatch` per image token, None per
text token) and keeps the pictures (`pictures`). Everything here reads those, never a model:

- `view_grids(amap, weights)`: weights over the units (one row of attention, a rollout row) put back on each
  view's grid (`ImagePatch.row`, `.col` of a `rows` × `cols` grid), one `ViewGrid` per (image, view), with
  the view's extent on its picture (the union of its cells' boxes: a tile lands on its part of the picture,
  a thumbnail on the whole);
- `image_share(amap)`: per head, the share of the text queries' attention that goes to image tokens (the
  queries that can see one; `METRICS["image_share"]` over a corpus); `image_to_text(amap)`: the share of the
  image queries' attention on text tokens, and on text *after* the query (`later=True`: only a mask that
  lets image tokens see later text, a prefix-LM's, gives any);
- `vision_language_heads(maps)`: both per head, rows pooled over maps, as a table;
- `image_rollout(amap, query)`: attention rollout (`analyses.flow.rollout`) through the decoder from a text
  token onto every unit;
- `visual_sinks(amap, value_norms=None)`: the image tokens that take most of the text's attention on the
  picture — the sinks section's measures (`analyses.sinks`) on image tokens: the share of the image
  attention a patch receives against Gu et al.'s ε, and, given value norms `[layer, head, key]`
  (`probe.sinks.head_internals`), the patch's value norm over the median of the other image tokens'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from headscope.probe.types import AttentionMap, CrossAttentionMap, ImageCrossAttention, ImagePatch, head_name, position

from .flow import rollout
from .metrics import image_tokens, outside_and_seeing, text_tokens
from .sinks import SINK_EPSILON

__all__ = ["ViewGrid", "has_images", "image_units", "text_query", "view_grids", "patch_grids", "cross_attention_heads", "CrossHeadSums",
           "cross_attention_reads", "image_share", "image_to_text",
           "vision_language_heads", "image_rollout", "visual_sinks", "VISUAL_SINKS_TOP"]

VISUAL_SINKS_TOP = 3  # patches listed per head in the visual sinks table


def has_images(amap: AttentionMap) -> bool:
    """True for a vision–language map: at least one unit is an image token."""
    return any(p is not None for p in amap.patches)


def image_units(amap: AttentionMap) -> list[int]:
    """The unit indices of the image tokens, in order."""
    return [i for i, p in enumerate(amap.patches) if p is not None]


def _check(amap: AttentionMap) -> None:
    if not has_images(amap):
        raise ValueError("this map has no image tokens (AttentionMap.patches is empty); extract a vision–language "
                         "model with images, e.g. hs.extract(lm, texts, images=[...])")


def text_query(amap: AttentionMap, query: int | str | None = None) -> int:
    """The unit whose row is drawn: a unit index, a word of the text (`amap.find`), or by default the last text
    token (the one that predicts the next word)."""
    _check(amap)
    if query is None:
        texts = [i for i, p in enumerate(amap.patches) if p is None]
        if not texts:
            raise ValueError("the map has no text token to attend from")
        return texts[-1]
    if isinstance(query, str):
        try:
            return amap.find(query)
        except KeyError as exc:  # a ValueError like every other bad query, its one line
            raise ValueError(exc.args[0]) from None
    if isinstance(query, bool) or not isinstance(query, (int, np.integer)) or not 0 <= int(query) < len(amap):
        raise ValueError(f"query must be a unit index 0..{len(amap) - 1} or a word of the text, got {query!r}")
    return int(query)


@dataclass(frozen=True, eq=False)
class ViewGrid:
    """Weights of one view of one picture on its grid: `values[..., row, col]` (NaN where no token sits),
    `units[row, col]` the unit index of each cell (-1 for none), `extent` the view's (top, left, bottom,
    right) on the picture, as fractions 0..1."""

    image: int
    view: str
    values: np.ndarray
    units: np.ndarray
    extent: tuple[float, float, float, float]

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.units.shape)


def view_grids(amap: AttentionMap, weights) -> tuple[ViewGrid, ...]:
    """`weights[..., unit]` (a tensor or array over the map's units) on the grid of each (image, view), in the
    order the views first occur among the units.

    >>> import torch
    >>> from headscope.probe.types import ImagePatch
    >>> cells = (None, ImagePatch(0, 0, 0, 1, 2), ImagePatch(0, 0, 1, 1, 2))
    >>> m = AttentionMap(text="a", level="token", labels=("a", "i0", "i1"), spans=((0, 1),) * 3, special=(False,) * 3,
    ...                  attention=torch.full((1, 1, 3, 3), 1 / 3), causal=False, patches=cells)
    >>> [g] = view_grids(m, [0.5, 0.2, 0.3])
    >>> g.values.tolist(), g.units.tolist(), g.extent
    ([[0.2, 0.3]], [[1, 2]], (0.0, 0.0, 1.0, 1.0))
    """
    _check(amap)
    return patch_grids(amap.patches, weights)


def patch_grids(patches: Sequence[ImagePatch | None], weights) -> tuple[ViewGrid, ...]:
    """`view_grids` of any units carrying `patches` (a map's, or a cross-attention map's image keys)."""
    w = weights.detach().float().cpu().numpy() if isinstance(weights, torch.Tensor) else np.asarray(weights, float)
    if w.shape[-1] != len(patches):
        raise ValueError(f"weights have {w.shape[-1]} entries on their last axis, the map has {len(patches)} units")
    views: dict[tuple[int, str], list[tuple[int, ImagePatch]]] = {}
    for i, p in enumerate(patches):
        if p is not None:
            views.setdefault((p.image, p.view), []).append((i, p))
    out = []
    for (image, view), cells in views.items():
        rows, cols = cells[0][1].rows, cells[0][1].cols
        if any((p.rows, p.cols) != (rows, cols) for _, p in cells):
            raise ValueError(f"image {image}, view {view!r}: its tokens disagree on the grid's size")
        units = np.full((rows, cols), -1)
        values = np.full(w.shape[:-1] + (rows, cols), np.nan)
        for i, p in cells:
            units[p.row, p.col] = i
            values[..., p.row, p.col] = w[..., i]
        boxes = np.array([p.box for _, p in cells], dtype=float)
        extent = (float(boxes[:, 0].min()), float(boxes[:, 1].min()), float(boxes[:, 2].max()), float(boxes[:, 3].max()))
        out.append(ViewGrid(image, view, values, units, extent))
    return tuple(out)


def _share(attention: torch.Tensor, keys: Sequence[bool], queries: Sequence[bool]) -> tuple[torch.Tensor, int]:
    """[layer, head] sum over the counted query rows of the attention on `keys`, and the number of rows."""
    q = torch.tensor(list(queries), dtype=torch.bool)
    k = torch.tensor(list(keys), dtype=torch.bool)
    n = int(q.sum())
    if not n:
        return torch.zeros(attention.shape[:2], dtype=torch.float64), 0
    return attention.double()[:, :, q][..., k].sum(-1).sum(-1), n


def _shares(amap: AttentionMap) -> dict[str, tuple[torch.Tensor, int]]:
    args = (amap.labels, amap.special)
    image = image_tokens(*args, patches=amap.patches)
    text = text_tokens(*args, patches=amap.patches)
    out = {"image_share": _share(amap.attention, image, outside_and_seeing(image, causal=amap.causal)),
           "image_to_text": _share(amap.attention, text, outside_and_seeing(text, causal=amap.causal))}
    # text after each image query: a per-row key set, so summed row by row over the image queries
    t = len(amap)
    later = torch.tensor([[text[k] and k > q for k in range(t)] for q in range(t)], dtype=torch.float64)
    rows = torch.tensor(image, dtype=torch.bool)
    n = int(rows.sum()) if any(text) else 0
    total = (amap.attention.double() * later)[:, :, rows].sum((-1, -2)) if n else torch.zeros(amap.attention.shape[:2],
                                                                                               dtype=torch.float64)
    out["image_to_later_text"] = (total, n)
    return out


def _mean(total: torch.Tensor, n: int) -> torch.Tensor:
    return total / n if n else torch.full(total.shape, math.nan, dtype=torch.float64)


def image_share(amap: AttentionMap) -> torch.Tensor:
    """[layer, head]: the attention the text queries put on image tokens, averaged over the text queries that
    can see an image token (as `METRICS["image_share"]`); NaN for a map without images."""
    return _mean(*_shares(amap)["image_share"])


def image_to_text(amap: AttentionMap, *, later: bool = False) -> torch.Tensor:
    """[layer, head]: the attention the image queries put on text tokens, averaged over the image queries that
    see one (as `METRICS["image_to_text"]`); `later=True`: on text after the query only, averaged over every
    image query — 0 under a causal mask, where an image token sees no later text. NaN without images."""
    return _mean(*_shares(amap)["image_to_later_text" if later else "image_to_text"])


def vision_language_heads(maps: Sequence[AttentionMap]) -> pd.DataFrame:
    """Per head (model layer and head ids): `image_share`, `image_to_text`, `image_to_later_text`, each with its
    query rows pooled over the maps (`n_*`), as `analyses.heads` pools a metric's rows over texts."""
    maps = [m for m in maps if has_images(m)]
    if not maps:
        raise ValueError("no map has image tokens; give the maps of a vision–language model with images")
    first = maps[0]
    sums: dict[str, list] = {}
    for m in maps:
        if (m.layer_ids, m.head_ids) != (first.layer_ids, first.head_ids):
            raise ValueError("the maps hold different layers or heads; give maps of one model, extracted alike")
        for name, (total, n) in _shares(m).items():
            acc = sums.setdefault(name, [torch.zeros_like(total), 0])
            acc[0] += total
            acc[1] += n
    layers, heads = np.meshgrid(first.layer_ids, first.head_ids, indexing="ij")
    frame = pd.DataFrame({"layer": layers.reshape(-1), "head": heads.reshape(-1)})
    frame.insert(0, "head_name", [head_name(l, h) for l, h in zip(frame["layer"], frame["head"])])
    for name, (total, n) in sums.items():
        frame[name] = _mean(total, n).reshape(-1).numpy()
        frame[f"n_{name}"] = n
    return frame


def image_rollout(amap: AttentionMap, query: int | str | None = None) -> np.ndarray:
    """[unit]: attention rollout (Abnar & Zuidema 2020, `analyses.flow.rollout`: heads averaged, 0.5·A + 0.5·I,
    multiplied through the layers) from the text token `query` (`text_query`) onto every unit."""
    q = text_query(amap, query)
    return rollout(amap.attention.detach().float().cpu()).numpy()[q]


def visual_sinks(amap: AttentionMap, value_norms: torch.Tensor | None = None, *, epsilon: float = SINK_EPSILON,
                 top: int = VISUAL_SINKS_TOP) -> pd.DataFrame:
    """Per head, the `top` image tokens that receive most of the text queries' attention on the picture.

    `received`: a patch's attention from the text queries that see it, averaged over them; `image_share`: the
    same over the text queries' attention on all image tokens (the share of the picture's attention it
    takes: 1 / n_image for a uniform head); `sink`: `image_share` > `epsilon` (Gu et al.'s ε, the sinks
    section's). `value_norm_ratio`: with `value_norms` ([layer, head, key], the map's layers and heads:
    `probe.sinks.head_internals(lm, ...)` gives them), the patch's ‖v‖ over the median ‖v‖ of the other
    image tokens — the sinks section's ratio, low for a sink that adds little (NaN without value norms).
    """
    _check(amap)
    t = len(amap)
    if value_norms is not None and tuple(value_norms.shape) != (amap.n_layers, amap.n_heads, t):
        raise ValueError(f"value_norms must be [layer, head, key] = {(amap.n_layers, amap.n_heads, t)}, got "
                         f"{tuple(value_norms.shape)}")
    image = image_units(amap)
    text = [i for i, p in enumerate(amap.patches) if p is None]
    a = amap.attention.detach().double().cpu()
    seen = torch.tensor([[(not amap.causal or q >= k) for k in image] for q in text], dtype=torch.float64)  # [text, img]
    n_seeing = seen.sum(0)  # text queries that see each patch
    block = a[:, :, text][..., image] * seen  # [layer, head, text, image]
    received = block.sum(-2) / n_seeing.clamp_min(1)  # [layer, head, image]
    received[..., n_seeing == 0] = math.nan
    counted = seen.any(1)  # text queries that see an image token
    per_query = block[:, :, counted]  # [layer, head, counted text, image]
    total = per_query.sum((-1, -2))
    share = per_query.sum(-2) / total.clamp_min(1e-300)[..., None]  # [layer, head, image]
    ratio = None
    if value_norms is not None:
        v = value_norms.detach().double().cpu()[..., image]  # [layer, head, image]
        others = torch.stack([torch.cat([v[..., :j], v[..., j + 1:]], -1).median(-1).values if len(image) > 1
                              else torch.full(v.shape[:2], math.nan, dtype=torch.float64) for j in range(len(image))], -1)
        ratio = v / others.clamp_min(1e-30)
    rows = []
    k = min(top, len(image))
    for li, layer in enumerate(amap.layer_ids):
        for hi, head in enumerate(amap.head_ids):
            if not bool(counted.any()) or float(total[li, hi]) <= 0:
                continue
            order = torch.argsort(share[li, hi], descending=True, stable=True)[:k]
            for rank, j in enumerate(order.tolist()):
                p = amap.patches[image[j]]
                rows.append({"layer": layer, "head": head, "head_name": head_name(layer, head), "rank": rank + 1,
                             "unit": image[j], "label": amap.labels[image[j]], "image": p.image, "view": p.view,
                             "row": p.row, "col": p.col, "received": float(received[li, hi, j]),
                             "image_share": float(share[li, hi, j]),
                             "value_norm_ratio": math.nan if ratio is None else float(ratio[li, hi, j]),
                             "sink": bool(share[li, hi, j] > epsilon)})
    return pd.DataFrame(rows, columns=["layer", "head", "head_name", "rank", "unit", "label", "image", "view", "row",
                                       "col", "received", "image_share", "value_norm_ratio", "sink"])


# ---------------------------------------------------------------- cross-attention readers (Mllama)


def _reading_rows(cross: CrossAttentionMap) -> list[int]:
    """The text rows the model's mask lets read an image (`meta["reads_image"]`; every row where not recorded)."""
    reads = cross.meta.get("reads_image")
    return [q for q in range(len(cross.queries)) if reads is None or reads[q]]


def cross_attention_heads(pairs: Sequence[ImageCrossAttention]) -> pd.DataFrame:
    """Per cross-attention head (the model's own layer numbers), over the text rows the mask lets read an image:
    `image_entropy` (each row's entropy over the image keys it sees, over the log of how many it sees: 0 all on
    one key, 1 spread evenly), `max_weight` (each row's largest weight), `patch_share` (the share on keys with a
    cell of the picture, not a tile's CLS token) — each the mean over the rows; `n` the rows.

    >>> import torch
    >>> from headscope.probe.types import ImagePatch, Units
    >>> q = Units("a", "token", ("a",), ((0, 1),), (False,))
    >>> k = Units("", "token", ("cls", "p"), ((0, 0),) * 2, (True, False), patches=(None, ImagePatch(0, 0, 0, 1, 1)))
    >>> c = CrossAttentionMap(queries=q, keys=k, attention=torch.tensor([[[[0.5, 0.5]]]]), layers=(3,))
    >>> d = AttentionMap(text="a", level="token", labels=("a",), spans=((0, 1),), special=(False,),
    ...                  attention=torch.ones(1, 1, 1, 1), causal=True)
    >>> cross_attention_heads([ImageCrossAttention(decoder=d, cross=c)])[["layer", "image_entropy", "patch_share"]].values.tolist()
    [[3.0, 1.0, 0.5]]
    """
    sums = CrossHeadSums()
    for pair in pairs:
        sums.add(pair.cross)
    return sums.frame()


class CrossHeadSums:
    """The sums behind `cross_attention_heads`, one cross-attention map at a time (`add`), so a corpus of images
    is scored without holding its maps; `frame()` the table."""

    COLUMNS = ("layer", "head", "head_name", "image_entropy", "max_weight", "patch_share", "n")

    def __init__(self) -> None:
        self.totals: torch.Tensor | None = None
        self.n = 0
        self.layers: tuple[int, ...] = ()
        self.heads: tuple[int, ...] = ()

    def add(self, cross: CrossAttentionMap) -> None:
        rows = _reading_rows(cross)
        if not rows:
            return
        a = cross.attention[:, :, rows].double()  # [layer, head, row, key]
        seen = (a > 0).sum(-1).clamp(min=2).double()  # the keys the row sees (the mask's are exact zeros)
        entropy = -(a * a.clamp(min=1e-300).log()).sum(-1) / seen.log()
        cells = torch.tensor([p is not None for p in cross.keys.patches], dtype=torch.bool)
        stats = torch.stack([entropy.sum(-1), a.amax(-1).sum(-1), a[..., cells].sum(-1).sum(-1)], -1)
        if self.totals is None:
            self.totals, self.layers, self.heads = stats, tuple(cross.layer_ids), tuple(cross.head_ids)
        elif (tuple(cross.layer_ids), tuple(cross.head_ids)) != (self.layers, self.heads):
            raise ValueError(f"this cross map has layers {cross.layer_ids} and heads {cross.head_ids}, the earlier "
                             f"ones {self.layers} and {self.heads}")
        else:
            self.totals = self.totals + stats
        self.n += len(rows)

    def frame(self) -> pd.DataFrame:
        if self.totals is None:
            return pd.DataFrame(columns=list(self.COLUMNS))
        mean = (self.totals / self.n).numpy()
        return pd.DataFrame([{"layer": layer, "head": head, "head_name": head_name(layer, head),
                              "image_entropy": mean[li, hi, 0], "max_weight": mean[li, hi, 1],
                              "patch_share": mean[li, hi, 2], "n": self.n}
                             for li, layer in enumerate(self.layers) for hi, head in enumerate(self.heads)],
                            columns=list(self.COLUMNS))


def cross_attention_reads(pair: ImageCrossAttention, layer: int, head: int) -> pd.DataFrame:
    """Which text token reads which image cell in one cross-attention head: per text row the mask lets read an
    image, its largest weight on a cell of the picture (image, view, row, column) and that weight."""
    cross = pair.cross
    a = cross.attention[position(cross.layer_ids, layer, "layer"), position(cross.head_ids, head, "head")]
    cells = [k for k, p in enumerate(cross.keys.patches) if p is not None]
    out = []
    for q in _reading_rows(cross):
        if cross.queries.special[q] or not cells:
            continue
        k = cells[int(a[q, cells].argmax())]
        p = cross.keys.patches[k]
        out.append({"text": cross.queries.text, "query": q, "token": cross.queries.labels[q], "image": p.image,
                    "view": p.view, "row": p.row, "col": p.col, "key": cross.keys.labels[k], "weight": float(a[q, k])})
    return pd.DataFrame(out, columns=["text", "query", "token", "image", "view", "row", "col", "key", "weight"])
