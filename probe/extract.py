"""Real attention out of a real model: batched, right-padded, padding removed per text.

Texts are tokenised one by one and padded on the right by us (no pad token needed, and a decoder's
positions start at 0 whatever the batch), then run through the model's base (no LM head: the
logits over a 262k vocabulary would cost more than the attention). Within a window of batches
texts are sorted by length so padding stays small; results come back in input order.
"""

from __future__ import annotations

import operator
import warnings
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import torch

from .families import SUPPORTED_TYPES, UnsupportedArchitecture, UnsupportedFeature, family_for
from .loading import LoadedModel
from .types import AttentionMap, CrossAttentionMap, Level, Seq2SeqAttention, Units, Weight
from .words import Segmenter, assign_words, to_word_level

__all__ = ["Encoded", "encode", "encode_many", "encode_targets", "seq2seq_inputs", "extract", "extract_ids", "iter_extract", "forward_batch", "base_model", "check_texts",
           "text_units"]


# The reason a text is left out of an analysis when it has more tokens than the model takes.
TOO_LONG = "longer than the model's context"


@dataclass(frozen=True)
class Encoded:
    """One tokenised text: ids, the tokens' character spans, and which are special."""

    text: str
    ids: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]
    special: tuple[bool, ...]


def check_texts(texts: str | Iterable[str]) -> list[str]:
    """The texts as a list; a clear error for a non-string or an empty text (naming its index)."""
    return list(_checked_stream(texts))


def _check_one(i: int, t: object) -> None:
    if not isinstance(t, str):
        raise TypeError(f"text {i} is a {type(t).__name__}, not a str; pass strings (decode bytes first)")
    if not t.strip():
        raise ValueError(f"text {i} is empty; every text needs at least one non-space character")
    try:
        t.encode("utf-8")
    except UnicodeEncodeError as exc:  # the tokenizer would fail with a bare TypeError
        raise ValueError(f"text {i} holds a lone surrogate {t[exc.start]!r} at character {exc.start}, which is not "
                         "Unicode text; decode its source with errors='replace' (or remove it)") from None


def _text_source(texts: object) -> Iterable[str]:
    """`texts` as an iterable of items to check one by one; a clear error for a wrong container."""
    if isinstance(texts, str):
        return [texts]
    if isinstance(texts, (bytes, bytearray, memoryview)):
        raise TypeError(f"texts is {type(texts).__name__}, not a str; decode it first, e.g. data.decode('utf-8')")
    if not isinstance(texts, Iterable):
        raise TypeError(f"texts must be a str or an iterable of str (a list, a generator, ...), got "
                        f"{type(texts).__name__}")
    return texts


def _checked_stream(texts: str | Iterable[str]) -> Iterator[str]:
    for i, t in enumerate(_text_source(texts)):
        _check_one(i, t)
        yield t


def encode(lm: LoadedModel, text: str, *, truncate: bool = False) -> Encoded:
    """Tokenise one text with its special tokens, checking the model's context limit."""
    return encode_many(lm, [text], truncate=truncate)[0]


def encode_many(lm: LoadedModel, texts: Sequence[str], *, truncate: bool = False, first_index: int = 0) -> list[Encoded]:
    """Tokenise texts in one call of the (Rust) fast tokenizer, checking the context limit of each.

    Errors name a text by its position, counted from `first_index` (where `texts` is part of a stream).
    """
    tok, limit = lm.tokenizer, lm.max_length
    enc = tok(list(texts), return_offsets_mapping=True, return_special_tokens_mask=True, add_special_tokens=True)
    out = []
    for i, text in enumerate(texts):
        ids, offsets, special = enc["input_ids"][i], enc["offset_mapping"][i], enc["special_tokens_mask"][i]
        if len(ids) > limit:
            if not truncate:
                raise ValueError(
                    f"text {first_index + i} (starting {text[:40]!r}) has {len(ids)} tokens; {lm.name} takes at most {limit}. "
                    "Split it, or pass truncate=True (CLI: --truncate) to keep its first tokens."
                )
            warnings.warn(f"{lm.name}: truncating a text of {len(ids)} tokens to the model's limit of {limit}",
                          stacklevel=3)
            cut = tok(text, return_offsets_mapping=True, return_special_tokens_mask=True, truncation=True,
                      max_length=limit)
            ids, offsets, special = cut["input_ids"], cut["offset_mapping"], cut["special_tokens_mask"]
        flags = tuple(bool(s) for s in special)
        spans = tuple((0, 0) if s else (int(a), int(b)) for (a, b), s in zip(offsets, flags))
        out.append(Encoded(text=text, ids=tuple(ids), spans=spans, special=flags))
    return out


