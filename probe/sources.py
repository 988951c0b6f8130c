"""Where attention comes from: the registry of attention sources, and the one place that picks one.

transformers picks an attention *implementation* by name from one registry (`ALL_ATTENTION_FUNCTIONS`);
headscope picks its attention *source* the same way, once per workflow call:

    source = source_for(lm, attention, budget=..., batch_size=...)    # SOURCES[attention](lm, ...)

    SOURCES     how each text's attention is obtained (`mode`)
    eager       the model's own weights (`output_attentions=True`), whole maps, batched
    recompute   the model runs with SDPA; each layer's probabilities are recomputed from scratch
                in blocks of query rows (`probe.recompute`): no [layer, head, T, T] tensor exists
    auto        recompute for a text whose eager attention would need more than `budget` bytes,
                eager otherwise (the same numbers as eager on every text that fits)

Every workflow, command and the explorer that reads attention (head scores, relation probes, syntax, the
report's sentences, the images of a vision run, map files, the live explorer) asks its source, never
`probe.extract`, `probe.forward` or `probe.live` itself (`tests/test_one_source.py` scans for that). What
it reads is one `probe.inputs.AttentionInput` (texts, images, texts with images, source–target pairs,
token-id sequences; a plain list of texts is taken as texts), and what it gets back is one type, a
`probe.reading.Reading`, folded layer by layer or collected into maps:

    source.read(input, ...)          per batch or text a `Reading`: a padded batch to fold layer by layer
                                     (`batched=True`, eager texts), a text's recomputed blocks of rows, or
                                     whole maps (norm weights, images, texts with images, pairs)
    source.maps(input, ...)          whole maps, in order: eager, or assembled from blocks (`iter_maps`: lazily)
    source.live(text, level=, weight=, images=)  one text held for a viewer (`probe.live.LiveText`): any
                                     head's query rows when asked for, sliced from its eager map or recomputed
    source.mode(n_tokens, batch)     "eager" | "recompute" for a text of that length in a batch that size
    source.need(n_tokens, batch)     bytes eager attention would keep: batch × layers × heads × T² × itemsize
    source.blocks(enc)               one encoded text as `Block`s of query rows, layer by layer
    source.checked(enc, layers=)     the first recomputed text checked against the model's eager
                                     attention on its prefix (`PrefixCheck`); a mismatch raises
    source.record()                  what results say about it: meta["attention"], meta["check"]

What a source can do beyond attention probabilities over texts is a capability it accepts or refuses by
name (`CAPABILITIES`: "norm" weights ‖αf(x)‖, "images", cross-attention "pairs"): `source.accepts(name)`,
and `source.require(name)` refuses in one line naming what to use instead (`RecomputeSource` refuses all
three: they come from the eager forward pass).

A new source (a GPU kernel, say) is one entry: a subclass with its `name`, `mode` and the capabilities it
refuses (and, where it obtains blocks another way, its own `blocks`).
"""

from __future__ import annotations

from collections import Counter
from itertools import islice
from types import MappingProxyType
from typing import ClassVar, Iterable, Iterator, Literal, Mapping, Sequence, get_args

import torch

from .encoding import Encoded, check_count, check_texts, checked_stream, encode, encode_many, text_units, token_count
from .extract import batches_encoded, extract_encoded, extract_ids, iter_extract
from .forward import attention_layers, is_seq2seq
from .live import EagerLive, LiveText, RecomputedLive
from .maps import MapFacts, kept_ids, make_map, select_heads, select_layers
from .model import LoadedModel
from .names import Attention, Level, Mode, Weight
from .recompute import DEFAULT_BUDGET, Block, PrefixCheck, check_prefix, iter_blocks_encoded
from .inputs import AttentionInput
from .reading import Reading
from .types import AttentionMap, Units
from .words import Segmenter, to_word_level

__all__ = ["AttentionSource", "EagerSource", "RecomputeSource", "AutoSource", "SOURCES", "source_for",
           "memory_budget", "eager_bytes", "Capability", "CAPABILITIES", "AttentionInput", "Reading"]

