"""What every offline page of headscope is made with: its templates, inlined scripts, CSP and safe JSON.

The report (`reports.html`), the notebook view (`reports.inline`) and the live explorer (`reports.live`)
are rendered by one jinja2 `environment()` with autoescape (`templates/`); their scripts come from
`static/` with the helpers the views share put in (`static_script`); a page's stylesheet and script are
allowed by their SHA-256 hashes (`csp_hash`) under `CSP`, which forbids every request; the data a script
reads sits in a `<script type="application/json">` block written by `script_json`.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
from importlib import resources
from typing import Any

from headscope.probe.types import json_safe

__all__ = ["CSP", "environment", "static_text", "static_script", "csp_hash", "script_json"]

CSP = ("default-src 'none'; img-src data:; style-src {style}; script-src {script}; connect-src 'none'; "
       "font-src 'none'; media-src 'none'; object-src 'none'; frame-src 'none'; worker-src 'none'; "
       "base-uri 'none'; form-action 'none'")


@functools.lru_cache(maxsize=1)
def environment():
    """The jinja2 environment of the pages' templates (`templates/`): autoescape on, undefined names an error."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader(__package__, "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    return env


def static_text(name: str) -> str:
    """The text of `static/<name>` (a script or a stylesheet), as packaged."""
    return resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8")


_COMMON = "// @include common.js"


def static_script(name: str) -> str:
    """A script of `static/` with the helpers both views share (`static/common.js`) put in at its
    `// @include common.js` line, inside its own function, so that they add no page global."""
    source = static_text(name)
    if source.count(_COMMON) != 1:
        raise ValueError(f"{name} must hold the line '{_COMMON}' once")
    return source.replace(_COMMON, static_text("common.js").strip(), 1)


def csp_hash(text: str) -> str:
    """The CSP source that allows exactly `text` as an inline script or style: `'sha256-…'`."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def script_json(obj: Any) -> str:
    """JSON that is safe inside <script>: <, >, &, ' escaped as \\u003c ... (jinja2's htmlsafe dumps)."""
    from jinja2.utils import htmlsafe_json_dumps

    return str(htmlsafe_json_dumps(json_safe(obj), dumps=functools.partial(json.dumps, separators=(",", ":"),
                                                                            ensure_ascii=False, allow_nan=False)))
