"""The report: one self-contained HTML file, its figures as PNG (and SVG/PDF) files, its tables as CSV files.

`build_report(analyses)` takes one `reports.analysis.ModelAnalysis` per model (plain results:
AttentionMaps, Verification, HeadScores, ProbeResults, DataFrames — never a model) and returns a
`Report`: its sections are `reports.sections.SECTIONS` (each with its template, its view of a model
and its tables), its figures `reports.panels.FIGURES`. `Report.write(folder)` puts `index.html`,
`figures/*.png` (or the formats asked for) and `*.csv` into a folder; `reports.folder.report` writes
that folder whole or not at all, with its run.json.

The HTML works offline from disk: no CDN and no request of any kind. A Content-Security-Policy
forbids them (`default-src 'none'`), the explorer script and the stylesheet are inlined and allowed
by their SHA-256 hashes only (so even markup that slipped through could not run a script), figures
are `data:` URIs, and the explorer's data sits in a `<script type="application/json">` block.
Every string from users or models is escaped by jinja2's autoescape; the explorer sets text with
`textContent` only.
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import pandas as pd

from headscope.probe.words import to_word_level

from .analysis import ModelAnalysis
from .canvas import FORMATS
from .drawing import Drawn, DrawingPool, compact_png, draw_all
from .page import CSP, csp_hash, environment, script_json, static_script, static_text
from .panels import FIGURES, STACKS, FigureSpec, Panel, plotted_metrics, slug, start_head
from .payload import SCALE, attention_ints, attention_payload, image_payload, with_keys
from .sections import SECTIONS, Section, flat, report_tables
from headscope.probe.wording import counted

if TYPE_CHECKING:
    from headscope.probe.types import AttentionMap, CrossAttentionMap

__all__ = [
    "FigureFile",
    "Report",
    "compact_png",
    "build_report",
    "explorer_data",
]

# Explorer attention is embedded by `reports.payload` (integers 0..SCALE, pooled past POOL_ABOVE units).
_NORM_SCALE = 100  # norm-based weights: two decimals (a second copy of each sentence, for the toggle)


@dataclass(frozen=True)
class FigureFile:
    """One figure of the report: `png` as written to `figures/<name>` (full colour, for papers),
    `inline` the copy in the page (256 colours: about a third of the size, the same to the eye)."""

    name: str
    caption: str
    png: bytes
    group: str  # verification | heads | probe | attention
    model: str
    inline: bytes = b""
    result: Any = field(default=None, repr=False, compare=False)  # what it draws (a probe's figures sit by it)
    files: Mapping[str, bytes] = field(default_factory=dict, repr=False)  # format -> the file written; {} = png only

    @property
    def written(self) -> dict[str, bytes]:
        """File name under `figures/` -> its bytes, one per requested format (`name` alone by default)."""
        stem = self.name.rsplit(".", 1)[0]
        return {f"{stem}.{fmt}": data for fmt, data in self.files.items()} if self.files else {self.name: self.png}

    @property
    def data_uri(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.inline or self.png).decode("ascii")


@dataclass(frozen=True, eq=False)
class Report:
    html: str
    figures: tuple[FigureFile, ...]
    tables: Mapping[str, pd.DataFrame]

    def write(self, folder: str | Path) -> list[Path]:
        """Write index.html, figures/*.png and <table>.csv into `folder` (created if needed)."""
        folder = Path(folder)
        (folder / "figures").mkdir(parents=True, exist_ok=True)
        written = [folder / "index.html"]
        written[0].write_text(self.html, encoding="utf-8")
        for f in self.figures:
            for name, data in f.written.items():
                path = folder / "figures" / name
                path.write_bytes(data)
                written.append(path)
        for name, frame in self.tables.items():
            path = folder / f"{name}.csv"
            frame.to_csv(path, index=False)
            written.append(path)
        return written


# ---------------------------------------------------------------- figures


def _figure_jobs(section: ModelAnalysis) -> list[tuple[FigureSpec, Panel]]:
    """Every figure of one model to draw: its spec and panel, in `FIGURES` order."""
    return [(spec, panel) for spec in FIGURES.values() for panel in spec.panels(section)]


def _figure_files(section: ModelAnalysis, name: str, jobs: Sequence[tuple[FigureSpec, Panel]],
                  drawn: Sequence[Drawn]) -> list[FigureFile]:
    """One model's figures (`jobs`, drawn as `drawn`), files named `<name>-<stem>.png` (and `.svg`, `.pdf` when
    asked).

    Ordered by report section (in `FIGURES` order), and within one the figures of one result stay
    together (a probe's grid, then its drill-down), results in the order they first appear.
    """
    out = [FigureFile(f"{name}-{spec.stem.format(**panel.words)}.png", spec.caption.format(**panel.words), d.png,
                      spec.group, section.model, d.inline, panel.result, d.files)
           for (spec, panel), d in zip(jobs, drawn)]
    groups = list(dict.fromkeys(spec.group for spec in FIGURES.values()))
    results: list[Any] = []  # each result once, by identity (results need not be hashable)
    for f in out:
        if not any(f.result is r for r in results):
            results.append(f.result)

    def place(f: FigureFile) -> tuple[int, int]:
        return groups.index(f.group), next(i for i, r in enumerate(results) if r is f.result)

    return sorted(out, key=place)


def _file_names(sections: Sequence[ModelAnalysis]) -> list[str]:
    """A distinct file-name stem per model ("a/b" and "a-b" would share a slug)."""
    names: list[str] = []
    for s in sections:
        base = slug(s.model)
        name, i = base, 2
        while name in names:
            name, i = f"{base}-{i}", i + 1
        names.append(name)
    return names


# ---------------------------------------------------------------- explorer data


def explorer_data(sections: Sequence[ModelAnalysis]) -> dict:
    """The explorer's data: per model its sentences, score grids, start head.

    Each sentence holds `views[kind][weight][level]`: kind "self" (one stack) or "encoder", "decoder",
    "cross" (`STACKS`), weight "attention" or "norm" (at the levels given), level "token" / "word". A view's units carry their own
    query labels and layer/head ids only where they differ from the keys' and the model's.
    """
    models = []
    for s in sections:
        if not s.maps and not s.vision_language:
            continue
        first = (s.maps or s.vision_language)[0]
        layer_ids, head_ids = list(first.layer_ids), list(first.head_ids)
        grids = _grids(s, layer_ids, head_ids)
        layer, head = start_head(s)
        start_metric = next((k for k in grids if k.startswith("probe:")), "previous_token")
        models.append({
            "name": s.model,
            "causal": bool(first.causal),
            "layer_ids": layer_ids,
            "head_ids": head_ids,
            "sentences": _sentences(s),
            "kinds": {"self": "Self-attention", **STACKS},
            "note": _explorer_note(s),
            "grids": grids,
            "start": {"layer": layer_ids.index(layer) if layer in layer_ids else 0,
                      "head": head_ids.index(head) if head in head_ids else 0, "metric": start_metric},
        })
    return {"models": models}


def _sentences(s: ModelAnalysis) -> list[dict]:
    """One entry per report sentence: its views (one stack, or an encoder–decoder's three)."""
    out = []
    for i, amap in enumerate(s.maps):
        words = s.word_maps[i] if s.word_maps else None
        own = {"attention": _levels(amap, words)}
        if s.shown_norm_maps:  # two decimals: the toggle's second copy of every sentence stays small
            own["norm"] = _levels(s.shown_norm_maps[i], None, scale=_NORM_SCALE)
        if not s.pairs:
            out.append({"text": amap.text, "views": {"self": own}})
            continue
        pair, word_pair = s.pairs[i], s.word_pairs[i] if s.word_pairs else None
        views = {"encoder": own}
        for kind in ("decoder", "cross"):  # their own layers, heads and masking (a decoder may differ in size)
            views[kind] = {"attention": _levels(getattr(pair, kind), getattr(word_pair, kind, None), own=True)}
        out.append({"text": f"{amap.text} \u2192 {pair.decoder.text}", "views": views})
    return out + [_generation(g) for g in s.generations] + [_vision_language_sentence(m) for m in s.vision_language]


def _vision_language_sentence(amap: AttentionMap) -> dict:
    """A text with images (`ModelAnalysis.vision_language`): its self-attention, and its pictures (each view
    carries `images`, `reports.payload.image_payload`), at word level too where its tokens know their words."""
    words = to_word_level(amap) if len(amap.word_index) == len(amap) else None
    return {"text": f"{amap.text} (with {len(amap.pictures)} image{'s' if len(amap.pictures) != 1 else ''})",
            "views": {"self": {"attention": _levels(amap, words)}}}


def _generation(gen: Any) -> dict:
    """A generation as the explorer steps through it: per new token its one query row over the prompt and
    the tokens generated so far (a causal row: it sees every key up to itself)."""
    prompt = gen.prompt
    images = image_payload(prompt) if prompt.patches or prompt.is_image else None  # drawn under each step's row
    steps = []
    for t, (token, row) in enumerate(zip(gen.generated_tokens, gen.steps)):  # row: [layer, head, key]
        n_k = row.shape[-1]
        units = {"labels": list(gen.key_labels(t)), "special": [bool(x) for x in prompt.special] + [False] * (t + 1),
                 "att": attention_ints(row.float().unsqueeze(2)), "queries": [token], "qspecial": [False],
                 "causal": True, "offset": n_k - 1}  # one query row: never pooled
        if images is not None:
            units["images"] = with_keys(images, n_k)
        steps.append({"token": token, "views": {"self": {"attention": {"token": units}}}})
    return {"text": f"generated after \u201c{prompt.text}\u201d: {gen.text}", "steps": steps}


def _explorer_note(s: ModelAnalysis) -> str:
    if not s.pairs:
        return ""
    target = s.info.get("targets", "")
    return ("Encoder\u2013decoder model: pick encoder self-, decoder self- or cross-attention. Cross-attention rows are "
            "the target's units (the decoder's input), columns the source's." + (f" Targets: {target}." if target else ""))


def _levels(amap: AttentionMap | CrossAttentionMap, words: AttentionMap | CrossAttentionMap | None, *,
            own: bool = False, scale: int = SCALE) -> dict:
    levels = {amap.level: _units(amap, own=own, scale=scale)}
    if words is not None:
        levels[words.level] = _units(words, own=own, scale=scale)
    return levels


def _units(amap: AttentionMap | CrossAttentionMap, *, own: bool = False, scale: int = SCALE) -> dict:
    """Labels and attention of one view, as integers 0..`scale` (`reports.payload`, pooled past `POOL_ABOVE`
    units); `own`: it carries its layer/head ids and masking (else the model's)."""
    keys, queries = getattr(amap, "keys", amap), getattr(amap, "queries", amap)  # a cross map's two sides
    p = attention_payload(amap.attention.detach().float().cpu(), queries.labels, keys.labels, scale=scale)
    out = {"labels": p["keys"], "special": [bool(x) for x in keys.special], "att": p["att"]}
    if "pooled" in p:  # one flag per tile: all of its units special
        e = p["pooled"]
        out.update(special=[all(keys.special[a:b]) for a, b in zip(e["key_edges"], e["key_edges"][1:])], pooled=e,
                   queries=p["queries"],
                   qspecial=[all(queries.special[a:b]) for a, b in zip(e["query_edges"], e["query_edges"][1:])])
    if scale != SCALE:
        out["scale"] = scale
    if queries is not keys and "pooled" not in p:
        out.update(queries=p["queries"], qspecial=[bool(x) for x in queries.special])
    if own:
        out.update(layer_ids=list(amap.layer_ids), head_ids=list(amap.head_ids), causal=bool(amap.causal))
    images = image_payload(amap) if getattr(amap, "patches", ()) or getattr(amap, "is_image", False) else None
    if images is not None:  # an image's or a vision–language map's pictures, drawn under its image units
        out["images"] = images
    return out


def _grids(section: ModelAnalysis, layer_ids: list[int], head_ids: list[int]) -> dict:
    grids: dict[str, dict] = {}
    for probe in section.probes:
        g = probe.heads.pivot(index="layer", columns="head", values="accuracy")
        chance = (probe.baselines or {}).get("chance")
        grids[f"probe:{probe.task}"] = _grid(g, layer_ids, head_ids, f"{probe.task}: accuracy",
                                             f"accuracy over {counted(probe.n, 'example')}" +
                                             (f", chance {chance:.0%}" if chance is not None else ""))
    if section.scores is not None:
        for metric in plotted_metrics(section.scores):
            grids[metric] = _grid(section.scores.grid(metric), layer_ids, head_ids,
                                  section.scores.registry[metric].label,
                                  f"{section.scores.level} level, {counted(section.scores.n_texts, 'text')}"
                                  if getattr(section.scores, "n_texts", 0) else "")
    return grids


def _grid(g: pd.DataFrame, layer_ids: list[int], head_ids: list[int], title: str, note: str) -> dict:
    """One score grid for the explorer; colours span the grid's own range (stated in the note)."""
    g = g.reindex(index=layer_ids, columns=head_ids)
    values = [[None if not math.isfinite(float(v)) else round(float(v), 4) for v in row] for row in g.to_numpy()]
    finite = [v for row in values for v in row if v is not None]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    span = f"colour from {lo:.2f} (light) to {hi:.2f} (dark)"
    return {"title": title, "values": values, "min": lo, "max": hi, "note": f"{note}; {span}" if note else span}


# ---------------------------------------------------------------- HTML


def build_report(
    analyses: Sequence[ModelAnalysis],
    *,
    title: str | None = None,
    settings: Mapping[str, Any] | None = None,
    versions: Mapping[str, Any] | None = None,
    dpi: int = 100,
    formats: Sequence[str] = ("png",),
    width: float | None = None,
    workers: int | None = None,
    pool: DrawingPool | None = None,
) -> Report:
    """Figures, tables and the HTML page for one or more models (side by side).

    `formats` (of `reports.canvas.FORMATS`), `dpi` and `width` (inches, a paper's column) shape the
    figure files; the page inlines the PNG at `dpi` and the figures' own size. The figures are drawn on
    `workers` processes (`reports.drawing.draw_all`; default: one per core, 1: all in this one), or on the
    started `pool`'s and this one.
    """
    from markupsafe import Markup

    if not analyses:
        raise ValueError("a report needs at least one model's analysis")
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise ValueError(f"figure formats {list(formats)}: choose one or more of {', '.join(FORMATS)}")
    jobs = [_figure_jobs(s) for s in analyses]
    # The page always shows the PNG at the figure's own size; `formats` and `width` shape only the files.
    drawn = iter(draw_all([(spec.draw, panel.args) for model in jobs for spec, panel in model], dpi=dpi,
                          formats=tuple(dict.fromkeys(formats)), width=width, workers=workers, pool=pool))
    per_model = [_figure_files(s, name, model, [next(drawn) for _ in model])
                 for s, name, model in zip(analyses, _file_names(analyses), jobs)]
    figures = [f for figs in per_model for f in figs]
    tables = report_tables(analyses)
    shown = [section for section in SECTIONS.values() if section.shown(analyses)]
    script, style = static_script("explorer.js"), static_text("report.css")
    data = script_json(explorer_data(analyses))
    if "</script" in script.lower():
        raise ValueError("explorer.js must not contain '</script'")
    csp = CSP.format(style=csp_hash(style), script=csp_hash(script))
    assert not set(csp) & set('"<>&'), csp  # plain ASCII tokens: safe as an attribute value unescaped
    title = title or "headscope report — " + " vs ".join(s.model for s in analyses)
    html = environment().get_template("report.html.j2").render(
        title=title,
        csp=Markup(csp),
        style=Markup(style),
        script=Markup(script),
        data=Markup(data),
        models=[_template_model(s, figs, shown) for s, figs in zip(analyses, per_model)],
        failed=[s.model for s in analyses if s.verification is not None and not s.verification.passed],
        sections=shown,
        settings=flat(settings or {}),
        versions=flat(versions or {}),
        tables=sorted(tables),
        figure_names=[n for f in figures for n in f.written],
        figure_kinds=", ".join(f.upper() for f in dict.fromkeys(formats)),
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    )
    return Report(html=html, figures=tuple(figures), tables=tables)


def _template_model(a: ModelAnalysis, figs: Sequence[FigureFile], sections: Sequence[Section]) -> dict:
    """What the template needs of one model: its name, info, notes, sentences and figures, and each
    section's view of it (`Section.view`), numbers already formatted."""
    by_group: dict[str, list[FigureFile]] = {}
    for f in figs:
        by_group.setdefault(f.group, []).append(f)
    model = {"name": a.model, "info": flat(a.info), "notes": list(a.notes), "sentences": [m.text for m in a.maps],
             "explorable": bool(a.maps or a.vision_language), "figures": by_group}
    for section in sections:
        model.update(section.view(a, by_group))
    return model
