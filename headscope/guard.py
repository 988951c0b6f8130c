"""Who may talk to the live explorer: the checks every request to `headscope serve` passes first.

A server on loopback is still reachable from any web page the user visits: the page's scripts can
send "simple" cross-site requests (a POST with `Content-Type: text/plain` needs no preflight), and
through DNS rebinding (a name of the attacker's that resolves to 127.0.0.1) they can even read the
answers. So, as Jupyter does, the server answers only

    Host     its own names: loopback names and addresses, the address it is bound to, and `allow_hosts`
             (403 otherwise; a rebinding page's Host is the attacker's name)
    Origin   its own origin, when the browser says one (403 otherwise); and a browser's
             `Sec-Fetch-Site` of an API request must be same-origin or none (403 otherwise)
    token    with `token` set (`--allow-remote`): the token, as a cookie that a first visit with
             `?token=` sets, an `Authorization: token ...` header, or `?token=` (403 otherwise)
    JSON     POST bodies only as `application/json` (415 otherwise), which a page can send cross-site
             only after a CORS preflight that this server never grants
    body     a POST body of at most `max_body` bytes (413 otherwise), read whole within `body_seconds`
             (408 otherwise, and the connection closed): a client trickling its body holds no slot
    limit    at most `max_in_flight` POST requests in flight per client address (429 otherwise), so
             one page cannot queue a thousand 16k-token texts; a request takes its slot once its body
             is in, so only requests being computed count
    redirect the one redirect (a first visit with `?token=`) goes to a path of this server
             (`local_location`), never to `//other.host`

`Guard.refusal` decides on plain values (no server needed, so the rules are tested one by one);
`guarded(app, guard)` wraps an ASGI app with it. Every refusal is a 4xx with one line of JSON.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import parse_qs, urlsplit

__all__ = ["Guard", "Refusal", "guarded", "host_name", "local_location", "loopback", "new_token", "TOKEN_COOKIE",
           "MAX_BODY"]

TOKEN_COOKIE = "headscope_token"
MAX_BODY = 1 << 20  # bytes of one request body (the explorer's max_chars of UTF-8, and the JSON around it)
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
_WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def new_token() -> str:
    """A random token for `--allow-remote` (32 bytes, URL-safe)."""
    return secrets.token_urlsafe(32)


def host_name(host: str) -> str:
    """The name part of a Host header or of a bound address, lower case, without port, brackets or final dot.

    >>> host_name("LocalHost:8765"), host_name("[::1]:80"), host_name("::1"), host_name("example.org.")
    ('localhost', '::1', '::1', 'example.org')
    """
    host = host.strip().lower()
    if host.startswith("["):  # [v6]:port
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:  # name:port (a bare v6 address has several colons)
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def local_location(path: str) -> str:
    r"""A `Location` on this server for a request's (decoded) `path`: percent-encoded, starting with exactly one
    `/`. A browser reads `//host`, `/\host` (and `/<tab>/host`, dropping the tab) as another server's address.

    >>> local_location("//evil.com"), local_location("/\\evil.com"), local_location("/\t/x"), local_location("/")
    ('/evil.com', '/evil.com', '/%09/x', '/')
    """
    from urllib.parse import quote

    return "/" + quote(path.lstrip("/\\"), safe="/")


def loopback(host: str) -> bool:
    """Whether `host` (a name or address, as `host_name` gives it) is this machine's loopback."""
    if host in _LOOPBACK_NAMES or host.endswith(".localhost"):  # RFC 6761: browsers resolve *.localhost themselves
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _own_addresses() -> frozenset[str]:
    """This machine's names and interface addresses: what a client may call a server bound to 0.0.0.0 or ::."""
    import socket

    import psutil

    names = {socket.gethostname(), socket.getfqdn()}
    for addresses in psutil.net_if_addrs().values():
        names.update(a.address.split("%", 1)[0] for a in addresses if a.family in (socket.AF_INET, socket.AF_INET6))
    return frozenset(host_name(n) for n in names if n)


