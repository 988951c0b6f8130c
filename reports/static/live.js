// headscope live explorer (headscope serve): plain JavaScript, no library, no network but the server's
// own JSON API (the page's CSP allows connect-src 'self' only). Strings from users or models are set
// with textContent only. A short text is drawn whole (one cell per weight); a long one as an overview
// of pooled tiles (max per tile), and a click on a tile (or a found token) zooms into its rows.
(function () {
  "use strict";
  // @include common.js
  var $ = function (id) { return document.getElementById(id); };
  var EXACT = 64, ZOOM = 64, TILES = 64, CELL = 12;
  var state = { models: [], labels: [], gen: null, step: 0, images: null, rows: null };

  function fail(message) { $("error").textContent = message || ""; }
  function post(path, body) {
    return fetch(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) })
      .then(function (r) {
        return r.json().then(function (j) { if (!r.ok) { throw new Error(j.error || r.statusText); } return j; });
      });
  }
  function req(extra) {
    var body = { model: $("model").value, text: $("text").value, layer: parseInt($("layer").value, 10) || 0,
      head: parseInt($("head").value, 10) || 0, level: $("level").value, weight: $("weight").value };
    var images = picked();
    if (images.length) { body.images = images; }
    Object.keys(extra || {}).forEach(function (k) { body[k] = extra[k]; });
    return body;
  }
  // The startup images (`headscope serve --image`) ticked for this text, by index: the server reads no other file.
  function picked() {
    var out = [];
    Array.prototype.forEach.call(document.querySelectorAll("#image-picks input"), function (box) {
      if (box.checked) { out.push(parseInt(box.getAttribute("data-index"), 10)); }
    });
    return out;
  }
  // A text with images: query row q's weights drawn over the pictures (the image tokens' cells).
  function pictures(images, weights, q, labels) {
    drawPictures($("pictures"), images, function (k) { return weights[k] || 0; }, q);
    $("picture-note").textContent = images ? label(labels[q]) + " over the picture" : "";
  }
  function banner() {
    var m = state.models.filter(function (x) { return x.name === $("model").value; })[0];
    if (!m) { return; }
    var b = $("banner");
    b.className = "banner " + (m.verified ? "ok" : "bad");
    b.textContent = (m.verified ? "verified: " : "unverified: ") + m.verification + " — " + m.layers + " layers × " +
      m.heads + " heads";
    $("layer").max = m.layers - 1; $("head").max = m.heads - 1;
    $("needle-length").max = m.max_tokens;
    $("run-needle").disabled = !m.causal;  // a needle prompt is answered: a decoder only
    $("run-needle").title = m.causal ? "" : "an encoder does not answer: pick a decoder";
  }
  // A heatmap of rows × keys: cells[r][k] in 0..1; qlab/klab their labels; onCell(r, k) on click.
  function heatmap(svg, cells, qlab, klab, onCell, cls) {
    clear(svg);
    var nq = cells.length, nk = nq ? cells[0].length : 0, left = 90, top = 90;
    svg.setAttribute("width", left + nk * CELL + 10); svg.setAttribute("height", top + nq * CELL + 10);
    var qs = [];
    qlab.forEach(function (s, r) {
      var t = el("svg:text", { x: left - 4, y: top + r * CELL + CELL - 2, "text-anchor": "end", "class": "q" }, label(s));
      svg.appendChild(t); qs.push(t);
    });
    klab.forEach(function (s, k) {
      var x = left + k * CELL + CELL - 3, y = top - 4;
      svg.appendChild(el("svg:text", { x: x, y: y, transform: "rotate(-60 " + x + " " + y + ")" }, label(s)));
    });
    cells.forEach(function (row, r) {
      row.forEach(function (v, k) {
        var c = el("svg:rect", { x: left + k * CELL, y: top + r * CELL, width: CELL, height: CELL, fill: blue(v),
          "class": cls, "data-q": r, "data-k": k });
        c.addEventListener("mouseenter", function () {
          qs.forEach(function (t, i) { t.setAttribute("class", i === r ? "q focus" : "q"); });
          $("hover").textContent = label(qlab[r]) + " → " + label(klab[k]) + ": " + v.toFixed(4);
        });
        c.addEventListener("click", function () { onCell(r, k); });
        svg.appendChild(c);
      });
    });
  }
  function explainCell(query) {
    if (!state.labels.length) { return; }
    post("/api/explain", req({ query: query })).then(function (e) {
      var box = $("explain"); clear(box);
      box.appendChild(el("p", null, e.summary));
      var t = el("table", { "class": "terms" }), cols = Object.keys(e.keys[0] || {});
      var head = el("tr"); cols.forEach(function (c) { head.appendChild(el("th", null, c)); }); t.appendChild(head);
      e.keys.forEach(function (row) {
        var tr = el("tr");
        cols.forEach(function (c) {
          var v = row[c]; tr.appendChild(el("td", null, typeof v === "number" ? v.toFixed(4) : (v === null ? "" : label(v))));
        });
        t.appendChild(tr);
      });
      box.appendChild(t);
    }).catch(function (e) { fail(e.message); });
  }
  function show() {
    fail(""); clear($("zoom")); clear($("explain"));
    $("status").textContent = "computing…";
    post("/api/overview", req({ tiles: TILES })).then(function (o) {
      state.labels = o.labels;
      var n = o.n_tokens;
      $("status").textContent = n + " " + $("level").value + "s; attention " + o.mode +
        (o.check ? " (" + o.check.summary + ")" : "");
      state.images = o.images || null;
      pictures(null);
      if (n <= EXACT) {
        return post("/api/attention", req({ rows: null })).then(function (a) {
          heatmap($("heatmap"), a.weights, a.labels, a.labels, function (r) {
            explainCell(r);
            if (state.images) { pictures(state.images, a.weights[r], r, a.labels); }
          }, "cell");
          if (state.images) {
            var q = startUnit(state.images, n);
            pictures(state.images, a.weights[q], q, a.labels);
          }
        });
      }
      var t = o.tiles, qe = t.query_edges, ke = t.key_edges;
      var ql = qe.slice(0, -1).map(function (s) { return o.labels[s]; });
      var kl = ke.slice(0, -1).map(function (s) { return o.labels[s]; });
      heatmap($("heatmap"), t.max, ql, kl, function (i) { zoom(qe[i]); }, "tile");
    }).catch(function (e) { $("status").textContent = ""; fail(e.message); });
  }
  // Rows start .. start + ZOOM of a long text, keys in a window ending at the last row (each row's
  // top keys listed too, wherever they are).
  function zoom(start) {
    var n = state.labels.length, s = Math.max(0, Math.min(start, n - ZOOM)), stop = Math.min(n, s + ZOOM);
    var k1 = Math.max(stop, Math.min(n, s + ZOOM)), k0 = Math.max(0, k1 - ZOOM);
    post("/api/attention", req({ rows: [s, stop], keys: [k0, k1] })).then(function (a) {
      var box = $("zoom"); clear(box);
      box.appendChild(el("p", null, "rows " + s + "–" + (stop - 1) + ", keys " + k0 + "–" + (k1 - 1) + " of " + n));
      var svg = el("svg:svg", { id: "zoom-map", role: "img", "aria-label": "zoomed rows" });
      box.appendChild(svg);
      heatmap(svg, a.weights, a.labels.slice(s, stop), a.labels.slice(k0, k1), function (r) {
        explainCell(s + r);
        if (a.images && k0 === 0) { pictures(a.images, a.weights[r], s + r, a.labels); }
      }, "cell");
      var list = el("ol", { start: s, "class": "topk" });
      a.top.keys.forEach(function (keys, r) {
        list.appendChild(el("li", null, label(a.labels[s + r]) + " → " + keys.map(function (k, j) {
          return label(a.labels[k]) + "@" + k + " " + a.top.weights[r][j].toFixed(3);
        }).join(", ")));
      });
      box.appendChild(list);
    }).catch(function (e) { fail(e.message); });
  }
  function find() {
    var want = $("search").value.trim().toLowerCase();
    var i = state.labels.findIndex(function (s) { return String(s).trim().toLowerCase() === want; });
    if (i < 0) { fail("no token " + JSON.stringify(want) + " in this text"); return; }
    fail(""); zoom(i);
  }
  function metrics() {
    fail("");
    post("/api/heads", req()).then(function (h) {
      var box = $("grid"); clear(box);
      var pick = el("select", { id: "metric" });
      Object.keys(h.metrics).forEach(function (m) { pick.appendChild(el("option", null, m)); });
      box.appendChild(pick);
      var table = el("table", { "class": "grid", id: "metric-grid" });
      box.appendChild(table);
      function draw() {
        clear(table);
        var g = h.metrics[pick.value], top = el("tr");
        top.appendChild(el("th"));
        for (var c = 0; c < h.heads; c++) { top.appendChild(el("th", null, c)); }
        table.appendChild(top);
        g.forEach(function (row, l) {
          var tr = el("tr"); tr.appendChild(el("th", null, "L" + l));
          row.forEach(function (v, hh) {
            var td = el("td", { title: "L" + l + "H" + hh + ": " + (v === null ? "n/a" : v.toFixed(3)) });
            td.style.background = v === null ? "#eee" : blue(v);
            td.addEventListener("click", function () { $("layer").value = l; $("head").value = hh; show(); });
            tr.appendChild(td);
          });
          table.appendChild(tr);
        });
      }
      pick.addEventListener("change", draw); draw();
    }).catch(function (e) { fail(e.message); });
  }
  function drawStep() {
    var g = state.gen, box = $("generation"); clear(box);
    if (!g || !g.tokens.length) { return; }
    var t = state.step, row = g.rows[t], keys = g.prompt_labels.concat(g.tokens.slice(0, t + 1));
    $("step").textContent = "step " + (t + 1) + " of " + g.tokens.length + ": " + label(g.tokens[t]);
    var max = Math.max.apply(null, row) || 1;
    var turns = g.turns.length ? g.turns.concat(g.tokens.map(function () { return "assistant"; })) : null;
    keys.forEach(function (k, i) {
      var s = el("span", { "class": "tok", title: (turns ? turns[i] + ": " : "") + row[i].toFixed(4),
        "data-turn": turns ? turns[i] : "" }, label(k));
      s.style.background = blue(row[i] / max);
      box.appendChild(s);
    });
    if (g.images) { drawPictures($("pictures"), g.images, function (k) { return row[k] || 0; }, -1); }
    $("picture-note").textContent = g.images ? label(g.tokens[t]) + " over the picture" : "";
  }
  function generate() {
    fail("");
    post("/api/generate", { model: $("model").value, prompt: $("text").value,
      max_new_tokens: parseInt($("new-tokens").value, 10) || 1, chat: $("chat").checked,
      temperature: parseFloat($("temperature").value) || 0, seed: parseInt($("seed").value, 10) || 0, layer: parseInt($("layer").value, 10) || 0,
      head: parseInt($("head").value, 10) || 0, images: picked().length ? picked() : null })
      .then(function (g) { state.gen = g; state.step = 0; drawStep(); }).catch(function (e) { fail(e.message); });
  }
  function stepBy(d) {
    if (!state.gen) { return; }
    state.step = Math.max(0, Math.min(state.gen.tokens.length - 1, state.step + d)); drawStep();
  }
  // A needle prompt answered greedily: the chosen head's top key at each step, the needle's tokens marked, the
  // keys its top attention landed on at copy steps marked (red: a hit, the copied token itself), every head's score.
  function needleBody() {
    var text = function (id) { var v = $(id).value; return v.trim() ? v : null; };
    var body = { model: $("model").value, layer: parseInt($("layer").value, 10) || 0,
      head: parseInt($("head").value, 10) || 0, length: parseInt($("needle-length").value, 10),
      depth: parseFloat($("needle-depth").value), seed: parseInt($("needle-seed").value, 10) || 0 };
    if (text("needle") !== null) { body.needle = $("needle").value; body.question = $("question").value; }
    if (text("needle-key") !== null) { body.key = $("needle-key").value; }
    return body;
  }
  function runNeedle() {
    fail("");
    $("needle-summary").textContent = "answering…";
    post("/api/needle", needleBody()).then(drawNeedle).catch(function (e) {
      $("needle-summary").textContent = ""; fail(e.message);
    });
  }
  function drawNeedle(r) {
    var score = r.score === null ? "no score" : "retrieval score " + r.score.toFixed(2);
    $("needle-summary").textContent = r.name + " on this prompt: hits at " + r.hits + " of " + r.copies +
      " copy steps (" + score + "); answer " + JSON.stringify(r.answer) +
      (r.retrieved === null ? "" : (r.retrieved ? " (the key retrieved)" : " (the key not retrieved)")) +
      (r.note ? ". " + r.note + "." : "");
    var grid = $("needle-grid"); clear(grid);
    var table = el("table", { "class": "grid", id: "needle-scores" }), top = el("tr");
    top.appendChild(el("th"));
    for (var c = 0; c < r.scores[0].length; c++) { top.appendChild(el("th", null, c)); }
    table.appendChild(top);
    r.scores.forEach(function (row, l) {
      var tr = el("tr"); tr.appendChild(el("th", null, "L" + l));
      row.forEach(function (v, hh) {
        var td = el("td", { title: "L" + l + "H" + hh + ": " + (v === null ? "no copy steps" : v.toFixed(2)),
          "data-layer": l, "data-head": hh });
        td.style.background = v === null ? "#eee" : blue(v);
        if (l === r.layer && hh === r.head) { td.style.outline = "2px solid #d62728"; }
        td.addEventListener("click", function () { $("layer").value = l; $("head").value = hh; runNeedle(); });
        tr.appendChild(td);
      });
      table.appendChild(tr);
    });
    grid.appendChild(table);
    var steps = $("needle-steps"); clear(steps);
    var t = el("table", { "class": "terms", id: "needle-table" }), head = el("tr");
    ["step", "token", "copied", "top key", "hit"].forEach(function (c) { head.appendChild(el("th", null, c)); });
    t.appendChild(head);
    r.steps.forEach(function (s, i) {
      var tr = el("tr", { "class": s.copied ? "copied" : "" });
      tr.appendChild(el("td", null, i + 1)); tr.appendChild(el("td", null, label(s.token)));
      tr.appendChild(el("td", null, s.copied ? "yes" : ""));
      tr.appendChild(el("td", null, s.top < 0 ? "" : label(s.top_label) + "@" + s.top + (s.in_needle ? " (needle)" : "")));
      tr.appendChild(el("td", { "class": s.hit ? "hit" : "" }, s.hit ? "hit" : ""));
      t.appendChild(tr);
    });
    steps.appendChild(t);
    var landed = {};
    r.steps.forEach(function (s, i) {
      if (!s.copied || !s.in_prompt) { return; }
      var k = landed[s.top] || (landed[s.top] = { steps: [], hit: false });
      k.steps.push(i + 1); k.hit = k.hit || s.hit;
    });
    var box = $("needle-prompt"); clear(box);
    r.labels.forEach(function (tok, i) {
      var cls = "tok" + (i >= r.span[0] && i < r.span[1] ? " needle" : "");
      var at = landed[i], title = "token " + i;
      if (at) { cls += " top" + (at.hit ? " hit" : ""); title += ": top key at copy step " + at.steps.join(", "); }
      box.appendChild(el("span", { "class": cls, title: title, "data-i": i }, label(tok)));
    });
  }
  fetch("/api/models").then(function (r) { return r.json(); }).then(function (j) {
    state.models = j.models;
    j.models.forEach(function (m) { $("model").appendChild(el("option", { value: m.name }, m.name)); });
    banner();
    (j.images || []).forEach(function (name, i) {  // the startup images, by index and file name
      var pick = el("label"), box = el("input", { type: "checkbox", "data-index": i });
      pick.appendChild(box);
      pick.appendChild(document.createTextNode(" " + name));  // the file's name as text, never markup
      $("image-picks").appendChild(pick);
    });
    document.body.setAttribute("data-ready", "1");
  }).catch(function (e) { fail("the server did not answer: " + e.message); });
  $("model").addEventListener("change", banner);
  // A file the user picks is read here, in the page, into the text box: the server never reads a file.
  $("file").addEventListener("change", function () {
    var f = $("file").files[0];
    if (!f) { return; }
    var reader = new FileReader();
    reader.onload = function () { $("text").value = String(reader.result); };
    reader.onerror = function () { fail("could not read " + f.name); };
    reader.readAsText(f);
  });
  $("show").addEventListener("click", show);
  $("metrics").addEventListener("click", metrics);
  $("find").addEventListener("click", find);
  $("generate").addEventListener("click", generate);
  $("prev").addEventListener("click", function () { stepBy(-1); });
  $("next").addEventListener("click", function () { stepBy(1); });
  $("run-needle").addEventListener("click", runNeedle);
})();
