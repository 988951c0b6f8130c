"""The report: one self-contained HTML file, its figures as PNG (and SVG/PDF) files, its tables as CSV files.

`build_report(sections)` takes one `ModelSection` per model (plain results: AttentionMaps at the
levels to draw, Verification, HeadScores, ProbeResults, DataFrames — never a model) and returns a
`Report`; its figures are those `reports.figures.FIGURES` lists;
`Report.write(folder)` puts `index.html`, `figures/*.png` (or the formats asked for) and `*.csv` into a folder.

The HTML works offline from disk: no CDN and no request of any kind. A Content-Security-Policy
forbids them (`default-src 'none'`), the explorer script and the stylesheet are inlined and allowed
by their SHA-256 hashes only (so even markup that slipped through could not run a script), figures
are `data:` URIs, and the explorer's data sits in a `<script type="application/json">` block.
Every string from users or models is escaped by jinja2's autoescape; the explorer sets text with
`textContent` only.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import pandas as pd

from headscope.analyses.metrics import METRICS
from headscope.probe.types import head_name, json_safe

from .causal import causal_heads_table, causal_view, probe_line, roles_table
from .figures import FIGURES, FORMATS, STACKS, figure_bytes, plotted_metrics, slug, start_head, to_png
from .syntax import relations_frame, syntax_tables, trees_frame

if TYPE_CHECKING:
    from headscope.probe.types import AttentionMap, CrossAttentionMap, Seq2SeqAttention
    from headscope.probe.verify import Verification

__all__ = [
    "ModelSection",
    "FigureFile",
    "Report",
    "compact_png",
    "build_report",
    "explorer_data",
    "report_tables",
    "slug",
    "CSP",
]

# Explorer attention is stored as integers 0..1000 (three decimals): a report stays small.
_SCALE = 1000
_NORM_SCALE = 100  # norm-based weights: two decimals (a second copy of each sentence, for the toggle)
CSP = ("default-src 'none'; img-src data:; style-src {style}; script-src {script}; connect-src 'none'; "
       "font-src 'none'; media-src 'none'; object-src 'none'; frame-src 'none'; worker-src 'none'; "
       "base-uri 'none'; form-action 'none'")


@dataclass(frozen=True, eq=False)
class ModelSection:
    """Everything the report shows about one model. Any part may be missing (None / empty)."""

    model: str
    maps: tuple[AttentionMap, ...] = ()  # token-level maps of the report sentences (explorer, all-heads view)
    word_maps: tuple[AttentionMap, ...] = ()  # the same sentences at word level, in the same order (or none)
    pairs: tuple[Seq2SeqAttention, ...] = ()  # encoder–decoder models: each sentence with its target, token level
    word_pairs: tuple[Seq2SeqAttention, ...] = ()  # the same pairs at word level (or none)
    # The sentences' norm-based weights (`extract(..., weight="norm")`) at one level, in the same order (or
    # none); `headscope run` keeps the word level only, so that the page stays small.
    norm_maps: tuple[AttentionMap, ...] = ()
    generations: tuple[Any, ...] = ()  # headscope.GenerationAttention: the explorer steps through the new tokens
    verification: Verification | None = None
    scores: Any = None  # analyses.heads.HeadScores
    probes: tuple[Any, ...] = ()  # analyses.coref.ProbeResult, one per task
    corpus: pd.DataFrame | None = None  # corpus statistics, one row per corpus
    syntax: Any = None  # analyses.syntax.SyntaxResult (the Syntax section), or None
    syntax_clusters: pd.DataFrame | None = None  # analyses.syntax.head_clusters table
    comparison: Any = None  # analyses.compare.HeadComparison of this model (B) with the model it is compared to (A)
    info: Mapping[str, Any] = field(default_factory=dict)  # family, layers, heads, dtype, source, timings
    notes: tuple[str, ...] = ()  # problems to show prominently (a stage that could not run, ...)
    causal: Any = None  # analyses.causal.CausalEvidence (reports/causal.py), or None

    def __post_init__(self) -> None:
        for name in ("word_maps", "pairs", "word_pairs", "norm_maps"):
            given = getattr(self, name)
            if given and len(given) != len(self.maps):
                raise ValueError(f"{len(given)} {name.replace('_', ' ')} for {len(self.maps)} sentences; give one per "
                                 "sentence, or none")

    @property
    def heatmap_maps(self) -> tuple[AttentionMap, ...]:
        """The sentences at the probe's level (words when there is no probe), as given."""
        level = self.probes[0].level if self.probes else "word"
        return self.word_maps if level == "word" and self.word_maps else self.maps


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


