"""The report's sections, each defined once: `SECTIONS[name]`, beside `reports.panels.FIGURES`.

A section is one entry: its anchor and navigation title, its template (`templates/_<name>.html.j2`),
what it shows of one model (`view`: the strings and tables its template reads, from a
`reports.analysis.ModelAnalysis` and the model's figures by group), the CSV tables it writes beside
the page (`tables`), and, for a section a run may lack, when it is on the page at all (`shown`).
The page lists the sections in this order; its figures are the `FIGURES` whose `group` the section
reads. A new section is one entry here plus its template.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from headscope.analyses.metrics import VISION_METRICS
from headscope.probe.types import head_name

from .analysis import ModelAnalysis
from .evidence import ablation_heads_table, evidence_view, probe_line, roles_table
from .longcontext import long_context_frames, long_context_tables
from .panels import plotted_metrics, start_choice, vision_language_head
from .sinks import sinks_tables
from .syntax import relations_frame, syntax_tables, trees_frame
from .vision_language import cross_head, cross_tables, vision_language_tables
from headscope.probe.wording import counted, numbers

__all__ = ["Section", "SECTIONS", "Table", "table_view", "flat", "report_tables"]

Figures = Mapping[str, Sequence[Any]]  # a model's reports.html.FigureFile by FIGURES group


@dataclass(frozen=True)
class Table:
    """A table ready for a template: header, rows of display strings, which columns are numbers."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: tuple[bool, ...]


def table_view(frame: pd.DataFrame | None, *, digits: int = 3, max_rows: int | None = None) -> Table | None:
    """`frame` as display strings, or None for no table: each float column in one notation, its numbers to
    `digits` significant digits (`probe.wording.numbers`; NaN as n/a), every other cell as it is. The CSV
    beside the page keeps the full numbers."""
    if frame is None or not len(frame.columns):
        return None
    frame = frame if max_rows is None else frame.head(max_rows)
    numeric = tuple(pd.api.types.is_numeric_dtype(frame[c]) and not pd.api.types.is_bool_dtype(frame[c])
                    for c in frame.columns)
    columns = [_column(frame.iloc[:, i], digits) for i in range(len(frame.columns))]
    rows = tuple(zip(*columns)) if columns else ()
    return Table(tuple(str(c) for c in frame.columns), tuple(rows), numeric)


def _column(values: pd.Series, digits: int) -> list[str]:
    """One column's display strings: a float column (or an object column of floats) in one notation."""
    floats = [_is_float(v) for v in values]
    shown = numbers([float(v) for v, f in zip(values, floats) if f], digits)
    out, k = [], 0
    for v, f in zip(values, floats):
        if f:
            out.append(shown[k])
            k += 1
        else:
            out.append("" if v is None else str(v))
    return out


def _is_float(v: Any) -> bool:
    return isinstance(v, float) or (hasattr(v, "dtype") and getattr(v.dtype, "kind", "") == "f")


