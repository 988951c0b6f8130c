"""The data that leaves `probe`: attention of one text, at token or word level.

Everything downstream (analyses, reports) takes these plain objects — tensors and strings —
never a model. Tensor order is always `[layer, head, query, key]`.
"""

from __future__ import annotations

import importlib
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # annotations only: the maps hold tensors, and nothing here computes with torch
    import torch

from .names import Level, Weight

__all__ = ["AttentionMap", "AttentionBatch", "ImagePatch", "Units", "CrossAttentionMap", "Seq2SeqAttention", "ImageCrossAttention", "Level", "Weight", "head_name", "parse_head",
           "parse_heads", "position", "Viewable", "json_safe", "whole_number", "seed_value", "SEED_MAX"]


_HEAD = re.compile(r"\s*L(\d+)\s*H(\d+)\s*|\s*(\d+)\s*,\s*(\d+)\s*", re.IGNORECASE)


def head_name(layer: int, head: int) -> str:
    """The one way a head is written: `L1H3` (0-based layer and head).

    >>> head_name(1, 3)
    'L1H3'
    """
    return f"L{int(layer)}H{int(head)}"


def parse_head(spec: str) -> tuple[int, int]:
    """`(layer, head)` from `L1H3` (any case; `1,3` is accepted too), the inverse of `head_name`.

    >>> parse_head("L16H0"), parse_head("l2h5"), parse_head("3,5")
    ((16, 0), (2, 5), (3, 5))
    """
    m = _HEAD.fullmatch(spec) if isinstance(spec, str) else None
    if m is None:
        raise ValueError(f"{spec!r} is not a head name; write LAYERHHEAD such as L1H3 (0-based layer and head)")
    layer, head = m.group(1, 2) if m.group(1) is not None else m.group(3, 4)
    return int(layer), int(head)


def parse_heads(spec: str) -> list[tuple[int, int]]:
    """`[(layer, head), ...]` from comma-separated head names, `L16H0,L18H6` (each read by `parse_head`).

    >>> parse_heads("L16H0, l18h6")
    [(16, 0), (18, 6)]
    """
    names = [part for part in str(spec).split(",") if part.strip()]
    if not names:
        raise ValueError(f"{spec!r} names no head; write head names separated by commas, such as L16H0,L18H6")
    return [parse_head(part) for part in names]


def position(ids: Sequence[int], wanted: object, what: str = "layer", *, where: str = "this map",
             no_attention: Sequence[int] = ()) -> int:
    """Where model layer (or head) number `wanted` sits among `ids`, the model numbers of a tensor's rows (or
    columns) in order: the index to read the tensor at. A number that is not there is one line naming the
    numbers that are (`what`: "layer" or "head"; `where`: what holds them); a hybrid stack's layer without
    softmax attention (`no_attention`) is named as such. A bool is not a number here.

    >>> position((0, 2, 5), 5), position(range(12), 3, "head")
    (2, 3)
    >>> position((0, 2, 5), 1)
    Traceback (most recent call last):
    ...
    ValueError: layer 1 is not among the layers of this map: 0, 2, 5
    """
    import operator

    ids = list(ids)
    try:
        n = None if isinstance(wanted, bool) else operator.index(wanted)
    except TypeError:
        n = None
    if n is not None and n in ids:
        return ids.index(n)
    shown = f"{ids[0]}..{ids[-1]}" if len(ids) > 3 and ids == list(range(ids[0], ids[0] + len(ids))) else \
        ", ".join(map(str, ids))
    if n is not None and n in no_attention:
        raise ValueError(f"{what} {n} of {where} has no softmax attention (a hybrid stack's layer); {what}s {shown} "
                         f"have")
    raise ValueError(f"{what} {wanted!r} is not among the {what}s of {where}: {shown or 'none'}")


SEED_MAX = 2**63 - 1  # the largest seed every generator headscope seeds (numpy's, torch's) takes


def whole_number(value: object, name: str, *, minimum: int | None = 0) -> int:
    """`value` as an int of at least `minimum` (None: any); a float (1.5 would silently become 1) or a bool is an error.

    >>> whole_number(3, "k", minimum=1)
    3
    """
    import operator

    try:
        if isinstance(value, bool):
            raise TypeError
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be a whole number such as {max(minimum or 0, 1)}, got {value!r} "
                        f"(a {type(value).__name__})") from None
    if minimum is not None and n < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {n}")
    return n