def compact_png(png: bytes) -> bytes:
    """`png` with a 256-colour palette (no dithering), or `png` itself when that is not smaller."""
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    buf = io.BytesIO()
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        buf, format="PNG", optimize=True)
    return buf.getvalue() if buf.tell() < len(png) else png


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


def _figures_for(section: ModelSection, name: str, *, dpi: int, formats: Sequence[str] = ("png",),
                 width: float | None = None) -> list[FigureFile]:
    """Every figure of one model, files named `<name>-<stem>.png` (and `.svg`, `.pdf` when asked).

    The page always shows the PNG at the figure's own size; `formats` and `width` (inches) shape
    only the files written for papers.

    Ordered by report section (in `FIGURES` order), and within one the figures of one result stay
    together (a probe's grid, then its drill-down), results in the order they first appear.
    """
    out: list[FigureFile] = []
    for spec in FIGURES.values():
        for panel in spec.panels(section):
            fig = spec.draw(*panel.args)
            png = to_png(fig, dpi=dpi)
            files = {} if tuple(formats) == ("png",) and width is None else {  # the PNG drawn once when unscaled
                fmt: png if fmt == "png" and width is None else figure_bytes(fig, fmt, dpi=dpi, width=width)
                for fmt in formats}
            out.append(FigureFile(f"{name}-{spec.stem.format(**panel.words)}.png", spec.caption.format(**panel.words),
                                  png, spec.group, section.model, compact_png(png), panel.result, files))
    groups = list(dict.fromkeys(spec.group for spec in FIGURES.values()))
    results: list[Any] = []  # each result once, by identity (results need not be hashable)
    for f in out:
        if not any(f.result is r for r in results):
            results.append(f.result)

    def place(f: FigureFile) -> tuple[int, int]:
        return groups.index(f.group), next(i for i, r in enumerate(results) if r is f.result)

    return sorted(out, key=place)


def _file_names(sections: Sequence[ModelSection]) -> list[str]:
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


def explorer_data(sections: Sequence[ModelSection]) -> dict:
    """The explorer's data: per model its sentences, score grids, start head.

    Each sentence holds `views[kind][weight][level]`: kind "self" (one stack) or "encoder", "decoder",
    "cross" (`STACKS`), weight "attention" or "norm" (at the levels given), level "token" / "word". A view's units carry their own
    query labels and layer/head ids only where they differ from the keys' and the model's.
    """
    models = []
    for s in sections:
        if not s.maps:
            continue
        first = s.maps[0]
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


def _sentences(s: ModelSection) -> list[dict]:
    """One entry per report sentence: its views (one stack, or an encoder–decoder's three)."""
    out = []
    for i, amap in enumerate(s.maps):
        words = s.word_maps[i] if s.word_maps else None
        own = {"attention": _levels(amap, words)}
        if s.norm_maps:  # two decimals: the toggle's second copy of every sentence stays small
            own["norm"] = _levels(s.norm_maps[i], None, scale=_NORM_SCALE)
        if not s.pairs:
            out.append({"text": amap.text, "views": {"self": own}})
            continue
        pair, word_pair = s.pairs[i], s.word_pairs[i] if s.word_pairs else None
        views = {"encoder": own}
        for kind in ("decoder", "cross"):  # their own layers, heads and masking (a decoder may differ in size)
            views[kind] = {"attention": _levels(getattr(pair, kind), getattr(word_pair, kind, None), own=True)}
        out.append({"text": f"{amap.text} \u2192 {pair.decoder.text}", "views": views})
    return out + [_generation(g) for g in s.generations]


