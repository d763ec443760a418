"""Authentication: who may talk to the daemon (docs/api.md §3, docs/security.md).

* The auth token: where it comes from, and constant-time checks of what clients send.
  Token precedence: ``--token`` / ``AGENT_BRIDGE_TOKEN``, else ``<data-dir>/token``, else a
  new random token written there with mode 0600.
* Credentials: ``Authorization: Bearer``, the WebSocket subprotocol pair
  ``agent-bridge.v1`` + ``bearer.<token>``, or the browser session cookie minted by
  ``POST /v1/session``. Never a URL query parameter.
* One-time login codes (:class:`LoginCodes`): the daemon prints one in the link it shows at
  start-up (``/#login=<code>``, in the URL fragment, which browsers never send); the page
  trades it once for the session cookie (``POST /v1/session {"code"}``). A holder of the
  token mints more with ``POST /v1/login-codes`` (``agent-bridge login-link``).

The request guard (Host, Origin, CORS, page headers) is api/guard.py.

Nothing here logs a token, a cookie or an Authorization header.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import math
import os
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import structlog
from fastapi import APIRouter, Request, Response
from starlette.requests import HTTPConnection

from bridge.api.users import OPERATOR, User, UserDirectory
from bridge.config import Settings
from bridge.errors import ConfigError, Throttled, Unauthorized
from bridge.store.base import SessionStore

log = structlog.get_logger("bridge.security")

RELOAD_S = 1.0  # a shared store's sessions are re-read at most this often (sign-ins and sign-outs elsewhere)

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
        shared: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ttl_s = ttl_s
        self.limit = limit
        self._clock = clock
        self._store = store
        # Other replicas sign browsers in and out of the same store: it is the authority,
        # re-read at most once per RELOAD_S (see lookup_shared).
        self._shared = shared and store is not None
        self._secret = (secret or "").encode()
        # key → (expiry, user name or None for the operator); insertion order = creation order
        self._expiry: dict[str, tuple[float, str | None]] = {}
        self._reloaded = -math.inf  # when the store was last read for a session not known here

    def _key(self, sid: str) -> str:
        return hmac.new(self._secret, sid.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()

    async def load(self, *, replace: bool = False) -> None:
        """Take over the unexpired sessions a previous daemon stored; with ``replace``, keep
        only those (a session signed out on another replica is gone from the store)."""
        if self._store is not None:
            stored = (await self._store.load_sessions(self._clock()))[-self.limit :]
            if replace:
                self._expiry = {}
            for key, exp, user in stored:
                self._expiry[key] = (exp, user)

    async def create(self, user: str | None = None) -> str:
        now = self._clock()
        evicted = [k for k, (exp, _) in self._expiry.items() if exp <= now]
        for key in evicted:
            del self._expiry[key]
        while len(self._expiry) >= self.limit:
            oldest = next(iter(self._expiry))
            del self._expiry[oldest]
            evicted.append(oldest)
        sid = secrets.token_urlsafe(32)
        key = self._key(sid)
        self._expiry[key] = (now + self.ttl_s, user)
        if self._store is not None:
            await self._store.save_session(key, now + self.ttl_s, evicted, user=user)
        return sid

    def valid(self, sid: str | None) -> bool:
        return self.lookup(sid)[0]

    async def lookup_shared(self, sid: str | None) -> tuple[bool, str | None]:
        """:meth:`lookup`, with the store read once more when another replica may have
        changed the answer: for a session this replica does not know (another replica may
        have signed the browser in), and, on a store shared with other replicas, for a known
        one too (another may have signed it out). The store is read at most once per
        RELOAD_S, however many cookies arrive; when it cannot be read, the sessions known
        here stand until it can."""
        found = self.lookup(sid)
        if not sid or self._store is None or (found[0] and not self._shared):
            return found
        if self._clock() - self._reloaded < RELOAD_S:
            return found
        self._reloaded = self._clock()
        try:
            await self.load(replace=self._shared)
        except Exception as exc:  # the store is down: keep serving the sessions known here
            log.warning("sessions.reload_failed", error=type(exc).__name__)
            return found
        return self.lookup(sid)

    def lookup(self, sid: str | None) -> tuple[bool, str | None]:
        """Whether ``sid`` is a live session, and whose (None: the operator's)."""
        if not sid:
            return False, None
        key = self._key(sid)
        found = self._expiry.get(key)
        if found is None:
            return False, None
        if found[0] <= self._clock():
            del self._expiry[key]
            return False, None
        return True, found[1]

    def drop_user(self, name: str) -> None:
        """Forget a revoked user's sessions here (the store's rows went with the revocation)."""
        for key in [k for k, (_, user) in self._expiry.items() if user == name]:
            del self._expiry[key]

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
        # (code, expiry, the user it signs in: None for the operator), oldest first
        self._codes: list[tuple[str, float, str | None]] = []

    def issue(self, user: str | None = None) -> str:
        self._expire()
        while len(self._codes) >= self.limit:
            self._codes.pop(0)
        code = secrets.token_urlsafe(32)
        self._codes.append((code, self._clock() + self.ttl_s, user))
        return code

    def redeem(self, given: object) -> bool:
        return self.redeem_for(given)[0]

    def redeem_for(self, given: object) -> tuple[bool, str | None]:
        """Whether ``given`` was a live code (now spent), and the user it signs in."""
        self._expire()
        if not isinstance(given, str) or not given or len(given) > 256:
            return False, None
        hit = None
        for i, (code, _, _) in enumerate(self._codes):
            # Every live code is compared (no early exit), each in constant time.
            if hmac.compare_digest(code.encode(), given.encode("utf-8", "replace")) and hit is None:
                hit = i
        if hit is None:
            return False, None
        user = self._codes[hit][2]
        del self._codes[hit]
        return True, user

    def _expire(self) -> None:
        now = self._clock()
        self._codes = [c for c in self._codes if c[1] > now]

    def __len__(self) -> int:
        self._expire()
        return len(self._codes)


class Refusals:
    """Wrong credentials, counted per source (Hardening II #9; issue #32 B7).

    * The source is the socket peer, or, when that peer is a trusted proxy
      (``[auth] proxy_trusted``), the client the proxy names in ``X-Forwarded-For``
      (:meth:`source`). An IPv6 source counts as its /64 (one host holds a whole /64).
    * Logged: ``auth.refused`` with the source, what was refused and how many times since the
      source's last line — at most one line per source per ``log_every_s``; never the secret.
    * Throttled: a source that sent ``max_failures`` wrong tokens or login codes within
      ``window_s`` gets 429 and ``Retry-After`` for every further *wrong* one, until fewer
      than ``max_failures`` of its wrong ones lie within the window (each one it sends while
      throttled counts too). A valid credential is checked first and always passes, from
      any source: the throttle is never the reason a valid token, cookie or code is
      refused. Missing credentials and stale cookies are not counted (a page whose session
      expired is not guessing).
    Pure but for the log; the clock is injected. At most ``max_peers`` sources are
    remembered, each with at most ``max_failures`` times (the one that failed least
    recently goes first).
    """

    def __init__(
        self,
        *,
        max_failures: int = 20,
        window_s: float = 60.0,
        log_every_s: float = 10.0,
        max_peers: int = 4096,
        trusted_proxies: Iterable[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_failures, self.window_s, self.log_every_s, self.max_peers = (
            max_failures,
            window_s,
            log_every_s,
            max_peers,
        )
        self.proxies = [ipaddress.ip_network(c, strict=False) for c in trusted_proxies]
        self._clock = clock
        # source → the times of its latest wrong credentials; least recently failed first
        self._failures: dict[str, deque[float]] = {}
        self._logged: dict[str, tuple[float, int]] = {}  # source → (last line, refusals since)

    def source(self, peer: str, forwarded: Iterable[str] = ()) -> str:
        """Whom a request's wrong credentials count against: the socket ``peer``; when that
        peer is a trusted proxy, the right-most address in ``X-Forwarded-For`` (the header's
        values, in order) that is not itself a trusted proxy. Entries left of it are written
        by the client and are never believed; an entry that is not an address ends the walk
        at the last address read."""
        addr = _address(peer)
        if addr is None:
            return peer  # a Unix socket, or unknown: one source
        if self.proxies and self._trusted(addr):
            entries = [e for value in forwarded for e in value.split(",") if e.strip()]
            for entry in reversed(entries[-MAX_FORWARDED_HOPS:]):
                hop = _address(entry)
                if hop is None:
                    break
                addr = hop
                if not self._trusted(hop):
                    break
        return _bucket(addr)

    def _trusted(self, addr: IPAddress) -> bool:
        return any(addr in net for net in self.proxies)

    def retry_after(self, peer: str) -> int | None:
        """Seconds until ``peer``'s wrong credentials are answered 401 again, or None when it
        is not throttled."""
        now = self._clock()
        times = self._failures.get(peer)
        if times is None:
            return None
        while times and now - times[0] >= self.window_s:
            times.popleft()
        if not times:
            del self._failures[peer]
            return None
        if len(times) < self.max_failures:
            return None
        return max(1, math.ceil(times[0] + self.window_s - now))

    def wrong(self, source: str, what: str) -> int | None:
        """A wrong token or login code from ``source``: counted and logged. The seconds to
        put in Retry-After when ``source`` was already throttled (the caller answers 429),
        else None (401)."""
        throttled = self.retry_after(source) is not None
        self.refused(source, what, guess=True)
        return self.retry_after(source) if throttled else None

    def refused(self, peer: str, what: str, *, guess: bool) -> None:
        now = self._clock()
        if guess:
            times = self._failures.pop(peer, None)
            if times is None:
                times = deque(maxlen=self.max_failures)
                while len(self._failures) >= self.max_peers:
                    self._failures.pop(next(iter(self._failures)))
            times.append(now)
            self._failures[peer] = times  # last: the most recent failure
        last, count = self._logged.get(peer, (-math.inf, 0))
        if now - last >= self.log_every_s:
            log.warning("auth.refused", peer=peer, refused=what, count=count + 1)
            if peer not in self._logged and len(self._logged) >= self.max_peers:
                self._logged.pop(next(iter(self._logged)))
            self._logged[peer] = (now, 0)
        else:
            self._logged[peer] = (last, count + 1)


MAX_FORWARDED_HOPS = 32  # X-Forwarded-For entries read, from the right
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _address(text: str) -> IPAddress | None:
    """An address as a peer or an X-Forwarded-For entry writes it (``[v6]:port`` and
    ``v4:port`` too), or None."""
    text = text.strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _bucket(addr: IPAddress) -> str:
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr)


def _peer(scope_client: Any) -> str:
    return str(scope_client[0]) if scope_client else "unknown"


def credential_source(conn: HTTPConnection) -> str:
    """Whom this request's wrong credentials count against (:meth:`Refusals.source`)."""
    refusals: Refusals = conn.app.state.refusals
    return refusals.source(_peer(conn.client), conn.headers.getlist("x-forwarded-for"))


def _wrong(state: Any, source: str, what: str) -> None:
    """Count a wrong token or login code; 429 when ``source`` was already throttled."""
    refusals: Refusals = state.refusals
    if (wait := refusals.wrong(source, what)) is not None:
        raise Throttled(f"too many wrong credentials from {source}; retry in {wait} s", retry_after_s=wait)


async def authenticate(
    state: Any,
    headers: Mapping[str, str],
    cookies: Mapping[str, str],
    *,
    websocket: bool = False,
    peer: str = "unknown",
    source: str | None = None,
) -> User | None:
    """The caller, or None: a trusted proxy's user header (users mode), a bearer token (header,
    or for a WebSocket the subprotocol) or a live session cookie. A token that is present
    but wrong fails even beside a good cookie. ``peer`` is the socket's peer (whom a proxy
    header is believed from), ``source`` whom wrong credentials count against (default:
    the peer). A valid credential always passes; a wrong token from a throttled source
    raises Throttled (:class:`Refusals`)."""
    if state.token is None:
        return OPERATOR
    source = peer if source is None else source
    directory: UserDirectory | None = state.users
    if directory is not None and (proxied := directory.proxy_name(headers, peer)) is not None:
        return await _proxy_user(state, directory, proxied, source)
    given = given_token(headers, websocket=websocket)
    if given is not None:
        user = await token_user(state, given)  # checked first: the throttle never refuses it
        if user is None:
            _wrong(state, source, "token")
        return user
    user = await _session_user(state, cookies.get(COOKIE_NAME))
    if user is None:
        what = "session cookie" if COOKIE_NAME in cookies else "no credentials"
        state.refusals.refused(source, what, guess=False)
    return user


def given_token(headers: Mapping[str, str], *, websocket: bool) -> str | None:
    """The bearer token sent: the header, or for a WebSocket upgrade the subprotocol."""
    given = bearer_from_header(headers.get("authorization"))
    if given is None and websocket:
        given = bearer_from_subprotocols(offered_subprotocols(headers))
    return given


async def _proxy_user(state: Any, directory: UserDirectory, name: str, peer: str) -> User | None:
    """The user a trusted proxy named: an active user, else nobody (401)."""
    user = await directory.by_name(name)
    if user is None:
        state.refusals.refused(peer, "proxy user", guess=False)
    return user


async def token_user(state: Any, given: str) -> User | None:
    """The daemon's own token is the operator; in users mode, a user's token is that user."""
    if token_matches(state.token, given):
        return OPERATOR
    directory: UserDirectory | None = state.users
    return None if directory is None else await directory.by_token(given)


async def _session_user(state: Any, sid: str | None) -> User | None:
    sessions: Sessions = state.sessions
    live, name = await sessions.lookup_shared(sid)
    if not live:
        return None
    if name is None:
        return OPERATOR
    directory: UserDirectory | None = state.users
    user = None if directory is None else await directory.by_name(name)
    if user is None:  # revoked (on any replica) since it signed in
        sessions.drop_user(name)
    return user


async def resolve_user(conn: HTTPConnection) -> User | None:
    """The one resolver for every transport (REST, WebSocket, SSE, the ACP gateway): the
    caller of this request or upgrade, or None when its credentials are missing or wrong.
    Raises Throttled (429) for a wrong token from a source that sent too many."""
    websocket = conn.scope["type"] == "websocket"
    return await authenticate(
        conn.app.state,
        conn.headers,
        conn.cookies,
        websocket=websocket,
        peer=_peer(conn.client),
        source=credential_source(conn),
    )


async def require_auth(request: Request) -> User:
    """The dependency of every ``/v1`` REST route; the caller is ``request.state.user``."""
    user = await resolve_user(request)
    if user is None:
        raise Unauthorized("missing or wrong credentials")
    request.state.user = user
    return user


session_router = APIRouter(prefix="/v1")


@session_router.post("/session", status_code=204)
async def login(request: Request) -> Response:
    """Trade the bearer token (header only), or a one-time login code (JSON body
    ``{"code": …}``), for an HttpOnly session cookie."""
    state = request.app.state
    expected: str | None = state.token
    given = bearer_from_header(request.headers.get("authorization"))
    user: User | None = OPERATOR
    if given is not None:
        if expected is not None:
            user = await token_user(state, given)
        what = "token"
    else:
        codes: LoginCodes = state.login_codes
        ok, name = codes.redeem_for(_code_from_body(await request.body()))
        user = OPERATOR if expected is None else await _code_user(state, name) if ok else None
        what = "login code"
    # Checked first, counted after: a valid token or code signs in from any source.
    if user is None:
        _wrong(state, credential_source(request), what)
        raise Unauthorized("POST /v1/session needs the token as Authorization: Bearer, or a valid one-time login code")
    sessions: Sessions = state.sessions
    sid = await sessions.create(user.owner)
    secure = bool(state.tls) or request.scope.get("bridge.scheme") == "https"
    return _cookie_response(sid, max(1, math.ceil(sessions.ttl_s)), secure=secure)


@session_router.post("/login-codes", status_code=201)
async def new_login_code(request: Request) -> Response:
    """A fresh one-time login code (``agent-bridge login-link``), for the bearer token
    only: a browser session may not mint the codes that would outlive it."""
    state = request.app.state
    given = bearer_from_header(request.headers.get("authorization"))
    user: User | None = OPERATOR
    if state.token is not None:
        user = None
        if given is not None:
            peer, source = _peer(request.client), credential_source(request)
            user = await authenticate(state, request.headers, {}, peer=peer, source=source)
    if user is None:
        raise Unauthorized("POST /v1/login-codes needs the token as Authorization: Bearer")
    codes: LoginCodes = state.login_codes
    body = {"code": codes.issue(user.owner), "expires_in_s": codes.ttl_s}
    return Response(json.dumps(body), status_code=201, media_type="application/json", headers=_NO_STORE)


_NO_STORE = {"Cache-Control": "no-store"}


async def _code_user(state: Any, name: str | None) -> User | None:
    """The user a redeemed login code signs in (None: revoked since)."""
    if name is None:
        return OPERATOR
    directory: UserDirectory | None = state.users
    return None if directory is None else await directory.by_name(name)


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
    await require_auth(request)
    sessions: Sessions = request.app.state.sessions
    await sessions.revoke(request.cookies.get(COOKIE_NAME))
    secure = bool(request.app.state.tls) or request.scope.get("bridge.scheme") == "https"
    return _cookie_response("", 0, secure=secure)


def _cookie_response(value: str, max_age: int, *, secure: bool) -> Response:
    cookie = f"{COOKIE_NAME}={value}; Max-Age={max_age}; Path=/; HttpOnly; SameSite=Strict"
    if secure:
        cookie += "; Secure"
    return Response(status_code=204, headers={"Set-Cookie": cookie, "Cache-Control": "no-store"})
