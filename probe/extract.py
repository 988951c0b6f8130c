"""Real attention out of a real model: batched, right-padded, padding removed per text.

The extraction loop: texts are tokenised (`probe.encoding`), run in batches through the model's base
(`probe.forward`), and each text's attention is cut out of its batch, padding removed, into an
`AttentionMap` (a `Seq2SeqAttention` for an encoder–decoder's pairs). Within a window of batches
texts are sorted by length so padding stays small; results come back in input order.
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import torch

from .encoding import Encoded, check_count, checked_stream, encode_many, encode_targets, text_units
from .forward import forward_batch, forward_each_layer, forward_seq2seq, is_cross_reader, is_seq2seq, learned_sinks
from .images import encode_images, for_input, require_modality
from .inputs import AttentionInput, InputKind
from .reading import Reading
from .maps import MapFacts, kept_ids, make_map, select_heads, select_layers
from .model import LoadedModel
from .norms import norm_attention, norm_weighted
from .vision_language import default_texts, encode_with_images
from .types import AttentionMap, CrossAttentionMap, ImageCrossAttention, Level, Seq2SeqAttention, Units, Weight, whole_number
from .words import Segmenter, to_word_level

__all__ = ["extract", "extract_ids", "iter_extract", "extract_encoded", "batches_encoded", "READERS", "ReadOptions"]


def iter_extract(
    lm: LoadedModel,
    texts: str | Iterable[str] | AttentionInput | None = None,
    *,
    images: object = None,
    batch_size: int = 8,
    level: Level = "token",
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    store_dtype: torch.dtype = torch.float32,
    truncate: bool = False,
    segmenter: Segmenter | None = None,
    window: int = 16,
    target: str | Iterable[str] | None = None,
    weight: Weight = "attention",
) -> Iterator[AttentionMap]:
    """Yield one `AttentionMap` per text, in input order, holding only one window of batches at a time.

    `layers`/`heads` keep only those rows/columns of `[layer, head, query, key]`; `store_dtype`
    (e.g. torch.float16) halves what is kept. Both shrink the O(T²) attention per head.

    An encoder–decoder model takes `texts` as its sources and `target` (one text per source) as
    the decoder's texts, and yields one `Seq2SeqAttention` per pair instead; without a target it
    runs the encoder alone and yields the encoder's self-attention over each text.

    `weight="norm"` gives Kobayashi et al.'s norm-based weights instead of the attention probabilities:
    ‖α_ij f(x_j)‖ (`probe.norms`), each query row divided by its sum (rows sum to 1, as attention's do);
    the maps' `weight` (and `meta["weight"]`) say which. One-stack self-attention only.

    A vision transformer takes `images` instead of texts (paths, PIL images or numpy arrays): each map's
    units are the tokens before the patches ([CLS], registers; special) and the patches, row by row, with
    their (row, column) in `positions` and the grid in `grid` (`probe.images`).

    What was given is one `probe.inputs.AttentionInput` (made here, or passed as `texts`), read by the reader
    of its kind (`READERS`).
    """
    check_count(batch_size, "batch_size")
    check_count(window, "window")
    if level not in ("token", "word"):
        raise ValueError(f"level must be 'token' or 'word', got {level!r}")
    inp = AttentionInput.of(texts, images=images, targets=target)
    options = ReadOptions(batch_size=batch_size, level=level, layers=layers, heads=heads, store_dtype=store_dtype,
                          truncate=truncate, segmenter=segmenter, window=window, weight=weight)
    return READERS[inp.kind](lm, inp, options)


@dataclass(frozen=True)
class ReadOptions:
    """How the maps of one input are read (`iter_extract`'s keywords)."""

    batch_size: int = 8
    level: Level = "token"
    layers: Sequence[int] | None = None
    heads: Sequence[int] | None = None
    store_dtype: torch.dtype = torch.float32
    truncate: bool = False
    segmenter: Segmenter | None = None
    window: int = 16
    weight: Weight = "attention"


def _attention_only(what: str, o: ReadOptions) -> None:
    if o.weight != "attention":
        raise ValueError(f"{what} are extracted with weight='attention' (norm-based weights are for texts)")


def _read_texts(lm: LoadedModel, inp: AttentionInput, o: ReadOptions) -> Iterator[AttentionMap]:
    lm = for_input(lm, images=False)  # a two-tower model: its text tower reads texts
    _check_store_dtype(o.store_dtype)
    if o.weight not in ("attention", "norm"):
        raise ValueError(f"weight must be 'attention' or 'norm', got {o.weight!r}")
    # Checked above, before the first text is asked for; the texts themselves are checked as they stream.
    return _windows(lm, inp.texts, o.batch_size, o.window, o.level, select_layers(lm, o.layers),
                    select_heads(lm, o.heads), o.store_dtype, o.truncate, o.segmenter, o.weight)


def _read_images(lm: LoadedModel, inp: AttentionInput, o: ReadOptions) -> Iterator[AttentionMap]:
    lm = for_input(lm, images=True)  # a two-tower model: its image tower reads images
    if getattr(lm, "reads_images", False):  # images alone on a vision–language decoder: each with the default prompt
        return _read_texts_with_images(lm, AttentionInput.of(default_texts(inp.images), images=inp.images), o)
    _attention_only("images", o)
    maps = _image_windows(lm, list(inp.images), o.batch_size, select_layers(lm, o.layers), select_heads(lm, o.heads),
                          o.store_dtype)
    return (to_word_level(m) for m in maps) if o.level == "word" else maps  # patches at both levels


def _read_texts_with_images(lm: LoadedModel, inp: AttentionInput, o: ReadOptions) -> Iterator[AttentionMap]:
    lm = for_input(lm, images=True)
    if not getattr(lm, "reads_images", False):
        raise ValueError("pass texts or images, not both (CLIP's two towers: hs.image_text for an image-caption "
                         "pair); texts with images are for a vision–language decoder (e.g. tiny:llava)")
    _attention_only("texts with images", o)
    _check_store_dtype(o.store_dtype)
    if is_cross_reader(lm):  # Mllama: its self-attention and cross-attention layers apart, one pair per text
        return _read_cross(lm, inp, o)
    encoded = encode_with_images(lm, list(inp.texts), list(inp.images))
    maps = _with_images(lm, encoded, select_layers(lm, o.layers), select_heads(lm, o.heads), o.store_dtype,
                        o.segmenter)
    return (to_word_level(m) for m in maps) if o.level == "word" else maps


def _read_cross(lm: LoadedModel, inp: AttentionInput, o: ReadOptions) -> Iterator[ImageCrossAttention]:
    """A decoder that reads its images through cross-attention layers: one `ImageCrossAttention` per text (the
    self-attention layers' map over the text, the cross-attention layers' map over the image keys)."""
    from .image_cross import image_cross_attention

    if o.layers is not None or o.heads is not None:
        raise ValueError(f"{lm.name} reads its images through cross-attention layers; layers= and heads= select in "
                         "one stack only, so extract all and index the maps (.decoder, .cross)")
    pairs = _stored(image_cross_attention(lm, list(inp.texts), images=list(inp.images)), o.store_dtype)
    return iter([to_word_level(p) for p in pairs] if o.level == "word" else pairs)  # image keys: units at both


def _stored(pairs: list[ImageCrossAttention], store_dtype: torch.dtype) -> list[ImageCrossAttention]:
    if store_dtype == torch.float32:
        return pairs
    return [replace(p, decoder=replace(p.decoder, attention=p.decoder.attention.to(store_dtype)),
                    cross=replace(p.cross, attention=p.cross.attention.to(store_dtype))) for p in pairs]


def _read_pairs(lm: LoadedModel, inp: AttentionInput, o: ReadOptions) -> Iterator[AttentionMap]:
    lm = for_input(lm, images=False)
    _check_store_dtype(o.store_dtype)
    if o.weight != "attention":
        raise ValueError("weight='norm' is for self-attention of one stack; extract an encoder-decoder's pairs "
                         "with weight='attention'")
    if not is_seq2seq(lm):
        raise ValueError(f"target= is for encoder-decoder models; {lm.name} ({lm.model_type}) has no decoder "
                         "reading a source")
    if o.layers is not None or o.heads is not None:
        raise ValueError(f"{lm.name} is an encoder-decoder model; layers= and heads= select in one stack only, "
                         "so extract all and index the maps")
    return _iter_seq2seq(lm, list(inp.texts), list(inp.targets), batch_size=o.batch_size, level=o.level,
                         store_dtype=o.store_dtype, truncate=o.truncate, segmenter=o.segmenter)


def _read_ids(lm: LoadedModel, inp: AttentionInput, o: ReadOptions) -> Iterator[AttentionMap]:
    _attention_only("token-id sequences", o)
    if o.level != "token":
        raise ValueError("token-id sequences have no words: read them with level='token'")
    return iter(extract_ids(lm, list(inp.sequences), batch_size=o.batch_size, layers=o.layers, heads=o.heads,
                            store_dtype=o.store_dtype))


# Each kind of input (`probe.inputs.InputKind`) and the reader of its maps: the one place the kind is looked at.
READERS: Mapping[InputKind, Callable[[LoadedModel, AttentionInput, ReadOptions], Iterator[AttentionMap]]] = \
    MappingProxyType({"texts": _read_texts, "images": _read_images, "texts+images": _read_texts_with_images,
                      "pairs": _read_pairs, "ids": _read_ids})


def extract_encoded(lm: LoadedModel, encoded: Sequence[Encoded], *, batch_size: int = 8, level: Level = "token",
                    truncate: bool = False, facts: MapFacts | None = None) -> Iterator[AttentionMap]:
    """`iter_extract` of texts already encoded (`encode_many`) and checked, as one window (sorted by length,
    every layer and head, float32), so that a caller that tokenised them to choose a mode does not again;
    `facts` (`MapFacts.of(lm)`) lets a caller that runs many windows read the model once."""
    require_modality(lm, images=False)
    return _run_encoded(lm, list(encoded), batch_size, level, select_layers(lm, None), select_heads(lm, None),
                        torch.float32, None, "attention", truncate, facts)


def batches_encoded(lm: LoadedModel, encoded: Sequence[Encoded], *, batch_size: int = 8,
                    facts: MapFacts | None = None, units: Callable[[Encoded], Units] | None = None,
                    by_length: bool = True,
                    maps: Callable[[list[Encoded]], list[AttentionMap]] | None = None) -> Iterator[Reading]:
    """`extract_encoded`'s batches, not cut into maps: the texts sorted by length (`by_length`), `batch_size`
    at a time, each a "layers" `probe.reading.Reading` (every layer and head) whose `run(each)` runs its forward
    pass and hands each layer's `(text, head, query, key)` weights, padding zeroed in place, to `each` as the pass
    gives them (`forward.forward_each_layer`), for a consumer that scores a whole batch one layer at a time
    (`analyses.heads.HeadScoreAccumulator.batch_fold`): one layer of the batch alive, never all of them.
    `units`: each item's token units (`encoding.text_units` of a text by default); `maps`: a chunk's whole maps
    when the reading is collected (`extract_encoded`'s by default)."""
    require_modality(lm, images=False)
    facts = facts or MapFacts.of(lm)
    units = units or (lambda e: text_units(lm, e))
    layer_idx, head_idx = select_layers(lm, None), select_heads(lm, None)
    maps = maps or (lambda chunk: list(extract_encoded(lm, chunk, batch_size=len(chunk), facts=facts)))
    order = sorted(encoded, key=lambda e: len(e.ids)) if by_length else list(encoded)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        yield Reading.of_layers(units=tuple(units(e) for e in chunk), causal=lm.is_causal, layers=tuple(layer_idx),
                                heads=tuple(head_idx), n_tokens=max(len(e.ids) for e in chunk),
                                run=_layerwise_run(lm, chunk, layer_idx), collect_maps=lambda chunk=chunk: maps(chunk),
                                meta=dict(facts.meta), no_attention=facts.no_attention)


def _layerwise_run(lm: LoadedModel, chunk: list[Encoded], layer_idx: list[int]):
    """`Reading.run` of one padded batch: its forward pass, each layer's weights zeroed where they are padding and
    handed to `each(i, weights)` (i: the layer's place in `layer_idx`)."""
    lengths = torch.tensor([len(e.ids) for e in chunk])
    real = torch.arange(int(lengths.max())) < lengths[:, None]  # (B, T): the texts' own units
    padding = ~(real[:, :, None] & real[:, None, :])[:, None]  # (B, 1, query, key)
    place = {layer: i for i, layer in enumerate(layer_idx)}

    def run(each: Callable[[int, torch.Tensor], None]) -> None:
        def zeroed(layer: int, a: torch.Tensor) -> None:  # the forward's own (inference) tensor, in inference mode
            each(place[layer], a.masked_fill_(padding.to(a.device), 0))

        forward_each_layer(lm, chunk, zeroed, layer_idx)

    return run


def _windows(lm, texts, batch_size, window, level, layer_idx, head_idx, store_dtype, truncate, segmenter, weight):
    pending: list[str] = []
    done = 0  # texts already yielded, so errors can name a text by its position in the whole stream
    for text in checked_stream(texts):
        pending.append(text)
        if len(pending) == batch_size * window:
            yield from _run_window(lm, pending, batch_size, level, layer_idx, head_idx, store_dtype, truncate,
                                   segmenter, done, weight)
            done, pending = done + len(pending), []
    if pending:
        yield from _run_window(lm, pending, batch_size, level, layer_idx, head_idx, store_dtype, truncate, segmenter,
                               done, weight)


def _with_images(lm, encoded, layer_idx, head_idx, store_dtype, segmenter):
    for enc in encoded:  # one text with its images at a time: its own image tokens, pixels and mask
        yield from _run_encoded(lm, [enc], 1, "token", layer_idx, head_idx, store_dtype, segmenter)


def _image_windows(lm, images, batch_size, layer_idx, head_idx, store_dtype):
    for start in range(0, len(images), batch_size):
        encoded = encode_images(lm, images[start : start + batch_size], first_index=start)
        for _, run in itertools.groupby(encoded, key=lambda e: e.grid):  # one batch holds one grid (SigLIP 2's vary)
            yield from _run_encoded(lm, list(run), batch_size, "token", layer_idx, head_idx, store_dtype, None)


def extract(lm: LoadedModel, texts: str | Iterable[str] | None = None, **kwargs) -> list[AttentionMap]:
    """Attention of each text as a list of `AttentionMap` (`[layer, head, query, key]`, no padding).

    For an encoder–decoder model, `extract(lm, source, target=...)` gives one `Seq2SeqAttention` per
    (source, target) pair: encoder self, decoder self and cross attention, each with its own units.

    >>> from headscope.probe.extract import extract                            # doctest: +SKIP
    >>> [m] = extract(load_model("minilm"), "The animal didn't cross the street")  # doctest: +SKIP
    >>> m.attention.shape, m.labels[:3]                               # doctest: +SKIP
    (torch.Size([6, 12, 10, 10]), ('[CLS]', 'The', 'animal'))
    """
    return list(iter_extract(lm, texts, **kwargs))


def _check_store_dtype(store_dtype: object) -> None:
    # Attention weights are probabilities in [0, 1]: an integer dtype would round them all to 0.
    if not isinstance(store_dtype, torch.dtype) or not store_dtype.is_floating_point:
        raise TypeError(f"store_dtype must be a floating-point torch.dtype (torch.float32, torch.float16 or "
                        f"torch.bfloat16), got {store_dtype!r}")


def _run_window(lm, texts, batch_size, level, layer_idx, head_idx, store_dtype, truncate, segmenter, first_index,
                weight="attention"):
    encoded = encode_many(lm, texts, truncate=truncate, first_index=first_index)
    yield from _run_encoded(lm, encoded, batch_size, level, layer_idx, head_idx, store_dtype, segmenter, weight,
                            truncate)


def _run_encoded(lm, encoded, batch_size, level, layer_idx, head_idx, store_dtype, segmenter, weight="attention",
                 truncate=False, facts=None):
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].ids))
    results: dict[int, AttentionMap] = {}
    layers, heads = kept_ids(lm, layer_idx, head_idx)
    facts = facts or MapFacts.of(lm)  # read off the model once, not once per text
    heads_at = torch.tensor(head_idx) if heads else slice(None)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        att = forward_batch(lm, [encoded[i] for i in chunk], layer_idx)  # L × (B, nh, T, T)
        norms = _norms(lm, [encoded[i].text for i in chunk], truncate) if weight == "norm" else None  # texts only
        per_text = split_batch(att, [len(encoded[i].ids) for i in chunk], heads_at, store_dtype)
        for b, i in enumerate(chunk):
            a = per_text[b]
            amap = make_map(lm, encoded[i], a, segmenter=segmenter, layers=layers, heads=heads, facts=facts)
            if norms is not None:
                amap = norm_weighted(amap, norms[b])
            results[i] = to_word_level(amap) if level == "word" else amap
        del att, per_text
    for i in range(len(encoded)):
        yield results.pop(i)


