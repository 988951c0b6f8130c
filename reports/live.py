"""The live explorer's page (`headscope serve`): one self-contained HTML document, no external request.

The page is rendered once per server by jinja2 with autoescape (`templates/live.html.j2`); its script
(`static/live.js`, with the shared helpers of `static/common.js`) and stylesheet are inlined and
allowed by their SHA-256 hashes, under the pages' Content-Security-Policy (`reports.page.CSP`)
with one change: `connect-src 'self'`, so that the script may ask the server's own JSON API and
nothing else. Every token and text from the user or the model is set with `textContent` only.
"""

from __future__ import annotations

from markupsafe import Markup

from .page import CSP, csp_hash, environment, static_script

__all__ = ["live_page", "LIVE_CSP"]

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; color: #222; margin: 16px; }
textarea { width: 100%; max-width: 60em; height: 6em; font: inherit; }
.controls label { margin-right: 10px; }
.banner { padding: 6px 10px; border-radius: 4px; margin: 6px 0; }
.banner.ok { background: #e6f4ea; } .banner.bad { background: #fdecea; }
.error { color: #b00020; min-height: 1.4em; }
.panes { display: flex; flex-wrap: wrap; gap: 20px; align-items: flex-start; }
svg text { font: 11px system-ui, sans-serif; }
.cell:hover, .tile:hover { stroke: #d62728; stroke-width: 1; }
.focus { fill: #d62728; font-weight: bold; }
table.grid td { width: 14px; height: 14px; padding: 0; cursor: pointer; }
table.grid th { font-weight: normal; color: #777; font-size: 11px; }
table.terms td, table.terms th { padding: 1px 6px; text-align: right; font-size: 12px; }
.tok { display: inline-block; margin: 1px; padding: 0 3px; border-radius: 3px; }
.muted { color: #666; }
input.num { width: 4em; }
.tok.needle { background: #e6f4ea; box-shadow: inset 0 -2px #2ca02c; }
.tok.top { background: #fdd0a2; } .tok.top.hit { background: #d62728; color: #fff; }
tr.copied td { font-weight: bold; } td.hit { color: #d62728; }
"""

LIVE_CSP = CSP.replace("connect-src 'none'", "connect-src 'self'")


def live_page(title: str = "headscope explorer") -> tuple[str, str]:
    """The page's HTML and its Content-Security-Policy header value."""
    script = static_script("live.js")
    if "</script" in script.lower() or "<!--" in script:
        raise ValueError("live.js must not contain '</script' or '<!--'")
    csp = LIVE_CSP.format(style=csp_hash(_STYLE), script=csp_hash(script))
    html = environment().get_template("live.html.j2").render(
        title=title, csp=Markup(csp), style=Markup(_STYLE), script=Markup(script))
    return html, csp
