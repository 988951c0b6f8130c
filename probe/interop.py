"""Attention that users computed themselves, as headscope `AttentionMap`s.

- `from_hf(outputs, encoding, tokenizer)`: a user's own `model(**encoding, output_attentions=True)`
  call, batched and padded on either side; padding is removed with the encoding's attention mask.
  An encoder–decoder's outputs (encoder, decoder and cross attentions) give one `Seq2SeqAttention`
  per row, as `extract(lm, source, target=...)` does.
- `from_transformer_lens(cache, tokens)`: the `hook_pattern` of every layer of a TransformerLens
  `ActivationCache` (transformer-lens is not imported: anything that answers
  `cache["pattern", layer]` with a `[batch, head, query, key]` tensor works).
- `long_frame(maps)`: one row per (text, layer, head, query, key) for pandas/seaborn users.

Labels, spans, special flags and words come from the same helpers as `extract`, so `from_hf` of a
forward pass equals `extract`'s map of the same text. The maps are copies (float32, on the CPU): the
caller's tensors are never modified or kept.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .encoding import Encoded, special_ids, tokenizer_labels
from .types import AttentionMap, CrossAttentionMap, Level, Seq2SeqAttention, Units
from .words import Segmenter, assign_words, to_word_level

__all__ = ["from_hf", "from_transformer_lens", "long_frame"]

LONG_COLUMNS = ["text", "layer", "head", "query", "query_token", "key", "key_token", "weight"]


def from_hf(
    outputs: Any,
    encoding: Any,
    tokenizer: Any,
    *,
    text: str | Sequence[str] | None = None,
    target: str | Sequence[str] | None = None,
    level: Level = "token",
    causal: bool | None = None,
    segmenter: Segmenter | None = None,
    name: str | None = None,
) -> list[AttentionMap] | list[Seq2SeqAttention]:
    """One `AttentionMap` per row of a Hugging Face forward pass run with `output_attentions=True`.

    `outputs` is the model's output (or its `.attentions` tuple: one `[batch, head, query, key]`
    tensor per layer); `encoding` the tokenizer's output that went in (`input_ids`, and
    `attention_mask` when padded). `text` (the strings that were tokenised; the encoding does not
    keep them) gives character spans and words: offsets come from the encoding's `offset_mapping`
    (`return_offsets_mapping=True`) or, without it, from tokenising `text` again. Without `text` the
    units are the raw tokens and only `level="token"` is possible. `causal=None` reads it off the
    weights: causal when no query attends to a later key.

    Encoder–decoder outputs (`encoder_attentions`, `decoder_attentions`, `cross_attentions`) give one
    `Seq2SeqAttention` per row instead. The encoding must then hold the decoder's input as well
    (`decoder_input_ids`, and `decoder_attention_mask` when padded), as the forward pass took it;
    `text` are the sources and `target` the targets (the decoder's input is the model's decoder start
    token, then the target's tokens, as `probe.encoding.encode_targets` builds it).

    >>> from headscope.probe.tiny import tiny_model                                   # doctest: +SKIP
    >>> enc = tok(texts, padding=True, return_offsets_mapping=True, return_tensors="pt")  # doctest: +SKIP
    >>> out = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask, output_attentions=True)  # doctest: +SKIP
    >>> maps = from_hf(out, enc, tok, text=texts)                                   # doctest: +SKIP
    """
    if _is_seq2seq(outputs):
        return _from_hf_seq2seq(outputs, encoding, tokenizer, text=text, target=target, level=level,
                                segmenter=segmenter, name=name)
    if target is not None:
        raise ValueError("target= is for an encoder–decoder's outputs; these hold one stack's attentions")
    return [_to_map(enc, att, tokenizer, causal=causal, level=level, segmenter=segmenter, name=name,
                    source="from_hf")
            for enc, att, _ in _hf_rows(_hf_attentions(outputs), encoding, tokenizer, text)]


def _hf_rows(layers: list[torch.Tensor], encoding, tokenizer, text, *, ids_key: str = "input_ids",
             mask_key: str = "attention_mask", offsets: bool = True):
    """Per row of a batch: its `Encoded`, its attention `[layer, head, query, key]` with padding cut, and
    the positions kept (padding removed, left or right). `offsets=False`: the encoding's offsets and
    special-token mask belong to another side (an encoder–decoder's source), so the text is tokenised again."""
    ids, batched = _rows(encoding[ids_key])
    rows = lambda key: _rows(encoding[key], batched)[0] if offsets and _has(encoding, key) else None  # noqa: E731
    mask = _rows(encoding[mask_key], batched)[0] if _has(encoding, mask_key) else [[1] * len(r) for r in ids]
    texts = _texts(text, len(ids))
    offsets, specials = rows("offset_mapping"), rows("special_tokens_mask")
    if layers[0].shape[0] != len(ids):
        raise ValueError(f"the outputs hold {layers[0].shape[0]} rows but the encoding {len(ids)}; pass the "
                         "encoding that went into this forward pass")
    out = []
    for b, row_ids in enumerate(ids):
        keep = [i for i, m in enumerate(mask[b]) if m]  # padding removed, left or right
        kept_ids = [int(row_ids[i]) for i in keep]
        flags = ([bool(specials[b][i]) or f for i, f in zip(keep, _special_flags(tokenizer, kept_ids))]
                 if specials is not None else _special_flags(tokenizer, kept_ids))
        if texts is None:
            enc = Encoded(text="", ids=tuple(kept_ids), spans=((0, 0),) * len(keep), special=tuple(flags))
        elif offsets is not None and specials is not None:
            spans = tuple((0, 0) if sp else (int(offsets[b][i][0]), int(offsets[b][i][1])) for i, sp in zip(keep, flags))
            enc = Encoded(text=texts[b], ids=tuple(kept_ids), spans=spans, special=tuple(flags))
        else:
            enc = _encode_like(tokenizer, texts[b], kept_ids)
        idx = torch.tensor(keep, dtype=torch.long)
        out.append((enc, _rows_and_keys(layers, b, idx, idx), idx))
    return out


def _rows_and_keys(layers: list[torch.Tensor], b: int, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Row `b` of every layer's `[batch, head, query, key]`, the given query and key positions only (a copy)."""
    att = torch.stack([a[b].detach().to("cpu", torch.float32) for a in layers])  # [layer, head, T, S]
    return att.index_select(-2, queries).index_select(-1, keys).clone()  # [layer, head, query, key]


# An encoder–decoder's output fields, by the stack they come from.
_SEQ2SEQ_FIELDS = {"encoder": "encoder_attentions", "decoder": "decoder_attentions", "cross": "cross_attentions"}


def _is_seq2seq(outputs: Any) -> bool:
    return all(getattr(outputs, f, None) is not None for f in _SEQ2SEQ_FIELDS.values())


def _from_hf_seq2seq(outputs, encoding, tokenizer, *, text, target, level: Level, segmenter, name) -> list[Seq2SeqAttention]:
    """One `Seq2SeqAttention` per row: the encoder's maps over the sources, the decoder's (causal) over the
    decoder's input, and the cross-attention between them, padding cut on both sides."""
    if not _has(encoding, "decoder_input_ids"):
        raise ValueError("these are an encoder–decoder's outputs: pass an encoding that also holds the "
                         "decoder_input_ids (and decoder_attention_mask when padded) that went into the forward pass")
    if level not in ("token", "word"):
        raise ValueError(f"level must be 'token' or 'word', got {level!r}")
    if level == "word" and (text is None or target is None):
        raise ValueError("level='word' needs the texts: pass text= (the sources) and target= (the targets)")
    stacks = {kind: list(getattr(outputs, f)) for kind, f in _SEQ2SEQ_FIELDS.items()}
    sources = _hf_rows(stacks["encoder"], encoding, tokenizer, text)
    targets = _hf_rows(stacks["decoder"], encoding, tokenizer, target, ids_key="decoder_input_ids",
                       mask_key="decoder_attention_mask", offsets=False)
    pairs = []
    for b, ((s_enc, s_att, s_idx), (t_enc, t_att, t_idx)) in enumerate(zip(sources, targets)):
        kw = dict(level="token", segmenter=segmenter, name=name, source="from_hf")
        encoder = _to_map(s_enc, s_att, tokenizer, causal=False, **kw)
        decoder = _to_map(t_enc, t_att, tokenizer, causal=True, **kw)
        cross = CrossAttentionMap(queries=Units.of(decoder), keys=Units.of(encoder),
                                  attention=_rows_and_keys(stacks["cross"], b, t_idx, s_idx), meta=dict(encoder.meta))
        pair = Seq2SeqAttention(encoder=encoder, decoder=decoder, cross=cross)
        pairs.append(to_word_level(pair) if level == "word" else pair)
    return pairs


def from_transformer_lens(
    cache: Any,
    tokens: Any,
    *,
    text: str | Sequence[str] | None = None,
    tokenizer: Any = None,
    attention_mask: Any = None,
    n_layers: int | None = None,
    level: Level = "token",
    causal: bool | None = True,
    segmenter: Segmenter | None = None,
    name: str | None = None,
) -> list[AttentionMap]:
    """One `AttentionMap` per row of a TransformerLens `ActivationCache` (`run_with_cache(tokens)`).

    `tokens` are the ids that went in (`[batch, pos]` or `[pos]`, as from `model.to_tokens`); the
    tokenizer defaults to `cache.model.tokenizer`. With `text` the tokens are matched to the text's
    own tokenisation (TransformerLens prepends its BOS itself) for character spans and words.
    `attention_mask` (`[batch, pos]`) drops padding of a padded batch. TransformerLens models are
    decoders, so `causal=True` unless told otherwise (`None` reads it off the weights).
    """
    model = getattr(cache, "model", None)
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if n_layers is None:
        n_layers = getattr(getattr(model, "cfg", None), "n_layers", None)
    layers = _tl_patterns(cache, n_layers)
    ids, batched = _rows(tokens)
    mask = _rows(attention_mask, batched)[0] if attention_mask is not None else [[1] * len(r) for r in ids]
    texts = _texts(text, len(ids))
    if texts is not None and tokenizer is None:
        raise ValueError("text= needs the tokenizer (pass tokenizer=, or a cache whose .model has one)")
    if layers[0].shape[0] != len(ids) or layers[0].shape[-1] != len(ids[0]):
        raise ValueError(f"the cache holds patterns of shape {tuple(layers[0].shape)} but tokens are "
                         f"{len(ids)} × {len(ids[0])}; pass the tokens the cache was run on")
    maps = []
    for b, row_ids in enumerate(ids):
        keep = [i for i, m in enumerate(mask[b]) if m]
        kept_ids = [int(row_ids[i]) for i in keep]
        if texts is not None:
            enc = _encode_like(tokenizer, texts[b], kept_ids)
        else:
            flags = _special_flags(tokenizer, kept_ids) if tokenizer is not None else [False] * len(keep)
            enc = Encoded(text="", ids=tuple(kept_ids), spans=((0, 0),) * len(keep), special=tuple(flags))
        idx = torch.tensor(keep, dtype=torch.long)
        att = torch.stack([p[b].detach().to("cpu", torch.float32) for p in layers])  # [layer, head, T, T]
        att = att.index_select(-2, idx).index_select(-1, idx).clone()  # [layer, head, query, key]
        maps.append(_to_map(enc, att, tokenizer, causal=causal, level=level, segmenter=segmenter,
                            name=name or _tl_name(model), source="from_transformer_lens"))
    return maps


def long_frame(maps: AttentionMap | Sequence[AttentionMap]):
    """Long format, one row per (text, layer, head, query, key), in that order (C order of the tensor).

    Every cell is a row, masked ones (a causal query's later keys) included with weight 0, so
    `frame.groupby([...]).weight.sum()` over keys is 1 per query.

    >>> m = AttentionMap(text="a b", level="token", labels=("a", "b"), spans=((0, 1), (2, 3)),
    ...                  special=(False, False), attention=torch.tensor([[[[1.0, 0.0], [0.25, 0.75]]]]), causal=True)
    >>> long_frame(m).iloc[2:].to_dict("records")[0]
    {'text': 'a b', 'layer': 0, 'head': 0, 'query': 1, 'query_token': 'b', 'key': 0, 'key_token': 'a', 'weight': 0.25}
    """
    import numpy as np
    import pandas as pd

    frames = []
    for m in [maps] if isinstance(maps, AttentionMap) else maps:
        n_l, n_h, t, _ = m.attention.shape  # [layer, head, query, key]
        layer, head, query, key = (g.reshape(-1) for g in np.indices((n_l, n_h, t, t)))
        labels = np.asarray(m.labels, dtype=object)
        frames.append(pd.DataFrame({
            "text": m.text,
            "layer": np.asarray(m.layer_ids, dtype=np.int64)[layer],
            "head": np.asarray(m.head_ids, dtype=np.int64)[head],
            "query": query.astype(np.int64),
            "query_token": labels[query] if t else np.asarray([], dtype=object),
            "key": key.astype(np.int64),
            "key_token": labels[key] if t else np.asarray([], dtype=object),
            "weight": m.attention.detach().to("cpu", torch.float64).reshape(-1).numpy(),
        }))
    if not frames:
        return pd.DataFrame({c: [] for c in LONG_COLUMNS})
    return pd.concat(frames, ignore_index=True)[LONG_COLUMNS]


# --- shared pieces ------------------------------------------------------------------------------


def _to_map(enc: Encoded, att: torch.Tensor, tokenizer, *, causal: bool | None, level: Level,
            segmenter: Segmenter | None, name: str | None, source: str) -> AttentionMap:
    if level not in ("token", "word"):
        raise ValueError(f"level must be 'token' or 'word', got {level!r}")
    if level == "word" and not enc.text:
        raise ValueError("level='word' needs the text: pass text= (the string(s) that were tokenised)")
    if enc.text:
        unit_of_token, unit_spans, _ = assign_words(enc.text, enc.spans, enc.special, segmenter)
        labels = tokenizer_labels(tokenizer, enc)
    else:
        unit_of_token, unit_spans = list(range(len(enc.ids))), []
        labels = (tuple(tokenizer.convert_ids_to_tokens(list(enc.ids))) if tokenizer is not None
                  else tuple(str(i) for i in enc.ids))
    amap = AttentionMap(
        text=enc.text, level="token", labels=labels, spans=enc.spans, special=enc.special, attention=att,
        causal=_is_causal(att) if causal is None else bool(causal), word_index=tuple(unit_of_token),
        word_spans=tuple(unit_spans), token_ids=enc.ids,
        meta={"model": name or str(getattr(tokenizer, "name_or_path", "") or ""), "dtype": "float32",
              "source": source},
    )
    return to_word_level(amap) if level == "word" else amap


def _is_causal(att: torch.Tensor) -> bool:
    """No query attends to a later key (`[layer, head, query, key]`)."""
    t = att.shape[-1]
    upper = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    return bool(att[..., upper].abs().max() == 0) if t > 1 else True


def _hf_attentions(outputs) -> list[torch.Tensor]:
    att = outputs if isinstance(outputs, (tuple, list)) else getattr(outputs, "attentions", None)
    if att is None and isinstance(outputs, dict):
        att = outputs.get("attentions")
    if not att or any(a is None for a in att):
        raise ValueError("the outputs carry no attention weights; call the model with output_attentions=True "
                         "(loaded with attn_implementation='eager')")
    return list(att)


def _tl_patterns(cache, n_layers: int | None) -> list[torch.Tensor]:
    """`cache["pattern", layer]` for every layer: all of `range(n_layers)`, or until the cache has no more."""
    out: list[torch.Tensor] = []
    layer = 0
    while n_layers is None or layer < n_layers:
        try:
            pattern = cache["pattern", layer]
        except (KeyError, IndexError):
            if n_layers is not None:
                raise ValueError(f"the cache has no attention pattern for layer {layer}; run the model with "
                                 "run_with_cache and keep the hook_pattern activations") from None
            break
        out.append(pattern if pattern.dim() == 4 else pattern[None])  # [batch, head, query, key]
        layer += 1
    if not out:
        raise ValueError("the cache holds no attention patterns (cache['pattern', 0] is missing)")
    return out


def _tl_name(model) -> str | None:
    cfg = getattr(model, "cfg", None)
    return getattr(cfg, "model_name", None)


def _has(encoding, key: str) -> bool:
    try:
        return encoding[key] is not None
    except (KeyError, TypeError):
        return False


def _rows(x, batched: bool | None = None) -> tuple[list[list], bool]:
    """`(rows, batched)`: a batch as nested lists, from a tensor, an array or lists.

    Whether `x` is a batch is read off the ids (`batched=None`: their first entry is a row) and then
    imposed on the fields that go with them, whose entries are pairs (offsets) even unbatched.
    """
    x = list(x.tolist() if hasattr(x, "tolist") else x)
    if batched is None:
        batched = bool(x) and isinstance(x[0], (list, tuple))
    return ([list(r) for r in x] if batched else [x]), batched


def _texts(text, n: int) -> list[str] | None:
    if text is None:
        return None
    texts = [text] if isinstance(text, str) else list(text)
    if len(texts) != n:
        raise ValueError(f"{len(texts)} text(s) given for a batch of {n}; pass one text per row")
    return texts


def _special_flags(tokenizer, ids: Sequence[int]) -> list[bool]:
    special = special_ids(tokenizer)  # as extract flags them: a special token typed in the text too
    return [int(i) in special for i in ids]


def _encode_like(tokenizer, text: str, ids: Sequence[int]) -> Encoded:
    """`text` tokenised for its offsets, matched to the `ids` that went into the model.

    The ids may carry special tokens the text's own tokenisation lacks (TransformerLens prepends
    BOS itself); every id outside the match must then be a special token.
    """
    for add in (True, False):
        enc = tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True, add_special_tokens=add)
        got = list(enc["input_ids"])
        for start in range(len(ids) - len(got) + 1):
            if list(ids[start : start + len(got)]) != got:
                continue
            flags = _special_flags(tokenizer, ids)
            outside = [i for i in range(len(ids)) if not start <= i < start + len(got)]
            if not all(flags[i] for i in outside):
                continue
            flags[start : start + len(got)] = [bool(f) or s for f, s in zip(enc["special_tokens_mask"],
                                                                               _special_flags(tokenizer, got))]  # as extract
            spans = [(0, 0)] * len(ids)
            for j, (a, b) in enumerate(enc["offset_mapping"]):
                if not flags[start + j]:
                    spans[start + j] = (int(a), int(b))
            return Encoded(text=text, ids=tuple(int(i) for i in ids), spans=tuple(spans), special=tuple(flags))
    raise ValueError(f"the tokens do not match the text starting {text[:40]!r} under this tokenizer; pass the "
                     "text that was tokenised, or the encoding's offset_mapping (return_offsets_mapping=True)")
