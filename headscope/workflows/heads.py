"""What every head does over a corpus: `heads(lm, texts)` -> `analyses.heads.HeadScores`.

    texts | images ──source.read──> Readings ──fold──> HeadScoreAccumulator ──> sums per (layer, head)
    decoders: repeated random token sequences ──source.read──> duplicate-token and induction sums

Every reading folds the same way (`probe.reading.Fold`): an eager batch layer by layer as its forward
pass gives it, a recomputed text block by block, a whole map (norm weights, images) at once.

The attention source (`probe.sources`: eager, recompute, auto) is chosen once, by `source_for`;
the accumulator keeps float64 sums only, so memory does not grow with the corpus. In a torchrun run
each process folds its shard and the sums are added over the processes (`headscope.distributed`).
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from headscope.probe.progress import progress as progress_bar

from headscope.analyses.heads import HeadScoreAccumulator, HeadScores
from headscope.analyses.induction import repeated_random_tokens
from headscope.analyses.vision_language import CrossHeadSums
from headscope.analyses.metrics import METRICS, Metric
from headscope.distributed import World, merge_attention_record, merge_head_scores, shard, shard_length, together
from headscope.probe.encoding import ordinary_token_ids, special_prefix
from headscope.probe.forward import is_cross_reader, is_seq2seq, no_attention_layers
from headscope.probe.images import for_input
from headscope.probe.inputs import AttentionInput
from headscope.probe.model import LoadedModel
from headscope.probe.names import DEFAULT_ATTENTION, DEFAULT_INCLUDE_SPECIAL, DEFAULT_LEVEL, Attention, Level, Weight
from headscope.probe.reading import Fold, Reading
from headscope.probe.sources import source_for
from headscope.probe.types import ImageCrossAttention

__all__ = ["heads", "checked_heads", "induction_inputs"]

T = TypeVar("T")


def heads(
    lm: LoadedModel,
    texts: Iterable[str] | None = None,
    *,
    images: Sequence | None = None,
    level: Level = DEFAULT_LEVEL,
    include_special: bool = DEFAULT_INCLUDE_SPECIAL,
    batch_size: int = 8,
    window: int = 4,
    induction_sequences: int = 20,
    induction_length: int = 50,
    seed: int = 0,
    truncate: bool = False,
    thresholds: Mapping[str, float] | None = None,
    progress: bool = False,
    total: int | None = None,
    source: str | None = None,
    attention: Attention = DEFAULT_ATTENTION,
    budget: int | None = None,
    weight: Weight = "attention",
    world: World | None = None,
    metrics: Mapping[str, Metric] = METRICS,
) -> HeadScores:
    """Score every head of `lm` over `texts`, plus induction for decoders -> `HeadScores`.

    `weight="norm"` scores the heads on norm-based weights (`extract(..., weight="norm")`) instead of
    attention; the repeated random sequences are then skipped (their duplicate-token and induction
    scores read attention) and `meta["weight"]` says "norm".

    Texts stream through the attention source into `analyses.heads.HeadScoreAccumulator`; only
    the layer being scored of one batch is alive, not the batch's every layer (each window of `window`
    batches sorted by length together: less padding): each eager batch's layers are scored as its forward
    pass gives them, padding masked (`HeadScoreAccumulator.batch_fold`, the sums of `update_batch`), never
    cut into per-text maps (a model whose attention gives its weights only when asked, DeBERTa v2 or MPNet,
    keeps a batch's layers until its pass ends).
    For decoders, repeated random token sequences (`induction_inputs`) give the duplicate-token
    and induction scores; `induction_sequences=0` skips them. `total` sizes the progress bar
    (stderr); `source` names the corpus in `meta`. An encoder–decoder model's texts are sources:
    its encoder's self-attention is scored (`meta["stack"] == "encoder"`), with no induction.

    `attention="recompute"` folds each text's attention in blocks of query rows recomputed from
    scratch (`probe.recompute`), so no `[layer, head, T, T]` of all layers exists; `"auto"` does so
    for the texts whose eager attention would exceed `budget` bytes (`probe.sources.memory_budget`).
    Either way the recomputation is first checked against the model's eager attention on the first
    recomputed text's prefix (`meta["check"]`); a mismatch raises.
    `world` (a `headscope.distributed.World`, in a torchrun run): this process scores its shard of
    the texts and of the induction sequences, and the sums are added over the processes, so every
    process returns the scores of the whole corpus. `metrics`: the registry scored
    (`analyses.metrics.METRICS`; `{**METRICS, "mine": Metric(...)}` adds one).

    `images` (an image model, a two-tower model's image tower, or a vision–language decoder, which reads each
    image with its text or the default prompt): the heads are scored on the images' maps (the vision metrics
    among the rest) and no induction sequences are read.

    >>> from headscope.probe.tiny import tiny_model
    >>> s = heads(tiny_model("llama"), ["The cat sat.", "A dog ran!"], induction_sequences=2, induction_length=5)
    >>> s.n_texts, s.n_sequences, s.level
    (2, 2, 'word')
    """
    inp = AttentionInput.of(texts, images=images)  # the one check of what was given
    lm = for_input(lm, images=images is not None)  # a two-tower model (CLIP, SigLIP): the tower that reads it
    attend = source_for(lm, attention, budget=budget, batch_size=batch_size)
    world = world or World()
    acc = HeadScoreAccumulator(model=lm.name, level=level, include_special=include_special, metrics=metrics)
    acc.no_attention = no_attention_layers(lm)  # a hybrid stack's layers without attention, also on the blocks path
    if inp.kind in ("images", "texts+images") and world.size > 1 and is_cross_reader(lm):
        raise ValueError(f"{lm.name}'s cross-attention heads are scored in one process; run it without torchrun")
    if inp.kind == "images":  # each rank its shard of the images, as of the texts
        inp = AttentionInput("images", images=tuple(shard(list(inp.images), world)))
    elif inp.kind == "texts+images" and world.size > 1:
        raise ValueError("texts with images are scored in one process; run them without torchrun")
    elif inp.kind == "texts":
        texts = shard(inp.texts, world)
        if progress:
            total = None if total is None else shard_length(total, world)
            texts = progress_bar(texts, total=total, desc=f"{lm.name} heads", unit="text")
        inp = AttentionInput("texts", texts=texts)
    corpus = _Scores(acc, repeated=False)
    with together(world):
        _fold_all(attend.read(inp, level=level, truncate=truncate, window=window, weight=weight, batched=True), corpus)
    meta: dict = {"corpus": source, "batch_size": batch_size, "causal": lm.is_causal}
    if corpus.cross.n:  # the cross-attention layers' heads over the image keys (`cross_attention_heads`)
        meta["cross_attention"] = corpus.cross.frame().to_dict("records")
    if is_seq2seq(lm):  # without targets, the texts are sources: the encoder's self-attention is scored
        meta["stack"] = "encoder"
    if weight != "attention":
        meta["weight"] = weight
    if lm.is_causal and induction_sequences > 0 and weight == "attention" and images is None:
        sequences, prefix = induction_inputs(lm, n_sequences=induction_sequences, length=induction_length, seed=seed)
        with together(world):
            _fold_all(attend.read(AttentionInput.of(sequences=shard(sequences, world)), batched=True),
                      _Scores(acc, repeated=True))
        meta["induction"] = {
            "sequences": induction_sequences, "length": induction_length, "seed": seed, "prefix": list(prefix),
            "prefix_tokens": lm.tokenizer.convert_ids_to_tokens(list(prefix)),
        }
    else:
        meta["induction"] = None
    if attention != "eager" and images is None:  # an eager run's output stays as it was; images are always eager
        meta.update(merge_attention_record(attend.record()))
    return merge_head_scores(acc).result(thresholds=thresholds, meta=meta)


def checked_heads(lm: LoadedModel, texts: Iterable[str] | None = None, *, images: Sequence | None = None,
                  check: Callable[[LoadedModel], T] | None = None, **options) -> tuple[HeadScores, T | None]:
    """`heads` on the model that reads the input (a two-tower model's image tower for images, its text tower for
    texts), with `check(model)` run on that model first (a caller's own checks and its verification, before any
    head is scored): `(scores, what check returned)`. What `headscope heads` calls."""
    reader = for_input(lm, images=images is not None)
    checked = None if check is None else check(reader)
    return heads(reader, texts, images=images, **options), checked


def _fold_all(readings: Iterator[Reading], scores: Fold) -> None:
    for reading in readings:
        reading.fold(scores)


class _Scores(Fold):
    """The accumulator's sums of every reading: corpus texts (or images), or repeated sequences (`repeated`)."""

    def __init__(self, acc: HeadScoreAccumulator, *, repeated: bool) -> None:
        self.acc, self.repeated = acc, repeated
        self.cross = CrossHeadSums()  # a cross-attention reader's cross layers (Mllama's), scored apart

    def map(self, amap) -> None:
        if isinstance(amap, ImageCrossAttention):  # Mllama: its self-attention heads as a text's, its cross apart
            self.cross.add(amap.cross)
            amap = amap.decoder
        (self.acc.update_repeated if self.repeated else self.acc.update)(amap)

    def layers(self, reading: Reading) -> None:
        """Run one padded batch's forward pass, each layer scored as it comes out (one layer alive at a time)."""
        fold = self.acc.batch_fold(reading, repeated=self.repeated)
        reading.run(fold)
        fold.commit()

    def blocks(self, reading: Reading, blocks) -> None:
        [units] = reading.units
        if self.repeated:
            self.acc.update_repeated_blocks(units.token_ids, blocks, causal=reading.causal, layers=reading.layers,
                                            heads=reading.heads)
        else:
            self.acc.update_blocks(units, blocks, causal=reading.causal, layers=reading.layers, heads=reading.heads)


def induction_inputs(lm: LoadedModel, *, n_sequences: int = 20, length: int = 50,
                     seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """Repeated random token sequences for `lm` and the prefix they start with: `(sequences, prefix)`.

    The prefix is whatever special tokens the tokenizer itself puts at the start of a text (Gemma's
    <bos>; nothing for SmolLM2, which adds none), so the sequences begin the way texts do, as
    TransformerLens's `to_tokens` prepends BOS. Random tokens are drawn from the vocabulary without
    special or added tokens (`probe.encoding`).

    >>> from headscope.probe.tiny import tiny_model
    >>> seqs, prefix = induction_inputs(tiny_model("llama"), n_sequences=2, length=3)
    >>> len(seqs), all(s[len(prefix):][:3] == s[len(prefix):][3:] for s in seqs)
    (2, True)
    """
    prefix = special_prefix(lm.tokenizer)
    sequences = repeated_random_tokens(ordinary_token_ids(lm), n_sequences=n_sequences, length=length, seed=seed,
                                       prefix=prefix)
    return sequences, prefix
