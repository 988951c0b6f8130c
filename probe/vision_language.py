"""Texts with images for a vision–language decoder (LLaVA, Gemma 3, PaliGemma): which image fills which slot,
the checkpoint's processor, and where each image token sits on its picture.

Images given without texts are each read with the prompt `DEFAULT_PROMPT`. A text names where each image goes
with the processor's image slot (`<image>` for LLaVA and PaliGemma,
`<start_of_image>` for Gemma 3): the images fill the slots in order, across the texts in order. A text without
a slot and images for it: the images go before the text, in a user turn of the checkpoint's chat template
where the processor has one (what a chat model was trained on), else as slots put before the text. The
processor then expands each slot into the model's image tokens; each image token becomes a unit carrying its
`ImagePatch` (its picture, its cell of the picture's grid), labelled `img0:r1c2`; tokens the layout adds that
are on no cell (a CLS feature, `<image_newline>`) are labelled by name and carry None; the tokens the processor
adds around a slot (Gemma 3's `<start_of_image>` … `<end_of_image>`, PaliGemma's `<bos>`) are special units.
Every text token keeps its character span in the text, found by aligning the processor's token ids with the
tokenizer's own tokenisation of the text.
"""

from __future__ import annotations

import difflib
from typing import Sequence

from .encoding import Encoded, special_ids
from .families import family_of_type
from .images import as_seen, check_images, load_image, processor_refusal
from .model import LoadedModel
from .types import ImagePatch

__all__ = ["DEFAULT_PROMPT", "default_texts", "image_slot", "assign_images", "encode_with_images", "patch_label", "prompt_with_slots", "sees_ahead"]


# The text each image is read with when only images are given (`extract(lm, images=[...])`, `--image` alone).
DEFAULT_PROMPT = "What is in this picture?"


def default_texts(images: object) -> list[str]:
    """One `DEFAULT_PROMPT` per image: each image then goes before its own prompt."""
    return [DEFAULT_PROMPT] * len(check_images(images))


def sees_ahead(lm: LoadedModel, enc: Encoded) -> bool:
    """Whether some token of this text with images attends to a later one: a bidirectional block of two or more
    tokens in the decoder's mask (Gemma 3's images, PaliGemma's prefix); then its map is not causal."""
    if enc.inputs is None:
        return False
    import torch

    ids = torch.tensor([enc.ids])
    blocks = family_of_type(lm.model_type).vision_language.blocks(lm.config, enc.inputs.get("token_type_ids"), ids, 0)
    if blocks is None:
        return False
    kept = blocks[blocks >= 0]
    return bool(len(kept)) and int(kept.unique(return_counts=True)[1].max()) > 1


def image_slot(lm: LoadedModel) -> str:
    """The string that marks an image's place in a text for `lm`'s processor (`<image>`, `<start_of_image>`): its
    `image_placeholder_token` where it names one apart from the image token it expands to (Qianfan-OCR's `<image>`
    becomes `<img>`, `<IMG_CONTEXT>`s and `</img>`), else its `image_token`."""
    return getattr(lm.processor, "image_placeholder_token", None) or lm.processor.image_token


def patch_label(p: ImagePatch) -> str:
    """A unit's label for an image token: `img0:r1c2`, with its view where it is not the whole picture.

    >>> patch_label(ImagePatch(0, 1, 2, 4, 4)), patch_label(ImagePatch(1, 0, 0, 2, 2, view="tile 0,1"))
    ('img0:r1c2', 'img1:tile 0,1:r0c0')
    """
    view = "" if p.view == "base" else f"{p.view}:"
    return f"img{p.image}:{view}r{p.row}c{p.col}"


def assign_images(texts: Sequence[str], n_images: int, slot: str) -> list[int]:
    """How many images each text takes: its slots' count; a text without slots takes all images when it is the
    only text, one image each when no text has a slot and there are as many images as texts. One clear
    `ValueError` otherwise.

    >>> assign_images(["a <image> b <image>", "c <image>"], 3, "<image>"), assign_images(["a"], 2, "<image>")
    ([2, 1], [2])
    """
    counts = [t.count(slot) for t in texts]
    if sum(counts) == 0:
        if len(texts) == 1:
            return [n_images]
        if n_images == len(texts):
            return [1] * len(texts)
        raise ValueError(f"{n_images} images for {len(texts)} texts with no {slot} slot; put {slot} in the texts where "
                         f"each image goes, or give one image per text")
    if sum(counts) != n_images:
        raise ValueError(f"the texts hold {sum(counts)} {slot} slot(s) but {n_images} image(s) were given; give one "
                         f"image per {slot} slot, in order")
    return counts


def prompt_with_slots(lm: LoadedModel, text: str, n: int) -> str:
    """`text` with its `n` images put before it: in a user turn of the chat template where the processor has
    one, else as `n` slots and a newline before the text."""
    slot = image_slot(lm)
    if n == 0 or slot in text:
        return text
    if getattr(lm.processor, "chat_template", None):
        turn = [{"role": "user", "content": [*({"type": "image"} for _ in range(n)), {"type": "text", "text": text}]}]
        return lm.processor.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
    return slot * n + "\n" + text


