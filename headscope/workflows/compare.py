"""Compare two checkpoints of one model over a corpus: load both, check they match, score, compare.

`compare_models("EleutherAI/pythia-70m@step1000", "EleutherAI/pythia-70m@step3000", texts)` — or two
local folders, two GGUF files, or two `LoadedModel`s — reads every text with both models, scores each
head on each text alone (`analyses.compare.per_text_scores`) and compares them head by head
(`analyses.compare.compare_scores`: differences with 95% intervals over texts, Holm-corrected).

Both models must have the same architecture (family, layers, heads) and tokenize every text into
the same tokens; otherwise the heads or the units would not correspond and `IncompatibleModels`
says which.
"""

from __future__ import annotations

from typing import Iterable

from headscope.analyses.compare import ALPHA, HeadComparison, compare_scores, per_text_scores
from headscope.probe.encoding import check_texts, encode_many
from headscope.probe.images import for_input
from headscope.probe.loading import load_model
from headscope.probe.model import LoadedModel
from headscope.probe.device_placement import Placement
from headscope.probe.names import DEFAULT_ATTENTION, DEFAULT_INCLUDE_SPECIAL, DEFAULT_LEVEL, Attention, Level
from headscope.probe.progress import progress as progress_bar
from headscope.probe.sources import source_for

__all__ = ["IncompatibleModels", "compare_models", "check_compatible", "comparison_report"]


class IncompatibleModels(ValueError):
    """The two models' heads or tokens do not correspond, so a head-by-head comparison means nothing."""


def compare_models(
    a: str | LoadedModel,
    b: str | LoadedModel,
    texts: str | Iterable[str],
    *,
    level: Level = DEFAULT_LEVEL,
    include_special: bool = DEFAULT_INCLUDE_SPECIAL,
    alpha: float = ALPHA,
    batch_size: int = 8,
    truncate: bool = False,
    placement: Placement | None = None,
    device: str | None = None,
    dtype: str | None = None,
    attention: Attention = DEFAULT_ATTENTION,
    budget: int | None = None,
    progress: bool = False,
) -> HeadComparison:
    """Per-head metric differences B - A over `texts` (see `analyses.compare` for the rule).

    `placement`: where a model given by name is loaded (`hs.Placement`; the cpu in float32 by default;
    `device=` / `dtype=` are kept for one release, as `hs.load` keeps them).
    `attention`/`budget`: where each model's attention comes from (`probe.sources`); every text's whole
    map is scored, so a recomputed text's map is assembled from blocks. `progress`: a bar per model on stderr.
    """
    texts = check_texts(texts)
    lm_a = a if isinstance(a, LoadedModel) else load_model(a, placement=placement, device=device, dtype=dtype)
    lm_b = b if isinstance(b, LoadedModel) else load_model(b, placement=placement, device=device, dtype=dtype)
    # a two-tower model (CLIP, SigLIP): its text tower reads the texts; an image model: one line
    lm_a, lm_b = for_input(lm_a, images=False), for_input(lm_b, images=False)
    check_compatible(lm_a, lm_b, texts, truncate=truncate)
    tables = [per_text_scores(progress_bar(source_for(lm, attention, budget=budget, batch_size=batch_size)
                                           .iter_maps(texts, level=level, truncate=truncate), enabled=progress,
                                           total=len(texts), desc=f"{lm.name} heads", unit="text"),
                              level=level, include_special=include_special) for lm in (lm_a, lm_b)]
    return compare_scores(*tables, a_name=lm_a.name, b_name=lm_b.name, alpha=alpha)


def check_compatible(a: LoadedModel, b: LoadedModel, texts: list[str], *, truncate: bool = False) -> None:
    """Raise `IncompatibleModels` unless both have the same family, layers, heads and tokens for `texts`."""
    shape = lambda lm: (lm.model_type, lm.config.num_hidden_layers, lm.config.num_attention_heads)  # noqa: E731
    if shape(a) != shape(b):
        (ta, la, ha), (tb, lb, hb) = shape(a), shape(b)
        raise IncompatibleModels(f"{a.name} is {ta} with {la} layers × {ha} heads but {b.name} is {tb} with "
                                 f"{lb} layers × {hb} heads; compare checkpoints of one architecture")
    for ea, eb in zip(encode_many(a, texts, truncate=truncate), encode_many(b, texts, truncate=truncate)):
        if ea.ids != eb.ids:
            raise IncompatibleModels(f"{a.name} and {b.name} tokenize the text starting {ea.text[:40]!r} differently "
                                     f"({len(ea.ids)} vs {len(eb.ids)} tokens); compare models that share a tokenizer")


def comparison_report(result: HeadComparison, models: tuple[LoadedModel, LoadedModel], out, *, verifications=(None, None),
                      checks: dict, source: str, force: bool = False, committed=None):
    """The HTML report of a comparison in the folder `out` (`hs.report`): one `ModelAnalysis` per model (its
    `Verification`, or None), B's carrying the comparison; `checks` is each model's verification line ("a", "b").
    Returns what `hs.report` wrote; `reports.folder.ReportFolderError` / `OSError` when the folder cannot be."""
    from headscope.reports.analysis import ModelAnalysis
    from headscope.reports.folder import report

    analyses = [ModelAnalysis(model=lm.name, verification=verification, comparison=comp,
                              info={"source": lm.source, "layers": lm.config.num_hidden_layers,
                                    "heads": lm.config.num_attention_heads, "verification": checks[key]["summary"]})
                for key, lm, verification, comp in (("a", models[0], verifications[0], None),
                                                    ("b", models[1], verifications[1], result))]
    return report(analyses, out, force=force, title=f"headscope comparison — {result.b} vs {result.a}",
                  settings={"corpus": source, "texts": result.n_texts, "rule": result.rule},
                  record={"command": "compare", "corpus": source, "comparison": result.to_dict(),
                          "verification": checks}, committed=committed)