def encode_targets(lm: LoadedModel, targets: Sequence[str], *, truncate: bool = False) -> list[Encoded]:
    """The decoder's inputs for target texts, as in training (teacher forcing): the model's decoder
    start token, a special unit of its own, then the target's tokens."""
    start = lm.config.decoder_start_token_id
    if start is None:
        raise ValueError(f"{lm.name}: the config names no decoder_start_token_id, so the decoder's input is unknown")
    return [Encoded(text=e.text, ids=(int(start),) + e.ids, spans=((0, 0),) + e.spans, special=(True,) + e.special)
            for e in encode_many(lm, targets, truncate=truncate)]


def seq2seq_inputs(sources: Sequence[Encoded], targets: Sequence[Encoded], device: torch.device) -> dict:
    """Keyword arguments of one encoder–decoder forward pass: both sides right-padded, attention asked for."""
    ids, mask = pad_batch(sources, device)
    decoder_ids, decoder_mask = pad_batch(targets, device)
    return dict(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids, decoder_attention_mask=decoder_mask,
                output_attentions=True, use_cache=False)


def is_seq2seq(lm: LoadedModel) -> bool:
    """True for a model of an encoder–decoder family (extract takes a target text)."""
    family = SUPPORTED_TYPES.get(lm.model_type)
    return family is not None and family.kind == "encoder-decoder"


def base_model(lm: LoadedModel) -> torch.nn.Module:
    """The transformer without its task head (LlamaForCausalLM -> LlamaModel)."""
    m = lm.model
    return getattr(m, getattr(m, "base_model_prefix", ""), m)


def forward_one_stream(lm: LoadedModel, ids: torch.Tensor, mask: torch.Tensor, *, output_attentions: bool):
    """One forward pass over a batch of single texts: the base model, or an encoder–decoder's encoder
    alone (its self-attention over the text is the model's one-text view: extract without a target)."""
    base = base_model(lm)
    if is_seq2seq(lm):  # the encoder stack takes no use_cache (T5's refuses it)
        return base.get_encoder()(input_ids=ids, attention_mask=mask, output_attentions=output_attentions)
    return base(input_ids=ids, attention_mask=mask, output_attentions=output_attentions, use_cache=False)


