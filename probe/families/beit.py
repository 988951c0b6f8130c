"""BEiT (image encoder): ViT's attention plus a learned relative position bias over the patch grid.

Each head adds to its scores a bias looked up by the 2-D offset between the query and key patches
(one table entry per offset in (2·rows − 1) × (2·cols − 1)), and three entries for [CLS]→patch,
patch→[CLS] and [CLS]→[CLS] (Bao et al. 2022, after Swin). The table lives in each layer
(`use_relative_position_bias`) or once for all layers (`use_shared_relative_position_bias`); the index
is rebuilt here from the grid, not read from the model. Absolute position embeddings, where a config
has them, are added before the first layer. Only the checkpoint's own grid is reproduced (the model
interpolates its table for other image sizes).
"""

from __future__ import annotations

import dataclasses

import torch

from ..family import Family, Refusal
from ._vision import projection_spec, tiny_image_processor, tiny_vision_config


def relative_index(rows: int, cols: int) -> torch.Tensor:
    """[1 + rows·cols, 1 + rows·cols] table rows: (Δrow + rows − 1)·(2·cols − 1) + (Δcol + cols − 1) between
    patches, then D − 3 for [CLS]→patch, D − 2 for patch→[CLS], D − 1 for [CLS]→[CLS] (D table rows).

    >>> relative_index(1, 2).tolist()
    [[5, 3, 3], [4, 1, 0], [4, 2, 1]]
    """
    d = (2 * rows - 1) * (2 * cols - 1) + 3
    pos = [(r, c) for r in range(rows) for c in range(cols)]
    n = len(pos) + 1
    index = torch.empty(n, n, dtype=torch.long)
    for i, (r1, c1) in enumerate(pos, start=1):
        for j, (r2, c2) in enumerate(pos, start=1):
            index[i, j] = (r1 - r2 + rows - 1) * (2 * cols - 1) + (c1 - c2 + cols - 1)
    index[0, :], index[:, 0], index[0, 0] = d - 3, d - 2, d - 1
    return index


def _table(base, i: int):
    module = base.layers[i].relative_position_bias or base.shared_position_bias
    return None if module is None else module.relative_position_bias_table.detach()  # (D, nh)


def _spec(base, i: int, cfg):
    spec = projection_spec(base.layers[i].attention)
    table = _table(base, i)
    if table is None:
        return spec
    size = cfg.image_size if isinstance(cfg.image_size, int) else cfg.image_size[0]
    bias = table[relative_index(size // cfg.patch_size, size // cfg.patch_size)].permute(2, 0, 1)  # (nh, T, T)

    def score_bias(t_query: int, t_key: int, *, query_start: int = 0, key_start: int = 0) -> torch.Tensor:
        return bias[:, query_start:t_query, key_start:t_key]

    return dataclasses.replace(spec, score_bias=score_bias)


def _grid_only(cfg) -> str | None:
    if not isinstance(cfg.image_size, int) and cfg.image_size[0] != cfg.image_size[1]:
        return f"image_size={cfg.image_size}: only square grids are reproduced"
    return None


FAMILY = Family(
    name="beit",
    model_types=("beit",),
    kind="encoder",
    features=("image patches (+ CLS)", "relative position bias over the 2-D patch grid (per layer or shared)",
              "bidirectional"),
    layer_spec=_spec,
    attention=lambda base, i: base.layers[i].attention,
    out_proj=lambda base, i: base.layers[i].attention.o_proj,
    refuses=(Refusal("non-square grid", _grid_only),),
    tiny_config=lambda vocab, model_type: tiny_vision_config(model_type, use_relative_position_bias=True),
    tokenizer=None,
    auto_class="AutoModel",
    modality="image",
    prefix_tokens=lambda cfg: ("[CLS]",),
    tiny_processor=tiny_image_processor,
    tiny_std=0.5,
)
