// headscope inline view for notebook output cells: plain JavaScript, no require.js, no library, no
// network. A function expression, called once per output with the root element's id: the data sits
// in the JSON block whose id is ROOTID-data; every element the view makes lives inside the
// root, so two outputs on one page never share an id. Strings from users or models are set with
// textContent only. Attention is stored per head as a flat [query * n_keys + key] list of 0..1000.
(function (rootId) {
  "use strict";
  var root = document.getElementById(rootId);
  var dataEl = document.getElementById(rootId + "-data");
  if (!root || !dataEl) { return; }
  var data = JSON.parse(dataEl.textContent);
  // @include common.js
  var state = { map: 0, layer: data.start.layer, head: data.start.head, focus: null };

  function part(cls) { return root.querySelector("." + cls); }
  function current() { return data.maps[state.map]; }
  function masked(m, q, k) { return m.causal && k > q + m.offset; }  // a decoder's future keys
  function weights(m, li, hi) { return m.att[li * data.head_ids.length + hi]; }

  // ---------------------------------------------------------------- model view: one thumbnail per head
  function drawModelView() {
    var box = part("hs-model-view"), m = current(), nq = m.queries.length, nk = m.keys.length;
    clear(box);
    var px = Math.max(2, Math.min(6, Math.floor(60 / Math.max(nq, nk))));
    var table = el("table", { "class": "hs-thumbs" });
    var head = el("tr");
    head.appendChild(el("th", null, "L\\H"));
    data.head_ids.forEach(function (h) { head.appendChild(el("th", null, h)); });
    table.appendChild(head);
    data.layer_ids.forEach(function (l, li) {
      var tr = el("tr");
      tr.appendChild(el("th", null, l));
      data.head_ids.forEach(function (h, hi) {
        var td = el("td");
        var canvas = el("canvas", { width: nk * px, height: nq * px, "class": "hs-thumb", "data-layer": li, "data-head": hi,
          title: "layer " + l + " head " + h + " (click to enlarge)" });
        if (li === state.layer && hi === state.head) { canvas.className = "hs-thumb hs-on"; }
        var ctx = canvas.getContext("2d"), w = weights(m, li, hi);
        for (var q = 0; q < nq; q++) {
          for (var k = 0; k < nk; k++) {
            ctx.fillStyle = masked(m, q, k) ? "#eeeeee" : blue(Math.sqrt(w[q * nk + k] / 1000));
            ctx.fillRect(k * px, q * px, px, px);
          }
        }
        canvas.addEventListener("click", function () { state.layer = li; state.head = hi; state.focus = null; render(); });
        td.appendChild(canvas);
        tr.appendChild(td);
      });
      table.appendChild(tr);
    });
    box.appendChild(table);
  }

  // ---------------------------------------------------------------- head view: the enlarged head
  function drawHeadView() {
    var svg = part("hs-head-view"), m = current(), nq = m.queries.length, nk = m.keys.length;
    var w = weights(m, state.layer, state.head);
    clear(svg);
    var n = Math.max(nq, nk), cell = n <= 20 ? 22 : n <= 40 ? 14 : 9, font = n <= 20 ? 12 : n <= 40 ? 10 : 8;
    var longest = m.queries.concat(m.keys).reduce(function (a, s) { return Math.max(a, label(s).length); }, 1);
    var margin = Math.min(150, 12 + longest * font * 0.62);
    svg.setAttribute("width", margin + nk * cell + 8);
    svg.setAttribute("height", margin + nq * cell + 8);
    svg.setAttribute("data-layer", data.layer_ids[state.layer]);
    svg.setAttribute("data-head", data.head_ids[state.head]);
    var g = el("svg:g", { transform: "translate(" + margin + "," + margin + ")" });
    for (var q = 0; q < nq; q++) {
      for (var k = 0; k < nk; k++) {
        var off = masked(m, q, k), v = w[q * nk + k] / 1000;
        var r = el("svg:rect", { x: k * cell, y: q * cell, width: cell, height: cell, fill: off ? "#eeeeee" : blue(v),
          "class": "hs-cell", "data-q": q, "data-k": k });
        if (!off) { r.appendChild(el("svg:title", null, label(m.queries[q]) + " \u2192 " + label(m.keys[k]) + ": " + v.toFixed(3))); }
        g.appendChild(r);
      }
    }
    if (state.focus !== null) {
      g.appendChild(el("svg:rect", { x: 0, y: state.focus * cell, width: nk * cell, height: cell, fill: "none",
        stroke: "#d62728", "stroke-width": 2, "pointer-events": "none" }));
    }
    svg.appendChild(g);
    m.queries.forEach(function (s, i) {
      svg.appendChild(el("svg:text", { x: margin - 4, y: margin + i * cell + cell / 2, "text-anchor": "end",
        "dominant-baseline": "central", "font-size": font, "class": "hs-q" + (i === state.focus ? " hs-focus" : ""), "data-q": i }, label(s)));
    });
    m.keys.forEach(function (s, i) {
      svg.appendChild(el("svg:text", { x: 0, y: 0, "dominant-baseline": "central", "font-size": font, "class": "hs-k",
        transform: "translate(" + (margin + i * cell + cell / 2) + "," + (margin - 4) + ") rotate(-90)" }, label(s)));
    });
    part("hs-caption").textContent = (data.title ? data.title + " \u00b7 " : "") + "layer " + data.layer_ids[state.layer] +
      " head " + data.head_ids[state.head] + " \u00b7 rows: " + data.query_name + ", columns: " + data.key_name;
    if (m.pooled) {
      part("hs-caption").textContent += " \u00b7 pooled: " + m.pooled.n_queries + " \u00d7 " + m.pooled.n_keys +
        " units in tiles, the max of each tile shown; hover a row for its rows' top keys";
    }
    drawStrip(w);
  }

  // Hovering a query token shows where it attends, over the key tokens.
  function drawStrip(w) {
    var strip = part("hs-strip"), note = part("hs-strip-note"), m = current(), nk = m.keys.length, q = state.focus;
    clear(strip);
    var row = q === null ? null : w.slice(q * nk, q * nk + nk);
    m.keys.forEach(function (s, k) {
      var span = el("span", { "class": "hs-tok", "data-k": k }, label(s));
      if (row) {
        var v = masked(m, q, k) ? 0 : row[k] / 1000;
        span.style.background = blue(v);
        span.style.color = v > 0.5 ? "#fff" : "#111";
        span.title = v.toFixed(3);
      }
      strip.appendChild(span);
    });
    note.textContent = row === null ? "Hover a row label or a cell to see where that " + data.query_name + " token attends." :
      "\u201c" + label(m.queries[q]) + "\u201d attends most to: " + row.map(function (v, k) { return [v, k]; })
        .filter(function (p) { return !masked(m, q, p[1]); })
        .sort(function (a, b) { return b[0] - a[0]; }).slice(0, 3)
        .map(function (p) { return "\u201c" + label(m.keys[p[1]]) + "\u201d " + (p[0] / 1000).toFixed(2); }).join(", ");
    if (m.pooled && q !== null) { note.appendChild(pooledRows(m.pooled, q)); }
    drawImageRow(w);
  }

  // A vision-language map: its pictures, and over them the selected query's row on the image tokens (the last
  // text token's until a query is picked). A pooled map's row is its tile row's maxima, key tile by key tile.
  function drawImageRow(w) {
    var m = current(), images = m.images, note = part("hs-picture-note"), nk = m.keys.length;
    note.textContent = "";
    if (!images) { drawPictures(part("hs-pictures"), null); return; }
    var p = m.pooled, unit = null, q = state.focus, weightOf;
    if (p) {
      var tileOf = function (edges, k) { var t = 0; while (t + 1 < edges.length - 1 && edges[t + 1] <= k) { t++; } return t; };
      if (q === null) { q = tileOf(p.query_edges, startUnit(images, p.n_queries)); }
      weightOf = function (k) { return masked(m, q, tileOf(p.key_edges, k)) ? 0 : w[q * nk + tileOf(p.key_edges, k)] / 1000; };
    } else {
      if (q === null) { q = startUnit(images, m.queries.length); }
      unit = q;
      weightOf = function (k) { return masked(m, q, k) ? 0 : w[q * nk + k] / 1000; };
    }
    drawPictures(part("hs-pictures"), images, weightOf, unit);
    var share = images.cells.reduce(function (a, c, k) { return c ? a + weightOf(k) : a; }, 0);
    note.textContent = "\u201c" + label(m.queries[q]) + "\u201d over the picture \u00b7 layer " + data.layer_ids[state.layer] +
      " head " + data.head_ids[state.head] + (p ? " \u00b7 pooled: each tile's largest weight" : " \u00b7 " + share.toFixed(2) +
      " of its attention on the image") + "; orange: its attention on each image token, relative to the largest." +
      (state.focus === null ? " Hover or click a row label to pick another token." : "");
  }

  // A pooled map (a long text): the rows of tile row q, each with its top keys over the whole text.
  function pooledRows(p, q) {
    var list = el("ol", { "class": "hs-top", start: p.query_edges[q] }), at = state.layer * data.head_ids.length + state.head;
    for (var r = p.query_edges[q]; r < Math.min(p.query_edges[q + 1], p.query_edges[q] + 16); r++) {
      list.appendChild(el("li", null, label(p.queries[r]) + " \u2192 " + p.top_keys[at][r].map(function (k, j) {
        return label(p.keys[k]) + "@" + k + " " + (p.top_weights[at][r][j] / p.scale).toFixed(2);
      }).join(", ")));
    }
    return list;
  }

  function render() {
    drawModelView();
    drawHeadView();
  }

  var pick = part("hs-pick");
  if (data.maps.length > 1) {
    data.maps.forEach(function (m, i) { pick.appendChild(el("option", { value: i }, m.text.length > 80 ? m.text.slice(0, 77) + "\u2026" : m.text)); });
    pick.addEventListener("change", function () { state.map = parseInt(pick.value, 10); state.focus = null; render(); });
  } else {
    pick.hidden = true;
  }
  function onQuery(ev) {
    var q = ev.target && ev.target.getAttribute ? ev.target.getAttribute("data-q") : null;
    if (q === null || parseInt(q, 10) === state.focus) { return; }
    state.focus = parseInt(q, 10);
    drawHeadView();
  }
  part("hs-head-view").addEventListener("mouseover", onQuery);
  part("hs-head-view").addEventListener("click", onQuery);
  render();
  root.setAttribute("data-ready", "1");
})
