"""Text to tokens: checked texts, their token ids and character spans, padded batches, and a map's units.

Texts are checked as they stream (a clear error naming the text by its index), tokenised with their
special tokens in one call of the fast tokenizer, and held to the model's context limit. A batch is
padded on the right by us (no pad token needed, and a decoder's positions start at 0 whatever the
batch). An encoder–decoder's targets start with the model's decoder start token, as in training.
A token's label (`token_labels`, `tokenizer_labels`) is the same in every map, whether its attention
comes from `extract`, `recompute` or a user's own forward pass (`interop`); `text_units` gives a text's
units (labels, spans, special flags, words, ids) without the attention.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

import torch

from .model import LoadedModel
from .types import Units
from .words import Segmenter, assign_words

__all__ = ["Encoded", "image_slots", "refuse_unfilled_slots", "check_texts", "encode", "encode_many", "encode_targets", "pad_batch", "ModelBatch", "model_batch", "token_labels",
           "tokenizer_labels", "text_units", "fit_context", "special_prefix", "ordinary_token_ids", "TOO_LONG",
           "special_ids", "bounded_text", "token_count", "checked_stream", "text_source", "check_count"]


# The reason a text is left out of an analysis when it has more tokens than the model takes.
TOO_LONG = "longer than the model's context"


@dataclass(frozen=True)
class Encoded:
    """One tokenised text: ids, the tokens' character spans, and which are special.

    An image (`probe.images.encode_images`) is one too: its name as `text`, one placeholder id per unit,
    its normalised pixels, its patch grid (rows, columns), its units' labels and the picture as seen."""

    text: str
    ids: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]
    special: tuple[bool, ...]
    pixels: Any = None  # an image's pixel values [3, H, W] (torch), as its image processor made them
    grid: tuple[int, int] | None = None  # an image's patch grid: (rows, columns)
    labels: tuple[str, ...] = ()  # an image's unit labels: [CLS], [REG0], ..., r0c0, r0c1, ...
    picture: Any = None  # an image as the model saw it: numpy [H, W, 3] in 0..1
    # A text with images for a vision–language decoder (`probe.vision_language`): the processor's other inputs
    # for this one text (pixel_values, token_type_ids, ...; batch of one), each unit's ImagePatch or None, the
    # pictures as the model saw them, and the labels of the image units (None for a text token).
    inputs: Any = None
    patches: tuple = ()
    pictures: tuple = ()
    image_labels: tuple = ()


def check_count(value: object, name: str) -> int:
    """`value` when it is a whole number of at least 1 (a batch size, a count); else a TypeError or ValueError
    naming `name` — the one check of every API's `batch_size`, before a loop steps by it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a whole number such as 8, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value


def check_texts(texts: str | Iterable[str]) -> list[str]:
    """The texts as a list; a clear error for a non-string or an empty text (naming its index)."""
    return list(checked_stream(texts))


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


def text_source(texts: object) -> Iterable[str]:
    """`texts` as an iterable of items to check one by one; a clear error for a wrong container."""
    if isinstance(texts, str):
        return [texts]
    if isinstance(texts, (bytes, bytearray, memoryview)):
        raise TypeError(f"texts is {type(texts).__name__}, not a str; decode it first, e.g. data.decode('utf-8')")
    if isinstance(texts, Mapping):  # iterating a dict gives its keys: {"text": "a"} would analyse "text"
        raise TypeError(f"texts is a {type(texts).__name__}; pass a str or a list of str (e.g. list(d.values()))")
    if isinstance(texts, (set, frozenset)):  # no order: the results' order would change from run to run
        raise TypeError(f"texts is a {type(texts).__name__}, which has no order; pass a list (e.g. sorted(texts))")
    if not isinstance(texts, Iterable):
        raise TypeError(f"texts must be a str or an iterable of str (a list, a generator, ...), got "
                        f"{type(texts).__name__}")
    return texts


def checked_stream(texts: str | Iterable[str]) -> Iterator[str]:
    """`texts` one at a time, each checked as it comes (`check_texts` without holding them all)."""
    for i, t in enumerate(text_source(texts)):
        _check_one(i, t)
        yield t


def encode(lm: LoadedModel, text: str, *, truncate: bool = False) -> Encoded:
    """Tokenise one text with its special tokens, checking the model's context limit."""
    return encode_many(lm, [text], truncate=truncate)[0]


# A long text is first tokenised only as far as a context of `limit` tokens needs: a prefix of `limit` × this
# many characters (growing 4× while it holds too few tokens, up to _LOOK_MAX characters), so a huge line never
# reaches the tokenizer whole (a 65 MB line made the Rust tokenizer abort; 21 MB took 32 s and 3.4 GB).
_CHARS_PER_TOKEN = 16
_LOOK_MAX = 1 << 22