# What a source may or may not do beyond attention probabilities over texts, each accepted or refused by name.
Capability = Literal["norm", "images", "pairs"]
CAPABILITIES: tuple[str, ...] = get_args(Capability)
# The capability an input kind needs (`probe.inputs.InputKind`); texts and token ids need none.
_NEEDS: Mapping[str, Capability | None] = MappingProxyType(
    {"texts": None, "ids": None, "images": "images", "texts+images": "images", "pairs": "pairs"})


def memory_budget(value: int | str | None = None) -> int:
    """Bytes that eager attention may take before `attention="auto"` recomputes: `value` (bytes, or a size such
    as "1GiB": `probe.sizes.parse_size`), or a quarter of RAM.

    >>> memory_budget(2**30)
    1073741824
    """
    if value is None:
        import psutil

        return psutil.virtual_memory().total // 4
    from .sizes import parse_size

    try:
        return parse_size(value)  # what --memory-budget takes: 2**30, "1GiB"
    except ValueError as exc:
        raise ValueError(f"memory_budget {exc}") from None


def eager_bytes(lm: LoadedModel, n_tokens: int, *, n_layers: int | None = None, batch: int = 1) -> int:
    """What eager extraction keeps: batch × layers × heads × T² × itemsize (every head is computed)."""
    n_layers = len(attention_layers(lm)) if n_layers is None else n_layers  # a hybrid's attention layers only
    itemsize = torch.empty((), dtype=lm.dtype).element_size()
    return batch * n_layers * lm.config.num_attention_heads * n_tokens**2 * itemsize


