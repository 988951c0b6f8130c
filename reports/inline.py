"""The head explorer inline in a notebook output cell, offline: `show(maps)` (also `hs.show`).

bertviz's views (`reports.notebook`) load require.js and d3 from a CDN, so they stay blank offline
and in frontends without require.js. This view is one self-contained HTML fragment instead: its
script (`static/inline.js`) is inlined once per output and uses no library, its data sits in a
`<script type="application/json">` block escaped as the report escapes it, and every element id
carries a fresh random suffix, so two outputs on one page never collide. It draws in Jupyter,
VS Code and Colab alike, with no network.

The view: a model view (every layer × head as a thumbnail; click one to enlarge it) and the head
view (the enlarged head as a heatmap; hover or click a query token to see where it attends). A
vision–language map (image tokens among its units) also draws its pictures, and over them the selected
token's attention on the image tokens (the last text token's until one is picked). Query and key
labels may differ (cross-attention, or generated tokens attending to the whole sequence).

Attention is embedded as the report embeds it (`reports.payload.attention_payload`): past `POOL_ABOVE`
(256) query or key units pooled (`reports.payload.pooled_units`): each
head as at most 64 × 64 tiles (the max of each, so a sharp diagonal survives) and each query row's top
3 keys, listed when a tile row is hovered; the page then grows with T, not T².

A map shown as a cell's value (`_repr_html_`) is a small static table, `reports.views`; call `show(amap)`
for the interactive view. Any other result (a `Verification`, `HeadScores`, ...) given to `show` is its
view from that same registry, `reports.views.VIEWS`.
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from headscope.probe.results import GenerationAttention
from headscope.probe.types import AttentionMap, CrossAttentionMap, position

from headscope.probe.wording import counted

from .page import script_json, static_script
from .payload import attention_payload, image_payload, with_keys
from .views import VIEWS, view_for

__all__ = ["InlineView", "show", "view_data", "generation_data"]


@dataclass(frozen=True)
class InlineView:
    """HTML that Jupyter, VS Code and Colab display as the explorer (`_repr_html_`); `html` is the fragment.

    Its plain `repr` (a terminal's REPL, `print`) is one line saying what it holds, never the fragment's
    kilobytes of HTML.

    >>> InlineView("<div>...</div>", "1 text, 6 layers × 12 heads")
    <head explorer: 1 text, 6 layers × 12 heads; shown in a notebook (.html holds its 14 characters of HTML)>
    """

    html: str = field(repr=False)
    what: str = ""
    kind: str = "head explorer"  # or "view": a result's static view (`reports.views`)

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        what = f": {self.what}" if self.what else ""
        return f"<{self.kind}{what}; shown in a notebook (.html holds its {len(self.html):,} characters of HTML)>"


def _map_data(attention: torch.Tensor, queries: Sequence[str], keys: Sequence[str], *, causal: bool,
              text: str, images: dict | None = None) -> dict:
    if attention.device.type == "meta":
        raise ValueError("attention is a meta tensor (a shape without values): load or compute the weights first")
    att = attention.detach().float().cpu()  # [layer, head, query, key]
    n_q, n_k = att.shape[2:]
    bad = ~att.isfinite()
    if bad.any():  # int32 would turn NaN and ±inf into -2147483648 and draw it as a weight
        l, h, q, k = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"attention holds {int(bad.sum())} NaN or infinite value(s), the first at layer index {l}, "
                         f"head {h}, query {q}, key {k}; attention weights are probabilities in [0, 1]")
    if (n_q, n_k) != (len(queries), len(keys)):
        raise ValueError(f"attention is {tuple(att.shape)} ([layer, head, query, key]) but there are "
                         f"{len(queries)} query and {len(keys)} key labels")
    p = attention_payload(att, queries, keys)  # pooled past POOL_ABOVE units: tiles (max) and each row's top keys
    # A causal query i sees keys up to i + offset: 0 for self-attention, more when the queries are
    # the last tokens of a longer sequence (generation).
    out = {"text": text, "queries": p["queries"], "keys": p["keys"], "causal": bool(causal),
           "offset": len(p["keys"]) - len(p["queries"]), "att": p["att"]}
    return out | ({"pooled": p["pooled"]} if "pooled" in p else {}) | ({"images": images} if images else {})


def _labels(amap: Any) -> tuple[Sequence[str], Sequence[str]]:
    """Query and key labels of a map; maps of cross-attention carry the two lists separately (a
    `CrossAttentionMap`: its target's and its source's units)."""
    if isinstance(amap, CrossAttentionMap):
        return amap.queries.labels, amap.keys.labels
    queries = getattr(amap, "query_labels", None) or amap.labels
    keys = getattr(amap, "key_labels", None) or amap.labels
    return queries, keys


def _text(amap: Any) -> str:
    """What a map's view is captioned with: its text; a cross-attention map's target text."""
    return amap.queries.text if isinstance(amap, CrossAttentionMap) else amap.text


def view_data(maps: Sequence[AttentionMap], *, layer: int | None = None, head: int | None = None,
              title: str = "") -> dict:
    """The view's data for maps of one model: per map its labels and attention, the head shown first."""
    first = maps[0]
    layer_ids, head_ids = list(first.layer_ids), list(first.head_ids)
    for m in maps[1:]:
        if list(m.layer_ids) != layer_ids or list(m.head_ids) != head_ids:
            raise ValueError("the maps hold different layers or heads; show maps of one model, extracted alike")
    cross = any(_labels(m)[0] is not _labels(m)[1] for m in maps)
    return _data([_map_data(m.attention, *_labels(m), causal=m.causal, text=_text(m),
                            images=image_payload(m) if isinstance(m, AttentionMap) else None) for m in maps], layer_ids,
                 head_ids, layer=layer, head=head, title=title or str(first.meta.get("model", "")), cross=cross)


def generation_data(gen: Any, *, layer: int | None = None, head: int | None = None, title: str = "") -> dict:
    """The view's data for a generation (`headscope.GenerationAttention`): one entry per generated token,
    its one query row over the prompt and the tokens generated so far, so the selector steps through them."""
    prompt = gen.prompt
    images = image_payload(prompt)  # a prompt with images: each step's row is drawn over its pictures too
    steps = [_map_data(row.unsqueeze(2), [tok], gen.key_labels(t), causal=True, text=f"step {t + 1}: {tok!r}",
                       images=with_keys(images, row.shape[-1]))
             for t, (tok, row) in enumerate(zip(gen.generated_tokens, gen.steps))]  # row: [layer, head, key]
    if not steps:
        raise ValueError("the generation has no generated tokens to show")
    return _data(steps, list(prompt.layer_ids), list(prompt.head_ids), layer=layer, head=head,
                 title=title or f"{gen.model}: generating after “{prompt.text}”", cross=False)


def _data(maps: list[dict], layer_ids: list[int], head_ids: list[int], *, layer: int | None, head: int | None,
          title: str, cross: bool) -> dict:
    return {"title": title, "layer_ids": layer_ids, "head_ids": head_ids,
            "start": {"layer": _start(layer_ids, layer, "layer"), "head": _start(head_ids, head, "head")},
            "query_name": "query (attending)",
            "key_name": "key (attended to, other sequence)" if cross else "key (attended to)", "maps": maps}


def _start(ids: list[int], wanted: int | None, what: str) -> int:
    """The position of the head shown first: the first one unless `wanted` names one."""
    return 0 if wanted is None else position(ids, wanted, what, where="these maps")


@functools.lru_cache(maxsize=1)
def _script() -> str:
    source = static_script("inline.js")
    lines = source.strip().splitlines()
    script = "\n".join(lines[next(i for i, line in enumerate(lines) if not line.startswith("//")):])  # no header
    if "</script" in script.lower() or "<!--" in script:
        raise ValueError("inline.js must not contain '</script' or '<!--'")
    return script


_STYLE = """
#{id} {{ font: 13px/1.4 system-ui, sans-serif; color: #222; }}
#{id} .hs-panes {{ display: flex; flex-wrap: wrap; gap: 18px; align-items: flex-start; }}
#{id} .hs-thumbs {{ border-collapse: collapse; }}
#{id} .hs-thumbs th {{ font-weight: normal; color: #777; font-size: 11px; padding: 0 3px; }}
#{id} .hs-thumbs td {{ padding: 1px; }}
#{id} .hs-thumb {{ display: block; cursor: pointer; outline: 1px solid #ddd; }}
#{id} .hs-thumb.hs-on {{ outline: 2px solid #d62728; }}
#{id} .hs-q.hs-focus {{ font-weight: bold; fill: #d62728; }}
#{id} .hs-tok {{ display: inline-block; margin: 1px; padding: 0 3px; border-radius: 3px; background: #f3f3f3; }}
#{id} .hs-caption, #{id} .hs-strip-note {{ color: #555; margin: 4px 0; }}
"""


def show(maps: Any, labels: Sequence[str] | None = None, *, key_labels: Sequence[str] | None = None,
         layer: int | None = None, head: int | None = None, causal: bool = False, title: str = "") -> InlineView:
    """The offline head explorer of `maps`, inline in a notebook (shown when it is a cell's last value).

    `maps`: an `AttentionMap`, a list of them (a selector steps through the texts), a
    `GenerationAttention` (the selector steps through the generated tokens), or, as bertviz's
    `head_view(attention, tokens)`, a `[layer, head, query, key]` tensor with its `labels` (and
    `key_labels` when keys differ from queries: cross-attention). `layer`/`head` (model indices)
    pick the head enlarged first. Any other result with a view (`reports.views.VIEWS`: `Verification`,
    `HeadScores`, `DLAResult`, ...) is shown as that view.
    """
    if isinstance(maps, torch.Tensor):
        if labels is None:
            raise ValueError("a tensor needs its labels: show(attention, labels)")
        if maps.dim() != 4:
            raise ValueError(f"attention must be [layer, head, query, key], got shape {tuple(maps.shape)}")
        keys = list(key_labels) if key_labels is not None else list(labels)
        n_l, n_h = maps.shape[:2]
        data = _data([_map_data(maps, list(labels), keys, causal=causal, text=title)], list(range(n_l)),
                     list(range(n_h)), layer=layer, head=head, title=title, cross=key_labels is not None)
    elif isinstance(maps, GenerationAttention):
        data = generation_data(maps, layer=layer, head=head, title=title)
    else:
        items = list(maps) if isinstance(maps, (list, tuple)) else [maps]
        if not items:
            raise ValueError("no attention maps given; pass the result of hs.extract(...)")
        view = None if isinstance(maps, (list, tuple, CrossAttentionMap, AttentionMap)) else view_for(maps)
        if view is not None:  # any other result: its notebook view (`reports.views.VIEWS`)
            return InlineView(view(maps), type(maps).__name__, kind="view")
        odd = next((m for m in items if not isinstance(m, (AttentionMap, CrossAttentionMap))), None)
        if odd is not None:  # not an AttributeError from deep inside
            parts = [p for p in ("encoder", "decoder", "cross") if hasattr(odd, p)]
            hint = f"; show one of its maps: {', '.join('.' + p for p in parts)}" if parts else ""
            results = ", ".join(sorted(t.__name__ for t in VIEWS if t is not AttentionMap))
            raise TypeError(f"show takes attention maps (AttentionMap, CrossAttentionMap), a GenerationAttention, a "
                            f"[layer, head, query, key] tensor with its labels or a result ({results}), "
                            f"not {type(odd).__name__}{hint}")
        data = view_data(items, layer=layer, head=head, title=title)
    n = len(data["maps"])
    steps = "generated token" if isinstance(maps, GenerationAttention) else "text"
    what = (f"{counted(n, steps)}, {counted(len(data['layer_ids']), 'layer')} × "
            f"{counted(len(data['head_ids']), 'head')}")
    return InlineView(_fragment(data), what)


def _fragment(data: dict) -> str:
    uid = "hs-view-" + uuid.uuid4().hex[:12]  # ids unique per output: several views on one page stay apart
    return (f'<div id="{uid}" class="hs-inline"><style>{_STYLE.format(id=uid)}</style>'
            '<select class="hs-pick" aria-label="text"></select>'
            '<div class="hs-panes"><div class="hs-model-view"></div><div>'
            '<p class="hs-caption"></p>'
            '<svg class="hs-head-view" xmlns="http://www.w3.org/2000/svg" role="img" '
            'aria-label="attention heatmap"></svg>'
            '<div class="hs-strip"></div><p class="hs-strip-note"></p>'
            '<div class="hs-pictures" hidden></div><p class="hs-picture-note"></p></div></div>'
            f'<script type="application/json" id="{uid}-data">{script_json(data)}</script>'
            f'<script>{_script()}("{uid}");</script></div>')
