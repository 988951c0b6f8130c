"""Attention as the pages embed it: integers, and past `POOL_ABOVE` units a pooled view of each head.

`attention_payload(att, queries, keys)` is the one encoder of a `[layer, head, query, key]` map for a page:
the report's explorer (`reports.html`) and the notebook view (`reports.inline`) both embed what it gives.
Weights are stored as integers 0..`scale` (`SCALE`: three decimals), one flat row per head
(`attention_ints`), so a page stays small. Past `POOL_ABOVE` query or key units a map is embedded pooled
(`pooled_units`, from `analyses.pooled`): per head at most `POOL_TILES`² tile maxima and, per query row,
its `POOL_TOP` keys; a page then grows with T, not T².

A vision–language map (image tokens among its units) also carries `image_payload(amap)`: each unit's cell
on its picture (image, panel, box) and each picture as a small JPEG data URL (`PICTURE_SIDE` pixels on its
longest side), so that the page draws a text token's row over the picture (`static/common.js`).
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["SCALE", "POOL_ABOVE", "POOL_TILES", "POOL_TOP", "PICTURE_SIDE", "attention_payload", "attention_ints",
           "pooled_units", "image_payload", "picture_uri", "with_keys"]

SCALE = 1000  # attention stored as integers 0..1000 (three decimals)
POOL_ABOVE = 256
POOL_TILES = 64
POOL_TOP = 3
PICTURE_SIDE = 192  # pixels on the longest side of a picture a page embeds


def attention_payload(att, queries: Sequence[str], keys: Sequence[str], *, scale: int = SCALE) -> dict:
    """`att` (`[layer, head, query, key]`, a float tensor on the CPU) with its query and key labels, as a page
    embeds it: `queries`, `keys` (labels as strings) and `att` (per head one flat row of integers 0..`scale`);
    past `POOL_ABOVE` units the tiles' labels, their maxima and, under `pooled`, the rest (`pooled_units`)."""
    if max(att.shape[2], att.shape[3]) > POOL_ABOVE:  # a long text: tiles and each row's top keys, never every weight
        return pooled_units(att, queries, keys, scale=scale)
    return {"queries": [str(s) for s in queries], "keys": [str(s) for s in keys], "att": attention_ints(att, scale)}


def attention_ints(att, scale: int = SCALE) -> list[list[int]]:
    """`[layer, head, query, key]` weights as integers 0..`scale`, one row `[query * key]` per (layer, head).

    >>> import torch
    >>> attention_ints(torch.tensor([[[[0.25, 0.75], [1.0, 0.0]]]]))
    [[250, 750, 1000, 0]]
    """
    import torch

    n_l, n_h, n_q, n_k = att.shape
    return (att * scale).round().to(torch.int32).reshape(n_l * n_h, n_q * n_k).tolist()


def pooled_units(att, queries: Sequence[str], keys: Sequence[str], *, scale: int = SCALE,
                 tiles: int = POOL_TILES, top: int = POOL_TOP) -> dict:
    """A `[layer, head, query, key]` map as a viewer of long texts shows it (`analyses.pooled`): the tiles'
    labels (first…last unit) as its queries and keys, each head's tile maxima as its `att` (integers
    0..`scale`), and under `pooled` the full labels, the tile edges and per query row its `top` keys and
    their weights. Square self-attention maps keep a decoder's masking: tile edges are the same on both
    sides, so a tile above the diagonal is all masked.
    """
    import torch

    from headscope.analyses.pooled import pool, top_keys

    n_l, n_h, n_q, n_k = att.shape
    maxima, top_idx, top_w, edges = [], [], [], None
    for li in range(n_l):
        for hi in range(n_h):
            w = att[li, hi].float()
            p = pool(w, tiles)
            edges = edges or (p.query_edges, p.key_edges)
            maxima.append((p.max * scale).round().to(torch.int32).flatten().tolist())
            t = top_keys(w, top)
            top_idx.append(t.keys.tolist())
            top_w.append((t.weights * scale).round().to(torch.int32).tolist())
    qe, ke = edges

    def tile_labels(labels: Sequence[str], e: tuple[int, ...]) -> list[str]:
        return [str(labels[a]) if b - a == 1 else f"{labels[a]}\u2026{labels[b - 1]}" for a, b in zip(e, e[1:])]

    return {"queries": tile_labels(queries, qe), "keys": tile_labels(keys, ke), "att": maxima,
            "pooled": {"n_queries": n_q, "n_keys": n_k, "query_edges": list(qe), "key_edges": list(ke),
                       "queries": [str(x) for x in queries], "keys": [str(x) for x in keys], "top_keys": top_idx,
                       "top_weights": top_w, "scale": scale}}