def flat(d: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """A nested mapping as `(dotted.key, display value)` pairs (settings, versions, model info)."""
    out: list[tuple[str, str]] = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.extend(flat(v, key + "."))
        elif isinstance(v, (list, tuple)):
            out.append((key, ", ".join(str(x) for x in v)))
        else:
            out.append((key, "" if v is None else str(v)))
    return out


def _nothing(a: ModelAnalysis, figures: Figures) -> dict:
    return {}


def _no_tables(a: ModelAnalysis) -> dict[str, pd.DataFrame | None]:
    return {}


def _always(analyses: Sequence[ModelAnalysis]) -> bool:
    return True


@dataclass(frozen=True)
class Section:
    """One section of the report page (see the module docstring)."""

    name: str  # the anchor id, `templates/_<name>.html.j2`
    title: str  # the navigation link
    view: Callable[[ModelAnalysis, Figures], dict] = _nothing  # keys the template reads of each model
    tables: Callable[[ModelAnalysis], Mapping[str, pd.DataFrame | None]] = _no_tables  # CSV name -> table
    shown: Callable[[Sequence[ModelAnalysis]], bool] = _always

    @property
    def template(self) -> str:
        return f"_{self.name}.html.j2"


# ---------------------------------------------------------------- what each section shows of one model


def _verification(a: ModelAnalysis, figures: Figures) -> dict:
    v = a.verification
    return {"verification": None if v is None else {
        "passed": v.passed, "summary": v.summary(), "table": table_view(_kind_first(v.to_frame()), digits=2),
        "detail": f"{counted(v.n_texts, 'text')}, {counted(v.n_tokens, 'token')}; output tolerance {v.tolerance_output:g} "
                  f"(relative); recomputation took {v.overhead:.2f}× the forward pass",
        "notes": list(getattr(v, "notes", ()) or ()),
    }}


def _kind_first(frame: pd.DataFrame) -> pd.DataFrame:
    """An encoder–decoder's verification rows say first which attention they are (encoder, decoder, cross)."""
    return frame[["kind", *[c for c in frame.columns if c != "kind"]]] if "kind" in frame.columns else frame


def _heads(a: ModelAnalysis, figures: Figures) -> dict:
    evidence = evidence_view(a)
    if evidence is not None:
        evidence = evidence | {"correlations": table_view(evidence["correlations"], digits=2)}
    scores = a.scores
    if scores is None:
        return {"scores": None, "evidence": evidence}
    plotted = plotted_metrics(scores)
    top = [{"metric": m, "heads": ", ".join(f"{head_name(r.layer, r.head)} ({float(r.value):.2f})"
                                            for r in scores.top(m, k=3).itertuples())} for m in plotted]
    roles = roles_table(a)
    return {"evidence": evidence, "scores": {
        "setting": getattr(scores, "setting", f"{scores.level} level"),
        "n_texts": getattr(scores, "n_texts", None),
        "n_sequences": getattr(scores, "n_sequences", None),
        "roles": table_view(roles[[c for c in roles.columns if c != "model"]]),
        "n_roles": len(scores.roles),
        "top": table_view(pd.DataFrame(top)),
        "not_applicable": [m for m in scores.metrics if m not in plotted],
    }}


def _probes(a: ModelAnalysis, figures: Figures) -> dict:
    return {"probes": [_probe(p, [f for f in figures.get("probe", []) if f.result is p]) | {"ablation": probe_line(a, p.task)}
                       for p in a.probes]}


def _probe(p: Any, figs: Sequence[Any]) -> dict:
    best, ci = p.best_head, p.ci95
    return {
        "task": p.task, "level": p.level, "n": p.n, "verdict": p.verdict,
        "best": f"layer {best[0]}, head {best[1]}" if best else "none",
        "heldout": None if p.heldout_accuracy is None else
        f"{p.heldout_accuracy:.1%} ({p.heldout_correct}/{p.heldout_n})",
        "ci": None if not ci else f"{ci[0]:.1%} – {ci[1]:.1%}",
        "p_value": None if p.p_value is None else (f"{p.p_value:.2g}"),
        "baselines": [(k, "n/a" if v is None or not math.isfinite(v) else f"{v:.1%}")
                      for k, v in (p.baselines or {}).items()],
        "top_heads": table_view(p.heads.sort_values("accuracy", ascending=False).head(5)),
        "examples": table_view(p.examples, max_rows=60),
        "n_examples_rows": len(p.examples),
        "figures": list(figs),
    }


def _syntax(a: ModelAnalysis, figures: Figures) -> dict:
    """How heads were chosen, the relations and trees tables, the figures."""
    shown = ["relation", "direction", "n", "best_head", "heldout_accuracy", "ci95_low", "ci95_high",
             "baseline_offset", "baseline_accuracy", "p_value", "p_holm", "verdict"]
    result = a.syntax
    view = {"figures": list(figures.get("syntax", [])), "grids": list(figures.get("syntax-grid", [])), "result": None}
    if result is not None:
        trees = trees_frame(result)
        view["result"] = {
            "treebank": result.treebank, "selection": result.selection, "n": result.n_sentences,
            "n_select": result.n_select_sentences, "n_skipped": result.n_skipped, "alpha": result.alpha,
            "n_permutations": result.n_permutations, "notes": list(result.notes),
            "skipped": [f"{v} × {k}" for k, v in result.skipped.items()],
            "excluded": [f"{v} × {k}" for k, v in result.excluded.items()],
            "relations": table_view(relations_frame(result)[shown]),
            "trees": table_view(trees[[c for c in trees.columns if c != "verdict"]]) if len(trees) else None,
            "trees_verdict": result.trees.verdict if result.trees is not None else None,
        }
    return {"syntax": view}


def _comparison(a: ModelAnalysis, figures: Figures) -> dict:
    """This model (B) against the model it was compared with (A): the rule, changed heads, roles, grids."""
    c = a.comparison
    if c is None:
        return {"comparison": None}
    changed = c.changed()
    shown = changed.assign(head=[head_name(r.layer, r.head) for r in changed.itertuples()])
    roles = c.roles_changed.assign(head=[head_name(r.layer, r.head) for r in c.roles_changed.itertuples()])
    return {"comparison": {
        "a": c.a, "b": c.b, "n_texts": c.n_texts, "rule": c.rule,
        "heads": ", ".join(head_name(layer, head) for layer, head in c.changed_heads()) or "none",
        "changed": table_view(shown[["head", "metric", "a", "b", "diff", "ci_low", "ci_high", "p_holm"]]),
        "n_changed": len(changed), "n_pairs": len(c.table),
        "roles": table_view(roles[["head", "role", "in_a", "in_b"]]) if len(roles) else None,
        "figures": list(figures.get("comparison", [])),
    }}


def _sinks(a: ModelAnalysis, figures: Figures) -> dict:
    """The sink rates, the sink heads with their dormant calls, the massive activations, the StreamingLLM test."""
    r, s = a.sinks, a.streaming
    view: dict = {"figures": list(figures.get("sinks", [])), "report": None, "streaming": None}
    if r is not None:
        heads = r.to_frame()
        sinks = heads[heads["sink"]].sort_values("first_share_1", ascending=False)
        shown = [c for c in ("head_name", "first_share_1", "first_share_4", "value_norm_ratio", "norm_share",
                             "ablation_effect", "random_median", "ablation_p", "dormant") if c in sinks.columns]
        rates = r.rates_frame()[["source", "k", "epsilon", "length", "n_sequences", "value", "ci95_low", "ci95_high"]]
        massive = r.massive[r.massive["massive"]]
        view["report"] = {
            "rates": table_view(rates), "n_sinks": len(sinks), "n_heads": len(heads),
            "n_dormant": int(sinks["dormant"].eq(True).sum()) if "dormant" in sinks.columns else 0,
            "ablation": r.settings.get("ablation"), "epsilon": r.sink_rate.epsilon,
            "heads": table_view(sinks[shown], max_rows=40),
            "massive": table_view(massive.drop(columns="massive"), max_rows=30) if len(massive) else None,
            "first_massive_layer": r.first_massive_layer, "notes": list(r.notes),
        }
    if s is not None:
        d = s.to_dict()
        view["streaming"] = {"n_tokens": s.n_tokens, "window": s.window, "keep": s.keep, "source": s.source,
                             "table": table_view(pd.DataFrame(
                                 [{"attention": "dense", "perplexity": d["dense_ppl"],
                                   "beyond the window": d["beyond_window"]["dense_ppl"]},
                                  {"attention": f"window of {s.window}", "perplexity": d["window_ppl"],
                                   "beyond the window": d["beyond_window"]["window_ppl"]},
                                  *[{"attention": f"window + first {k}", "perplexity": v,
                                     "beyond the window": s.beyond_window(s.sink_window[int(k)])}
                                    for k, v in d["sink_window_ppls"].items()]]), digits=2)}
    return {"sinks": view}


def _mechanisms(a: ModelAnalysis, figures: Figures) -> dict:
    """Each part's headline (or why it did not run), the patching verdict, the figures."""
    m = a.mechanisms
    view: dict = {"figures": list(figures.get("mechanisms", [])), "result": None}
    if m is not None:
        top = m.composition.top(10) if m.composition is not None else None
        view["result"] = {
            "dla": [r.summary() for r in m.dla],
            "composition": None if m.composition is None else m.composition.summary(),
            "composition_top": None if top is None else table_view(top[["kind", "sender", "receiver", "score", "ratio"]]),
            "edges": m.edges,
            "patching": None if m.patching is None else m.patching.summary(),
            "verdict": None if m.patching is None else m.patching.verdict,
            "notes": list(m.notes),
            "seconds": ", ".join(f"{k} {v:.1f} s" for k, v in m.seconds.items()),
        }
    return {"mechanisms": view}


def _long_context(a: ModelAnalysis, figures: Figures) -> dict:
    """The needle grid, the retrieval heads, the causal check, the cost curve and its verdicts."""
    if a.long_context is None:
        return {"long_context": None}
    f = long_context_frames(a.long_context)
    return {"long_context": f | {"grid": table_view(f["grid"]), "top": table_view(f["top"]),
                                 "curve": table_view(f["curve"])}}


def _corpus(a: ModelAnalysis, figures: Figures) -> dict:
    return {"corpus": table_view(a.corpus)}


# ---------------------------------------------------------------- the tables each section writes


def _verification_tables(a: ModelAnalysis) -> dict:
    return {"verification": None if a.verification is None else a.verification.to_frame()}


def _heads_tables(a: ModelAnalysis) -> dict:
    s = a.scores
    return {"head_scores": None if s is None else s.table, "head_roles": None if s is None else s.roles,
            "ablation_heads": ablation_heads_table(a)}


def _probe_tables(a: ModelAnalysis) -> dict:
    """Per probe its summary row, its heads and its examples, each with a `task` column (several probes stack)."""
    def of(name: str) -> pd.DataFrame | None:
        parts = [f for p in a.probes if (f := _with(_probe_frames(p)[name], task=p.task)) is not None]  # empty: none
        return pd.concat(parts, ignore_index=True) if parts else None

    return {name: of(name) for name in ("probe_summary", "probe_heads", "probe_examples")}


def _probe_frames(p: Any) -> dict[str, pd.DataFrame | None]:
    best = p.best_head
    ci = p.ci95 or (None, None)
    row = {"level": p.level, "n": p.n, "best_layer": best[0] if best else None,
           "best_head": best[1] if best else None, "heldout_accuracy": p.heldout_accuracy,
           "heldout_correct": p.heldout_correct, "heldout_n": p.heldout_n, "ci95_low": ci[0], "ci95_high": ci[1],
           "p_value": p.p_value, "verdict": p.verdict}
    row.update({f"baseline_{k}": v for k, v in (p.baselines or {}).items()})
    return {"probe_summary": pd.DataFrame([row]), "probe_heads": p.heads, "probe_examples": p.examples}


def _syntax_tables(a: ModelAnalysis) -> dict:
    return syntax_tables(a.syntax, a.syntax_clusters)


def _comparison_tables(a: ModelAnalysis) -> dict:
    c = a.comparison
    if c is None:
        return {}
    return {"comparison_heads": _with(c.table, compared_with=c.a),
            "comparison_roles": _with(c.roles_changed, compared_with=c.a)}


def _sinks_tables(a: ModelAnalysis) -> dict:
    return sinks_tables(a.sinks, a.streaming)


def _mechanisms_tables(a: ModelAnalysis) -> dict:
    m = a.mechanisms
    if m is None:
        return {}
    return {"mechanisms_dla": m.dla_frame(), "mechanisms_composition": m.composition_frame(),
            "mechanisms_patching": m.patching_frame()}


def _corpus_tables(a: ModelAnalysis) -> dict:
    return {"corpus": a.corpus}


def _with(frame: pd.DataFrame | None, **cols: Any) -> pd.DataFrame | None:
    """`frame` with columns `cols` first (replacing columns of those names); None stays None."""
    if frame is None or not len(frame):
        return None
    frame = frame.copy()
    for k, v in reversed(list(cols.items())):
        if k in frame.columns:
            frame = frame.drop(columns=k)
        frame.insert(0, k, v)
    return frame


def report_tables(analyses: Sequence[ModelAnalysis]) -> dict[str, pd.DataFrame]:
    """Every table of the report, models stacked (a `model` column first), ready for CSV."""
    parts: dict[str, list[pd.DataFrame]] = {}
    for section in SECTIONS.values():
        for a in analyses:
            for name, frame in section.tables(a).items():
                frame = _with(frame, model=a.model)
                if frame is not None:
                    parts.setdefault(name, []).append(frame)
    return {k: pd.concat(v, ignore_index=True) for k, v in parts.items()}


# ---------------------------------------------------------------- the registry


def _vision(a: ModelAnalysis, figures: Figures) -> dict:
    """The images' overlays, layer mosaic and rollout, and the vision heads (their top scores)."""
    images = [m for m in a.maps if m.is_image]
    top = None
    if images and a.scores is not None:
        rows = [{"metric": metric, **{f"top {k + 1}": f"{head_name(r.layer, r.head)} {r.value:.2f}"
                                      for k, r in enumerate(a.scores.top(metric, 3).itertuples())}}
                for metric in VISION_METRICS
                if metric in a.scores.metrics and a.scores.table.loc[a.scores.table["metric"] == metric, "value"].notna().any()]
        top = table_view(pd.DataFrame(rows)) if rows else None
    return {"vision": {"figures": list(figures.get("vision", [])), "images": [m.text for m in images],
                       "grid": list(images[0].grid) if images else None, "top": top}}


def _vision_language(a: ModelAnalysis, figures: Figures) -> dict:
    """The texts with images, the heads that read the image most, the visual sink patches, the figures."""
    if a.image_cross:
        return {"vision_language": _cross_view(a, figures)}
    maps = a.vision_language
    if not maps:
        return {"vision_language": None}
    tables = vision_language_tables(maps, a.vision_language_value_norms)
    heads = tables["vision_language_heads"].sort_values("image_share", ascending=False, na_position="last")
    sinks = tables["visual_sinks"]
    sinks = sinks[sinks["sink"]].sort_values("image_share", ascending=False)
    layer, head = vision_language_head(a)
    return {"vision_language": {
        "cross": False, "figures": list(figures.get("vision_language", [])),
        "texts": [f"{m.text} ({len(m.pictures)} image(s), {sum(p is not None for p in m.patches)} image tokens)"
                  for m in maps],
        "head": head_name(layer, head),
        "heads": table_view(heads[["head_name", "image_share", "image_to_text", "image_to_later_text"]], max_rows=10),
        "n_sinks": len(sinks), "n_rows": len(tables["visual_sinks"]),
        "sinks": table_view(sinks[["text", "head_name", "label", "image", "view", "row", "col", "image_share",
                                   "received", "value_norm_ratio"]], max_rows=20) if len(sinks) else None,
        "norms": bool(a.vision_language_value_norms) and any(v is not None for v in a.vision_language_value_norms),
    }}


def _cross_view(a: ModelAnalysis, figures: Figures) -> dict:
    """A cross-attention reader (Mllama): its texts, every cross head's focus on the picture, which text token
    reads which image cell in the head the figures show."""
    tables = cross_tables(a.image_cross)
    layer, head = cross_head(a.image_cross)
    heads = tables["cross_attention_heads"].sort_values("image_entropy")
    return {"cross": True, "figures": list(figures.get("vision_language", [])), "head": head_name(layer, head),
            "texts": [f"{p.text} ({len(p.decoder.pictures)} image(s), {len(p.cross.keys)} image keys in cross "
                      f"layers {', '.join(map(str, p.cross.layer_ids))})" for p in a.image_cross],
            "heads": table_view(heads[["head_name", "image_entropy", "max_weight", "patch_share", "n"]], max_rows=10),
            "reads": table_view(tables["cross_attention_reads"][["text", "token", "image", "view", "row", "col",
                                                                 "weight"]], max_rows=20)}


def _vision_language_tables(a: ModelAnalysis) -> dict:
    if a.image_cross:
        return cross_tables(a.image_cross)
    return vision_language_tables(a.vision_language, a.vision_language_value_norms)


def _shows_images(analyses: Sequence[ModelAnalysis]) -> bool:
    return any(m.is_image for a in analyses for m in a.maps)


def _any(field: str, *more: str) -> Callable[[Sequence[ModelAnalysis]], bool]:
    def shown(analyses: Sequence[ModelAnalysis]) -> bool:
        return any(getattr(a, f) is not None for a in analyses for f in (field, *more))

    return shown


SECTIONS: Mapping[str, Section] = MappingProxyType({s.name: s for s in (
    Section("explorer", "Head explorer"),
    Section("verification", "Verification", _verification, _verification_tables),
    Section("heads", "Head roles", _heads, _heads_tables),
    Section("probe", "Coreference probe", _probes, _probe_tables),
    Section("attention", "Attention figures", lambda a, figures: {"chosen": start_choice(a)[2]}),
    Section("vision", "Vision", _vision, shown=_shows_images),
    Section("vision_language", "Vision–language", _vision_language, _vision_language_tables,
            shown=lambda analyses: any(a.vision_language or a.image_cross for a in analyses)),
    Section("syntax", "Syntax", _syntax, _syntax_tables, shown=_any("syntax", "syntax_clusters")),
    Section("comparison", "Comparison", _comparison, _comparison_tables, shown=_any("comparison")),
    Section("sinks", "Sinks", _sinks, _sinks_tables, shown=_any("sinks", "streaming")),
    Section("mechanisms", "Mechanisms", _mechanisms, _mechanisms_tables, shown=_any("mechanisms")),
    Section("long_context", "Long context", _long_context, lambda a: long_context_tables(a.long_context),
            shown=_any("long_context")),
    Section("corpus", "Corpus", _corpus, _corpus_tables),
    Section("settings", "Settings & versions"),
)})