def _generation(gen: Any) -> dict:
    """A generation as the explorer steps through it: per new token its one query row over the prompt and
    the tokens generated so far (a causal row: it sees every key up to itself)."""
    import torch

    prompt = gen.prompt
    steps = []
    for t, (token, row) in enumerate(zip(gen.generated_tokens, gen.steps)):  # row: [layer, head, key]
        n_l, n_h, n_k = row.shape
        ints = (row.float() * _SCALE).round().to(torch.int32).reshape(n_l * n_h, n_k)  # [layer*head, 1*key]
        units = {"labels": list(gen.key_labels(t)), "special": [bool(x) for x in prompt.special] + [False] * (t + 1),
                 "att": ints.tolist(), "queries": [token], "qspecial": [False], "causal": True, "offset": n_k - 1}
        steps.append({"token": token, "views": {"self": {"attention": {"token": units}}}})
    return {"text": f"generated after \u201c{prompt.text}\u201d: {gen.text}", "steps": steps}


def _explorer_note(s: ModelSection) -> str:
    if not s.pairs:
        return ""
    target = s.info.get("targets", "")
    return ("Encoder\u2013decoder model: pick encoder self-, decoder self- or cross-attention. Cross-attention rows are "
            "the target's units (the decoder's input), columns the source's." + (f" Targets: {target}." if target else ""))


def _levels(amap: AttentionMap | CrossAttentionMap, words: AttentionMap | CrossAttentionMap | None, *,
            own: bool = False, scale: int = _SCALE) -> dict:
    levels = {amap.level: _units(amap, own=own, scale=scale)}
    if words is not None:
        levels[words.level] = _units(words, own=own, scale=scale)
    return levels


def _units(amap: AttentionMap | CrossAttentionMap, *, own: bool = False, scale: int = _SCALE) -> dict:
    """Labels and attention of one view, as integers 0..`scale`; `own`: it carries its layer/head ids and
    masking (else the model's)."""
    import torch

    att = amap.attention.detach().float().cpu()  # [layer, head, query, key]
    n_l, n_h, n_q, n_k = att.shape
    ints = (att * scale).round().to(torch.int32).reshape(n_l * n_h, n_q * n_k)  # [layer*head, query*key]
    keys, queries = getattr(amap, "keys", amap), getattr(amap, "queries", amap)  # a cross map's two sides
    out = {"labels": list(keys.labels), "special": [bool(x) for x in keys.special], "att": ints.tolist()}
    if scale != _SCALE:
        out["scale"] = scale
    if queries is not keys:
        out.update(queries=list(queries.labels), qspecial=[bool(x) for x in queries.special])
    if own:
        out.update(layer_ids=list(amap.layer_ids), head_ids=list(amap.head_ids), causal=bool(amap.causal))
    return out


