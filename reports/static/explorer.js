// headscope head explorer: plain JavaScript, no library, no network.
// Reads the report data from <script type="application/json" id="hs-data">. Every string that
// came from a user or a model (tokens, sentences, model names) is set with textContent, never as
// markup. Attention is stored per head as a flat [query * n_keys + key] list of integers 0..1000
// (0..scale where a view gives its own scale).
// A sentence holds views[kind][weight][level]: kind "self", or an encoder-decoder's "encoder",
// "decoder", "cross"; weight "attention" or "norm"; a generation holds one such set per step.
(function () {
  "use strict";
  // @include common.js
  var dataEl = document.getElementById("hs-data");
  var root = document.getElementById("hs-explorer");
  if (!dataEl || !root) { return; }
  var data = JSON.parse(dataEl.textContent);
  if (!data.models || !data.models.length) { root.hidden = true; return; }

  var ui = {
    model: document.getElementById("hs-model"),
    sentence: document.getElementById("hs-sentence"),
    layer: document.getElementById("hs-layer"),
    head: document.getElementById("hs-head"),
    metric: document.getElementById("hs-metric"),
    grid: document.getElementById("hs-grid"),
    gridNote: document.getElementById("hs-grid-note"),
    heatmap: document.getElementById("hs-heatmap"),
    caption: document.getElementById("hs-caption"),
    strip: document.getElementById("hs-strip"),
    stripNote: document.getElementById("hs-strip-note"),
    pictures: document.getElementById("hs-pictures"),
    pictureNote: document.getElementById("hs-picture-note"),
    levels: Array.prototype.slice.call(document.querySelectorAll("input[name='hs-level']")),
    kind: document.getElementById("hs-kind"),
    weights: Array.prototype.slice.call(document.querySelectorAll("input[name='hs-weight']")),
    weightBox: document.getElementById("hs-weight-box"),
    stepBox: document.getElementById("hs-step-box"),
    step: document.getElementById("hs-step"),
    prev: document.getElementById("hs-prev"),
    next: document.getElementById("hs-next"),
    note: document.getElementById("hs-note")
  };
  var state = { model: 0, sentence: 0, step: 0, kind: null, weight: "attention", level: "word", layer: 0, head: 0,
    metric: null, focus: null };

  function option(select, value, text) { var o = el("option", { value: value }, text); select.appendChild(o); return o; }

  // Score grids: matplotlib's "rocket_r"-like light -> dark, 6 stops.
  var WARM = [[250, 235, 221], [246, 170, 130], [234, 96, 76], [180, 38, 85], [103, 28, 83], [40, 15, 45]];
  // Grid colours over the grid's own range [lo, hi]; NaN (not applicable) is grey.
  function gridColour(v, lo, hi) {
    if (v === null || v === undefined || isNaN(v)) { return "#e6e6e6"; }
    return ramp(WARM, hi > lo ? (v - lo) / (hi - lo) : 0);
  }

  function model() { return data.models[state.model]; }
  function sentence() { return model().sentences[state.sentence]; }
  function first(obj, key) { return obj[key] || obj[Object.keys(obj)[0]]; }
  function views() { var s = sentence(); return s.steps ? s.steps[state.step].views : s.views; }
  function kindViews() { return first(views(), state.kind); }
  // Norm weights where the view has them at this level, else attention.
  function hasNorm() { var n = kindViews().norm; return !!n && state.level in n; }
  function unitData() {
    var levels = state.weight === "norm" && hasNorm() ? kindViews().norm : kindViews().attention;
    return first(levels, state.level);  // a word-level-only map has no "token"
  }
  // A view's own layers and heads (an encoder-decoder's decoder may differ), else the model's.
  function layerIds() { return unitData().layer_ids || model().layer_ids; }
  function headIds() { return unitData().head_ids || model().head_ids; }
  function queries(u) { return u.queries || u.labels; }
  function causal(u) { return u.causal === undefined ? model().causal : u.causal; }
  // A causal query q sees keys up to q + offset (offset > 0: a generated token over a longer sequence).
  function masked(u, q, k) { return causal(u) && k > q + (u.offset || 0); }
  function headIndex() { return state.layer * headIds().length + state.head; }
  function weights() { return unitData().att[headIndex()]; }

  // ---------------------------------------------------------------- controls
  function fillModels() {
    clear(ui.model);
    data.models.forEach(function (m, i) { option(ui.model, i, m.name); });
    ui.model.parentNode.hidden = data.models.length < 2;
  }
  function fillModelControls() {
    var m = model();
    clear(ui.sentence); clear(ui.layer); clear(ui.head); clear(ui.metric);
    m.sentences.forEach(function (s, i) { option(ui.sentence, i, s.text.length > 80 ? s.text.slice(0, 77) + "\u2026" : s.text); });
    Object.keys(m.grids).forEach(function (k) { option(ui.metric, k, m.grids[k].title); });
    state.sentence = Math.min(state.sentence, m.sentences.length - 1);
    state.layer = m.start.layer;
    state.head = m.start.head;
    state.metric = m.start.metric in m.grids ? m.start.metric : Object.keys(m.grids)[0] || null;
    ui.sentence.value = String(state.sentence);
    if (state.metric) { ui.metric.value = state.metric; }
    ui.metric.parentNode.hidden = !state.metric;
    if (ui.note) { ui.note.textContent = m.note || ""; ui.note.hidden = !m.note; }
    fillViewControls();
  }
  // The controls that depend on the sentence: kind, weight, step, and the view's layers and heads.
  function fillViewControls() {
    var s = sentence(), m = model();
    state.step = s.steps ? Math.min(state.step, s.steps.length - 1) : 0;
    if (ui.stepBox) { ui.stepBox.hidden = !s.steps; }
    var kinds = Object.keys(views());
    if (!(state.kind in views())) { state.kind = kinds[0]; }
    if (ui.kind) {
      clear(ui.kind);
      kinds.forEach(function (k) { option(ui.kind, k, m.kinds[k] || k); });
      ui.kind.value = state.kind;
      ui.kind.parentNode.hidden = kinds.length < 2;
    }
    if (ui.weightBox) { ui.weightBox.hidden = !hasNorm(); }
    clear(ui.layer); clear(ui.head);
    layerIds().forEach(function (l, i) { option(ui.layer, i, "layer " + l); });
    headIds().forEach(function (h, i) { option(ui.head, i, "head " + h); });
    state.layer = Math.min(state.layer, layerIds().length - 1);
    state.head = Math.min(state.head, headIds().length - 1);
    ui.layer.value = String(state.layer);
    ui.head.value = String(state.head);
    if (s.steps && ui.step) {
      ui.step.textContent = "step " + (state.step + 1) + " of " + s.steps.length + ": \u201c" + label(s.steps[state.step].token) + "\u201d";
      ui.prev.disabled = state.step === 0;
      ui.next.disabled = state.step === s.steps.length - 1;
    }
  }

  // ---------------------------------------------------------------- score grid (click a cell)
  function drawGrid() {
    clear(ui.grid);
    var m = model();
    if (!state.metric) { ui.gridNote.textContent = "no head scores in this report"; return; }
    var g = m.grids[state.metric];
    var table = el("table", { "class": "hs-gridtable", role: "grid" });
    var head = el("tr");
    head.appendChild(el("th", null, "L\\H"));
    m.head_ids.forEach(function (h) { head.appendChild(el("th", { scope: "col" }, h)); });
    table.appendChild(head);
    g.values.forEach(function (row, li) {
      var tr = el("tr");
      tr.appendChild(el("th", { scope: "row" }, m.layer_ids[li]));
      row.forEach(function (v, hi) {
        var td = el("td", { "data-layer": li, "data-head": hi, tabindex: -1 });
        td.style.background = gridColour(v, g.min, g.max);
        var dark = v !== null && g.max > g.min && (v - g.min) / (g.max - g.min) > 0.55;
        td.style.color = dark ? "#fff" : "#222";
        td.title = "layer " + m.layer_ids[li] + " head " + m.head_ids[hi] + ": " + (v === null ? "n/a" : v.toFixed(3));
        td.textContent = v === null ? "" : (Math.abs(v) >= 10 ? v.toFixed(0) : v.toFixed(2).replace(/^0\./, "."));
        if (li === state.layer && hi === state.head) { td.className = "hs-selected"; }
        td.addEventListener("click", function () { select(li, hi); });
        tr.appendChild(td);
      });
      table.appendChild(tr);
    });
    ui.grid.appendChild(table);
    ui.gridNote.textContent = g.note || "";
  }

  function select(li, hi) {
    state.layer = Math.min(li, layerIds().length - 1); state.head = Math.min(hi, headIds().length - 1); state.focus = null;
    ui.layer.value = String(state.layer); ui.head.value = String(state.head);
    render();
  }

  // ---------------------------------------------------------------- heatmap (SVG)
  function drawHeatmap() {
    var svg = ui.heatmap, u = unitData(), w = weights(), m = model();
    var rows = queries(u), nq = rows.length, nk = u.labels.length, n = Math.max(nq, nk);
    var qspecial = u.qspecial || u.special;
    clear(svg);
    var cell = n <= 20 ? 24 : n <= 40 ? 16 : 11;
    var font = n <= 20 ? 12 : n <= 40 ? 10 : 8;
    var longest = rows.concat(u.labels).reduce(function (a, s) { return Math.max(a, label(s).length); }, 1);
    var margin = Math.min(160, 12 + longest * font * 0.62);
    var width = margin + nk * cell + 8, height = margin + nq * cell + 8;
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.setAttribute("data-layer", layerIds()[state.layer]);
    svg.setAttribute("data-head", headIds()[state.head]);
    svg.setAttribute("data-level", state.level);
    svg.setAttribute("data-kind", state.kind);
    svg.setAttribute("data-weight", hasNorm() ? state.weight : "attention");
    var cells = el("svg:g", { transform: "translate(" + margin + "," + margin + ")" });
    for (var q = 0; q < nq; q++) {
      for (var k = 0; k < nk; k++) {
        var off = masked(u, q, k);
        var v = w[q * nk + k] / (u.scale || 1000);
        var r = el("svg:rect", { x: k * cell, y: q * cell, width: cell, height: cell, fill: off ? "#eeeeee" : blue(v),
          "class": "hs-cell", "data-q": q, "data-k": k });
        if (!off) { r.appendChild(el("svg:title", null, label(rows[q]) + " \u2192 " + label(u.labels[k]) + ": " + v.toFixed(3))); }
        cells.appendChild(r);
      }
    }
    if (state.focus !== null && state.focus < nq) {
      cells.appendChild(el("svg:rect", { x: 0, y: state.focus * cell, width: nk * cell, height: cell, fill: "none",
        stroke: "#d62728", "stroke-width": 2, "pointer-events": "none" }));
    }
    svg.appendChild(cells);
    rows.forEach(function (s, i) {
      var cls = "hs-label" + (qspecial[i] ? " hs-special" : "") + (i === state.focus ? " hs-focus" : "");
      svg.appendChild(el("svg:text", { x: margin - 4, y: margin + i * cell + cell / 2, "text-anchor": "end",
        "dominant-baseline": "central", "font-size": font, "class": cls, "data-q": i }, label(s)));
    });
    u.labels.forEach(function (s, i) {
      var cls = "hs-label hs-key" + (u.special[i] ? " hs-special" : "") + (!u.queries && i === state.focus ? " hs-focus" : "");
      // Column labels read upwards; one character (or two CJK ones) stays upright.
      var upright = /^(.|[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]{2})$/.test(label(s));
      svg.appendChild(el("svg:text", { x: 0, y: 0, "text-anchor": upright ? "middle" : "start", "dominant-baseline": upright ? "auto" : "central",
        "font-size": font, "class": cls, "data-k": i,
        transform: "translate(" + (margin + i * cell + cell / 2) + "," + (margin - 4) + ")" + (upright ? "" : " rotate(-90)") }, label(s)));
    });
    var kinds = Object.keys(views()), weight = svg.getAttribute("data-weight");
    ui.caption.textContent = m.name + (kinds.length > 1 ? " \u00b7 " + (m.kinds[state.kind] || state.kind) : "") +
      (weight === "norm" ? " \u00b7 norm-weighted \u2016\u03b1f(x)\u2016" : "") +
      " \u00b7 layer " + layerIds()[state.layer] + " head " + headIds()[state.head] + " \u00b7 " + state.level + " level \u00b7 " +
      (u.queries ? "rows: " + (state.kind === "cross" ? "target" : "generated") + " query (attending), columns: " +
        (state.kind === "cross" ? "source" : "sequence") + " key (attended to)" : "rows: query (attending), columns: key (attended to)");
    drawStrip();
  }

  // Hovering a token (row label or cell) shows where it attends, over the sentence itself.
  function onHover(ev) {
    var t = ev.target;
    if (!t || !t.getAttribute) { return; }
    var q = t.getAttribute("data-q");
    if (q === null) { return; }
    q = parseInt(q, 10);
    if (q === state.focus) { return; }
    state.focus = q;
    drawHeatmap();
  }

  function drawStrip() {
    clear(ui.strip);
    var u = unitData(), w = weights(), n = u.labels.length, rows = queries(u);
    var q = state.focus === null || state.focus >= rows.length ? null : state.focus;
    if (q === null) { ui.stripNote.textContent = "Hover a token (a row label or a cell) to see where it attends."; }
    var row = q === null ? null : w.slice(q * n, q * n + n).map(function (v, k) { return masked(u, q, k) ? 0 : v; });
    var max = row ? Math.max.apply(null, row.concat([1])) : 1;
    u.labels.forEach(function (s, k) {
      var span = el("span", { "class": "hs-tok" + (u.special[k] ? " hs-special" : "") + (!u.queries && k === q ? " hs-query" : ""), "data-k": k }, label(s));
      if (row) {
        var v = row[k] / (u.scale || 1000);
        span.style.background = blue(v);
        span.style.color = v > 0.5 ? "#fff" : "#111";
        span.title = v.toFixed(3);
      }
      // Over one sequence a key is a query too: hovering it shows where it attends.
      if (!u.queries) { span.addEventListener("mouseenter", function () { if (state.focus !== k) { state.focus = k; drawHeatmap(); } }); }
      ui.strip.appendChild(span);
    });
    if (row) {
      var order = row.map(function (v, k) { return [v, k]; }).sort(function (a, b) { return b[0] - a[0]; }).slice(0, 3);
      ui.stripNote.textContent = "\u201c" + label(rows[q]) + "\u201d attends most to: " + order.map(function (p) {
        return "\u201c" + label(u.labels[p[1]]) + "\u201d " + (p[0] / (u.scale || 1000)).toFixed(2);
      }).join(", ");
    }
    drawImageRow();
  }

  // A text with images: its pictures, and over them the selected token's row on the image tokens (the last text
  // token's until one is picked). A pooled view's row is its tile row's maxima, key tile by key tile.
  function drawImageRow() {
    if (!ui.pictures) { return; }
    var u = unitData(), images = u.images, w = weights(), n = u.labels.length, rows = queries(u), scale = u.scale || 1000;
    ui.pictureNote.textContent = "";
    if (!images) { drawPictures(ui.pictures, null); return; }
    var p = u.pooled, unit = null, q = state.focus === null || state.focus >= rows.length ? null : state.focus, weightOf;
    var picked = q !== null;
    if (p) {
      var tileOf = function (edges, k) { var t = 0; while (t + 1 < edges.length - 1 && edges[t + 1] <= k) { t++; } return t; };
      if (q === null) { q = tileOf(p.query_edges, startUnit(images, p.n_queries)); }
      weightOf = function (k) { var t = tileOf(p.key_edges, k); return masked(u, q, t) ? 0 : w[q * n + t] / scale; };
    } else {
      if (q === null) { q = startUnit(images, rows.length); }
      unit = q;
      weightOf = function (k) { return masked(u, q, k) ? 0 : w[q * n + k] / scale; };
    }
    drawPictures(ui.pictures, images, weightOf, unit);
    var share = images.cells.reduce(function (a, c, k) { return c ? a + weightOf(k) : a; }, 0);
    ui.pictureNote.textContent = "\u201c" + label(rows[q]) + "\u201d over the picture \u00b7 layer " + layerIds()[state.layer] +
      " head " + headIds()[state.head] + (p ? " \u00b7 pooled: each tile's largest weight" : " \u00b7 " + share.toFixed(2) +
      " of its attention on the image") + "; orange: its attention on each image token, relative to the largest." +
      (picked ? "" : " Hover or click a token to pick another.");
  }

  function render() {
    drawGrid();
    drawHeatmap();
  }

  // ---------------------------------------------------------------- wiring
  ui.model.addEventListener("change", function () { state.model = parseInt(ui.model.value, 10); state.sentence = 0; state.step = 0; state.focus = null; fillModelControls(); render(); });
  ui.sentence.addEventListener("change", function () { state.sentence = parseInt(ui.sentence.value, 10); state.step = 0; state.focus = null; fillViewControls(); drawHeatmap(); });
  function redrawView() { state.focus = null; fillViewControls(); drawHeatmap(); }
  if (ui.kind) { ui.kind.addEventListener("change", function () { state.kind = ui.kind.value; redrawView(); }); }
  ui.weights.forEach(function (r) {
    r.addEventListener("change", function () { if (r.checked) { state.weight = r.value; redrawView(); } });
  });
  if (ui.prev) { ui.prev.addEventListener("click", function () { state.step = Math.max(0, state.step - 1); redrawView(); }); }
  if (ui.next) { ui.next.addEventListener("click", function () { state.step += 1; redrawView(); }); }
  ui.layer.addEventListener("change", function () { select(parseInt(ui.layer.value, 10), state.head); });
  ui.head.addEventListener("change", function () { select(state.layer, parseInt(ui.head.value, 10)); });
  ui.metric.addEventListener("change", function () { state.metric = ui.metric.value; drawGrid(); });
  ui.levels.forEach(function (r) {
    r.addEventListener("change", function () { if (r.checked) { state.level = r.value; redrawView(); } });
  });
  ui.heatmap.addEventListener("mouseover", onHover);
  ui.heatmap.addEventListener("click", onHover);
  // Arrow keys step through heads (left/right) and layers (up/down) while the heatmap has focus
  // (click it or tab to it); elsewhere they scroll the page as usual.
  ui.heatmap.setAttribute("tabindex", "0");
  ui.heatmap.addEventListener("click", function () { ui.heatmap.focus(); });
  ui.heatmap.addEventListener("keydown", function (ev) {
    var nh = headIds().length, nl = layerIds().length;
    var moves = { ArrowRight: [0, 1], ArrowLeft: [0, nh - 1], ArrowDown: [1, 0], ArrowUp: [nl - 1, 0] };
    var d = moves[ev.key];
    if (!d) { return; }
    ev.preventDefault();
    select((state.layer + d[0]) % nl, (state.head + d[1]) % nh);
  });

  fillModels();
  state.level = ui.levels.filter(function (r) { return r.checked; }).map(function (r) { return r.value; })[0] || "word";
  fillModelControls();
  render();
  root.setAttribute("data-ready", "1");
})();