def seed_value(seed: object, name: str = "seed") -> int:
    """A random seed: a whole number 0 .. 2**63 - 1, the range of every generator headscope seeds (numpy's refuse
    negatives, torch's overflow past it).

    >>> seed_value(0), seed_value(2**63 - 1) == SEED_MAX
    (0, True)
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise ValueError(f"{name} must be a whole number in 0..2**63-1, got {seed!r}")
    return seed


def json_safe(obj: Any) -> Any:
    """Strict JSON for every output (CLI, run.json, the report's data block): NaN/inf become null.

    >>> import torch
    >>> json_safe({"a": float("nan"), "b": (1, 2.5), 3: torch.tensor(1.5)})
    {'a': None, 'b': [1, 2.5], '3': 1.5}
    """
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        return json_safe(obj.item())
    return obj


class Viewable:
    """A result that a notebook shows as HTML (`_repr_html_`). The view is drawn by `reports.views` (one
    registry, `VIEWS`, keyed by result type), which `hs.show` reads too; probe and analyses may not import
    reports, so the view is looked up by the module's name when a notebook asks for it, and importing a
    result type loads no report code."""

    __slots__ = ()

    def _repr_html_(self) -> str:
        return importlib.import_module("headscope.reports.views").html_view(self)


class _HeadGrid:
    """The layer and head ids of a `[layer, head, query, key]` tensor `attention`, whose rows are the model
    layers `layers` and columns the heads `heads` (all of them when empty)."""

    attention: torch.Tensor
    layers: tuple[int, ...]
    heads: tuple[int, ...]

    @property
    def n_layers(self) -> int:
        return self.attention.shape[0]

    @property
    def n_heads(self) -> int:
        return self.attention.shape[1]

    @property
    def layer_ids(self) -> tuple[int, ...]:
        return self.layers or tuple(range(self.n_layers))

    @property
    def head_ids(self) -> tuple[int, ...]:
        return self.heads or tuple(range(self.n_heads))


@dataclass(frozen=True)
class ImagePatch:
    """Where one image token of a vision–language text sits: which picture, which cell of which view of it.

    A decoder that reads images (LLaVA, Qwen2-VL, Gemma 3, ...) puts image tokens among the text tokens. Each
    carries its picture (`image`, the 0-based index of the `<image>` slot it fills), the cell of its view's
    grid (`row`, `col` of a `rows` × `cols` grid), the view (`"base"`; a tile `"tile 0,1"`; `"thumbnail"`)
    and `box`, the cell's (top, left, bottom, right) in the picture as the model saw it, as fractions 0..1, so
    any view can draw the cell over its picture whatever the tiling.

    >>> p = ImagePatch(image=0, row=1, col=2, rows=2, cols=4)
    >>> p.box
    (0.5, 0.5, 1.0, 0.75)
    """

    image: int
    row: int
    col: int
    rows: int
    cols: int
    view: str = "base"
    box: tuple[float, float, float, float] | None = None  # None: the cell of a whole-picture grid, from row/col

    def __post_init__(self) -> None:
        if not (0 <= self.row < self.rows and 0 <= self.col < self.cols):
            raise ValueError(f"cell ({self.row}, {self.col}) is outside a {self.rows} x {self.cols} grid")
        if self.box is None:
            object.__setattr__(self, "box", (self.row / self.rows, self.col / self.cols,
                                             (self.row + 1) / self.rows, (self.col + 1) / self.cols))


@dataclass(frozen=True, eq=False)
class AttentionMap(_HeadGrid, Viewable):
    """Attention of one text: `attention[layer, head, query, key]`, padding removed.

    Units are sub-word tokens (`level="token"`) or words (`level="word"`). Special tokens
    ([CLS], [SEP], <bos>) are units of their own at both levels and flagged in `special`.

    >>> import torch
    >>> a = torch.full((1, 1, 2, 2), 0.5)
    >>> m = AttentionMap(text="hi you", level="word", labels=("hi", "you"), spans=((0, 2), (3, 6)),
    ...                  special=(False, False), attention=a, causal=False)
    >>> m.n_layers, m.n_heads, len(m)
    (1, 1, 2)
    """

    text: str
    level: Level
    labels: tuple[str, ...]  # display string of each unit
    spans: tuple[tuple[int, int], ...]  # (start, end) character span in `text`; (0, 0) for specials
    special: tuple[bool, ...]
    attention: torch.Tensor  # [layer, head, query, key]
    causal: bool  # decoder (query i sees keys <= i) or encoder
    word_index: tuple[int, ...] = ()  # token level: the word unit each token belongs to
    word_spans: tuple[tuple[int, int], ...] = ()  # token level: character span of each word unit
    token_ids: tuple[int, ...] = ()  # token level: vocabulary ids
    layers: tuple[int, ...] = ()  # model layer index of each row of `attention` (all when empty)
    heads: tuple[int, ...] = ()  # model head index of each column (all when empty)
    meta: dict = field(default_factory=dict)  # model name, dtype, ... (never tensors)
    sinks: bool = False  # the model gives learned attention sinks part of each row (gpt-oss): see `sink_share`
    # A hybrid stack's layers without softmax attention (Mamba, recurrent, convolution), by the model's own numbers:
    # they have no row in `attention` (never a row of zeros), and `layers` keeps the others' numbers.
    no_attention: tuple[int, ...] = ()
    # Images (vision transformers): the patch grid (rows, columns); the units are the special tokens before
    # the patches ([CLS], registers) and then the patches row by row (`positions`). `image`: the picture as
    # the model saw it, a numpy [H, W, 3] in 0..1 (for the overlays), or None.
    grid: tuple[int, int] | None = None
    image: Any = None
    # Vision–language decoders: one entry per unit, an `ImagePatch` for an image token and None for a text token
    # (empty for a map without images); `pictures`: each image as the model saw it, numpy [H, W, 3] in 0..1.
    patches: tuple[ImagePatch | None, ...] = ()
    pictures: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.labels)
        if self.grid is not None and self.grid[0] * self.grid[1] != n - sum(self.special):
            raise ValueError(f"a {self.grid[0]} x {self.grid[1]} patch grid needs {self.grid[0] * self.grid[1]} "
                             f"non-special units, the map has {n - sum(self.special)}")
        if self.patches and len(self.patches) != n:
            raise ValueError(f"patches must have one entry per unit (an ImagePatch or None), got {len(self.patches)} "
                             f"for {n} units")
        if self.attention.dim() != 4:
            raise ValueError(f"attention must be [layer, head, query, key], got shape {tuple(self.attention.shape)}")
        if self.attention.shape[-1] != n or self.attention.shape[-2] != n:
            raise ValueError(f"attention is {tuple(self.attention.shape)} but there are {n} units")
        if not (len(self.spans) == len(self.special) == n):
            raise ValueError("labels, spans and special must have one entry per unit")

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def is_image(self) -> bool:
        """True for the map of an image: its units are patches on a grid (`grid`, `positions`)."""
        return self.grid is not None

    @property
    def positions(self) -> tuple[tuple[int, int] | None, ...]:
        """(row, column) of each unit on the patch grid, None for the special units ([CLS], registers) and
        for every unit of a text.

        >>> import torch
        >>> a = torch.full((1, 1, 5, 5), 0.2)
        >>> m = AttentionMap(text="img", level="token", labels=("[CLS]", "r0c0", "r0c1", "r1c0", "r1c1"),
        ...                  spans=((0, 0),) * 5, special=(True,) + (False,) * 4, attention=a, causal=False,
        ...                  grid=(2, 2))
        >>> m.positions
        (None, (0, 0), (0, 1), (1, 0), (1, 1))
        """
        if self.grid is None:
            return (None,) * len(self)
        cols, out, k = self.grid[1], [], 0
        for s in self.special:
            out.append(None if s else divmod(k, cols))
            k += not s
        return tuple(out)

    @property
    def sink_share(self) -> torch.Tensor | None:
        """[layer, head, query]: the share of each row that went to the head's learned sink, 1 − the row's sum.

        A model with learned sinks (gpt-oss) adds one logit per head to every softmax and drops it, so its
        rows sum to less than 1; the maps keep the model's own weights, never renormalised, and this is the
        rest. None for a model without sinks, whose rows sum to 1.
        """
        if not self.sinks:
            return None
        return (1.0 - self.attention.float().sum(-1)).clamp_min(0.0)

    @property
    def weight(self) -> Weight:
        """What the values are: attention probabilities, or norm-based weights (`extract(..., weight="norm")`)."""
        return self.meta.get("weight", "attention")

    def find(self, word: str, occurrence: int = 0) -> int:
        """Index of the `occurrence`-th unit whose text equals `word` (case-insensitive), else (a word split
        into pieces) of the unit where the word starts in the text, as `explain` finds its token."""
        want = _norm(word)
        hits = [i for i, lab in enumerate(self.labels) if not self.special[i] and _norm(lab) == want]
        if not hits and want:
            hits = [i for i, (a, _) in enumerate(self.spans) if not self.special[i]
                    and self.text[a:a + len(want)].lower() == want and (a == 0 or not self.text[a - 1].isalnum())
                    and not self.text[a + len(want):a + len(want) + 1].isalnum()]  # the whole word, not a prefix
        if occurrence >= len(hits):
            raise KeyError(f"{word!r} occurs {len(hits)} time(s) among {self.level}s {list(self.labels)}")
        return hits[occurrence]

    def to_frame(self, layer: int, head: int):
        """One head as a query × key DataFrame labelled by units (model indices `layer`, `head`)."""
        import pandas as pd

        values = self.attention[position(self.layer_ids, layer, "layer"),
                                position(self.head_ids, head, "head")].detach().float().cpu().numpy()  # [query, key]
        labels = list(self.labels)
        return pd.DataFrame(values, index=pd.Index(labels, name="query"), columns=pd.Index(labels, name="key"))


@dataclass(frozen=True)
class Units:
    """The units (tokens or words) of one side of a cross-attention map, as an `AttentionMap` holds its own."""

    text: str
    level: Level
    labels: tuple[str, ...]
    spans: tuple[tuple[int, int], ...]
    special: tuple[bool, ...]
    word_index: tuple[int, ...] = ()
    word_spans: tuple[tuple[int, int], ...] = ()
    token_ids: tuple[int, ...] = ()
    patches: tuple[ImagePatch | None, ...] = ()  # a vision–language text: its image tokens' cells (AttentionMap.patches)

    @classmethod
    def of(cls, amap: AttentionMap) -> "Units":
        """The units of a self-attention map (the source's from the encoder's, the target's from the decoder's)."""
        return cls(amap.text, amap.level, amap.labels, amap.spans, amap.special, amap.word_index, amap.word_spans,
                   amap.token_ids, amap.patches)

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True, eq=False)
class AttentionBatch:
    """A batch of texts' eager attention as one forward pass gave it, padding kept: `attention[i]` is the
    `(text, head, query, key)` tensor of model layer `layers[i]`, right-padded to the longest text, every
    padded query row and key an exact zero; text b's own map is `attention[i][b, :, :n, :n]` with n =
    `len(units[b])` (token-level units). For scoring a batch at once (`analyses.heads`), where cutting
    each text out of it would copy every map."""

    units: tuple[Units, ...]
    attention: tuple[torch.Tensor, ...]
    causal: bool
    layers: tuple[int, ...]  # model layer ids, one per tensor of `attention`
    heads: tuple[int, ...]  # model head ids, one per head of each tensor
    meta: dict = field(default_factory=dict)  # as each text's `AttentionMap.meta` (model name, dtype)
    no_attention: tuple[int, ...] = ()  # a hybrid stack's layers without softmax attention

    def __len__(self) -> int:
        return len(self.units)

    @property
    def n_tokens(self) -> int:
        """The padded length: every text's tokens and its padding."""
        return self.attention[0].shape[-1]


@dataclass(frozen=True, eq=False)
class CrossAttentionMap(_HeadGrid):
    """Cross-attention of one (source, target) pair: `attention[layer, head, query, key]`, padding removed,
    queries the target's units (the decoder's input) and keys the source's (the encoder's input).

    >>> import torch
    >>> src = Units("a b", "word", ("a", "b"), ((0, 1), (2, 3)), (False, False))
    >>> tgt = Units("x", "word", ("x",), ((0, 1),), (False,))
    >>> CrossAttentionMap(queries=tgt, keys=src, attention=torch.full((1, 2, 1, 2), 0.5)).n_heads
    2
    """

    queries: Units  # the target side
    keys: Units  # the source side
    attention: torch.Tensor  # [layer, head, query, key]
    layers: tuple[int, ...] = ()
    heads: tuple[int, ...] = ()
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.attention.dim() != 4:
            raise ValueError(f"attention must be [layer, head, query, key], got shape {tuple(self.attention.shape)}")
        if tuple(self.attention.shape[-2:]) != (len(self.queries), len(self.keys)):
            raise ValueError(f"attention is {tuple(self.attention.shape)} but there are {len(self.queries)} query "
                             f"and {len(self.keys)} key units")
        if self.queries.level != self.keys.level:
            raise ValueError("queries and keys must be units of the same level")

    @property
    def level(self) -> Level:
        return self.queries.level

    @property
    def causal(self) -> bool:
        return False  # every target position sees the whole source


@dataclass(frozen=True, eq=False)
class Seq2SeqAttention:
    """All attention of an encoder–decoder model on one (source, target) pair: the encoder's self-attention
    over the source, the decoder's causal self-attention over the target, and the cross-attention."""

    encoder: AttentionMap
    decoder: AttentionMap
    cross: CrossAttentionMap

    @property
    def level(self) -> Level:
        return self.encoder.level


@dataclass(frozen=True, eq=False)
class ImageCrossAttention:
    """All attention of a decoder that reads its images through cross-attention layers (Mllama) on one text with
    its images: `decoder` the self-attention layers' map over the text (the model's own layer numbers), `cross`
    the cross-attention layers' map of text queries over the image keys (each key's `ImagePatch`: image, tile,
    row, column; None for a tile's CLS or padding), `gates` the tanh of each cross-attention layer's gates."""

    decoder: AttentionMap
    cross: CrossAttentionMap
    gates: dict = field(default_factory=dict)

    @property
    def level(self) -> Level:
        return self.decoder.level

    @property
    def text(self) -> str:
        return self.decoder.text


def _norm(s: str) -> str:
    return s.strip().lower()