def _grids(section: ModelSection, layer_ids: list[int], head_ids: list[int]) -> dict:
    grids: dict[str, dict] = {}
    for probe in section.probes:
        g = probe.heads.pivot(index="layer", columns="head", values="accuracy")
        chance = (probe.baselines or {}).get("chance")
        grids[f"probe:{probe.task}"] = _grid(g, layer_ids, head_ids, f"{probe.task}: accuracy",
                                             f"accuracy over {probe.n} examples" +
                                             (f", chance {chance:.0%}" if chance is not None else ""))
    if section.scores is not None:
        for metric in plotted_metrics(section.scores):
            grids[metric] = _grid(section.scores.grid(metric), layer_ids, head_ids, METRICS[metric].label,
                                  f"{section.scores.level} level, {section.scores.n_texts} texts"
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


# ---------------------------------------------------------------- tables


def report_tables(sections: Sequence[ModelSection]) -> dict[str, pd.DataFrame]:
    """Every table of the report, models stacked (a `model` column), ready for CSV."""
    parts: dict[str, list[pd.DataFrame]] = {}

    def put(name: str, frame: pd.DataFrame | None, model: str, **cols: Any) -> None:
        if frame is None or not len(frame):
            return
        frame = frame.copy()
        for k, v in reversed(list({"model": model, **cols}.items())):
            if k in frame.columns:
                frame = frame.drop(columns=k)
            frame.insert(0, k, v)
        parts.setdefault(name, []).append(frame)

    for s in sections:
        if s.verification is not None:
            put("verification", s.verification.to_frame(), s.model)
        if s.scores is not None:
            put("head_scores", s.scores.table, s.model)
            put("head_roles", s.scores.roles, s.model)
        for p in s.probes:
            put("probe_summary", pd.DataFrame([_probe_summary(p)]), s.model, task=p.task)
            put("probe_heads", p.heads, s.model, task=p.task)
            put("probe_examples", p.examples, s.model, task=p.task)
        put("corpus", s.corpus, s.model)
        for name, frame in syntax_tables(s.syntax, s.syntax_clusters).items():
            put(name, frame, s.model)
        if s.comparison is not None:
            put("comparison_heads", s.comparison.table, s.model, compared_with=s.comparison.a)
            put("comparison_roles", s.comparison.roles_changed, s.model, compared_with=s.comparison.a)
        put("causal_heads", causal_heads_table(s), s.model)
    return {k: pd.concat(v, ignore_index=True) for k, v in parts.items()}


def _probe_summary(p: Any) -> dict:
    best = p.best_head
    ci = p.ci95 or (None, None)
    row = {"level": p.level, "n": p.n, "best_layer": best[0] if best else None,
           "best_head": best[1] if best else None, "heldout_accuracy": p.heldout_accuracy,
           "heldout_correct": p.heldout_correct, "heldout_n": p.heldout_n, "ci95_low": ci[0], "ci95_high": ci[1],
           "p_value": p.p_value, "verdict": p.verdict}
    row.update({f"baseline_{k}": v for k, v in (p.baselines or {}).items()})
    return row


@dataclass(frozen=True)
class _Table:
    """A table ready for the template: header, rows of display strings, which columns are numbers."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: tuple[bool, ...]


def _view(frame: pd.DataFrame | None, *, digits: int = 3, max_rows: int | None = None) -> _Table | None:
    if frame is None or not len(frame.columns):
        return None
    frame = frame if max_rows is None else frame.head(max_rows)
    numeric = tuple(pd.api.types.is_numeric_dtype(frame[c]) and not pd.api.types.is_bool_dtype(frame[c])
                    for c in frame.columns)
    rows = tuple(tuple(_cell(v, digits) for v in r) for r in frame.itertuples(index=False, name=None))
    return _Table(tuple(str(c) for c in frame.columns), rows, numeric)


def _cell(v: Any, digits: int) -> str:
    if v is None:
        return ""
    if isinstance(v, float) or hasattr(v, "dtype") and getattr(v.dtype, "kind", "") == "f":
        v = float(v)
        if math.isnan(v):
            return "n/a"
        if v != 0 and (abs(v) < 10 ** -digits or abs(v) >= 1e6):
            return f"{v:.2e}"
        return f"{v:.{digits}f}"
    return str(v)


# ---------------------------------------------------------------- HTML


@functools.lru_cache(maxsize=1)
def _environment():
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader(__package__, "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    return env


def _static(name: str) -> str:
    return resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8")


_COMMON = "// @include common.js"


def static_script(name: str) -> str:
    """A script of `static/` with the helpers both views share (`static/common.js`) put in at its
    `// @include common.js` line, inside its own function, so that they add no page global."""
    source = _static(name)
    if source.count(_COMMON) != 1:
        raise ValueError(f"{name} must hold the line '{_COMMON}' once")
    return source.replace(_COMMON, _static("common.js").strip(), 1)


def _hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def _script_json(obj: Any) -> str:
    """JSON that is safe inside <script>: <, >, &, ' escaped as \\u003c ... (jinja2's htmlsafe dumps)."""
    from jinja2.utils import htmlsafe_json_dumps

    return str(htmlsafe_json_dumps(json_safe(obj), dumps=functools.partial(json.dumps, separators=(",", ":"),
                                                                            ensure_ascii=False, allow_nan=False)))


def build_report(
    sections: Sequence[ModelSection],
    *,
    title: str | None = None,
    settings: Mapping[str, Any] | None = None,
    versions: Mapping[str, Any] | None = None,
    dpi: int = 100,
    formats: Sequence[str] = ("png",),
    width: float | None = None,
) -> Report:
    """Figures, tables and the HTML page for one or more models (side by side).

    `formats` (of `reports.figures.FORMATS`), `dpi` and `width` (inches, a paper's column) shape the
    figure files; the page inlines the PNG at `dpi` and the figures' own size.
    """
    from markupsafe import Markup

    if not sections:
        raise ValueError("a report needs at least one model section")
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise ValueError(f"figure formats {list(formats)}: choose one or more of {', '.join(FORMATS)}")
    per_model = [_figures_for(s, name, dpi=dpi, formats=tuple(dict.fromkeys(formats)), width=width)
                 for s, name in zip(sections, _file_names(sections))]
    figures = [f for figs in per_model for f in figs]
    tables = report_tables(sections)
    script, style = static_script("explorer.js"), _static("report.css")
    data = _script_json(explorer_data(sections))
    if "</script" in script.lower():
        raise ValueError("explorer.js must not contain '</script'")
    csp = CSP.format(style=_hash(style), script=_hash(script))
    assert not set(csp) & set('"<>&'), csp  # plain ASCII tokens: safe as an attribute value unescaped
    title = title or "headscope report — " + " vs ".join(s.model for s in sections)
    html = _environment().get_template("report.html.j2").render(
        title=title,
        csp=Markup(csp),
        style=Markup(style),
        script=Markup(script),
        data=Markup(data),
        models=[_template_model(s, figs) for s, figs in zip(sections, per_model)],
        failed=[s.model for s in sections if s.verification is not None and not s.verification.passed],
        settings=_flat(settings or {}),
        versions=_flat(versions or {}),
        tables=sorted(tables),
        figure_names=[n for f in figures for n in f.written],
        figure_kinds=", ".join(f.upper() for f in dict.fromkeys(formats)),
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        has_explorer=any(s.maps for s in sections),
        has_syntax=any(s.syntax is not None or s.syntax_clusters is not None for s in sections),
        has_comparison=any(s.comparison is not None for s in sections),
    )
    return Report(html=html, figures=tuple(figures), tables=tables)


def _flat(d: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.extend(_flat(v, key + "."))
        elif isinstance(v, (list, tuple)):
            out.append((key, ", ".join(str(x) for x in v)))
        else:
            out.append((key, "" if v is None else str(v)))
    return out


def _template_model(s: ModelSection, figs: Sequence[FigureFile]) -> dict:
    """What the template needs of one model, numbers already formatted."""
    by_group: dict[str, list[FigureFile]] = {}
    for f in figs:
        by_group.setdefault(f.group, []).append(f)
    v = s.verification
    scores = s.scores
    return {
        "name": s.model,
        "info": _flat(s.info),
        "notes": list(s.notes),
        "sentences": [m.text for m in s.maps],
        "figures": by_group,
        "verification": None if v is None else {
            "passed": v.passed, "summary": v.summary(), "table": _view(_kind_first(v.to_frame()), digits=2),
            "detail": f"{v.n_texts} texts, {v.n_tokens} tokens; output tolerance {v.tolerance_output:g} "
                      f"(relative); recomputation took {v.overhead:.2f}× the forward pass",
            "notes": list(getattr(v, "notes", ()) or ()),
        },
        "scores": None if scores is None else _scores_view(scores, roles_table(s)),
        "causal": _causal_view(s),
        "probes": [_probe_view(p, [f for f in by_group.get("probe", []) if f.result is p])
                   | {"causal": probe_line(s, p.task)} for p in s.probes],
        "corpus": _view(s.corpus),
        "comparison": _comparison_view(s.comparison, by_group.get("comparison", [])),
        "syntax": _syntax_view(s.syntax, by_group.get("syntax", []), by_group.get("syntax-grid", [])),
    }


def _kind_first(frame: pd.DataFrame) -> pd.DataFrame:
    """An encoder–decoder's verification rows say first which attention they are (encoder, decoder, cross)."""
    return frame[["kind", *[c for c in frame.columns if c != "kind"]]] if "kind" in frame.columns else frame


def _causal_view(s: ModelSection) -> dict | None:
    view = causal_view(s)
    return None if view is None else view | {"correlations": _view(view["correlations"], digits=2)}


def _scores_view(scores: Any, roles: pd.DataFrame) -> dict:
    plotted = plotted_metrics(scores)
    top = []
    for m in plotted:
        t = scores.top(m, k=3)
        top.append({"metric": m, "heads": ", ".join(f"{head_name(r.layer, r.head)} ({float(r.value):.2f})"
                                                     for r in t.itertuples())})
    return {
        "setting": getattr(scores, "setting", f"{scores.level} level"),
        "n_texts": getattr(scores, "n_texts", None),
        "n_sequences": getattr(scores, "n_sequences", None),
        "roles": _view(roles[[c for c in roles.columns if c != "model"]]),
        "n_roles": len(scores.roles),
        "top": _view(pd.DataFrame(top)),
        "not_applicable": [m for m in scores.metrics if m not in plotted],
    }


def _probe_view(p: Any, figs: Sequence[FigureFile]) -> dict:
    best = p.best_head
    ci = p.ci95
    baselines = {k: v for k, v in (p.baselines or {}).items()}
    examples = p.examples
    return {
        "task": p.task, "level": p.level, "n": p.n, "verdict": p.verdict,
        "best": f"layer {best[0]}, head {best[1]}" if best else "none",
        "heldout": None if p.heldout_accuracy is None else
        f"{p.heldout_accuracy:.1%} ({p.heldout_correct}/{p.heldout_n})",
        "ci": None if not ci else f"{ci[0]:.1%} – {ci[1]:.1%}",
        "p_value": None if p.p_value is None else (f"{p.p_value:.2g}"),
        "baselines": [(k, "n/a" if v is None or not math.isfinite(v) else f"{v:.1%}") for k, v in baselines.items()],
        "top_heads": _view(p.heads.sort_values("accuracy", ascending=False).head(5)),
        "examples": _view(examples, max_rows=60),
        "n_examples_rows": len(examples),
        "figures": list(figs),
    }


def _syntax_view(result: Any, figs: Sequence[FigureFile], grids: Sequence[FigureFile]) -> dict:
    """The Syntax section of one model: how heads were chosen, the relations and trees tables, figures."""
    shown = ["relation", "direction", "n", "best_head", "heldout_accuracy", "ci95_low", "ci95_high",
             "baseline_offset", "baseline_accuracy", "p_value", "p_holm", "verdict"]
    view = {"figures": list(figs), "grids": list(grids), "result": None}
    if result is not None:
        trees = trees_frame(result)
        view["result"] = {
            "treebank": result.treebank, "selection": result.selection, "n": result.n_sentences,
            "n_select": result.n_select_sentences, "n_skipped": result.n_skipped, "alpha": result.alpha,
            "n_permutations": result.n_permutations, "notes": list(result.notes),
            "skipped": [f"{v} × {k}" for k, v in result.skipped.items()],
            "excluded": [f"{v} × {k}" for k, v in result.excluded.items()],
            "relations": _view(relations_frame(result)[shown]),
            "trees": _view(trees[[c for c in trees.columns if c != "verdict"]]) if len(trees) else None,
            "trees_verdict": result.trees.verdict if result.trees is not None else None,
        }
    return view


def _comparison_view(c: Any, figs: Sequence[FigureFile]) -> dict | None:
    """This model (B) against the model it was compared with (A): the rule, changed heads, roles, grids."""
    if c is None:
        return None
    changed = c.changed()
    shown = changed.assign(head=[head_name(r.layer, r.head) for r in changed.itertuples()])
    roles = c.roles_changed.assign(head=[head_name(r.layer, r.head) for r in c.roles_changed.itertuples()])
    return {
        "a": c.a, "b": c.b, "n_texts": c.n_texts, "rule": c.rule,
        "heads": ", ".join(head_name(layer, head) for layer, head in c.changed_heads()) or "none",
        "changed": _view(shown[["head", "metric", "a", "b", "diff", "ci_low", "ci_high", "p_holm"]]),
        "n_changed": len(changed), "n_pairs": len(c.table),
        "roles": _view(roles[["head", "role", "in_a", "in_b"]]) if len(roles) else None,
        "figures": list(figs),
    }