class AttentionSource:
    """How `lm`'s attention is obtained, for one workflow call: the shared machinery of every source.

    `budget`: bytes eager attention may take (`memory_budget`; a quarter of RAM by default);
    `batch_size`: texts per forward pass. `counts` tallies the texts each mode served.
    """

    name: ClassVar[Attention]

    def __init__(self, lm: LoadedModel, *, budget: int | None = None, batch_size: int = 8) -> None:
        self.lm, self.budget, self.batch_size = lm, memory_budget(budget), check_count(batch_size, "batch_size")
        self.counts: Counter = Counter()
        self.check: PrefixCheck | None = None  # of the first recomputed text
        n = lm.config
        self.all_layers, self.all_heads = attention_layers(lm), tuple(range(n.num_attention_heads))

    def mode(self, n_tokens: int, batch: int = 1) -> Mode:
        """How the attention of a text of `n_tokens` tokens, in a batch of `batch` texts, is obtained."""
        raise NotImplementedError

    def need(self, n_tokens: int, batch: int = 1, *, n_layers: int | None = None) -> int:
        return eager_bytes(self.lm, n_tokens, n_layers=n_layers, batch=batch)

    # -- what this source can do ------------------------------------------------------------------

    # The capabilities this source refuses, each with the one line that names what to use instead.
    refuses: ClassVar[Mapping[Capability, str]] = MappingProxyType({})

    def accepts(self, capability: Capability) -> bool:
        """Whether this source can read `capability` ("norm" weights, "images", encoder–decoder "pairs")."""
        if capability not in CAPABILITIES:
            raise ValueError(f"a capability is one of {', '.join(map(repr, CAPABILITIES))}, got {capability!r}")
        return capability not in self.refuses

    def require(self, capability: Capability) -> None:
        """A ValueError (one line: what to use instead) when this source cannot read `capability`."""
        if not self.accepts(capability):
            raise ValueError(self.refuses[capability])

    def _require_for(self, inp: AttentionInput, weight: Weight) -> None:
        if weight not in ("attention", "norm"):
            raise ValueError(f"weight must be 'attention' or 'norm', got {weight!r}")
        for capability in (_NEEDS[inp.kind], "norm" if weight == "norm" else None):
            if capability is not None:
                self.require(capability)

    # -- attention, one reading at a time ----------------------------------------------------------

    def read(self, inp: AttentionInput | str | Iterable[str], *, level: Level = "token", truncate: bool = False,
             window: int = 4, weight: Weight = "attention", batched: bool = False) -> Iterator[Reading]:
        """The attention of `inp` (an `AttentionInput`; texts as they are are taken as texts), one `Reading` at a
        time: fold each (`Reading.fold`) or collect its maps. Checked before anything runs: what the input needs
        of this source (`require`), the weight.

        Texts (attention weights) stream in chunks of `batch_size × window`; within a chunk the eager texts come
        first, in order, each its own map at `level`, then the recomputed ones (token-level blocks of rows).
        `batched`: the eager texts come as padded batches instead (token level, sorted by length within the
        chunk, each layer handed over as its forward pass gives it), for a consumer that scores a batch at once,
        one layer at a time (`level` is then the consumer's to apply). Token-id sequences: `batch_size` at a
        time, a batch eager where it fits, else each sequence's blocks. Norm weights, images, texts with images
        and pairs: every item's eager map, each its own reading."""
        inp = AttentionInput.of(inp)
        self._require_for(inp, weight)
        how = "_eager_readings" if weight == "norm" else _READ[inp.kind]
        return getattr(self, how)(inp, level=level, truncate=truncate, window=window, weight=weight, batched=batched)

    def texts(self, texts: Iterable[str], **options) -> Iterator[Reading]:
        """`read` of texts."""
        return self.read(AttentionInput.of(texts), **options)

    def sequences(self, sequences: Sequence[Sequence[int]], *, batched: bool = False) -> Iterator[Reading]:
        """`read` of token-id sequences (repeated random tokens)."""
        return self.read(AttentionInput.of(sequences=sequences), batched=batched)

    def _texts(self, inp: AttentionInput, *, level: Level, truncate: bool, window: int, batched: bool,
               **_) -> Iterator[Reading]:
        stream, done = iter(inp.texts), 0
        facts = MapFacts.of(self.lm)  # what every map carries, read off the model once for the whole stream
        while chunk := list(islice(stream, self.batch_size * window)):
            try:
                chunk = check_texts(chunk)
            except (TypeError, ValueError) as exc:  # name the text by its place in the whole stream
                raise type(exc)(f"{exc} (text {done} is the first of this chunk of {len(chunk)})") from None
            encoded = encode_many(self.lm, chunk, truncate=truncate, first_index=done)
            modes = self._modes(encoded)
            eager = [e for e, m in zip(encoded, modes) if m == "eager"]  # one window, tokenised once
            if batched:
                yield from batches_encoded(self.lm, eager, batch_size=self.batch_size, facts=facts)
            else:
                for amap in extract_encoded(self.lm, eager, batch_size=self.batch_size, level=level,
                                            truncate=truncate, facts=facts):
                    yield Reading.of_maps([amap])
            for enc, m in zip(encoded, modes):
                if m == "recompute":
                    yield self._blocks_reading(enc, text_units(self.lm, enc), level)
            done += len(chunk)

    def _sequences(self, inp: AttentionInput, *, batched: bool, **_) -> Iterator[Reading]:
        """Token-id sequences, `batch_size` at a time: eager maps of a batch that fits (`batched`: the padded
        batch, in input order), else each sequence's recomputed blocks (its units: the ids as they are)."""
        bs, lm, sequences = self.batch_size, self.lm, inp.sequences
        for start in range(0, len(sequences), bs):  # one batch of maps alive at a time
            chunk = sequences[start : start + bs]
            if self.mode(max(map(len, chunk)), len(chunk)) == "eager":
                if batched:
                    yield from batches_encoded(lm, [_id_item(lm, s) for s in chunk], batch_size=bs, units=_id_units,
                                               by_length=False,
                                               maps=lambda items: extract_ids(lm, [e.ids for e in items],
                                                                              batch_size=len(items)))
                else:
                    yield from (Reading.of_maps([m]) for m in extract_ids(lm, chunk, batch_size=bs))
                continue
            for seq in chunk:
                enc = _id_item(lm, seq)
                yield self._blocks_reading(enc, _id_units(enc), "token")

    def _blocks_reading(self, enc: Encoded, units: Units, level: Level) -> Reading:
        """One text recomputed in blocks of query rows (every layer and head); collected, its assembled map."""
        layer_idx, head_idx = list(self.all_layers), list(self.all_heads)
        return Reading.of_blocks(units=units, causal=self.lm.is_causal, layers=self.all_layers, heads=self.all_heads,
                                 make_blocks=lambda: self._later_blocks(enc),
                                 collect_maps=lambda: self._assembled([enc], layer_idx, head_idx, torch.float32, None,
                                                                      level))

    def _later_blocks(self, enc: Encoded) -> Iterator[Block]:
        """`blocks(enc)`, begun (checked, recomputed) only when the first block is asked for."""
        yield from self.blocks(enc)

    def _eager_readings(self, inp: AttentionInput, *, level: Level, truncate: bool, window: int, weight: Weight,
                        **_) -> Iterator[Reading]:
        """Every item's eager map, each its own reading (norm weights, images, texts with images, pairs)."""
        for amap in self._eager(inp, level=level, truncate=truncate, window=window, weight=weight):
            yield Reading.of_maps([amap])

    def _eager(self, inp: AttentionInput, *, truncate: bool = False, **options) -> Iterator[AttentionMap]:
        """`probe.extract.iter_extract` of `inp`, the texts of a "texts" input each checked against the budget
        first (`_within_budget`), each map counted as eager."""
        if inp.kind == "texts":
            inp = AttentionInput("texts", texts=self._within_budget(inp.texts, truncate=truncate))
        for amap in iter_extract(self.lm, inp, batch_size=self.batch_size, truncate=truncate, **options):
            self.counts["eager"] += 1
            yield amap

    def _within_budget(self, texts: str | Iterable[str], *, truncate: bool) -> Iterator[str]:
        """`texts`, each checked before it reaches the model: a ValueError (the need, the budget and the way
        out) when its eager attention alone would take more than the budget, instead of the allocator's
        failure in the middle of the forward pass."""
        limit = self.lm.max_length
        for i, text in enumerate(checked_stream(texts)):
            n, _ = token_count(self.lm.tokenizer, text, limit)
            if n > limit and not truncate:
                yield text  # too long for the model: extraction says so, with its own advice
                continue
            self._fits(i, text, min(n, limit))
            yield text

    def _fits(self, i: int, text: str, n: int) -> None:
        """A ValueError when text `i`'s eager attention (`n` tokens) alone takes more than the budget."""
        need, config = self.need(n), self.lm.config
        if need > self.budget:
            itemsize = torch.empty((), dtype=self.lm.dtype).element_size()
            raise ValueError(
                f"text {i} (starting {text[:40]!r}) has {n:,} tokens: its eager attention alone takes "
                f"{need / 1e9:.1f} GB ({config.num_hidden_layers} layers × {config.num_attention_heads} heads × "
                f"{n:,}² × {itemsize} B), more than the memory budget of {self.budget / 1e9:.1f} GB; use "
                "attention='auto' (CLI: --attention auto), which recomputes such a text in blocks, or raise "
                "the budget (CLI: --memory-budget)")

    def blocks(self, enc: Encoded, *, layers: Sequence[int] | None = None,
               heads: Sequence[int] | None = None) -> Iterator[Block]:
        """One text's blocks of query rows; the source's first recomputed text is checked first."""
        self.checked(enc)
        return (block for _, block in iter_blocks_encoded(self.lm, [enc], layers=layers, heads=heads,
                                                          budget=self.block_budget))

    @property
    def block_budget(self) -> int:
        """Bytes for one block of rows and its working copies."""
        return min(DEFAULT_BUDGET, self.budget)

    def checked(self, enc: Encoded, *, layers: Sequence[int] | None = None) -> PrefixCheck:
        """The recomputation checked against the model's eager attention on `enc`'s prefix, once per source
        (`layers`: only those; explain checks its one layer). A mismatch raises: nothing recomputed is used."""
        if self.check is None:
            self.check = check_prefix(self.lm, enc, layers=layers)
            if not self.check.passed:
                raise RuntimeError(f"{self.lm.name}: {self.check.summary()}; the recomputed attention cannot be "
                                   "trusted, run with attention='eager'")
        return self.check

    # -- whole maps --------------------------------------------------------------------------------

    def maps(self, inp: AttentionInput | str | Iterable[str], **options) -> list[AttentionMap]:
        """`iter_maps` as a list."""
        return list(self.iter_maps(inp, **options))

    def iter_maps(self, inp: AttentionInput | str | Iterable[str], *, level: Level = "token",
                  layers: Sequence[int] | None = None, heads: Sequence[int] | None = None,
                  store_dtype: torch.dtype = torch.float32, truncate: bool = False,
                  segmenter: Segmenter | None = None, window: int = 16,
                  weight: Weight = "attention") -> Iterator[AttentionMap]:
        """Whole maps of `inp`, in order. Texts (attention weights), `batch_size` at a time: a batch's eager maps
        where its eager attention fits, else its maps assembled from recomputed blocks (`meta["attention"] =
        "recompute"` and `meta["check"]`); for texts short enough to hold whole maps (figures, trees). Norm
        weights, images, texts with images, pairs: eager maps, as this source accepts them (`require`)."""
        if level not in ("token", "word"):
            raise ValueError(f"level must be 'token' or 'word', got {level!r}")
        inp = AttentionInput.of(inp)
        self._require_for(inp, weight)
        options = dict(level=level, layers=layers, heads=heads, store_dtype=store_dtype, truncate=truncate,
                       segmenter=segmenter, window=window)
        if inp.kind == "texts" and weight == "attention":
            return self._text_maps(inp, **options)
        return self._eager(inp, weight=weight, **options)

    def _text_maps(self, inp: AttentionInput, *, level: Level, layers, heads, store_dtype, truncate: bool,
                   segmenter: Segmenter | None, window: int) -> Iterator[AttentionMap]:
        texts = check_texts(inp.texts)
        layer_idx = select_layers(self.lm, layers)
        head_idx = select_heads(self.lm, heads)
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start : start + self.batch_size]
            encoded = encode_many(self.lm, batch, truncate=truncate, first_index=start)
            if self.mode(max(len(e.ids) for e in encoded), len(encoded)) == "eager":
                self.counts["eager"] += len(batch)
                yield from iter_extract(self.lm, batch, batch_size=self.batch_size, level=level, layers=layers,
                                        heads=heads, store_dtype=store_dtype, truncate=truncate, segmenter=segmenter)
                continue
            self.counts["recompute"] += len(batch)
            yield from self._assembled(encoded, layer_idx, head_idx, store_dtype, segmenter, level)

    def _assembled(self, encoded: list[Encoded], layer_idx: list[int], head_idx: list[int], store_dtype,
                   segmenter: Segmenter | None, level: Level) -> list[AttentionMap]:
        """One batch's maps filled from recomputed blocks: [layer, head, query, key]."""
        check = self.checked(encoded[0], layers=layer_idx)
        maps = [torch.empty(len(layer_idx), len(head_idx), len(e.ids), len(e.ids), dtype=store_dtype) for e in encoded]
        row_of = {layer: r for r, layer in enumerate(layer_idx)}
        for b, block in iter_blocks_encoded(self.lm, encoded, layers=layer_idx, heads=head_idx,
                                            budget=self.block_budget):
            maps[b][row_of[block.layer], :, block.query_start : block.query_stop] = block.probs
        layers, heads = kept_ids(self.lm, layer_idx, head_idx)
        out = []
        for enc, a in zip(encoded, maps):
            amap = make_map(self.lm, enc, a, segmenter=segmenter, layers=layers, heads=heads)
            amap.meta.update(attention="recompute", check=check.to_dict())
            out.append(to_word_level(amap) if level == "word" else amap)
        return out

    # -- one text, held for a viewer ----------------------------------------------------------------

    def live(self, text: str, *, level: Level = "token", weight: Weight = "attention", keep_layers: int = 4,
             images: Sequence = ()) -> LiveText:
        """`text` held for a viewer (`probe.live`): any head's query rows, computed when asked for, eager or
        recomputed as this source obtains a text of its length (`mode`). With `images` (a vision–language
        decoder's text with its images, as this source accepts them): its whole eager map."""
        if weight == "norm":
            self.require("norm")
        if images:
            self.require("images")
            [amap] = self._eager(AttentionInput.of([text], images=list(images)), level=level, weight=weight)
            return EagerLive(self.lm, self, amap)
        enc = self._live_text(text, level, weight)
        if self.mode(len(enc.ids)) == "eager":
            return self._eager_live(text, level, weight)
        return self._recomputed_live(enc, level, weight, keep_layers)

    def _live_text(self, text: str, level: Level, weight: Weight) -> Encoded:
        if level not in ("token", "word"):
            raise ValueError(f"level must be 'token' or 'word', got {level!r}")
        if weight not in ("attention", "norm"):
            raise ValueError(f"weight must be 'attention' or 'norm', got {weight!r}")
        if not isinstance(text, str):
            raise TypeError(f"a live text is one str, got {type(text).__name__}")
        [text] = check_texts(text)
        return encode(self.lm, text)

    def _eager_live(self, text: str, level: Level, weight: Weight) -> EagerLive:
        [amap] = iter_extract(self.lm, text, level=level, weight=weight)
        return EagerLive(self.lm, self, amap)

    def _recomputed_live(self, enc: Encoded, level: Level, weight: Weight, keep_layers: int) -> RecomputedLive:
        if weight == "norm":
            raise ValueError("weight='norm' comes from the eager forward pass; this text is recomputed "
                             "(use weight='attention', or attention='eager' with a larger memory budget)")
        if level == "word":
            raise ValueError(f"this text has {len(enc.ids):,} tokens and is recomputed in blocks of rows, which are "
                             "token rows: use level='token'")
        return RecomputedLive(self.lm, self, enc, text_units(self.lm, enc), keep_layers=keep_layers)

    # -- bookkeeping -------------------------------------------------------------------------------

    def _modes(self, encoded: Sequence[Encoded]) -> list[Mode]:
        batch = min(self.batch_size, len(encoded))
        modes = [self.mode(len(e.ids), batch) for e in encoded]
        self.counts.update(modes)
        return modes

    def record(self) -> dict:
        """What a result's `meta` says about how its attention was obtained."""
        return {"attention": {"asked": self.name, "budget": self.budget,
                              **{k: self.counts[k] for k in ("eager", "recompute")}},
                "check": None if self.check is None else self.check.to_dict()}