def bounded_text(tokenizer, text: str, limit: int) -> tuple[str, bool]:
    """`text` if it is short, else its first prefix (see `_CHARS_PER_TOKEN`) that already holds more than
    `limit` tokens; and whether it was cut. The first `limit` tokens of the prefix are those of `text`
    (a few tokens of margin cover the word cut at its end).

    >>> from headscope.probe.tiny import tiny_model
    >>> tok = tiny_model("bert").tokenizer
    >>> bounded_text(tok, "cat " * 3, 128), len(bounded_text(tok, "cat " * 10**6, 128)[0])
    (('cat cat cat ', False), 2048)
    """
    size = max(limit, 1) * _CHARS_PER_TOKEN
    while size < len(text):
        prefix = text[:size]
        if len(tokenizer(prefix, add_special_tokens=False)["input_ids"]) > limit + 8 or size >= _LOOK_MAX:
            return prefix, True
        size *= 4
    return text, False


def token_count(tokenizer, text: str, limit: int) -> tuple[int, bool]:
    """Tokens of `text` with its special tokens, and whether that is only a lower bound: a text far beyond
    `limit` is counted on a prefix (`bounded_text`), never whole."""
    shown, cut = bounded_text(tokenizer, text, limit)
    return len(tokenizer(shown)["input_ids"]), cut


def encode_many(lm: LoadedModel, texts: Sequence[str], *, truncate: bool = False, first_index: int = 0) -> list[Encoded]:
    """Tokenise texts in one call of the (Rust) fast tokenizer, checking the context limit of each.

    Errors name a text by its position, counted from `first_index` (where `texts` is part of a stream).
    A text far longer than the context is tokenised only on a prefix (`bounded_text`).
    """
    if not texts:  # the fast tokenizer fails on an empty batch
        return []
    tok, limit = lm.tokenizer, lm.max_length
    if tok is None:  # an image model (or a two-tower model's image tower): "'NoneType' object is not callable"
        raise ValueError(f"{lm.name} ({lm.model_type}) has no tokenizer, so it cannot read text: this takes a "
                         "text model (an image model reads images: --image FILE where a command takes one)")
    slots = image_slots(lm)
    looked = [bounded_text(tok, text, limit) for text in texts]
    enc = tok([shown for shown, _ in looked], return_offsets_mapping=True, return_special_tokens_mask=True,
              add_special_tokens=True)
    specials = special_ids(tok)
    out = []
    for i, text in enumerate(texts):
        ids, offsets, special = enc["input_ids"][i], enc["offset_mapping"][i], enc["special_tokens_mask"][i]
        shown, only_prefix = looked[i]
        if slots and (slots[0] in text or any(int(t) in slots[1] for t in ids)):
            raise _unfilled(text, slots[0], first_index + i)
        if len(ids) > limit:
            count = f"more than {limit} tokens ({len(text):,} characters)" if only_prefix else f"{len(ids)} tokens"
            if not truncate:
                raise ValueError(
                    f"text {first_index + i} (starting {text[:40]!r}) has {count}; {lm.name} takes at most {limit}. "
                    "Split it, or pass truncate=True (CLI: --truncate) to keep its first tokens."
                )
            warnings.warn(f"{lm.name}: truncating a text of {count} to the model's limit of {limit}",
                          stacklevel=3)
            cut = tok(shown, return_offsets_mapping=True, return_special_tokens_mask=True, truncation=True,
                      max_length=limit)
            ids, offsets, special = cut["input_ids"], cut["offset_mapping"], cut["special_tokens_mask"]
        flags = tuple(bool(s) or int(t) in specials for s, t in zip(special, ids))  # a "[SEP]" typed in the text too
        spans = tuple((0, 0) if s else (int(a), int(b)) for (a, b), s in zip(offsets, flags))
        out.append(Encoded(text=text, ids=tuple(ids), spans=spans, special=flags))
    return out


def image_slots(lm: LoadedModel) -> tuple[str, set[int]] | None:
    """A vision–language model's image slot (`<image>`, `<start_of_image>`, `<|image_pad|>`) and the ids that
    stand for an image in its texts (the slot's and the model's image token's); None for any other model."""
    slot = getattr(getattr(lm, "processor", None), "image_token", None) if getattr(lm, "reads_images", False) else None
    if not isinstance(slot, str) or lm.tokenizer is None:
        return None
    cfg = lm.model.config
    found = getattr(cfg, "image_token_id", None)
    ids = {found if found is not None else getattr(cfg, "image_token_index", None),
           lm.tokenizer.convert_tokens_to_ids(slot)} - {None, lm.tokenizer.unk_token_id}
    return slot, {int(i) for i in ids}


def refuse_unfilled_slots(lm: LoadedModel, texts: Iterable[str]) -> None:
    """Before any work, `encode_many`'s refusal of a text that holds an image slot (or the image token) with no
    image to fill it, read in the texts themselves (no tokenisation): for a command that reads them last."""
    slots = image_slots(lm)
    if slots is None:
        return
    typed = [t for t in lm.tokenizer.convert_ids_to_tokens(sorted(slots[1])) if t]
    for i, text in enumerate(texts):
        if any(t in text for t in (slots[0], *typed)):
            raise _unfilled(text, slots[0], i)


