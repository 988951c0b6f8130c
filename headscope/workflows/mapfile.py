"""Attention maps written to a file as they are extracted: `extract_file(lm, texts, "attention.safetensors")`.

    texts ──encode──> each text's units (the file's header) and how its attention is obtained (`source.mode`)
          ──> checked against the memory budget and the free disk, before any forward pass
          ──> eager maps (a batch that fits) or recomputed blocks of rows, one layer at a time
          ──> MAP_FORMATS[suffix].write: the file, layer by layer (`probe.mapfiles`)

The attention source (`probe.sources`: eager, recompute, auto) decides each text, as everywhere; a
recomputed text never has more than one layer of its maps in memory ([head, query, key]), so a text too
long for eager attention is written in the memory of one of its layers. The file's formats and how to read
them back with numpy or torch alone are described in `headscope.probe.mapfiles`.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import torch

from headscope.probe.encoding import check_texts, encode_many
from headscope.probe.images import for_input
from headscope.probe.inputs import AttentionInput
from headscope.probe.mapfiles import MapEntry, check_target, entries_of, entry_of, file_bytes, write_entries
from headscope.probe.maps import MapFacts, kept_ids, make_map, select_heads, select_layers
from headscope.probe.model import LoadedModel
from headscope.probe.names import DEFAULT_ATTENTION, DEFAULT_LEVEL, Attention, Level
from headscope.probe.progress import progress as progress_bar
from headscope.probe.sources import AttentionSource, source_for
from headscope.probe.types import AttentionMap
from headscope.probe.wording import counted, size
from headscope.probe.words import to_word_level

__all__ = ["extract_file", "ExtractedFile"]


@dataclass(frozen=True)
class ExtractedFile:
    """What `extract_file` wrote: the file, its maps' count and bytes, and how each map's attention was obtained."""

    path: Path
    n_maps: int
    n_bytes: int
    level: Level
    source: str  # "texts", "images" or "texts with images"
    meta: dict = field(default_factory=dict)  # the attention source's record: meta["attention"], meta["check"]

    def summary(self) -> str:
        how = self.meta.get("attention") or {}
        recomputed = how.get("recompute", 0)
        tail = f"; {recomputed} of them recomputed one layer at a time" if recomputed else ""
        return (f"wrote {counted(self.n_maps, 'map')} ({self.level} level, {size(self.n_bytes)} of float32 attention, "
                f"from {self.source}) to {self.path}{tail}")

    def to_dict(self) -> dict:
        return {"path": str(self.path), "maps": self.n_maps, "bytes": self.n_bytes, "level": self.level,
                "from": self.source, **self.meta}


@dataclass(frozen=True)
class _Plan:
    """One map of the file before its attention: its entry, its token-level template, how it is obtained."""

    entry: MapEntry
    template: AttentionMap | None  # token level, no layers (recomputed texts: the units a layer is pooled with)
    text: str
    mode: str
    batch: int = 0  # texts of one batch share this number (eager together); a text run alone has its own


def extract_file(lm: LoadedModel, texts: str | Iterable[str] | None, path: str | Path, *, images: Sequence | None = None,
                 level: Level = DEFAULT_LEVEL, layers: Sequence[int] | None = None,
                 heads: Sequence[int] | None = None, attention: Attention = DEFAULT_ATTENTION,
                 budget: int | None = None, batch_size: int = 8, truncate: bool = False, force: bool = False,
                 progress: bool = False) -> ExtractedFile:
    """Extract the attention of `texts` (or `images`) and write it to `path` as the suffix names (.safetensors,
    .npz, .pt, .parquet: `probe.mapfiles`), each map with its labels, special marks and image positions;
    `hs.load_maps(path)` reads them back as `AttentionMap`s.

    `layers` / `heads`: only those (model indices); `level`: tokens or words (an image's units are its
    patches at either level). `attention` and `budget` choose each text's source as `hs.heads` does
    (`probe.sources`): a text whose eager attention would exceed the budget is recomputed in blocks of rows
    and written one layer at a time. Before any forward pass a request that cannot be done is a ValueError
    saying why: a layer of a recomputed text larger than the budget, a .pt file (written from memory) larger
    than the budget, a file larger than the free space of its disk. An existing `path` is replaced only with
    `force` and only when headscope wrote it. `progress`: a bar on stderr, one step per layer written.
    """
    path = Path(path)
    fmt = check_target(path, force=force)
    lm = for_input(lm, images=images is not None)  # a two-tower model (CLIP, SigLIP): the tower that reads the input
    source = source_for(lm, attention, budget=budget, batch_size=batch_size)
    if images is not None:
        maps = source.maps(AttentionInput.of(texts, images=images), level=level, layers=layers, heads=heads)
        image_entries, layer_stream = entries_of(maps)  # a cross-attention reader's pair: two entries
        plans = [_Plan(e, None, e.info["text"], "eager") for e in image_entries]
        made = "texts with images" if texts is not None else "images"
    else:
        if texts is None:
            raise TypeError("texts must be a str or an iterable of str; an image model takes images=[...] instead")
        plans = _plan(lm, check_texts(texts), source, level, select_layers(lm, layers), select_heads(lm, heads),
                      truncate)
        made, layer_stream = "texts", _layers(lm, plans, source, level, layers, heads, batch_size, truncate)
    entries = [p.entry for p in plans]
    _fits(plans, fmt.streams, source.budget, path)
    bar = progress_bar(enabled=progress, total=sum(e.shape[0] for e in entries), desc=f"{lm.name} extract",
                       unit="layer")
    with bar:
        def counted() -> Iterator[torch.Tensor]:
            for layer in layer_stream:
                yield layer
                bar.update()

        write_entries(path, entries, counted())
    return ExtractedFile(path=path, n_maps=len(entries), n_bytes=file_bytes(entries), level=level, source=made,
                         meta=source.record())


def _plan(lm: LoadedModel, texts: list[str], source: AttentionSource, level: Level, layer_idx: list[int],
          head_idx: list[int], truncate: bool) -> list[_Plan]:
    """Every text's entry and mode, from its tokens alone (no forward pass): chunks of `batch_size` texts are
    eager together where the chunk's eager attention fits, else each text as its own length decides."""
    facts = MapFacts.of(lm)
    kl, kh = kept_ids(lm, layer_idx, head_idx)
    encoded = encode_many(lm, texts, truncate=truncate)
    plans: list[_Plan] = []
    bs = source.batch_size
    for start in range(0, len(encoded), bs):
        chunk = encoded[start : start + bs]
        together = source.mode(max(len(e.ids) for e in chunk), len(chunk)) == "eager"
        for i, enc in enumerate(chunk, start=start):
            mode = "eager" if together else source.mode(len(enc.ids))
            n = len(enc.ids)
            template = make_map(lm, enc, torch.empty(0, len(head_idx), n, n), layers=kl, heads=kh, facts=facts)
            shown = to_word_level(template) if level == "word" else template
            shown = replace(shown, meta={**shown.meta, "attention": mode})
            entry = entry_of(shown, i, layer_ids=layer_idx, head_ids=head_idx, n_layers=len(layer_idx))
            plans.append(_Plan(entry, template, enc.text, mode, start if together else -1 - i))
            if mode == "recompute":  # an eager text is counted by the source as it reads it (`iter_maps`)
                source.counts[mode] += 1
    if any(p.mode == "eager" for p in plans) and source.name != "recompute":
        longest = max(len(p.template) for p in plans if p.mode == "eager")
        need = source.need(longest)
        if need > source.budget:  # only `--attention eager` gets here: auto recomputes such a text
            raise ValueError(f"a text of {longest:,} tokens needs {size(need)} of eager attention, more than "
                             f"the memory budget of {size(source.budget)}; use attention='auto', which "
                             "recomputes it one layer at a time, or raise the budget (CLI: --memory-budget)")
    return plans


