"""What an attention source reads: one typed input, its kind checked once, where it is made.

    AttentionInput.of(texts)                       "texts"         texts (a stream: checked as they are read)
    AttentionInput.of(images=[...])                "images"        images alone (paths, PIL images, arrays)
    AttentionInput.of(texts, images=[...])         "texts+images"  texts with images, for a vision–language decoder
    AttentionInput.of(sources, targets=[...])      "pairs"         source–target pairs of an encoder–decoder
    AttentionInput.of(sequences=[[5, 17, 2]])      "ids"           token-id sequences as they are (repeated tokens)

The kind is decided here, once, from what was given; every later step (the source, `probe.extract`) looks it up by
name in a registry instead of asking again what it was given. The images are checked once (an iterator is read
here); their pixel values are made later, by the model's processor, and travel in their own field
(`probe.encoding.ModelBatch.pixels`), never in the token ids' slot.

>>> AttentionInput.of(["The cat sat."]).kind, AttentionInput.of(["a"], targets=["b"]).kind
('texts', 'pairs')
>>> AttentionInput.of(sequences=[[5, 17, 2]]).kind
'ids'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal, Sequence, get_args

__all__ = ["AttentionInput", "InputKind", "INPUT_KINDS"]

InputKind = Literal["texts", "images", "texts+images", "pairs", "ids"]
INPUT_KINDS: tuple[str, ...] = get_args(InputKind)


@dataclass(frozen=True, eq=False)
class AttentionInput:
    """One input of an attention source: its `kind` and what it holds (`texts`: a stream for "texts", the prompts
    of "texts+images", the sources of "pairs"; `images`; `targets`; `sequences`). Made by `of`, which checks it."""

    kind: InputKind
    texts: Iterable[str] = ()
    images: tuple = ()
    targets: tuple[str, ...] = ()
    sequences: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in INPUT_KINDS:
            raise ValueError(f"an attention input is one of {', '.join(map(repr, INPUT_KINDS))}, got {self.kind!r}")

    @classmethod
    def of(cls, texts: str | Iterable[str] | None = None, *, images: object = None,
           targets: str | Iterable[str] | None = None,
           sequences: Sequence[Sequence[int]] | None = None) -> "AttentionInput":
        """The input of what was given, its kind decided and its parts checked (a clear error otherwise)."""
        from .encoding import check_texts, text_source

        if isinstance(texts, AttentionInput):
            return texts
        if sequences is not None:
            if texts is not None or images is not None or targets is not None:
                raise ValueError("token-id sequences are read alone: pass sequences=[...] without texts, images or "
                                 "targets")
            if isinstance(sequences, (str, bytes, bytearray)) or not isinstance(sequences, Iterable):
                raise TypeError("sequences must be a list of token-id lists such as [[5, 17, 2]], got "
                                f"{type(sequences).__name__}")
            return cls("ids", sequences=tuple(sequences))
        if images is not None:
            from .images import check_images

            if targets is not None:
                raise ValueError("images are read with no target; targets are for an encoder–decoder's texts")
            images = tuple(check_images(images))  # once: an iterator is read here, not emptied by a second look
            if texts is None:
                return cls("images", images=images)
            return cls("texts+images", texts=tuple(check_texts(texts)), images=images)
        if texts is None:
            raise TypeError("texts must be a str or an iterable of str (a list, a generator, ...), got NoneType; "
                            "an image model takes images=[...] instead")
        if targets is not None:
            sources, targets = tuple(check_texts(texts)), tuple(check_texts(targets))
            if len(sources) != len(targets):
                raise ValueError(f"{len(sources)} source texts but {len(targets)} targets; give one target per source")
            return cls("pairs", texts=sources, targets=targets)
        return cls("texts", texts=text_source(texts))