def _unfilled(text: str, slot: str, i: int) -> ValueError:
    """A text read without images may not hold an image slot (or the image token): no picture would fill it,
    and the model would read its id as an ordinary token."""
    return ValueError(f"text {i} (starting {text[:40]!r}) holds an image slot ({slot}) but no image fills it; "
                      f"give one image per slot (images=[...]; CLI: --image FILE), or take {slot} out of the text")


def special_ids(tokenizer) -> set[int]:
    """The ids that are special tokens wherever they stand: the tokenizer's special tokens but its unknown token.

    A tokenizer turns a "[SEP]" or "[MASK]" written in a text into the special token itself, yet its
    special-tokens mask flags only the ones it added; the model sees the same token either way, so
    headscope flags both (and `--no-special` drops both). The unknown token stands for real text.
    """
    unk = getattr(tokenizer, "unk_token_id", None)
    return {int(i) for i in (getattr(tokenizer, "all_special_ids", None) or []) if i != unk}


def encode_targets(lm: LoadedModel, targets: Sequence[str], *, truncate: bool = False) -> list[Encoded]:
    """The decoder's inputs for target texts, as in training (teacher forcing): the model's decoder
    start token, a special unit of its own, then the target's tokens."""
    start = lm.config.decoder_start_token_id
    if start is None:
        raise ValueError(f"{lm.name}: the config names no decoder_start_token_id, so the decoder's input is unknown")
    return [Encoded(text=e.text, ids=(int(start),) + e.ids, spans=((0, 0),) + e.spans, special=(True,) + e.special)
            for e in encode_many(lm, targets, truncate=truncate)]


@dataclass(frozen=True, eq=False)
class ModelBatch:
    """One batch as the model takes it: texts as right-padded `ids` and their `mask` (B, T); images as their
    `pixels` (B, 3, H, W), in a field of their own, and a mask of ones (B, T) over their units (`ids` None)."""

    mask: torch.Tensor
    ids: torch.Tensor | None = None
    pixels: torch.Tensor | None = None


def model_batch(items: Sequence[Encoded], device: torch.device) -> ModelBatch:
    """The `ModelBatch` of encoded texts or images (every image of a batch has the same size)."""
    if items and items[0].pixels is not None:
        if len({e.pixels.shape for e in items}) > 1:
            raise ValueError("images of different patch grids cannot share a batch; run them in batches of one grid")
        pixels = torch.stack([e.pixels for e in items])  # (B, 3, H, W)
        return ModelBatch(mask=torch.ones(len(items), len(items[0].ids), dtype=torch.long, device=device),
                          pixels=pixels.to(device))
    ids, mask = pad_batch(items, device)
    return ModelBatch(mask=mask, ids=ids)


def pad_batch(items: Sequence[Encoded], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded `input_ids` and `attention_mask` of encoded texts, both (B, T) (images: `model_batch`)."""
    if items and items[0].pixels is not None:
        raise ValueError("images have pixel values, not token ids; batch them with model_batch")
    t_max = max(len(e.ids) for e in items)
    ids = torch.zeros(len(items), t_max, dtype=torch.long)
    mask = torch.zeros(len(items), t_max, dtype=torch.long)
    for i, e in enumerate(items):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        mask[i, : len(e.ids)] = 1
    return ids.to(device), mask.to(device)


def token_labels(lm: LoadedModel, enc: Encoded) -> tuple[str, ...]:
    """Display string per token: its text in the input, or the raw piece for specials and byte pieces."""
    return tokenizer_labels(lm.tokenizer, enc)


def tokenizer_labels(tokenizer, enc: Encoded) -> tuple[str, ...]:
    """`token_labels` from the tokenizer alone (for attention computed outside headscope)."""
    raw = tokenizer.convert_ids_to_tokens(list(enc.ids))
    labels = tuple(r if sp or not enc.text[a:b].strip() else enc.text[a:b].strip()
                   for r, (a, b), sp in zip(raw, enc.spans, enc.special))
    if enc.image_labels:  # a text with images: image tokens labelled by their cell (img0:r1c2)
        labels = tuple(own if own is not None else label for own, label in zip(enc.image_labels, labels))
    return labels


def text_units(lm: LoadedModel, enc: Encoded, segmenter: Segmenter | None = None) -> Units:
    """The token units of one text (labels, spans, special flags, words, ids): an `AttentionMap`'s, without
    the attention (for attention that comes in blocks of rows, `probe.recompute`)."""
    unit_of_token, unit_spans, _ = assign_words(enc.text, enc.spans, enc.special, segmenter)
    return Units(text=enc.text, level="token", labels=token_labels(lm, enc), spans=enc.spans, special=enc.special,
                 word_index=tuple(unit_of_token), word_spans=tuple(unit_spans), token_ids=enc.ids)


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
    if token_count(lm.tokenizer, text, lm.max_length)[0] <= lm.max_length:
        return text
    with warnings.catch_warnings():  # the caller asked for the cut; encode's "truncating" warning says it again
        warnings.simplefilter("ignore")
        enc = encode(lm, text, truncate=True)
    return text[: max(b for (a, b), special in zip(enc.spans, enc.special) if not special)]


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
