// headscope head explorer: plain JavaScript, no library, no network.
// Reads the report data from <script type="application/json" id="hs-data">. Every string that
// came from a user or a model (tokens, sentences, model names) is set with textContent, never as
// markup. Attention is stored per head as a flat [query * n + key] list of integers 0..1000.
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";
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
    levels: Array.prototype.slice.call(document.querySelectorAll("input[name='hs-level']"))
  };
  var state = { model: 0, sentence: 0, level: "word", layer: 0, head: 0, metric: null, focus: null };

  function el(name, attrs, text) {
    var node = name.indexOf("svg:") === 0 ? document.createElementNS(SVG, name.slice(4)) : document.createElement(name);
    if (attrs) { Object.keys(attrs).forEach(function (k) { node.setAttribute(k, String(attrs[k])); }); }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }
  function clear(node) { while (node.firstChild) { node.removeChild(node.firstChild); } }
  function option(select, value, text) { var o = el("option", { value: value }, text); select.appendChild(o); return o; }

  // Sequential blues (matplotlib's "Blues", as in the PNG figures), interpolated between its 9 stops.
  var BLUES = [[247, 251, 255], [222, 235, 247], [198, 219, 239], [158, 202, 225], [107, 174, 214],
    [66, 146, 198], [33, 113, 181], [8, 81, 156], [8, 48, 107]];
  // Score grids: matplotlib's "rocket_r"-like light -> dark, 6 stops.
  var WARM = [[250, 235, 221], [246, 170, 130], [234, 96, 76], [180, 38, 85], [103, 28, 83], [40, 15, 45]];
  function ramp(stops, v) {
    var t = Math.max(0, Math.min(1, v)) * (stops.length - 1);
    var i = Math.min(stops.length - 2, Math.floor(t)), f = t - i, a = stops[i], b = stops[i + 1];
    return "rgb(" + [0, 1, 2].map(function (c) { return Math.round(a[c] + f * (b[c] - a[c])); }).join(",") + ")";
  }
  function blue(v) { return ramp(BLUES, v); }
  // Grid colours over the grid's own range [lo, hi]; NaN (not applicable) is grey.
  function gridColour(v, lo, hi) {
    if (v === null || v === undefined || isNaN(v)) { return "#e6e6e6"; }
    return ramp(WARM, hi > lo ? (v - lo) / (hi - lo) : 0);
  }
  function label(s) {
    var shown = String(s).replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5");
    return shown.trim() ? shown : "\u2423";
  }

  function model() { return data.models[state.model]; }
  function unitData() {
    var levels = model().sentences[state.sentence].levels;  // a word-level-only map has no "token"
    return levels[state.level] || levels[Object.keys(levels)[0]];
  }
  function headIndex() { var m = model(); return state.layer * m.head_ids.length + state.head; }
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
    m.layer_ids.forEach(function (l, i) { option(ui.layer, i, "layer " + l); });
    m.head_ids.forEach(function (h, i) { option(ui.head, i, "head " + h); });
    Object.keys(m.grids).forEach(function (k) { option(ui.metric, k, m.grids[k].title); });
    state.sentence = Math.min(state.sentence, m.sentences.length - 1);
    state.layer = Math.min(m.start.layer, m.layer_ids.length - 1);
    state.head = Math.min(m.start.head, m.head_ids.length - 1);
    state.metric = m.start.metric in m.grids ? m.start.metric : Object.keys(m.grids)[0] || null;
    ui.sentence.value = String(state.sentence);
    ui.layer.value = String(state.layer);
    ui.head.value = String(state.head);
    if (state.metric) { ui.metric.value = state.metric; }
    ui.metric.parentNode.hidden = !state.metric;
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
    state.layer = li; state.head = hi; state.focus = null;
    ui.layer.value = String(li); ui.head.value = String(hi);
    render();
  }

  // ---------------------------------------------------------------- heatmap (SVG)
  function drawHeatmap() {
    var svg = ui.heatmap, u = unitData(), w = weights(), m = model();
    var n = u.labels.length;
    clear(svg);
    var cell = n <= 20 ? 24 : n <= 40 ? 16 : 11;
    var font = n <= 20 ? 12 : n <= 40 ? 10 : 8;
    var longest = u.labels.reduce(function (a, s) { return Math.max(a, label(s).length); }, 1);
    var margin = Math.min(160, 12 + longest * font * 0.62);
    var size = margin + n * cell + 8;
    svg.setAttribute("viewBox", "0 0 " + size + " " + size);
    svg.setAttribute("width", size);
    svg.setAttribute("height", size);
    svg.setAttribute("data-layer", m.layer_ids[state.layer]);
    svg.setAttribute("data-head", m.head_ids[state.head]);
    svg.setAttribute("data-level", state.level);
    var cells = el("svg:g", { transform: "translate(" + margin + "," + margin + ")" });
    for (var q = 0; q < n; q++) {
      for (var k = 0; k < n; k++) {
        var masked = m.causal && k > q;
        var v = w[q * n + k] / 1000;
        var r = el("svg:rect", { x: k * cell, y: q * cell, width: cell, height: cell, fill: masked ? "#eeeeee" : blue(v),
          "class": "hs-cell", "data-q": q, "data-k": k });
        if (!masked) { r.appendChild(el("svg:title", null, label(u.labels[q]) + " \u2192 " + label(u.labels[k]) + ": " + v.toFixed(3))); }
        cells.appendChild(r);
      }
    }
    if (state.focus !== null && state.focus < n) {
      cells.appendChild(el("svg:rect", { x: 0, y: state.focus * cell, width: n * cell, height: cell, fill: "none",
        stroke: "#d62728", "stroke-width": 2, "pointer-events": "none" }));
    }
    svg.appendChild(cells);
    for (var i = 0; i < n; i++) {
      var cls = "hs-label" + (u.special[i] ? " hs-special" : "") + (i === state.focus ? " hs-focus" : "");
      var ty = el("svg:text", { x: margin - 4, y: margin + i * cell + cell / 2, "text-anchor": "end",
        "dominant-baseline": "central", "font-size": font, "class": cls, "data-q": i }, label(u.labels[i]));
      svg.appendChild(ty);
      // Column labels read upwards; one character (or two CJK ones) stays upright.
      var upright = /^(.|[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]{2})$/.test(label(u.labels[i]));
      var tx = el("svg:text", { x: 0, y: 0, "text-anchor": upright ? "middle" : "start", "dominant-baseline": upright ? "auto" : "central",
        "font-size": font, "class": cls,
        transform: "translate(" + (margin + i * cell + cell / 2) + "," + (margin - 4) + ")" + (upright ? "" : " rotate(-90)") }, label(u.labels[i]));
      svg.appendChild(tx);
    }
    ui.caption.textContent = m.name + " \u00b7 layer " + m.layer_ids[state.layer] + " head " + m.head_ids[state.head] +
      " \u00b7 " + state.level + " level \u00b7 rows: query (attending), columns: key (attended to)";
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
    var u = unitData(), w = weights(), n = u.labels.length;
    var q = state.focus === null ? null : state.focus;
    if (q === null) { ui.stripNote.textContent = "Hover a token (a row label or a cell) to see where it attends."; }
    var row = q === null ? null : w.slice(q * n, q * n + n);
    var max = row ? Math.max.apply(null, row.concat([1])) : 1;
    u.labels.forEach(function (s, k) {
      var span = el("span", { "class": "hs-tok" + (u.special[k] ? " hs-special" : "") + (k === q ? " hs-query" : ""), "data-k": k }, label(s));
      if (row) {
        var v = row[k] / 1000;
        span.style.background = blue(v);
        span.style.color = v > 0.5 ? "#fff" : "#111";
        span.title = v.toFixed(3);
      }
      span.addEventListener("mouseenter", function () { if (state.focus !== k) { state.focus = k; drawHeatmap(); } });
      ui.strip.appendChild(span);
    });
    if (row) {
      var order = row.map(function (v, k) { return [v, k]; }).sort(function (a, b) { return b[0] - a[0]; }).slice(0, 3);
      ui.stripNote.textContent = "\u201c" + label(u.labels[q]) + "\u201d attends most to: " + order.map(function (p) {
        return "\u201c" + label(u.labels[p[1]]) + "\u201d " + (p[0] / 1000).toFixed(2);
      }).join(", ");
    }
  }

  function render() {
    drawGrid();
    drawHeatmap();
  }

  // ---------------------------------------------------------------- wiring
  ui.model.addEventListener("change", function () { state.model = parseInt(ui.model.value, 10); state.sentence = 0; state.focus = null; fillModelControls(); render(); });
  ui.sentence.addEventListener("change", function () { state.sentence = parseInt(ui.sentence.value, 10); state.focus = null; drawHeatmap(); });
  ui.layer.addEventListener("change", function () { select(parseInt(ui.layer.value, 10), state.head); });
  ui.head.addEventListener("change", function () { select(state.layer, parseInt(ui.head.value, 10)); });
  ui.metric.addEventListener("change", function () { state.metric = ui.metric.value; drawGrid(); });
  ui.levels.forEach(function (r) {
    r.addEventListener("change", function () { if (r.checked) { state.level = r.value; state.focus = null; drawHeatmap(); } });
  });
  ui.heatmap.addEventListener("mouseover", onHover);
  // Arrow keys step through heads (left/right) and layers (up/down) while the heatmap has focus
  // (click it or tab to it); elsewhere they scroll the page as usual.
  ui.heatmap.setAttribute("tabindex", "0");
  ui.heatmap.addEventListener("click", function () { ui.heatmap.focus(); });
  ui.heatmap.addEventListener("keydown", function (ev) {
    var m = model(), nh = m.head_ids.length, nl = m.layer_ids.length;
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