def pad_batch(items: Sequence[Encoded], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded `input_ids` and `attention_mask`, both (B, T)."""
    t_max = max(len(e.ids) for e in items)
    ids = torch.zeros(len(items), t_max, dtype=torch.long)
    mask = torch.zeros(len(items), t_max, dtype=torch.long)
    for i, e in enumerate(items):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        mask[i, : len(e.ids)] = 1
    return ids.to(device), mask.to(device)


@torch.inference_mode()
def forward_batch(lm: LoadedModel, items: Sequence[Encoded], layers: Sequence[int] | None = None) -> list[torch.Tensor]:
    """Attention of the chosen layers (all by default) for one batch: a list of (B, nh, T, T).

    When only some layers are wanted, hooks on those layers' attention modules catch their weights
    and the model is asked for none, so the other layers' O(T²) tensors are never kept alive.
    """
    wanted = list(range(lm.config.num_hidden_layers)) if layers is None else list(layers)
    ids, mask = pad_batch(items, lm.device)
    if len(wanted) < lm.config.num_hidden_layers:
        caught = _forward_hooked(lm, ids, mask, wanted)
        if caught is not None:
            return caught
    out = forward_one_stream(lm, ids, mask, output_attentions=True)
    att = getattr(out, "attentions", None)
    if not att or any(a is None for a in att):
        raise RuntimeError(
            f"{lm.name} returned no attention weights although it runs eager attention "
            f"(implementation {lm.config._attn_implementation!r}); this model class does not expose them."
        )
    return [att[layer] for layer in wanted]


def _forward_hooked(lm: LoadedModel, ids, mask, wanted: list[int]) -> list[torch.Tensor] | None:
    """The wanted layers' weights caught from their attention modules; None where that cannot work."""
    try:
        family = family_for(lm.config)
    except (UnsupportedArchitecture, UnsupportedFeature):
        return None
    base = base_model(lm)
    caught: dict[int, torch.Tensor | None] = {}

    def grab(layer):
        def hook(module, args, out):
            # the weights come last: (output, weights), or (output, position_bias, weights) in T5
            caught[layer] = out[-1] if isinstance(out, tuple) and len(out) > 1 else None
        return hook

    handles = [family.attention(base, layer).register_forward_hook(grab(layer)) for layer in wanted]
    try:
        forward_one_stream(lm, ids, mask, output_attentions=False)
    finally:
        for h in handles:
            h.remove()
    if any(caught.get(layer) is None for layer in wanted):
        return None
    return [caught[layer] for layer in wanted]


def iter_extract(
    lm: LoadedModel,
    texts: str | Iterable[str],
    *,
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
    """
    _check_count(batch_size, "batch_size")
    _check_count(window, "window")
    if level not in ("token", "word"):
        raise ValueError(f"level must be 'token' or 'word', got {level!r}")
    _check_store_dtype(store_dtype)
    if weight not in ("attention", "norm"):
        raise ValueError(f"weight must be 'attention' or 'norm', got {weight!r}")
    if target is not None and weight != "attention":
        raise ValueError("weight='norm' is for self-attention of one stack; extract an encoder-decoder's pairs "
                         "with weight='attention'")
    if target is not None:
        if not is_seq2seq(lm):
            raise ValueError(f"target= is for encoder-decoder models; {lm.name} ({lm.model_type}) has no decoder "
                             "reading a source")
        if layers is not None or heads is not None:
            raise ValueError(f"{lm.name} is an encoder-decoder model; layers= and heads= select in one stack only, "
                             "so extract all and index the maps")
        return _iter_seq2seq(lm, _text_source(texts), target, batch_size=batch_size, level=level,
                             store_dtype=store_dtype, truncate=truncate, segmenter=segmenter)
    layer_idx = _select(layers, lm.config.num_hidden_layers, "layer")
    head_idx = _select(heads, lm.config.num_attention_heads, "head")
    texts = _text_source(texts)
    # Checked above, before the first text is asked for; the texts themselves are checked as they stream.
    return _windows(lm, texts, batch_size, window, level, layer_idx, head_idx, store_dtype, truncate, segmenter,
                    weight)


def _windows(lm, texts, batch_size, window, level, layer_idx, head_idx, store_dtype, truncate, segmenter, weight):
    pending: list[str] = []
    done = 0  # texts already yielded, so errors can name a text by its position in the whole stream
    for text in _checked_stream(texts):
        pending.append(text)
        if len(pending) == batch_size * window:
            yield from _run_window(lm, pending, batch_size, level, layer_idx, head_idx, store_dtype, truncate,
                                   segmenter, done, weight)
            done, pending = done + len(pending), []
    if pending:
        yield from _run_window(lm, pending, batch_size, level, layer_idx, head_idx, store_dtype, truncate, segmenter,
                               done, weight)


def extract(lm: LoadedModel, texts: str | Iterable[str], **kwargs) -> list[AttentionMap]:
    """Attention of each text as a list of `AttentionMap` (`[layer, head, query, key]`, no padding).

    For an encoder–decoder model, `extract(lm, source, target=...)` gives one `Seq2SeqAttention` per
    (source, target) pair: encoder self, decoder self and cross attention, each with its own units.

    >>> from headscope.probe import load_model, extract                       # doctest: +SKIP
    >>> [m] = extract(load_model("minilm"), "The animal didn't cross the street")  # doctest: +SKIP
    >>> m.attention.shape, m.labels[:3]                               # doctest: +SKIP
    (torch.Size([6, 12, 10, 10]), ('[CLS]', 'The', 'animal'))
    """
    return list(iter_extract(lm, texts, **kwargs))


def _select(chosen: Sequence[int] | None, n: int, what: str) -> list[int]:
    if chosen is None:
        return list(range(n))
    if isinstance(chosen, (str, bytes)) or not isinstance(chosen, Iterable):
        raise TypeError(f"{what}s must be a list of {what} indices such as [0, 2] (or None for all), got {chosen!r}")
    out = sorted({_index(c, what) for c in chosen})
    if not out:
        raise ValueError(f"{what}s is empty; pass None for all {what}s or a list such as [0, 2] "
                         f"(the model has {what}s 0..{n - 1})")
    bad = [c for c in out if not 0 <= c < n]
    if bad:
        raise ValueError(f"{what}s {bad} out of range: the model has {what}s 0..{n - 1}")
    return out


def _index(value: object, what: str) -> int:
    """A whole-number index; a float (1.5 would silently mean 1) or a bool (True would mean 1) is an error."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"{what} index {value!r} is a {type(value).__name__}; {what}s are whole numbers such as 0 or 3")


def _check_count(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a whole number such as 8, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1")


def _check_store_dtype(store_dtype: object) -> None:
    # Attention weights are probabilities in [0, 1]: an integer dtype would round them all to 0.
    if not isinstance(store_dtype, torch.dtype) or not store_dtype.is_floating_point:
        raise TypeError(f"store_dtype must be a floating-point torch.dtype (torch.float32, torch.float16 or "
                        f"torch.bfloat16), got {store_dtype!r}")


def _run_window(lm, texts, batch_size, level, layer_idx, head_idx, store_dtype, truncate, segmenter, first_index,
                weight="attention"):
    encoded = encode_many(lm, texts, truncate=truncate, first_index=first_index)
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].ids))
    results: dict[int, AttentionMap] = {}
    all_layers = len(layer_idx) == lm.config.num_hidden_layers
    all_heads = len(head_idx) == lm.config.num_attention_heads
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        att = forward_batch(lm, [encoded[i] for i in chunk], layer_idx)
        picked = torch.stack(att, dim=1)  # (B, L, nh, T, T)
        if not all_heads:
            picked = picked[:, :, head_idx]
        norms = _norms(lm, [encoded[i].text for i in chunk], truncate) if weight == "norm" else None
        for b, i in enumerate(chunk):
            n = len(encoded[i].ids)
            a = picked[b, :, :, :n, :n].to("cpu", store_dtype, copy=True)  # [layer, head, query, key]
            amap = _make_map(lm, encoded[i], a, segmenter, () if all_layers else tuple(layer_idx),
                             () if all_heads else tuple(head_idx))
            if norms is not None:
                from .norms import norm_weighted  # norms builds on extract: imported when asked for

                amap = norm_weighted(amap, norms[b])
            results[i] = to_word_level(amap) if level == "word" else amap
        del att, picked
    for i in range(len(texts)):
        yield results.pop(i)


