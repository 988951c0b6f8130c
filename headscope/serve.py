"""The live explorer's web app (`headscope serve`): Starlette routes over `workflows.explore.Explorer`.

Starlette (with uvicorn as the server) because it is small, typed and well kept, gives a JSON API and
one page without a framework's extras, and its TestClient (httpx) tests the API in-process.

    GET  /                 the page (`reports.live`): self-contained, CSP connect-src 'self'
    GET  /api/models       names, families, verified, limits
    POST /api/attention    {"model", "text", "layer", "head", "level", "weight", "rows": [start, stop] | null,
                            "keys": [start, stop] | null, "top_k"} → {"labels", "rows", "weights", "top", "verified", ...}
    POST /api/overview     {"model", "text", "layer", "head", "tiles", "level", "weight"} → {"labels", "tiles", ...}
    POST /api/explain      {"model", "text", "layer", "head", "query"} → explain's terms of that query row
    POST /api/heads        {"model", "text"} → the text's head metrics, [layer][head] per metric
    POST /api/generate     {"model", "prompt", "max_new_tokens", "layer", "head", "chat", "temperature", "top_p",
                            "seed"} → each generated token's row, each prompt token's turn (chat)
    POST /api/needle       {"model", "layer", "head", "needle", "question", "key", "length", "depth", "seed"} → a
                           needle prompt's labels and needle range, the answer, the head's top key per step, its
                           hits, copy steps and retrieval score on the prompt (every head's too)

Every request passes `headscope.guard` first: its own Host and Origin only, POST bodies only as JSON, the
token under `--allow-remote`, a bound on each client's requests in flight. A bad request gets a 4xx and
`{"error": "<one line>"}`; anything unexpected a 500 with one line, never a traceback. Requests run in a
worker thread, one at a time per model (the explorer's lock). No route reads or writes a file: the server
knows only the models it was started with.
"""

from __future__ import annotations

import json
import signal
import threading
from typing import Any

from headscope.guard import MAX_BODY, Guard, guarded
from headscope.workflows.explore import Explorer, ExplorerError

__all__ = ["app", "listen", "parse_body", "serve", "MAX_BODY"]

_FIELDS = {  # route → (required fields, optional fields)
    "attention": (("model", "text", "layer", "head"), ("level", "weight", "rows", "keys", "top_k", "images")),
    "overview": (("model", "text", "layer", "head"), ("tiles", "level", "weight", "images")),
    "explain": (("model", "text", "layer", "head", "query"), ("level", "weight", "images")),
    "heads": (("model", "text"), ("layer", "head", "level", "weight", "images")),
    "generate": (("model", "prompt", "layer", "head"), ("max_new_tokens", "chat", "temperature", "top_p", "seed",
                                                        "images")),
    "needle": (("model", "layer", "head"), ("needle", "question", "key", "length", "depth", "seed")),
}
_IGNORED = {"explain": ("level", "weight"), "heads": ("layer", "head", "level", "weight")}  # the page sends them


def _error(message: str, status: int):
    from starlette.responses import JSONResponse

    return JSONResponse({"error": " ".join(str(message).split())[:500]}, status_code=status)


def parse_body(raw: bytes) -> dict:
    """A request's JSON object: every body is parsed here. Anything else, a body nested too deeply for the parser
    included, is an `ExplorerError` (400) with one line.

    >>> parse_body(b'{"model": "m"}')
    {'model': 'm'}
    """
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:  # a number of over 4,300 digits included
        raise ExplorerError(f"the request body must be a JSON object ({' '.join(str(exc).split())[:200]})") from None
    except RecursionError:
        raise ExplorerError("the request body is nested too deeply; send a flat JSON object") from None
    if not isinstance(body, dict):
        raise ExplorerError("the request body must be a JSON object")
    return body


def app(explorer: Explorer, *, title: str = "headscope explorer", guard: Guard | None = None):
    """The Starlette app serving `explorer` and its page, behind `guard` (default: a loopback server's)."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.responses import HTMLResponse, JSONResponse
    from starlette.routing import Route

    from headscope.reports.live import live_page

    page, csp = live_page(title)
    headers = {"Content-Security-Policy": csp + "; frame-ancestors 'none'", "X-Frame-Options": "DENY",
               "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}

    async def index(request):
        return HTMLResponse(page, headers=headers)

    async def models(request):
        return JSONResponse(explorer.models())

    def handler(name: str):
        required, optional = _FIELDS[name]

        async def handle(request):
            try:
                body = parse_body(await request.body())  # read whole by the guard: bounded in size and time
                missing = [f for f in required if f not in body]
                unknown = sorted(set(body) - set(required) - set(optional))
                if missing or unknown:
                    raise ExplorerError(f"/api/{name} " + (f"needs {', '.join(missing)}" if missing else
                                                           f"takes no field {', '.join(unknown)}") +
                                        f"; its fields: {', '.join(required + optional)}")
                kwargs = {k: v for k, v in body.items() if k not in _IGNORED.get(name, ())}
                result = await run_in_threadpool(getattr(explorer, name), **kwargs)
            except ExplorerError as exc:
                return _error(str(exc), exc.status)
            except Exception as exc:  # one line, never a traceback
                return _error(f"unexpected {type(exc).__name__}: {exc}", 500)
            return JSONResponse(result)

        return handle

    async def not_found(request, exc: HTTPException):
        return _error(f"{request.url.path}: {exc.detail}", exc.status_code)

    routes = [Route("/", index), Route("/api/models", models)]
    routes += [Route(f"/api/{name}", handler(name), methods=["POST"]) for name in _FIELDS]
    served = Starlette(routes=routes, exception_handlers={HTTPException: not_found})
    served.router.redirect_slashes = False  # no redirect but the guard's (`guard.local_location`): /api/x/ is 404
    return guarded(served, Guard() if guard is None else guard)


def listen(host: str = "127.0.0.1", port: int = 8765):
    """A socket bound to `host`:`port` (0: a free port), bound as uvicorn binds one, for `serve` to answer on:
    taken before any model loads, so a port in use is an `OSError` at once, and no other server can take it
    between the check and the start."""
    import socket

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock


def serve(explorer: Explorer, *, host: str = "127.0.0.1", port: int = 8765, guard: Guard | None = None,
          log_level: str = "warning", sock=None) -> Any:
    """Run the app with uvicorn until Ctrl-C (uvicorn shuts down cleanly, then the interrupt is raised again).
    `guard` defaults to one for `host`; `sock` (`listen`'s) is answered on instead of binding `host`:`port`."""
    import uvicorn

    guard = Guard(bound=host) if guard is None else guard
    server = uvicorn.Server(uvicorn.Config(app(explorer, guard=guard), host=host, port=port, log_level=log_level,
                                           lifespan="off", server_header=False, access_log=False,
                                           timeout_graceful_shutdown=30))
    # SIGTERM (a service manager's stop) shuts down as gracefully as Ctrl-C: uvicorn answers what is in flight,
    # then raises the signal again under the handler it found, which here records it instead of killing the
    # process, so the caller can say so and exit 0. Ctrl-C stays the caller's (headscope.cli: exit 130).
    server.stopped_by = None
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: setattr(server, "stopped_by", "SIGTERM")) if main else None
    try:
        server.run(sockets=None if sock is None else [sock])
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
    return server