@dataclass(frozen=True)
class Refusal:
    """Why a request is not served: its HTTP status and one line."""

    status: int
    message: str


@dataclass(frozen=True)
class Guard:
    """The rules of the module docstring for a server bound to `bound` (its `--host`).

    `allow_hosts` adds names a client may use in Host (a reverse proxy's, say); `token` (None: none
    needed) is what `--allow-remote` requires; `max_in_flight` bounds one client's POSTs at once; `max_body`
    bounds a POST body's bytes and `body_seconds` the time its client may take to send it.
    """

    bound: str = "127.0.0.1"
    allow_hosts: frozenset[str] = frozenset()
    token: str | None = None
    max_in_flight: int = 8
    max_body: int = MAX_BODY
    body_seconds: float = 30.0
    hosts: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        if self.max_in_flight < 1 or self.max_body < 1:
            raise ValueError(f"max_in_flight and max_body must be at least 1, got {self.max_in_flight}, "
                             f"{self.max_body}")
        if not self.body_seconds > 0:
            raise ValueError(f"body_seconds must be more than 0, got {self.body_seconds}")
        bound = host_name(self.bound)
        own = _own_addresses() if bound in _WILDCARDS else frozenset({bound})
        object.__setattr__(self, "hosts", frozenset(host_name(h) for h in self.allow_hosts) | own)

    def host_allowed(self, host: str | None) -> bool:
        if not host:
            return False
        try:  # a Host no browser sends (`[::1`, `localhost:abc`, a port past 65535): refused, not read generously
            parts = urlsplit(f"//{host.strip()}")
            parts.port
        except ValueError:
            return False
        if parts.path or parts.query or parts.fragment or parts.username is not None:
            return False
        name = host_name(host)
        return loopback(name) or name in self.hosts

    def refusal(self, *, method: str, path: str, headers: Mapping[str, str], query: str = "",
                scheme: str = "http") -> Refusal | None:
        """The refusal of a request, or None to serve it. `headers` with lower-case names."""
        host = headers.get("host")
        if not self.host_allowed(host):
            shown = " ".join((host or "").split())[:100] or "no Host header"
            return Refusal(403, f"Host {shown!r} is not this server's name; open it at its own address "
                                "(loopback), or start it with --allow-host NAME")
        origin = headers.get("origin")
        if origin is not None and not self._same_origin(origin, host, scheme):
            return Refusal(403, f"cross-origin request from {origin[:100]!r} refused: the explorer answers only "
                                "its own page")
        site = headers.get("sec-fetch-site")
        if path.startswith("/api/") and site not in (None, "same-origin", "none"):
            return Refusal(403, f"a {site} request to the explorer's API is refused: it answers only its own page")
        if self.token is not None and not self._has_token(headers, query):
            return Refusal(403, "this server needs its token: open the address with ?token=... that "
                                "`headscope serve` printed when it started")
        if method == "POST":
            media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if media != "application/json":
                return Refusal(415, f"the request body must be sent as application/json, not {media or 'no type'}")
        return None

    def _same_origin(self, origin: str, host: str | None, scheme: str) -> bool:
        try:
            parts = urlsplit(origin.strip())
            port = parts.port
        except ValueError:
            return False
        if parts.scheme != scheme or not parts.hostname or parts.path not in ("", "/"):
            return False  # "null" (a sandboxed frame, a file://) included
        default = {"http": 80, "https": 443}[scheme] if scheme in ("http", "https") else None
        mine = urlsplit(f"{scheme}://{host}")
        try:
            mine_port = mine.port
        except ValueError:
            return False
        return (host_name(parts.hostname) == host_name(mine.hostname or "")
                and (port or default) == (mine_port or default))

    def _has_token(self, headers: Mapping[str, str], query: str) -> bool:
        given = [*_cookies(headers.get("cookie", "")).get(TOKEN_COOKIE, []), *parse_qs(query).get("token", [])]
        scheme, _, value = headers.get("authorization", "").partition(" ")
        if scheme.lower() in ("token", "bearer"):
            given.append(value.strip())
        return any(secrets.compare_digest(g.encode(), self.token.encode()) for g in given)  # type: ignore[union-attr]