def _norms(lm, texts: list[str], truncate: bool) -> list:
    """Norm-based attention of one batch of texts (`probe.norms`), in order; truncation already warned about."""
    from .norms import norm_attention

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return norm_attention(lm, texts, batch_size=len(texts), truncate=truncate)


def _iter_seq2seq(lm, sources, targets, *, batch_size, level, store_dtype, truncate, segmenter):
    sources, targets = check_texts(sources), check_texts(targets)
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} source texts but {len(targets)} targets; give one target per source")
    src, tgt = encode_many(lm, sources, truncate=truncate), encode_targets(lm, targets, truncate=truncate)
    for start in range(0, len(src), batch_size):
        s_items, t_items = src[start : start + batch_size], tgt[start : start + batch_size]
        att = forward_seq2seq(lm, s_items, t_items)
        for b, (s_enc, t_enc) in enumerate(zip(s_items, t_items)):
            ns, nt = len(s_enc.ids), len(t_enc.ids)

            def keep(kind, nq, nk):  # [layer, head, query, key] of item b, padding cut
                return att[kind][b, :, :, :nq, :nk].to("cpu", store_dtype, copy=True)

            encoder = _make_map(lm, s_enc, keep("encoder", ns, ns), segmenter, (), (), causal=False)
            decoder = _make_map(lm, t_enc, keep("decoder", nt, nt), segmenter, (), (), causal=True)
            cross = CrossAttentionMap(queries=Units.of(decoder), keys=Units.of(encoder),
                                      attention=keep("cross", nt, ns), meta=dict(encoder.meta))
            pair = Seq2SeqAttention(encoder=encoder, decoder=decoder, cross=cross)
            yield to_word_level(pair) if level == "word" else pair
        del att


