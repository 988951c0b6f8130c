"""The report's figures, each defined once: `FIGURES[name]`, beside `reports.sections.SECTIONS`.

Each `FigureSpec` names the field of a model's analysis (`reports.analysis.ModelAnalysis`) it draws, the
drawing function (`reports.figures`, `reports.sinks`, `reports.syntax`, `reports.vision`), the `Panel`s
to draw from one analysis, its file stem and its caption; the report (`reports.html`) draws what the
registry lists, so a new report figure is one entry. `start_head`, `plotted_metrics`, `STACKS` and
`slug` are the choices the report's figures and its explorer share.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Mapping

from headscope.analyses.flow import FLOW_MAX_EDGES, FLOW_MAX_SECONDS, TokenMap, flow_fits
from headscope.analyses.metrics import FIGURE_HEAD_METRICS, METRICS
from headscope.probe.types import head_name

from .figures import (attention_heatmap, attention_mosaic, composition_graph, difference_grid, dla_grid, patch_grid,
                      probe_drilldown, probe_grid, score_grid, token_map, verification_plot)
from .sinks import massive_figure, sink_share_grid, streaming_figure
from .syntax import cluster_plot, relation_bars, relation_grid, tree_figure
from .vision import layer_overlays, patch_overlay, patch_rollout
from .vision_language import MOSAIC_MAX, cross_head, cross_overlay, image_mosaic, image_overlay, image_rollout_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["FigureSpec", "Panel", "FIGURES", "STACKS", "MECHANISMS_EDGES", "plotted_metrics", "start_head", "start_choice", "slug",
           "SLUG_MAX", "vision_language_head"]


@dataclass(frozen=True)
class Panel:
    """One figure to draw: the arguments of its spec's `draw`, the words that fill its file stem and
    caption, and the result it shows (a report places a probe's figures beside that probe)."""

    args: tuple
    words: Mapping[str, Any]
    result: Any = None


@dataclass(frozen=True)
class FigureSpec:
    """A figure of the report. `source` names the field of a model's analysis (`reports.analysis.ModelAnalysis`)
    it draws; `panels(section)` lists what to draw from it (nothing when the field is empty); `stem`
    and `caption` are format strings over each panel's words; `group` is the report section showing it."""

    name: str
    source: str
    group: Literal["verification", "heads", "probe", "attention", "syntax", "syntax-grid", "comparison", "sinks",
                   "mechanisms", "vision", "vision_language"]
    draw: Callable[..., Figure]
    panels: Callable[[Any], Iterable[Panel]]
    stem: str
    caption: str


def _verification_panels(section: Any) -> Iterable[Panel]:
    if section.verification is not None:
        yield Panel((section.verification,), {}, section.verification)


def _score_panels(section: Any) -> Iterable[Panel]:
    if section.scores is not None:
        for metric in plotted_metrics(section.scores):
            yield Panel((section.scores, metric), {"metric": metric, "label": section.scores.registry[metric].label},
                        section.scores)


def _probe_panels(section: Any) -> Iterable[Panel]:
    no_attention = tuple(getattr(section.scores, "no_attention", ()))  # a hybrid stack's layers without attention
    for probe in section.probes:
        yield Panel((probe, no_attention), {"task": probe.task, "file_task": slug(probe.task), "n": probe.n}, probe)


def _drilldown_panels(section: Any) -> Iterable[Panel]:
    for panel in _probe_panels(section):
        probe = panel.result
        if probe.best_head is not None and len(probe.examples):
            yield Panel((probe,), panel.words, probe)  # the drilldown draws the best head's examples only


def _heatmap_panels(section: Any) -> Iterable[Panel]:
    layer, head = start_head(section)
    kind = f"{STACKS['encoder']} · " if section.pairs else ""  # an encoder–decoder's maps are its encoder's
    for i, amap in enumerate(section.heatmap_maps):
        yield Panel((amap, layer, head), {"i": i, "head": head_name(layer, head), "layer_id": layer, "head_id": head,
                                          "text": amap.text, "level": amap.level, "kind": kind}, amap)


# The attention maps of an encoder–decoder model, named once: the report's explorer and figure captions use these.
STACKS: Mapping[str, str] = {"encoder": "Encoder self-attention", "decoder": "Decoder self-attention",
                             "cross": "Cross-attention (target → source)"}


def _seq2seq_panels(section: Any) -> Iterable[Panel]:
    """The decoder's self-attention and the cross-attention of each (source, target) pair, at the
    heatmaps' level, on the start head (or the stack's first head where it has no such head)."""
    layer, head = start_head(section)
    words = bool(section.heatmap_maps) and section.heatmap_maps[0].level == "word"
    pairs = section.word_pairs if words and section.word_pairs else section.pairs
    for i, pair in enumerate(pairs):
        for kind in ("decoder", "cross"):
            amap = getattr(pair, kind)
            lay = layer if layer in amap.layer_ids else amap.layer_ids[0]
            hd = head if head in amap.head_ids else amap.head_ids[0]
            yield Panel((amap, lay, hd), {"i": i, "kind": kind, "stack": STACKS[kind], "head": head_name(lay, hd),
                                          "layer_id": lay, "head_id": hd, "text": pair.encoder.text,
                                          "target": pair.decoder.text, "level": amap.level}, amap)


def _token_map_panels(kind: TokenMap):
    def panels(section: Any) -> Iterable[Panel]:
        for i, amap in enumerate(section.maps):  # token level: every layer of the whole text
            if kind != "flow" or flow_fits(amap.attention):
                yield Panel((amap, kind), {"i": i, "text": amap.text}, amap)
    return panels


def _mosaic_panels(section: Any) -> Iterable[Panel]:
    if section.maps:
        yield Panel((section.maps[0],), {"text": section.maps[0].text}, section.maps)  # the first of the sentences


def _image_maps(section: Any) -> list:
    return [m for m in section.maps if m.is_image]


def _overlay_panels(section: Any) -> Iterable[Panel]:
    """Each image: the start head's attention from [CLS] (the first patch where there is none) over the image."""
    layer, head = start_head(section)
    for i, amap in enumerate(_image_maps(section)):
        yield Panel((amap, layer, head), {"i": i, "head": head_name(layer, head), "from": amap.labels[0],
                                          "text": amap.text}, amap)


def _layer_overlay_panels(section: Any) -> Iterable[Panel]:
    """The first image: every head of the start head's layer."""
    maps = _image_maps(section)
    if maps:
        layer, _ = start_head(section)
        yield Panel((maps[0], layer), {"layer": layer, "from": maps[0].labels[0], "text": maps[0].text}, maps[0])


def _patch_rollout_panels(section: Any) -> Iterable[Panel]:
    for i, amap in enumerate(_image_maps(section)):
        yield Panel((amap,), {"i": i, "from": amap.labels[0], "text": amap.text}, amap)


def vision_language_head(section: Any) -> tuple[int, int]:
    """The head the Vision–language figures show: the one whose text queries put the largest share of their
    attention on the image tokens, over the section's maps (the first head where no share is finite)."""
    from headscope.analyses.vision_language import vision_language_heads

    frame = vision_language_heads(section.vision_language)
    shares = frame["image_share"]
    if not shares.notna().any():
        return int(frame["layer"].iloc[0]), int(frame["head"].iloc[0])
    best = frame.loc[shares.idxmax()]
    return int(best["layer"]), int(best["head"])


def _vl_words(amap: Any, i: int) -> dict:
    from headscope.analyses.vision_language import text_query

    q = text_query(amap)
    return {"i": i, "text": amap.text, "from": amap.labels[q], "images": len(amap.pictures)}


def _vl_overlay_panels(section: Any) -> Iterable[Panel]:
    maps = getattr(section, "vision_language", ())
    if maps:
        layer, head = vision_language_head(section)
        for i, amap in enumerate(maps):
            yield Panel((amap, layer, head), _vl_words(amap, i) | {"head": head_name(layer, head)}, amap)


def _vl_mosaic_panels(section: Any) -> Iterable[Panel]:
    maps = getattr(section, "vision_language", ())
    if maps:
        yield Panel((maps[0],), _vl_words(maps[0], 0) | {"most": MOSAIC_MAX}, maps[0])


def _vl_rollout_panels(section: Any) -> Iterable[Panel]:
    for i, amap in enumerate(getattr(section, "vision_language", ())):
        yield Panel((amap,), _vl_words(amap, i), amap)


def _cross_panels(section: Any) -> Iterable[Panel]:
    pairs = getattr(section, "image_cross", ())
    if pairs:
        layer, head = cross_head(pairs)
        for i, pair in enumerate(pairs):
            yield Panel((pair, layer, head), {"i": i, "text": pair.text, "head": head_name(layer, head)}, pair)


def _vl_mosaic(amap: Any) -> Figure:
    return image_mosaic(amap, most=MOSAIC_MAX)


def _comparison_panels(section: Any) -> Iterable[Panel]:
    comparison = getattr(section, "comparison", None)
    for metric in dict.fromkeys(comparison.table["metric"]) if comparison is not None else ():
        yield Panel((comparison, metric), {"metric": metric, "a": comparison.a, "b": comparison.b,
                                           "label": METRICS[metric].label if metric in METRICS else metric},
                    comparison)


def _direction_slug(direction: str) -> str:
    return slug(direction.replace("->", "-to-"))  # dependent-to-head


def _relation_bar_panels(section: Any) -> Iterable[Panel]:
    result = getattr(section, "syntax", None)
    for direction in dict.fromkeys(r.direction for r in result.relations) if result is not None else ():
        if any(r.direction == direction and r.best_head is not None for r in result.relations):
            yield Panel((result, direction), {"direction": direction, "file_direction": _direction_slug(direction)}, result)


def _relation_grid_panels(section: Any) -> Iterable[Panel]:
    result = getattr(section, "syntax", None)
    for r in result.relations if result is not None else ():
        if r.best_head is not None:
            yield Panel((result, r.relation, r.direction), {"direction": r.direction, "relation": r.relation, "n": r.n,
                                               "file_relation": slug(r.relation), "file_direction": _direction_slug(r.direction),
                                               "head": head_name(*r.best_head)}, result)


def _tree_panels(section: Any) -> Iterable[Panel]:
    result = getattr(section, "syntax", None)
    trees = result.trees if result is not None else None
    if trees is not None and trees.example is not None and trees.example_heads:
        yield Panel((trees,), {"head": head_name(*trees.best_head), "text": trees.example.text}, result)


def _cluster_panels(section: Any) -> Iterable[Panel]:
    clusters = getattr(section, "syntax_clusters", None)
    if clusters is not None and len(clusters):
        yield Panel((clusters,), {"n": len(clusters)}, getattr(section, "syntax", None))


def _sink_panels(section: Any) -> Iterable[Panel]:
    report = getattr(section, "sinks", None)
    if report is not None:
        yield Panel((report,), {"epsilon": report.sink_rate.epsilon}, report)


def _streaming_panels(section: Any) -> Iterable[Panel]:
    result = getattr(section, "streaming", None)
    if result is not None:
        yield Panel((result,), {"n": result.n_tokens, "window": result.window, "keep": result.keep}, result)


def _dla_panels(section: Any) -> Iterable[Panel]:
    found = getattr(section, "mechanisms", None)
    for i, r in enumerate(found.dla if found is not None else ()):
        yield Panel((r,), {"i": i, "text": r.prompt, "answer": r.answer.strip() or repr(r.answer),
                           "total": r.total, "err": r.identity_abs_err}, found)


MECHANISMS_EDGES = 25  # composition edges drawn (the strongest; the CSV keeps more)


def _composition_panels(section: Any) -> Iterable[Panel]:
    found = getattr(section, "mechanisms", None)
    if found is not None and found.composition is not None:  # K-composition: the one induction heads are made of
        yield Panel((found.composition, "k", MECHANISMS_EDGES), {"kind": "k", "kind_name": "K", "k": MECHANISMS_EDGES},
                    found)


def _mechanisms_patch_panels(section: Any) -> Iterable[Panel]:
    found = getattr(section, "mechanisms", None)
    if found is not None and found.patching is not None:
        yield Panel((found.patching,), {"pair_set": found.pair_set, "n": len(found.patching.pairs)}, found)


def _composition_figure(scores: Any, kind: str, k: int) -> Figure:
    return composition_graph(scores, kind=kind, k=k)


FIGURES: Mapping[str, FigureSpec] = {spec.name: spec for spec in (
    FigureSpec("verification", "verification", "verification", verification_plot, _verification_panels,
               "verification",
               "Max |Δ| per layer between the model's attention and the from-scratch recomputation (log scale)."),
    FigureSpec("head_scores", "scores", "heads", score_grid, _score_panels,
               "heads-{metric}", "{label}: one cell per head, the top heads boxed."),
    FigureSpec("probe_grid", "probes", "probe", probe_grid, _probe_panels,
               "probe-{file_task}-grid", "{task}: accuracy of every head over all {n} examples; the selected head boxed."),
    FigureSpec("probe_drilldown", "probes", "probe", probe_drilldown, _drilldown_panels,
               "probe-{file_task}-drilldown", "{task}: the selected head's attention from the source word to each candidate."),
    FigureSpec("attention", "maps", "attention", attention_heatmap, _heatmap_panels,
               "attention-{i}-{head}", "{kind}Layer {layer_id}, head {head_id} on “{text}” ({level} level)."),
    FigureSpec("seq2seq_attention", "pairs", "attention", attention_heatmap, _seq2seq_panels,
               "attention-{i}-{kind}-{head}",
               "{stack} · layer {layer_id}, head {head_id}: target “{target}”, source “{text}” ({level} level)."),
    FigureSpec("attention_mosaic", "maps", "attention", attention_mosaic, _mosaic_panels,
               "model-view", "Every head on “{text}” (token level), one small heatmap per head."),
    FigureSpec("rollout", "maps", "attention", token_map, _token_map_panels("rollout"),
               "rollout-{i}", "Attention rollout (Abnar & Zuidema 2020) on “{text}”: how much of each output token "
               "(row) comes from each input token (column), heads averaged, the residual as 0.5·A + 0.5·I."),
    FigureSpec("flow", "maps", "attention", token_map, _token_map_panels("flow"),
               "flow-{i}", "Attention flow (Abnar & Zuidema 2020) on “{text}”: the max-flow from each output token "
               "(row) to each input token (column) through the layers, rows normalised; the colours run from the map's "
               "smallest to its largest share (on its colour bar), not from 0 to 1, so that the structure of a "
               "short sentence, whose shares are all near 1/tokens, shows "
               "(drawn when layers × "
               f"tokens² ≤ {FLOW_MAX_EDGES:,} and it takes at most {FLOW_MAX_SECONDS:g} s; the notes name a text "
               "whose flow was not drawn)."),
    FigureSpec("syntax_relations", "syntax", "syntax", relation_bars, _relation_bar_panels,
               "syntax-{file_direction}",
               "{direction}: per relation, the head chosen on the selection sentences, its test accuracy (95% "
               "Wilson interval) beside the best fixed offset's."),
    FigureSpec("syntax_tree", "syntax", "syntax", tree_figure, _tree_panels,
               "syntax-tree", "The gold tree of “{text}” above, the tree decoded from {head} below."),
    FigureSpec("syntax_clusters", "syntax_clusters", "syntax", cluster_plot, _cluster_panels,
               "syntax-clusters", "All {n} heads placed by the Jensen-Shannon distance between their attention "
                                  "(metric MDS), coloured by layer, labelled by each head's top role."),
    FigureSpec("comparison_grid", "comparison", "comparison", difference_grid, _comparison_panels,
               "compare-{metric}", "{label}: {b} minus {a} per head, the changed heads boxed."),
    FigureSpec("syntax_grid", "syntax", "syntax-grid", relation_grid, _relation_grid_panels,
               "syntax-grid-{file_relation}-{file_direction}",
               "{relation} ({direction}, n={n}): test accuracy of every head; {head}, chosen on the selection "
               "sentences, boxed."),
    FigureSpec("patch_overlay", "maps", "vision", patch_overlay, _overlay_panels,
               "vision-{i}-{head}", "{head}'s attention from {from} onto the patches of “{text}”, over the image "
               "as the model saw it (the query patch outlined where it is one)."),
    FigureSpec("layer_overlays", "maps", "vision", layer_overlays, _layer_overlay_panels,
               "vision-layer-{layer}", "Every head of layer {layer} on “{text}”: attention from {from} onto the patches."),
    FigureSpec("patch_rollout", "maps", "vision", patch_rollout, _patch_rollout_panels,
               "vision-rollout-{i}", "Attention rollout (Abnar & Zuidema 2020) from {from} onto the patches of "
               "“{text}”: heads averaged, the residual as 0.5·A + 0.5·I, through every layer."),
    FigureSpec("image_overlay", "vision_language", "vision_language", image_overlay, _vl_overlay_panels,
               "vision-language-{i}-{head}", "{head}, the head whose text queries look most at the image: its "
               "attention from “{from}” onto the image tokens of “{text}”, over the picture(s) as the model saw them."),
    FigureSpec("cross_overlay", "image_cross", "vision_language", cross_overlay, _cross_panels,
               "vision-language-cross-{i}-{head}", "{head}, the cross-attention head most focused on the picture: "
               "its attention from the last text token that reads the image in “{text}” onto the image keys, over "
               "the picture (each tile on its part)."),
    FigureSpec("image_mosaic", "vision_language", "vision_language", _vl_mosaic, _vl_mosaic_panels,
               "vision-language-mosaic", "Every head (at most {most} layers and {most} heads, evenly spaced) on "
               "“{text}”: attention from “{from}” over the first picture, each cell on its own scale."),
    FigureSpec("image_rollout", "vision_language", "vision_language", image_rollout_figure, _vl_rollout_panels,
               "vision-language-rollout-{i}", "Attention rollout (Abnar & Zuidema 2020) through the decoder from "
               "“{from}” onto the image tokens of “{text}”: heads averaged, the residual as 0.5·A + 0.5·I."),
    FigureSpec("sink_shares", "sinks", "sinks", sink_share_grid, _sink_panels,
               "sinks-shares", "Every head's attention on position 0; sink heads (share > {epsilon:g}) marked by what "
                               "ablating them shows: ○ dormant, ● active."),
    FigureSpec("massive_activations", "sinks", "sinks", massive_figure, _sink_panels,
               "sinks-massive", "The largest residual-stream activation of each layer beside the layer's median; "
                                "massive ones (|a| > 100 and > 1000 × the median, Sun et al. 2024) labelled."),
    FigureSpec("streaming", "streaming", "sinks", streaming_figure, _streaming_panels,
               "sinks-streaming", "Next-token loss against position on {n} tokens: dense attention, a window of "
                                  "{window} keys, and the window plus the first {keep} tokens (StreamingLLM)."),
    FigureSpec("mechanisms_dla", "mechanisms", "mechanisms", dla_grid, _dla_panels,
               "mechanisms-dla-{i}", "Direct logit attribution of the next token “{answer}” after “{text}”: each head's "
                                     "write at the last position through the frozen final norm onto the unembedding "
                                     "(logit {total:.3f}; the parts sum back to it within {err:.0e})."),
    FigureSpec("mechanisms_composition", "mechanisms", "mechanisms", _composition_figure, _composition_panels,
               "mechanisms-composition-{kind}", "The {k} strongest {kind_name}-composition edges (Elhage et al. 2021) "
                                                "between heads, from the weights alone, by the ratio to random "
                                                "matrices of the same shapes (Q and V: mechanisms_composition.csv)."),
    FigureSpec("mechanisms_patching", "mechanisms", "mechanisms", patch_grid, _mechanisms_patch_panels,
               "mechanisms-patching", "Head-output patching (denoising) on {n} pairs of the built-in {pair_set} set: "
                                      "the logit difference with each head's clean output patched into the corrupt "
                                      "run, normalised (0 = corrupt, 1 = clean)."),
)}


def plotted_metrics(scores: Any) -> list[str]:
    """Metrics with at least one finite value (the rest are listed as not applicable)."""
    finite = scores.table.groupby("metric", sort=False)["value"].apply(lambda v: v.notna().any())
    return [m for m in scores.metrics if bool(finite.get(m, False))]


def start_head(section: Any) -> tuple[int, int]:
    """The head shown first: the probe's selected head, else the top previous-token head, else the
    most confident one, else the map's first head (`start_choice` says which and why)."""
    layer, head, _ = start_choice(section)
    return layer, head


def start_choice(section: Any) -> tuple[int, int, str]:
    """(layer, head, why): the head the attention figures show, and the sentence that says why it was chosen."""
    for probe in section.probes:
        if probe.best_head is not None:
            layer, head = int(probe.best_head[0]), int(probe.best_head[1])
            return layer, head, (f"The figures show {head_name(layer, head)}, the head the {probe.task} probe "
                                 "selected on held-out folds (Coreference probe section).")
    if section.scores is not None:
        for metric in FIGURE_HEAD_METRICS:
            top = section.scores.top(metric, k=1) if metric in section.scores.metrics else None
            if top is not None and len(top):
                layer, head = int(top["layer"].iloc[0]), int(top["head"].iloc[0])
                what = METRICS[metric].role or f"head by {METRICS[metric].label}"  # "previous-token head"
                return layer, head, (f"The figures show {head_name(layer, head)}, the top {what} ({metric} "
                                     f"{float(top['value'].iloc[0]):.2f}; no probe selected a head).")
    if section.maps:
        layer, head = section.maps[0].layer_ids[0], section.maps[0].head_ids[0]
        return layer, head, (f"The figures show {head_name(layer, head)}, the maps' first head (no probe or head "
                             "score chose one).")
    return 0, 0, ""


SLUG_MAX = 60  # characters (ASCII: bytes) of a slug, so that every file name of a report stays far below 255 bytes


def slug(text: str) -> str:
    """A file-name-safe form of a model name or task, at most `SLUG_MAX` characters: a longer one keeps its
    start and ends in a hash of the whole text, so different texts keep different slugs.

    >>> slug("HuggingFaceTB/SmolLM2-135M"), slug("../my model")
    ('HuggingFaceTB-SmolLM2-135M', 'my-model')
    >>> len(slug("/data/" + "checkpoints/" * 40 + "step-1000"))
    60
    """
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "model"
    if len(s) <= SLUG_MAX:
        return s
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{s[:SLUG_MAX - len(digest) - 1].rstrip('-.')}-{digest}"
