"""The request guard (docs/api.md §3.3, docs/security.md): pure ASGI middleware that runs
before routing on every HTTP request and WebSocket upgrade.

* :class:`RequestGuard`: the Host check (DNS rebinding), the Origin check (cross-site
  WebSocket hijacking, CSRF) and CORS for allowlisted origins.
* :class:`JsonBodies`: which request bodies are read as JSON (a missing or form content
  type only beside an Authorization header, which no cross-site page can send).
* :class:`PageHeaders`: the Content-Security-Policy and friends on every HTTP response.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

import structlog
from fastapi import Response
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bridge.errors import error_body
from bridge.network import DEFAULT_PORTS, is_loopback_host, parse_host_port, parse_origin

log = structlog.get_logger("bridge.security")


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CORS_METHODS = "GET, POST, PUT, PATCH, DELETE, OPTIONS"
CORS_HEADERS = "Authorization, Content-Type, Last-Event-ID"
CORS_MAX_AGE = "600"
_HOST_REFUSED = (421, "host_not_allowed", "this Host is not served here; see [server] allowed_hosts")
_ORIGIN_REFUSED = (403, "origin_not_allowed", "this Origin may not use the daemon; see [server] allowed_origins")


class RequestGuard:
    """Pure ASGI (BaseHTTPMiddleware would break WebSockets and streaming). For every
    HTTP request and WebSocket upgrade, before routing:

    1. Host: bound to loopback, the Host header must be a loopback name or address with
       the bound port, or match ``allowed_hosts``; bound elsewhere, only a non-empty
       ``allowed_hosts`` is enforced (loopback names with the port still pass). On a
       Unix socket (``--uds``) there is no port: a loopback name with any port, or
       none, passes. Otherwise 421 ``host_not_allowed``.
    2. Origin: a WebSocket upgrade or a state-changing request (not GET/HEAD/OPTIONS) that
       carries an Origin other than the daemon's own (same scheme, host and port as the
       Host header) or one in ``allowed_origins`` gets 403 ``origin_not_allowed``.
    3. CORS, for ``allowed_origins`` only: preflights are answered here; other responses
       get Access-Control-Allow-Origin (the exact origin), -Credentials and Vary: Origin.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        bind_host: str,
        port: int,
        allowed_hosts: Iterable[str],
        allowed_origins: Iterable[str],
        tls: bool,
        trust_proxy_headers: bool,
        unix_socket: bool = False,
    ) -> None:
        self.app = app
        self.unix_socket = unix_socket
        self.loopback = unix_socket or is_loopback_host(bind_host)
        self.port = port
        self.allowed_hosts = [parse_host_port(h) for h in allowed_hosts]
        self.allowed_origins = {parse_origin(o) for o in allowed_origins}
        self.tls = tls
        self.trust_proxy_headers = trust_proxy_headers
        self.check_hosts = self.loopback or bool(self.allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        scheme = self._scheme(scope, headers)
        scope["bridge.scheme"] = scheme  # the scheme the client used, for the cookie's Secure
        hosts = headers.getlist("host")
        host = _host_or_none(hosts[0]) if len(hosts) == 1 else None
        if self.check_hosts and (host is None or not self._host_allowed(host, scheme)):
            await _refuse(scope, receive, send, *_HOST_REFUSED)
            return
        origins = headers.getlist("origin")
        if not origins:
            await self.app(scope, receive, send)
            return
        await self._with_origin(scope, receive, send, headers, origins, host, scheme)

    async def _with_origin(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        headers: Headers,
        origins: list[str],
        host: tuple[str, int | None] | None,
        scheme: str,
    ) -> None:
        origin = _origin_or_none(origins[0]) if len(origins) == 1 else None
        allowlisted = origin is not None and origin in self.allowed_origins
        own = _is_own(origin, host, scheme)
        if scope["type"] == "http" and scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await self._preflight(scope, receive, send, headers, origins[0] if allowlisted else None)
            return
        state_changing = scope["type"] == "websocket" or scope["method"] not in SAFE_METHODS
        if state_changing and not (allowlisted or own):
            await _refuse(scope, receive, send, *_ORIGIN_REFUSED)
            return
        if allowlisted and scope["type"] == "http":
            await self.app(scope, receive, _with_cors(send, origins[0]))
            return
        await self.app(scope, receive, send)

    def _scheme(self, scope: Scope, headers: Headers) -> str:
        if self.trust_proxy_headers:
            fwd = headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
            if fwd in DEFAULT_PORTS:
                return fwd
        if self.tls or scope.get("scheme") in ("https", "wss"):
            return "https"
        return "http"

    def _host_allowed(self, host: tuple[str, int | None], scheme: str) -> bool:
        name, port = host
        if is_loopback_host(name) and self._own_port(port, scheme):
            return True
        for a_name, a_port in self.allowed_hosts:
            # No port in the Host header: the client used a default port (80 or 443;
            # behind a TLS proxy the daemon cannot tell which).
            if name == a_name and (
                a_port is None or a_port == port or (port is None and a_port in DEFAULT_PORTS.values())
            ):
                return True
        return False

    def _own_port(self, port: int | None, scheme: str) -> bool:
        # A Unix socket has no port: whatever the client wrote (or none) is its own.
        return self.unix_socket or (port or DEFAULT_PORTS[scheme]) == self.port

    async def _preflight(
        self, scope: Scope, receive: Receive, send: Send, headers: Headers, origin: str | None
    ) -> None:
        if origin is None:
            await _refuse(scope, receive, send, *_ORIGIN_REFUSED)
            return
        out = {
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Credentials": "true",
            "Access-Control-Allow-Methods": CORS_METHODS,
            "Access-Control-Allow-Headers": CORS_HEADERS,
            "Access-Control-Max-Age": CORS_MAX_AGE,
            "Vary": "Origin",
        }
        if headers.get("access-control-request-private-network") == "true":
            out["Access-Control-Allow-Private-Network"] = "true"
        await Response(status_code=204, headers=out)(scope, receive, send)


# Content types a body with an Authorization header may have and still be read as JSON:
# none at all, and what curl -d sends (issue #34 item 5).
LENIENT_TYPES = frozenset({"", "text/plain", "application/x-www-form-urlencoded"})
_NOT_JSON = (
    "the request body was sent as {what}; send it as JSON with content-type: application/json "
    "(requests with an Authorization header may leave the content type out)"
)


def _media_type(value: str) -> str:
    return value.split(";", 1)[0].strip().lower()


def _is_json(media: str) -> bool:
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class JsonBodies:
    """Pure ASGI: which ``/v1`` request bodies are read as JSON (docs/security.md §4).

    A body with ``content-type: application/json`` (or ``…+json``) always is. A body with
    no content type, ``text/plain`` or ``application/x-www-form-urlencoded`` (curl -d) is
    read as JSON when the request carries an ``Authorization`` header: a browser sends
    those three cross-site without a preflight, but never with an Authorization header, so
    leniency there opens nothing to a foreign page. Any other body of a request without
    that header (a browser session's cookie, or ``--no-auth``) is refused 415
    ``unsupported_media_type`` before routing; a cross-site page's form or text post is
    thus refused twice over (the Origin check, then this), and one whose Origin was
    stripped still once. Requests without a body pass untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in SAFE_METHODS or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        media = _media_type(headers.get("content-type", ""))
        has_body = headers.get("content-length", "0").strip() not in ("", "0") or "transfer-encoding" in headers
        if not has_body or _is_json(media):
            await self.app(scope, receive, send)
            return
        if "authorization" in headers and media in LENIENT_TYPES:
            scope = dict(scope)
            raw = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
            scope["headers"] = [*raw, (b"content-type", b"application/json")]
            await self.app(scope, receive, send)
            return
        what = media or "no content type"
        body = error_body("unsupported_media_type", _NOT_JSON.format(what=what))
        await JSONResponse(body, status_code=415)(scope, receive, send)


# The bundled page's policy (issue #6 item 7): no inline script or style, nothing from
# another origin, never framed. It is set on every HTTP response (JSON included, where it
# costs nothing); the page's own assets are the ones it matters for. The manifest and the
# service worker (/sw.js) are the page's own too (issue #39), said explicitly.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'; manifest-src 'self'; worker-src 'self'"
)
PAGE_HEADERS = (
    ("content-security-policy", CONTENT_SECURITY_POLICY),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
)


class PageHeaders:
    """Pure ASGI: adds :data:`PAGE_HEADERS` to every HTTP response that lacks them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                h = MutableHeaders(scope=message)
                for name, value in PAGE_HEADERS:
                    if name not in h:
                        h[name] = value
            await send(message)

        await self.app(scope, receive, wrapped)


def _is_own(origin: tuple[str, str, int] | None, host: tuple[str, int | None] | None, scheme: str) -> bool:
    """The daemon's own origin: the scheme, host and port the request itself used."""
    if origin is None or host is None:
        return False
    return origin == (scheme, host[0], host[1] or DEFAULT_PORTS[scheme])


def _host_or_none(value: str) -> tuple[str, int | None] | None:
    try:
        return parse_host_port(value)
    except ValueError:
        return None


def _origin_or_none(value: str) -> tuple[str, str, int] | None:
    try:
        return parse_origin(value)
    except ValueError:
        return None  # "null", garbage: never own, never allowlisted


def _with_cors(send: Send, origin: str) -> Callable[[Message], Awaitable[None]]:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            h = MutableHeaders(scope=message)
            h["Access-Control-Allow-Origin"] = origin
            h["Access-Control-Allow-Credentials"] = "true"
            h.add_vary_header("Origin")
        await send(message)

    return wrapped


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, code: str, message: str) -> None:
    log.info("security.refused", code=code, type=scope["type"], path=scope.get("path"))
    body = error_body(code, message)
    if scope["type"] == "websocket" and "websocket.http.response" not in scope.get("extensions", {}):
        # No denial-response extension: closing before accept is an HTTP 403.
        await send({"type": "websocket.close", "code": 1008})
        return
    await JSONResponse(body, status_code=status)(scope, receive, send)