_SEQ2SEQ_ATTENTIONS = {"encoder": "encoder_attentions", "decoder": "decoder_attentions", "cross": "cross_attentions"}


@torch.inference_mode()
def forward_seq2seq(lm: LoadedModel, sources: Sequence[Encoded], targets: Sequence[Encoded]) -> dict[str, torch.Tensor]:
    """Encoder self, decoder self and cross attention of one batch: "encoder" (B, L, nh, S, S),
    "decoder" (B, L, nh, T, T), "cross" (B, L, nh, T, S)."""
    out = base_model(lm)(**seq2seq_inputs(sources, targets, lm.device))
    found = {}
    for kind, name in _SEQ2SEQ_ATTENTIONS.items():
        att = getattr(out, name, None)
        if not att or any(a is None for a in att):
            raise RuntimeError(f"{lm.name} returned no {kind} attention weights although it runs eager attention")
        found[kind] = torch.stack(att, dim=1)
    return found


def token_labels(lm: LoadedModel, enc: Encoded) -> tuple[str, ...]:
    """Display string per token: its text in the input, or the raw piece for specials and byte pieces."""
    return tokenizer_labels(lm.tokenizer, enc)


def tokenizer_labels(tokenizer, enc: Encoded) -> tuple[str, ...]:
    """`token_labels` from the tokenizer alone (for attention computed outside headscope)."""
    raw = tokenizer.convert_ids_to_tokens(list(enc.ids))
    return tuple(r if sp or not enc.text[a:b].strip() else enc.text[a:b].strip()
                 for r, (a, b), sp in zip(raw, enc.spans, enc.special))


def text_units(lm: LoadedModel, enc: Encoded, segmenter: Segmenter | None = None) -> Units:
    """The token units of one text (labels, spans, special flags, words, ids): an `AttentionMap`'s, without
    the attention (for attention that comes in blocks of rows, `probe.recompute`)."""
    unit_of_token, unit_spans, _ = assign_words(enc.text, enc.spans, enc.special, segmenter)
    return Units(text=enc.text, level="token", labels=token_labels(lm, enc), spans=enc.spans, special=enc.special,
                 word_index=tuple(unit_of_token), word_spans=tuple(unit_spans), token_ids=enc.ids)


