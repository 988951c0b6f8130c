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