def picture_uri(picture, *, side: int = PICTURE_SIDE) -> dict:
    """A picture (numpy [H, W, 3] in 0..1, or [H, W]) as a page embeds it: a JPEG data URL at most `side` pixels
    on its longest side, with its `width` and `height` in pixels.

    >>> import numpy as np
    >>> p = picture_uri(np.ones((40, 100, 3)) * 0.5, side=50)
    >>> p["width"], p["height"], p["src"][:23]
    (50, 20, 'data:image/jpeg;base64,')
    """
    import base64
    import io

    import numpy as np
    from PIL import Image

    a = np.asarray(picture, dtype=float)
    if a.ndim == 2:
        a = np.repeat(a[..., None], 3, axis=-1)
    if a.ndim != 3 or a.shape[-1] not in (3, 4) or not np.isfinite(a).all():
        raise ValueError(f"a picture must be a finite [H, W, 3] array in 0..1, got shape {a.shape}")
    image = Image.fromarray((a[..., :3].clip(0, 1) * 255).round().astype(np.uint8))
    image.thumbnail((side, side))  # keeps the aspect ratio, never enlarges
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=85, optimize=True)  # a photograph: a fifth of a PNG's size
    return {"src": "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii"),
            "width": image.width, "height": image.height}


def image_payload(amap, *, side: int = PICTURE_SIDE) -> dict | None:
    """The pictures of a map as a page draws them under its image units, or None for a map without any:
    `cells` (per unit `[image, panel, top, left, bottom, right]` for an image unit, the box as fractions of
    its picture, or None for a text or special unit; views that overlap — a thumbnail and its tiles — are in
    different panels, `reports.vision_language.panel_groups`), `pictures` (`picture_uri` of each, None where
    the map has no picture: the page draws a grey ground), `panels` (per picture) and `start` (the unit whose
    row is drawn first: a vision–language map's last text token). An image's map (a vision transformer's:
    `grid`, `image`) gives its patches' cells and `start` 0 ([CLS], or the first patch)."""
    if amap.is_image and not amap.patches:
        if amap.image is None:
            return None
        rows, cols = amap.grid
        cells = [None if pos is None else [0, 0, *(round(x, 5) for x in (pos[0] / rows, pos[1] / cols,
                                                                        (pos[0] + 1) / rows, (pos[1] + 1) / cols))]
                 for pos in amap.positions]
        return {"cells": cells, "pictures": [picture_uri(amap.image, side=side)], "panels": [1], "start": 0}
    if not any(p is not None for p in amap.patches):
        return None
    from headscope.analyses.vision_language import view_grids

    from .vision_language import panel_groups

    panel_of: dict[tuple[int, str], int] = {}
    seen: dict[int, int] = {}
    for group in panel_groups(view_grids(amap, [0.0] * len(amap))):
        image = group[0].image
        for g in group:
            panel_of[(image, g.view)] = seen.get(image, 0)
        seen[image] = seen.get(image, 0) + 1
    cells = [None if p is None else [p.image, panel_of[(p.image, p.view)], *(round(float(x), 5) for x in p.box)]
             for p in amap.patches]
    n_images = max(max(p.image for p in amap.patches if p is not None) + 1, len(amap.pictures))
    pictures = [picture_uri(amap.pictures[i], side=side) if i < len(amap.pictures) and amap.pictures[i] is not None
                else None for i in range(n_images)]
    start = max((i for i, p in enumerate(amap.patches) if p is None), default=0)
    return {"cells": cells, "pictures": pictures, "panels": [seen.get(i, 0) for i in range(n_images)], "start": start}


def with_keys(images: dict | None, n_keys: int) -> dict | None:
    """`image_payload` of a prompt for a row over `n_keys` keys (the prompt, then generated tokens: text units),
    its row drawn first from the generated token (the only query).

    >>> with_keys({"cells": [None, [0, 0, 0, 0, 1, 1]], "pictures": [None], "panels": [1], "start": 0}, 3)["cells"]
    [None, [0, 0, 0, 0, 1, 1], None]
    """
    if images is None:
        return None
    return {**images, "cells": list(images["cells"]) + [None] * (n_keys - len(images["cells"])), "start": 0}