def _make_map(lm, enc: Encoded, attention, segmenter, layers, heads, *, causal: bool | None = None) -> AttentionMap:
    units = text_units(lm, enc, segmenter)
    return AttentionMap(
        text=units.text,
        level="token",
        labels=units.labels,
        spans=units.spans,
        special=units.special,
        attention=attention,
        causal=lm.is_causal if causal is None else causal,
        word_index=units.word_index,
        word_spans=units.word_spans,
        token_ids=units.token_ids,
        layers=layers,
        heads=heads,
        meta={"model": lm.name, "dtype": str(lm.dtype).replace("torch.", "")},
    )


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
    _check_count(batch_size, "batch_size")
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
    layer_idx = _select(layers, lm.config.num_hidden_layers, "layer")
    head_idx = _select(heads, lm.config.num_attention_heads, "head")
    out = []
    for start in range(0, len(encoded), batch_size):
        chunk = encoded[start : start + batch_size]
        att = forward_batch(lm, chunk, layer_idx)
        picked = torch.stack(att, dim=1)  # (B, L, nh, T, T)
        if len(head_idx) < lm.config.num_attention_heads:
            picked = picked[:, :, head_idx]  # (B, L, H, T, T)
        for b, enc in enumerate(chunk):
            n = len(enc.ids)
            out.append(AttentionMap(
                text="", level="token", labels=tuple(lm.tokenizer.convert_ids_to_tokens(list(enc.ids))),
                spans=enc.spans, special=enc.special,
                attention=picked[b, :, :, :n, :n].to("cpu", store_dtype, copy=True),  # [layer, head, query, key]
                causal=lm.is_causal, word_index=tuple(range(n)), token_ids=enc.ids,
                layers=() if layers is None else tuple(layer_idx), heads=() if heads is None else tuple(head_idx),
                meta={"model": lm.name, "dtype": str(lm.dtype).replace("torch.", "")},
            ))
    return out


def _token_ids(i: int, seq: object) -> tuple[int, ...]:
    if isinstance(seq, (str, bytes, bytearray)) or not isinstance(seq, Iterable):
        raise TypeError(f"sequence {i} is a {type(seq).__name__}; each sequence is a list of token ids (ints), "
                        "e.g. sequences=[[5, 17, 2]]")
    return tuple(_index(t, f"sequence {i}: token id") for t in seq)


def special_prefix(tokenizer) -> list[int]:
    """The ids of the special tokens the tokenizer itself puts at the start of a text (Gemma's <bos>;
    none for SmolLM2, which adds none)."""
    enc = tokenizer("a", add_special_tokens=True, return_special_tokens_mask=True)
    prefix = []
    for i, sp in zip(enc["input_ids"], enc["special_tokens_mask"]):
        if not sp:
            break
        prefix.append(int(i))
    return prefix


def ordinary_token_ids(lm: LoadedModel) -> list[int]:
    """The vocabulary's ids without special or added tokens: what random token sequences are drawn from."""
    tok = lm.tokenizer
    excluded = set(getattr(tok, "all_special_ids", [])) | set(getattr(tok, "added_tokens_decoder", {}) or {})
    return [i for i in range(min(len(tok), lm.config.vocab_size)) if i not in excluded]


def fit_context(lm: LoadedModel, text: str) -> str:
    """`text` cut after the last token that fits `lm`'s context (special tokens included); unchanged if it fits.

    >>> from headscope.probe.tiny import tiny_model
    >>> lm = tiny_model("bert")
    >>> fit_context(lm, "The cat sat.") == "The cat sat."
    True
    >>> long = fit_context(lm, "cat " * 5000)
    >>> len(lm.tokenizer(long)["input_ids"]) <= lm.max_length < len(lm.tokenizer("cat " * 5000)["input_ids"])
    True
    """
    if len(lm.tokenizer(text)["input_ids"]) <= lm.max_length:
        return text
    with warnings.catch_warnings():  # the caller asked for the cut; encode's "truncating" warning says it again
        warnings.simplefilter("ignore")
        enc = encode(lm, text, truncate=True)
    return text[: max(b for (a, b), special in zip(enc.spans, enc.special) if not special)]