class EagerSource(AttentionSource):
    """The model's own eager weights, for every text."""

    name = "eager"

    def mode(self, n_tokens: int, batch: int = 1) -> Mode:
        return "eager"

    def _texts(self, inp: AttentionInput, *, level: Level, truncate: bool, window: int, batched: bool,
               **_) -> Iterator[Reading]:
        """Every text eager, streamed through `probe.iter_extract` as they come (no decision to make), each
        checked against the budget first; `batched`: padded batches, layer by layer, as `AttentionSource` gives
        them."""
        if batched:
            checked = AttentionInput("texts", texts=self._within_budget(inp.texts, truncate=truncate))
            return super()._texts(checked, level=level, truncate=truncate, window=window, batched=True)
        return self._eager_readings(inp, level=level, truncate=truncate, window=window, weight="attention")

    def live(self, text: str, *, level: Level = "token", weight: Weight = "attention", keep_layers: int = 4,
             images: Sequence = ()) -> EagerLive:
        """The text's whole map, extracted once and sliced (checked against the budget first)."""
        if images:
            return super().live(text, level=level, weight=weight, images=images)
        self._fits(0, text, len(self._live_text(text, level, weight).ids))
        return self._eager_live(text, level, weight)

    def _text_maps(self, inp: AttentionInput, *, truncate: bool, **options) -> Iterator[AttentionMap]:
        """`probe.iter_extract` itself: batches sorted by length within windows of `window` batches (each text
        first checked against the budget)."""
        return self._eager(inp, truncate=truncate, **options)


