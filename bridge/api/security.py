"""Who may talk to the daemon (API.md §1 and §4, issue #6; docs/security.md).

* The auth token: where it comes from, and constant-time checks of what clients send.
  Token precedence: ``--token`` / ``AGENT_BRIDGE_TOKEN``, else ``<data-dir>/token``, else a
  new random token written there with mode 0600.
* Credentials: ``Authorization: Bearer``, the WebSocket subprotocol pair
  ``agent-bridge.v1`` + ``bearer.<token>``, or the browser session cookie minted by
  ``POST /v1/session``. Never a URL query parameter.
* One-time login codes (:class:`LoginCodes`): the daemon prints one in the link it shows at
  start-up (``/#login=<code>``, in the URL fragment, which browsers never send); the page
  trades it once for the session cookie (``POST /v1/session {"code"}``).
* :class:`RequestGuard`, a pure ASGI middleware that runs before routing: the Host check
  (DNS rebinding), the Origin check (cross-site WebSocket hijacking, CSRF) and CORS for
  allowlisted origins.
* :class:`PageHeaders`: the Content-Security-Policy and friends on every HTTP response.

Nothing here logs a token, a cookie or an Authorization header.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import structlog
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bridge.config import DEFAULT_PORTS, Settings, parse_host_port, parse_origin
from bridge.errors import ConfigError, Unauthorized, error_body
from bridge.process.launch import is_loopback_host

log = structlog.get_logger("bridge.security")

SUBPROTOCOL = "agent-bridge.v1"
BEARER_PREFIX = "bearer."
COOKIE_NAME = "agent_bridge_session"


# --------------------------------------------------------------------------- the token


def resolve_token(settings: Settings) -> str | None:
    if settings.no_auth:
        return None
    if settings.token:
        return settings.token
    path = settings.data_dir / "token"
    try:
        token = path.read_text(encoding="utf-8").strip()
        if token:
            return token
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ConfigError(f"cannot read token file {path}: {exc.strerror}") from exc
    return _write_new_token(path)


def _write_new_token(path: Path) -> str:
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return token


def token_matches(expected: str, given: str | None) -> bool:
    if given is None:
        return False
    return hmac.compare_digest(expected.encode(), given.encode())


def bearer_from_header(value: str | None) -> str | None:
    if not value:
        return None
    scheme, _, cred = value.partition(" ")
    if scheme.lower() != "bearer" or not cred:
        return None
    return cred.strip()


def bearer_from_subprotocols(offered: list[str]) -> str | None:
    for p in offered:
        if p.startswith(BEARER_PREFIX):
            return p[len(BEARER_PREFIX) :]
    return None


def offered_subprotocols(headers: Mapping[str, str]) -> list[str]:
    return [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",") if p.strip()]


# --------------------------------------------------------------------------- sessions


class SessionStore(Protocol):
    async def load_sessions(self, now: float) -> list[tuple[str, float]]: ...
    async def save_session(self, key: str, expires_at: float, evicted: Sequence[str] = ()) -> None: ...
    async def delete_session(self, key: str) -> None: ...


class Sessions:
    """Browser sessions: random 256-bit ids, each with an expiry; at most ``limit`` at once
    (the oldest goes first). Checked in memory; with a ``store`` they also survive a daemon
    restart. Only a keyed hash of an id is kept (HMAC-SHA256 under the auth token), never
    the id: a copy of the database signs nobody in, and a new token ends every session."""

    def __init__(
        self,
        ttl_s: float,
        limit: int,
        *,
        secret: str | None = None,
        store: SessionStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ttl_s = ttl_s
        self.limit = limit
        self._clock = clock
        self._store = store
        self._secret = (secret or "").encode()
        self._expiry: dict[str, float] = {}  # key → expiry; insertion order = creation order

    def _key(self, sid: str) -> str:
        return hmac.new(self._secret, sid.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()

    async def load(self) -> None:
        """Take over the unexpired sessions a previous daemon stored."""
        if self._store is not None:
            for key, exp in (await self._store.load_sessions(self._clock()))[-self.limit :]:
                self._expiry[key] = exp

    async def create(self) -> str:
        now = self._clock()
        evicted = [k for k, exp in self._expiry.items() if exp <= now]
        for key in evicted:
            del self._expiry[key]
        while len(self._expiry) >= self.limit:
            oldest = next(iter(self._expiry))
            del self._expiry[oldest]
            evicted.append(oldest)
        sid = secrets.token_urlsafe(32)
        key = self._key(sid)
        self._expiry[key] = now + self.ttl_s
        if self._store is not None:
            await self._store.save_session(key, now + self.ttl_s, evicted)
        return sid

    def valid(self, sid: str | None) -> bool:
        if not sid:
            return False
        key = self._key(sid)
        exp = self._expiry.get(key)
        if exp is None:
            return False
        if exp <= self._clock():
            del self._expiry[key]
            return False
        return True

    async def revoke(self, sid: str | None) -> None:
        if sid:
            key = self._key(sid)
            self._expiry.pop(key, None)
            if self._store is not None:
                await self._store.delete_session(key)

    def __len__(self) -> int:
        return len(self._expiry)


class LoginCodes:
    """Single-use codes for the start-up link (docs/security.md "One-time link"). Each
    lives ``ttl_s`` (10 min by default); at most ``limit`` are live at once (the oldest goes
    first). Redeeming compares against every live code in constant time and consumes the
    one that matches. Codes are never logged."""

    def __init__(self, ttl_s: float = 600.0, limit: int = 8, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.limit = limit
        self._clock = clock
        self._codes: list[tuple[str, float]] = []  # (code, expiry), oldest first

    def issue(self) -> str:
        self._expire()
        while len(self._codes) >= self.limit:
            self._codes.pop(0)
        code = secrets.token_urlsafe(32)
        self._codes.append((code, self._clock() + self.ttl_s))
        return code

    def redeem(self, given: object) -> bool:
        self._expire()
        if not isinstance(given, str) or not given or len(given) > 256:
            return False
        hit = None
        for i, (code, _) in enumerate(self._codes):
            # Every live code is compared (no early exit), each in constant time.
            if hmac.compare_digest(code.encode(), given.encode("utf-8", "replace")) and hit is None:
                hit = i
        if hit is None:
            return False
        del self._codes[hit]
        return True

    def _expire(self) -> None:
        now = self._clock()
        self._codes = [(c, exp) for c, exp in self._codes if exp > now]

    def __len__(self) -> int:
        self._expire()
        return len(self._codes)


def authorized(state: Any, headers: Mapping[str, str], cookies: Mapping[str, str], *, websocket: bool = False) -> bool:
    """A bearer token (header, or for a WebSocket the subprotocol) or a live session
    cookie. A token that is present but wrong fails even beside a good cookie."""
    expected: str | None = state.token
    if expected is None:
        return True
    given = bearer_from_header(headers.get("authorization"))
    if given is None and websocket:
        given = bearer_from_subprotocols(offered_subprotocols(headers))
    if given is not None:
        return token_matches(expected, given)
    sessions: Sessions = state.sessions
    return sessions.valid(cookies.get(COOKIE_NAME))


def require_auth(request: Request) -> None:
    """The dependency of every ``/v1`` REST route."""
    if not authorized(request.app.state, request.headers, request.cookies):
        raise Unauthorized("missing or wrong credentials")


session_router = APIRouter(prefix="/v1")


@session_router.post("/session", status_code=204)
async def login(request: Request) -> Response:
    """Trade the bearer token (header only), or a one-time login code (JSON body
    ``{"code": …}``), for an HttpOnly session cookie."""
    state = request.app.state
    expected: str | None = state.token
    given = bearer_from_header(request.headers.get("authorization"))
    if given is not None:
        ok = expected is None or token_matches(expected, given)
    else:
        codes: LoginCodes = state.login_codes
        ok = codes.redeem(_code_from_body(await request.body())) or expected is None
    if not ok:
        raise Unauthorized("POST /v1/session needs the token as Authorization: Bearer, or a valid one-time login code")
    sessions: Sessions = state.sessions
    sid = await sessions.create()
    secure = bool(state.tls) or request.scope.get("bridge.scheme") == "https"
    return _cookie_response(sid, max(1, math.ceil(sessions.ttl_s)), secure=secure)


def _code_from_body(body: bytes) -> object:
    if not body or len(body) > 4096:
        return None
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return obj.get("code") if isinstance(obj, dict) else None


@session_router.delete("/session", status_code=204)
async def logout(request: Request) -> Response:
    require_auth(request)
    sessions: Sessions = request.app.state.sessions
    await sessions.revoke(request.cookies.get(COOKIE_NAME))
    secure = bool(request.app.state.tls) or request.scope.get("bridge.scheme") == "https"
    return _cookie_response("", 0, secure=secure)


def _cookie_response(value: str, max_age: int, *, secure: bool) -> Response:
    cookie = f"{COOKIE_NAME}={value}; Max-Age={max_age}; Path=/; HttpOnly; SameSite=Strict"
    if secure:
        cookie += "; Secure"
    return Response(status_code=204, headers={"Set-Cookie": cookie, "Cache-Control": "no-store"})


# --------------------------------------------------------------------------- Host / Origin / CORS

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CORS_METHODS = "GET, POST, PUT, PATCH, DELETE, OPTIONS"
CORS_HEADERS = "Authorization, Content-Type, Last-Event-ID"
CORS_MAX_AGE = "600"


class RequestGuard:
    """Pure ASGI (BaseHTTPMiddleware would break WebSockets and streaming). For every
    HTTP request and WebSocket upgrade, before routing:

    1. Host: bound to loopback, the Host header must be a loopback name or address with
       the bound port, or match ``allowed_hosts``; bound elsewhere, only a non-empty
       ``allowed_hosts`` is enforced (loopback names with the port still pass).
       Otherwise 421 ``host_not_allowed``.
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
    ) -> None:
        self.app = app
        self.loopback = is_loopback_host(bind_host)
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
            await _refuse(
                scope,
                receive,
                send,
                421,
                "host_not_allowed",
                "this Host is not served here; see [server] allowed_hosts",
            )
            return

        origins = headers.getlist("origin")
        if not origins:
            await self.app(scope, receive, send)
            return
        origin = _origin_or_none(origins[0]) if len(origins) == 1 else None
        allowlisted = origin is not None and origin in self.allowed_origins
        own = origin is not None and host is not None and origin == (scheme, host[0], host[1] or DEFAULT_PORTS[scheme])
        if scope["type"] == "http" and scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await self._preflight(scope, receive, send, headers, origins[0] if allowlisted else None)
            return
        state_changing = scope["type"] == "websocket" or scope["method"] not in SAFE_METHODS
        if state_changing and not (allowlisted or own):
            await _refuse(
                scope,
                receive,
                send,
                403,
                "origin_not_allowed",
                "this Origin may not use the daemon; see [server] allowed_origins",
            )
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
        if is_loopback_host(name) and (port or DEFAULT_PORTS[scheme]) == self.port:
            return True
        for a_name, a_port in self.allowed_hosts:
            # No port in the Host header: the client used a default port (80 or 443;
            # behind a TLS proxy the daemon cannot tell which).
            if name == a_name and (
                a_port is None or a_port == port or (port is None and a_port in DEFAULT_PORTS.values())
            ):
                return True
        return False

    async def _preflight(
        self, scope: Scope, receive: Receive, send: Send, headers: Headers, origin: str | None
    ) -> None:
        if origin is None:
            await _refuse(
                scope,
                receive,
                send,
                403,
                "origin_not_allowed",
                "this Origin may not use the daemon; see [server] allowed_origins",
            )
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


# The bundled page's policy (issue #6 item 7): no inline script or style, nothing from
# another origin, never framed. It is set on every HTTP response (JSON included, where it
# costs nothing); the page's own assets are the ones it matters for.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
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