def split_batch(att: list[torch.Tensor], lengths: Sequence[int], heads_at, store_dtype: torch.dtype) -> list[torch.Tensor]:
    """One batch's attention, `att` (per layer, (B, nh, T, T); the list is emptied), as one cpu tensor per text
    `[layer, head, query, key]`, padding cut. Each layer's batch tensor is released as soon as it is copied, so
    the batch and its copies are not both whole in memory at once (one layer of it at most, not the model's).
    """
    n_layers = len(att)
    n_heads = (att[0].shape[1] if isinstance(heads_at, slice) else len(heads_at)) if n_layers else 0
    out = [torch.empty((n_layers, n_heads, n, n), dtype=store_dtype) for n in lengths]
    for layer in range(n_layers):
        x, att[layer] = att[layer], None
        for b, n in enumerate(lengths):
            out[b][layer].copy_(x[b, heads_at, :n, :n])
        del x
    att.clear()
    return out


def _norms(lm, texts: list[str], truncate: bool) -> list:
    """Norm-based attention of one batch of texts (`probe.norms`), in order; truncation already warned about."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return norm_attention(lm, texts, batch_size=len(texts), truncate=truncate)


def _iter_seq2seq(lm, sources, targets, *, batch_size, level, store_dtype, truncate, segmenter):
    src, tgt = encode_many(lm, sources, truncate=truncate), encode_targets(lm, targets, truncate=truncate)
    for start in range(0, len(src), batch_size):
        s_items, t_items = src[start : start + batch_size], tgt[start : start + batch_size]
        att = forward_seq2seq(lm, s_items, t_items)
        for b, (s_enc, t_enc) in enumerate(zip(s_items, t_items)):
            ns, nt = len(s_enc.ids), len(t_enc.ids)

            def keep(kind, nq, nk):  # [layer, head, query, key] of item b, padding cut
                return att[kind][b, :, :, :nq, :nk].to("cpu", store_dtype, copy=True)

            encoder = make_map(lm, s_enc, keep("encoder", ns, ns), segmenter=segmenter, causal=False)
            decoder = make_map(lm, t_enc, keep("decoder", nt, nt), segmenter=segmenter, causal=True)
            cross = CrossAttentionMap(queries=Units.of(decoder), keys=Units.of(encoder),
                                      attention=keep("cross", nt, ns), meta=dict(encoder.meta))
            pair = Seq2SeqAttention(encoder=encoder, decoder=decoder, cross=cross)
            yield to_word_level(pair) if level == "word" else pair
        del att


def extract_ids(
    lm: LoadedModel,
    sequences: Sequence[Sequence[int]],
    *,
    batch_size: int = 8,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    store_dtype: torch.dtype = torch.float32,
) -> list[AttentionMap]:
    """Token-level attention for given token-id sequences (e.g. repeated random tokens for induction).

    The ids go in as they are: no special tokens are added. Units are tokens; spans are empty.
    """
    check_count(batch_size, "batch_size")
    _check_store_dtype(store_dtype)
    if isinstance(sequences, (str, bytes, bytearray)) or not isinstance(sequences, Iterable):
        raise TypeError(f"sequences must be a list of token-id lists such as [[5, 17, 2]], got {type(sequences).__name__}")
    special_ids = set(getattr(lm.tokenizer, "all_special_ids", []))
    vocab = lm.config.vocab_size
    encoded = []
    for i, seq in enumerate(sequences):
        ids = _token_ids(i, seq)
        if not ids or any(not 0 <= t < vocab for t in ids):
            raise ValueError(f"sequence {i} is empty or has ids outside the vocabulary 0..{vocab - 1}")
        if len(ids) > lm.max_length:
            raise ValueError(f"sequence {i} has {len(ids)} tokens; {lm.name} takes at most {lm.max_length}")
        encoded.append(Encoded(text="", ids=ids, spans=((0, 0),) * len(ids), special=tuple(t in special_ids for t in ids)))
    layer_idx = select_layers(lm, layers)
    head_idx = select_heads(lm, heads)
    out = []
    sinks = learned_sinks(lm)
    for start in range(0, len(encoded), batch_size):
        chunk = encoded[start : start + batch_size]
        heads_at = torch.tensor(head_idx) if len(head_idx) < lm.config.num_attention_heads else slice(None)
        per_text = split_batch(forward_batch(lm, chunk, layer_idx), [len(enc.ids) for enc in chunk], heads_at,
                               store_dtype)
        for b, enc in enumerate(chunk):
            n = len(enc.ids)
            out.append(AttentionMap(
                text="", level="token", labels=tuple(lm.tokenizer.convert_ids_to_tokens(list(enc.ids))),
                spans=enc.spans, special=enc.special,
                attention=per_text[b],  # [layer, head, query, key]
                causal=lm.is_causal, word_index=tuple(range(n)), token_ids=enc.ids,
                layers=() if len(layer_idx) == lm.config.num_hidden_layers else tuple(layer_idx),  # model numbers
                heads=() if heads is None else tuple(head_idx),
                meta={"model": lm.name, "dtype": str(lm.dtype).replace("torch.", "")}, sinks=sinks,
            ))
    return out


def _token_ids(i: int, seq: object) -> tuple[int, ...]:
    if isinstance(seq, (str, bytes, bytearray)) or not isinstance(seq, Iterable):
        raise TypeError(f"sequence {i} is a {type(seq).__name__}; each sequence is a list of token ids (ints), "
                        "e.g. sequences=[[5, 17, 2]]")
    return tuple(whole_number(t, f"sequence {i}: token id", minimum=None) for t in seq)