def encode_with_images(lm: LoadedModel, texts: Sequence[str], images: object) -> list[Encoded]:
    """Each text and its images (`assign_images`) as an `Encoded` whose `inputs` hold the processor's pixels."""
    if lm.processor is None or not hasattr(lm.processor, "image_token"):
        raise ValueError(f"{lm.name} has no processor that places images in a text; load the checkpoint with its "
                         "processor (processor.save_pretrained(folder) beside the model)")
    images = check_images(images)
    counts = assign_images(texts, len(images), image_slot(lm))
    out, first = [], 0
    for text, n in zip(texts, counts):
        mine = images[first : first + n]
        pictures = [load_image(first + k, item) for k, item in enumerate(mine)]
        try:
            out.append(_encode_one(lm, prompt_with_slots(lm, text, n), pictures))
        except _Refused as refused:  # e.g. Qwen-VL's "absolute aspect ratio must be smaller than 200": which image
            raise ValueError(processor_refusal(lm, pictures, mine, first, refused.reason)) from None
        first += n
    return out


class _Refused(Exception):
    """The processor refused a text's images (`reason`, its ValueError)."""

    def __init__(self, reason: ValueError) -> None:
        super().__init__(str(reason))
        self.reason = reason


def _encode_one(lm: LoadedModel, text: str, pictures: list) -> Encoded:
    proc, tok, cfg = lm.processor, lm.tokenizer, lm.model.config
    reading = family_of_type(lm.model_type).vision_language
    kwargs = {"images": pictures} if pictures else {}
    try:
        out = proc(text=[text], return_tensors="pt", **kwargs)
    except ValueError as exc:
        raise _Refused(exc) from None
    ids = [int(i) for i in out["input_ids"][0]]
    if len(ids) > lm.max_length:
        raise ValueError(f"the text and its {len(pictures)} image(s) make {len(ids)} tokens; {lm.name} takes at most "
                         f"{lm.max_length}. Use fewer or smaller images, or a shorter text")
    own = tok(text, return_offsets_mapping=True, return_special_tokens_mask=True, add_special_tokens=True)
    spans, special = _aligned(ids, own, special_ids(tok))
    image_id = _image_token_id(cfg)
    places = [t for t, i in enumerate(ids) if i == image_id]
    # what the layout may read: the processor's outputs and each picture's (height, width) before the processor
    # (InternVL's tiles: the grid it cut the picture into follows from its aspect ratio)
    facts = {**out, "picture_sizes": [(p.height, p.width) for p in pictures]}
    units: list = []
    for k in range(len(pictures)):
        units += reading.image_units(cfg, facts, k)
    if len(units) != len(places):
        raise RuntimeError(f"{lm.name}: the processor made {len(places)} image tokens, the layout of "
                           f"{len(pictures)} image(s) has {len(units)}; this checkpoint's image layout is not known")
    patches: list = [None] * len(ids)
    labels: list = [None] * len(ids)
    for t, unit in zip(places, units):
        special[t], spans[t] = True, (0, 0)
        if isinstance(unit, ImagePatch):
            patches[t], labels[t] = unit, patch_label(unit)
        else:
            labels[t] = unit
    inputs = {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask") and hasattr(v, "to")}
    whole = reading.picture or (lambda cfg, inputs, k: _whole(inputs["pixel_values"][k]))
    seen = tuple(as_seen(getattr(proc, "image_processor", proc), whole(cfg, facts, k)[None])[0]
                 for k in range(len(pictures)))
    return Encoded(text=text, ids=tuple(ids), spans=tuple(spans), special=tuple(special), inputs=inputs or None,
                   patches=tuple(patches) if pictures else (), pictures=seen, image_labels=tuple(labels))


def _whole(pixels):
    """An image's pixels (3, H, W) as the model saw the whole picture: the first tile of a tiled image (LLaVA-NeXT's
    thumbnail, the picture resized)."""
    return pixels[0] if pixels.dim() == 4 else pixels


def _image_token_id(cfg) -> int:
    found = getattr(cfg, "image_token_id", None)
    return int(found if found is not None else cfg.image_token_index)


def _aligned(ids: list[int], own, specials: set[int]) -> tuple[list, list]:
    """Each of the processor's tokens' span in the text and special flag: a token that the tokenizer's own
    tokenisation of the text holds at the aligned place keeps its span; one the processor added is special."""
    own_ids = list(own["input_ids"])
    spans: list = [(0, 0)] * len(ids)
    special: list = [True] * len(ids)
    matcher = difflib.SequenceMatcher(a=own_ids, b=ids, autojunk=False)
    for a, b, size in matcher.get_matching_blocks():
        for d in range(size):
            flag = bool(own["special_tokens_mask"][a + d]) or own_ids[a + d] in specials
            special[b + d] = flag
            spans[b + d] = (0, 0) if flag else tuple(int(x) for x in own["offset_mapping"][a + d])
    return spans, special
