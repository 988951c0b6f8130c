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
from .figures import FIGURES, FORMATS, figure_bytes, plotted_metrics, slug, start_head, to_png

if TYPE_CHECKING:
    from headscope.probe.types import AttentionMap
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
CSP = ("default-src 'none'; img-src data:; style-src {style}; script-src {script}; connect-src 'none'; "
       "font-src 'none'; media-src 'none'; object-src 'none'; frame-src 'none'; worker-src 'none'; "
       "base-uri 'none'; form-action 'none'")


@dataclass(frozen=True, eq=False)
class ModelSection:
    """Everything the report shows about one model. Any part may be missing (None / empty)."""

    model: str
    maps: tuple[AttentionMap, ...] = ()  # token-level maps of the report sentences (explorer, all-heads view)
    word_maps: tuple[AttentionMap, ...] = ()  # the same sentences at word level, in the same order (or none)
    verification: Verification | None = None
    scores: Any = None  # analyses.heads.HeadScores
    probes: tuple[Any, ...] = ()  # analyses.coref.ProbeResult, one per task
    corpus: pd.DataFrame | None = None  # corpus statistics, one row per corpus
    info: Mapping[str, Any] = field(default_factory=dict)  # family, layers, heads, dtype, source, timings
    notes: tuple[str, ...] = ()  # problems to show prominently (a stage that could not run, ...)
    causal: Any = None  # analyses.causal.CausalEvidence (reports/causal.py), or None

    def __post_init__(self) -> None:
        if self.word_maps and len(self.word_maps) != len(self.maps):
            raise ValueError(f"{len(self.word_maps)} word-level maps for {len(self.maps)} sentences; give one per "
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
    """The explorer's data: per model its sentences (token and word level), score grids, start head."""
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
            "sentences": [_sentence(m, w) for m, w in zip(s.maps, s.word_maps or (None,) * len(s.maps))],
            "grids": grids,
            "start": {"layer": layer_ids.index(layer) if layer in layer_ids else 0,
                      "head": head_ids.index(head) if head in head_ids else 0, "metric": start_metric},
        })
    return {"models": models}


def _sentence(amap: AttentionMap, words: AttentionMap | None) -> dict:
    levels = {amap.level: _units(amap)}
    if words is not None:
        levels[words.level] = _units(words)
    return {"text": amap.text, "levels": levels}


def _units(amap: AttentionMap) -> dict:
    import torch

    att = amap.attention.detach().float().cpu()  # [layer, head, query, key]
    n_l, n_h, n, _ = att.shape
    ints = (att * _SCALE).round().to(torch.int32).reshape(n_l * n_h, n * n)  # [layer*head, query*key]
    return {"labels": list(amap.labels), "special": [bool(x) for x in amap.special], "att": ints.tolist()}


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
    script, style = _static("explorer.js"), _static("report.css")
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
            "passed": v.passed, "summary": v.summary(), "table": _view(v.to_frame(), digits=2),
            "detail": f"{v.n_texts} texts, {v.n_tokens} tokens; output tolerance {v.tolerance_output:g} "
                      f"(relative); recomputation took {v.overhead:.2f}× the forward pass",
            "notes": list(getattr(v, "notes", ()) or ()),
        },
        "scores": None if scores is None else _scores_view(scores, roles_table(s)),
        "causal": _causal_view(s),
        "probes": [_probe_view(p, [f for f in by_group.get("probe", []) if f.result is p])
                   | {"causal": probe_line(s, p.task)} for p in s.probes],
        "corpus": _view(s.corpus),
    }


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