def _cookies(header: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for part in header.split(";"):
        name, eq, value = part.strip().partition("=")
        if eq:
            out.setdefault(name, []).append(value)
    return out


async def _read_body(receive, guard: Guard) -> bytes | Refusal | None:
    """The whole body of a request, read within `guard.body_seconds`; a `Refusal` for one too large or too slow,
    None when the client went away."""
    import asyncio

    async def whole() -> bytes | Refusal | None:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > guard.max_body:
                return Refusal(413, f"the request body is larger than {guard.max_body:,} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    try:  # wait_for, not asyncio.timeout: the package supports Python 3.10
        return await asyncio.wait_for(whole(), guard.body_seconds)
    except asyncio.TimeoutError:
        return Refusal(408, f"the request body did not arrive within {guard.body_seconds:g} s; send it at once")


def guarded(app: Any, guard: Guard) -> Any:
    """`app` (ASGI) behind `guard`: refusals answered as one-line JSON, a first visit with `?token=` given
    its cookie (and sent on to `local_location` without the token in the address), a POST's body read whole
    (bounded in size and time) before the request counts against its client's POSTs in flight."""
    in_flight: dict[str, int] = {}  # client address → POSTs being served; this app's, not global

    async def answer(send, status: int, body: dict, extra: tuple = ()) -> None:
        data = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                                (b"cache-control", b"no-store"), *extra]})
        await send({"type": "http.response.body", "body": data})

    async def guarded_app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        headers: dict[str, str] = {}
        for k, v in scope.get("headers", ()):  # a repeated header: its first value (a second Host is refused below)
            name = k.decode("latin-1").lower()
            if name == "host" and name in headers:
                return await answer(send, 400, {"error": "the request has two Host headers"})
            headers.setdefault(name, v.decode("latin-1"))
        method, path = scope["method"], scope["path"]
        query = scope.get("query_string", b"").decode("latin-1")
        refusal = guard.refusal(method=method, path=path, headers=headers, query=query,
                                scheme=scope.get("scheme", "http"))
        if refusal is not None:
            return await answer(send, refusal.status, {"error": refusal.message})
        if guard.token is not None and method == "GET" and not path.startswith("/api/") and "token" in parse_qs(query):
            cookie = f"{TOKEN_COOKIE}={guard.token}; Path=/; HttpOnly; SameSite=Strict"
            location = local_location(path)
            return await answer(send, 303, {"location": location}, ((b"location", location.encode("ascii")),
                                                                    (b"set-cookie", cookie.encode())))
        if method != "POST":
            return await app(scope, receive, send)
        size = headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > guard.max_body):
            return await answer(send, 413, {"error": f"the request body is larger than {guard.max_body:,} bytes"},
                                ((b"connection", b"close"),))
        body = await _read_body(receive, guard)
        if body is None:  # the client went away
            return None
        if isinstance(body, Refusal):
            return await answer(send, body.status, {"error": body.message}, ((b"connection", b"close"),))
        client = (scope.get("client") or ("?", 0))[0]
        if in_flight.get(client, 0) >= guard.max_in_flight:
            return await answer(send, 429, {"error": f"{guard.max_in_flight} requests of this client are already "
                                                     "being served; wait for their answers"},
                                ((b"retry-after", b"1"),))
        delivered = False

        async def replay():  # the body read above, then the client's own messages (its disconnect)
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        in_flight[client] = in_flight.get(client, 0) + 1
        try:
            await app(scope, replay, send)
        finally:
            in_flight[client] -= 1
            if not in_flight[client]:
                del in_flight[client]

    return guarded_app