class RecomputeSource(AttentionSource):
    """Every text recomputed from scratch in blocks of query rows (one stack of self-attention)."""

    name = "recompute"
    refuses = MappingProxyType({
        "norm": "attention='recompute' recomputes attention probabilities in blocks of query rows; norm-based "
                "weights (weight='norm') come from the eager forward pass: use attention='auto' or attention='eager'",
        "images": "attention='recompute' recomputes one stack's self-attention over texts; images are read by the "
                  "eager forward pass: use attention='auto' or attention='eager'",
        "pairs": "attention='recompute' recomputes one stack's self-attention; an encoder-decoder's source-target "
                 "pairs (cross-attention) come from the eager forward pass: use attention='auto' or attention='eager'",
    })

    def __init__(self, lm: LoadedModel, **kwargs) -> None:
        if is_seq2seq(lm):  # recompute mode hooks one stack of self-attention
            raise ValueError(f"{lm.name} is an encoder-decoder model; recomputed attention covers encoders and "
                             "decoders only, use attention='eager'")
        super().__init__(lm, **kwargs)

    def mode(self, n_tokens: int, batch: int = 1) -> Mode:
        return "recompute"


class AutoSource(AttentionSource):
    """Recompute where eager attention would exceed the budget, eager everywhere else (norm weights, images and
    pairs, which only the eager forward pass gives: each text checked against the budget first)."""

    name = "auto"

    def mode(self, n_tokens: int, batch: int = 1) -> Mode:
        if is_seq2seq(self.lm):  # eager is all an encoder-decoder model has
            return "eager"
        return "recompute" if self.need(n_tokens, batch) > self.budget else "eager"