def _fits(plans: Sequence[_Plan], streams: bool, budget: int, path: Path) -> None:
    """Refuse, before any forward pass, what would not fit: one layer of a recomputed text in the memory
    budget, a format written from memory (.pt) in it, the file on its disk."""
    recomputed = [p for p in plans if p.mode == "recompute"]
    if recomputed:
        # The token-level layer being filled (a word-level layer, pooled from it, is smaller).
        biggest = max(recomputed, key=lambda p: len(p.template))
        n = len(biggest.template)
        token_layer = biggest.entry.shape[1] * n**2 * 4
        if token_layer > budget:
            raise ValueError(f"text {plans.index(biggest)} has {n:,} tokens: one layer of its attention takes "
                             f"{size(token_layer)}, more than the memory budget of {size(budget)}; "
                             "keep fewer heads (CLI: --head-indices), split the text, or raise the budget "
                             "(CLI: --memory-budget)")
    total = file_bytes([p.entry for p in plans])
    if not streams and total > budget:
        raise ValueError(f"the maps take {size(total)} and a {path.suffix} file is written from memory, more "
                         f"than the memory budget of {size(budget)}; write .safetensors, .npz or .parquet "
                         "(written one layer at a time), or keep fewer layers or heads")
    folder = next(p for p in (path.absolute(), *path.absolute().parents) if p.exists())
    free = shutil.disk_usage(folder).free
    if total > free:
        raise ValueError(f"the maps take {size(total)} of float32 attention and the disk of {folder} has "
                         f"{size(free)} free; keep fewer layers, heads or texts, or write elsewhere")


def _layers(lm: LoadedModel, plans: Sequence[_Plan], source: AttentionSource, level: Level, layers, heads,
            batch_size: int, truncate: bool) -> Iterator[torch.Tensor]:
    """Every map's [head, query, key] layers in file order: the texts of a batch whose eager attention fits
    together (`_plan`) extracted at once, any other eager text alone, a recomputed text one layer at a time."""
    i = 0
    while i < len(plans):
        if plans[i].mode == "eager":
            j = i
            while j < len(plans) and plans[j].mode == "eager" and plans[j].batch == plans[i].batch:
                j += 1
            for m in source.iter_maps([p.text for p in plans[i:j]], level=level, layers=layers, heads=heads,
                                      truncate=truncate):
                yield from m.attention
            i = j
            continue
        yield from _recomputed(lm, plans[i], source, level, truncate)
        i += 1


def _recomputed(lm: LoadedModel, plan: _Plan, source: AttentionSource, level: Level,
                truncate: bool) -> Iterator[torch.Tensor]:
    """One text's layers from recomputed blocks of query rows: each layer filled, pooled to words when asked,
    handed over and let go before the next is begun."""
    from headscope.probe.encoding import encode

    layer_ids, head_ids = plan.entry.info["layer_ids"], plan.entry.info["head_ids"]
    enc = encode(lm, plan.text, truncate=truncate)
    n = len(enc.ids)
    current, buffer = None, None
    for block in source.blocks(enc, layers=layer_ids, heads=head_ids):
        if block.layer != current:
            if buffer is not None:
                yield _pooled(plan.template, buffer, level)
            current, buffer = block.layer, torch.zeros(len(head_ids), n, n)
        buffer[:, block.query_start : block.query_stop] = block.probs
    if buffer is not None:
        yield _pooled(plan.template, buffer, level)


def _pooled(template: AttentionMap, layer: torch.Tensor, level: Level) -> torch.Tensor:
    if level != "word":
        return layer
    return to_word_level(replace(template, attention=layer[None])).attention[0]
