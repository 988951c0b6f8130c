  // ---- shared by the report's explorer and the notebook's inline view (reports/html.py inlines it) ----
  var SVG = "http://www.w3.org/2000/svg";
  // An element (an SVG one for "svg:NAME") with attributes and text; text is set as textContent only.
  function el(name, attrs, text) {
    var node = name.indexOf("svg:") === 0 ? document.createElementNS(SVG, name.slice(4)) : document.createElement(name);
    if (attrs) { Object.keys(attrs).forEach(function (k) { node.setAttribute(k, String(attrs[k])); }); }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }
  function clear(node) { while (node.firstChild) { node.removeChild(node.firstChild); } }
  // Sequential blues (matplotlib's "Blues", as in the PNG figures), interpolated between its 9 stops.
  var BLUES = [[247, 251, 255], [222, 235, 247], [198, 219, 239], [158, 202, 225], [107, 174, 214],
    [66, 146, 198], [33, 113, 181], [8, 81, 156], [8, 48, 107]];
  function ramp(stops, v) {
    var t = Math.max(0, Math.min(1, v)) * (stops.length - 1);
    var i = Math.min(stops.length - 2, Math.floor(t)), f = t - i, a = stops[i], b = stops[i + 1];
    return "rgb(" + [0, 1, 2].map(function (c) { return Math.round(a[c] + f * (b[c] - a[c])); }).join(",") + ")";
  }
  function blue(v) { return ramp(BLUES, v); }
  // A token as shown: newline and tab as arrows, a blank token as a visible space.
  function label(s) {
    var shown = String(s).replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5");
    return shown.trim() ? shown : "\u2423";
  }
  // A vision-language map's pictures (`images`: reports/payload.py image_payload) with one query's row drawn over
  // its image tokens' cells: per picture and panel a canvas of the picture and, stacked on it, a canvas of the
  // overlay (class hs-heat), each cell filled in orange with an opacity by its weight over the row's largest
  // on the image; the query's own cell outlined when it is an image token. weightOf(k): key unit k's weight.
  function drawPictures(box, images, weightOf, query) {
    clear(box);
    box.hidden = !images;
    if (!images) { return; }
    var max = 0;
    images.cells.forEach(function (c, k) { if (c) { max = Math.max(max, weightOf(k)); } });
    images.pictures.forEach(function (p, i) {
      for (var panel = 0; panel < (images.panels[i] || 0); panel++) {
        var width = p ? p.width : 192, height = p ? p.height : 192;
        var wrap = el("div", { "class": "hs-picture", "data-image": i, "data-panel": panel });
        wrap.style.position = "relative";
        wrap.style.display = "inline-block";
        wrap.style.margin = "0 8px 8px 0";
        var pic = el("canvas", { width: width, height: height, "class": "hs-pic" });
        var heat = el("canvas", { width: width, height: height, "class": "hs-heat", "data-image": i, "data-panel": panel });
        heat.style.position = "absolute";
        heat.style.left = "0";
        heat.style.top = "0";
        var pctx = pic.getContext("2d");
        if (p && p.src) {
          var img = new Image();
          img.onload = (function (ctx, im, w, h) { return function () { ctx.drawImage(im, 0, 0, w, h); }; })(pctx, img, width, height);
          img.setAttribute("src", p.src);  // a data: URL, embedded in the page: nothing is fetched
        } else {
          pctx.fillStyle = "#cccccc";
          pctx.fillRect(0, 0, width, height);
        }
        var ctx = heat.getContext("2d");
        images.cells.forEach(function (c, k) {
          if (!c || c[0] !== i || c[1] !== panel) { return; }
          var x = c[3] * width, y = c[2] * height, w = (c[5] - c[3]) * width, h = (c[4] - c[2]) * height;
          var v = max > 0 ? weightOf(k) / max : 0;
          if (v > 0) {
            ctx.fillStyle = "rgba(255,69,0," + (0.85 * v).toFixed(3) + ")";
            ctx.fillRect(x, y, w, h);
          }
          if (k === query) {
            ctx.strokeStyle = "#d62728";
            ctx.lineWidth = 2;
            ctx.strokeRect(x + 1, y + 1, Math.max(w - 2, 1), Math.max(h - 2, 1));
          }
        });
        wrap.appendChild(pic);
        wrap.appendChild(heat);
        box.appendChild(wrap);
      }
    });
  }
  // The unit a picture is first drawn from (`images.start`: a vision-language map's last text token, an image's
  // [CLS]), within the n query units.
  function startUnit(images, n) { return Math.min(images.start, n - 1); }