# How each kind of input is read (`AttentionSource.read`), attention weights; norm weights are always eager maps.
_READ: Mapping[str, str] = MappingProxyType({"texts": "_texts", "ids": "_sequences", "images": "_eager_readings",
                                             "texts+images": "_eager_readings", "pairs": "_eager_readings"})


SOURCES: Mapping[Attention, type[AttentionSource]] = MappingProxyType(
    {cls.name: cls for cls in (EagerSource, RecomputeSource, AutoSource)})


def source_for(lm: LoadedModel, attention: Attention, *, budget: int | None = None,
               batch_size: int = 8) -> AttentionSource:
    """The attention source named `attention` (`SOURCES`), for `lm`: the one place a workflow picks one.

    >>> from headscope.probe.tiny import tiny_model
    >>> lm = tiny_model("gpt2")
    >>> [source_for(lm, a, budget=10**4).mode(64) for a in ("eager", "recompute", "auto")]  # 2·4·64²·4 B > 10⁴
    ['eager', 'recompute', 'recompute']
    >>> source_for(lm, "auto", budget=10**6).mode(64)
    'eager'
    """
    try:
        cls = SOURCES[attention]
    except (KeyError, TypeError):
        raise ValueError(f"attention must be {', '.join(map(repr, SOURCES))}; got {attention!r}") from None
    return cls(lm, budget=budget, batch_size=batch_size)


def _id_units(enc: Encoded) -> Units:
    """The units of a token-id sequence: its ids as they are, no text."""
    return Units(text="", level="token", labels=(), spans=enc.spans, special=enc.special, token_ids=enc.ids)


def _id_item(lm: LoadedModel, seq: Sequence[int]) -> Encoded:
    """A token-id sequence as an `Encoded` text (no text, the ids as they are)."""
    special = set(getattr(lm.tokenizer, "all_special_ids", []))
    ids = tuple(int(t) for t in seq)
    return Encoded(text="", ids=ids, spans=((0, 0),) * len(ids), special=tuple(t in special for t in ids))
