"""Users (``[auth] mode = "users"``, docs/security.md "Users"): who a caller is, what they
may see, and ending a revoked user's open streams.

* :class:`User`: the caller. In token mode (the default) every good credential is the one
  :data:`OPERATOR`, an admin; in users mode the daemon's own token is still the operator,
  and each user's token, browser session or trusted-proxy name is that user.
* Tokens: ``abu_`` and 32 random bytes (URL-safe base64), shown once by ``agent-bridge
  users add``. The store keeps only SHA-256 of the token (:func:`token_hash`): a random
  256-bit secret cannot be guessed from its hash, so neither a slow KDF (which every
  request would pay for) nor a pepper (one more secret every replica must share) adds
  anything. A lookup is by the hash; the stored hash is then compared again with
  ``hmac.compare_digest``.
* :class:`UserDirectory`: resolves a token, a session's user or a proxy's header to an
  active user, reading the store every time, so a user revoked on any replica is refused
  at their next request on every replica.
* :class:`Streams` and :func:`watch_revocations`: every WebSocket and SSE stream a user
  holds is registered; each replica reads the users table every ``REVOKE_POLL_S`` while
  any stream is open and closes a revoked (or removed) user's streams at once.
* Ownership: :func:`visible` / :func:`check_owner`: a thread belongs to its creator; any
  other non-admin is told ``404 thread_not_found``, exactly as for a thread that does not
  exist.

Nothing here logs a token, or the value of a proxy header sent by an untrusted peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import re
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from starlette.requests import HTTPConnection

from bridge.config import AuthSettings
from bridge.errors import NotFound
from bridge.store.base import Store, UserRow

log = structlog.get_logger("bridge.security")

TOKEN_PREFIX = "abu_"  # noqa: S105 -- a prefix, not a secret
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
RESERVED_NAMES = frozenset({"operator"})
REVOKE_POLL_S = 1.0
PROXY_LOG_EVERY_S = 10.0


@dataclass(frozen=True, slots=True)
class User:
    name: str
    admin: bool
    # What the threads this caller creates record as their owner: None in token mode.
    owner: str | None = None


OPERATOR = User("operator", admin=True)


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def check_name(name: str) -> str | None:
    """Why ``name`` cannot be a user's name, or None."""
    if not NAME.fullmatch(name):
        return "a user name is 1-64 letters, digits and _.@- (starting with a letter or digit)"
    if name in RESERVED_NAMES:
        return f"{name!r} is reserved (the daemon's own token)"
    return None


def _user(row: UserRow | None) -> User | None:
    if row is None or row.revoked_at is not None:
        return None
    return User(row.name, row.admin, row.name)


class UserDirectory:
    """Credentials → active users, from the store (users mode only)."""

    def __init__(self, store: Store, auth: AuthSettings) -> None:
        self.store = store
        self.header = auth.proxy_user_header.lower() if auth.proxy_user_header else None
        self.trusted = [ipaddress.ip_network(c, strict=False) for c in auth.proxy_trusted]
        self._ignored_logged: dict[str, float] = {}

    async def by_token(self, token: str) -> User | None:
        if not token.startswith(TOKEN_PREFIX) or len(token) > 256:
            return None
        digest = token_hash(token)
        found = await self.store.user_by_token(digest)
        if found is None or not hmac.compare_digest(found[1].encode(), digest.encode()):
            return None
        return _user(found[0])

    async def by_name(self, name: str) -> User | None:
        return _user(await self.store.get_user(name)) if NAME.fullmatch(name) else None

    def proxy_name(self, headers: Mapping[str, str], peer: str) -> str | None:
        """The user a trusted proxy names; None when there is no such header, or when the
        peer is not a trusted proxy (then the header is ignored, and logged without its
        value)."""
        if self.header is None or self.header not in headers:
            return None
        if self._trusted(peer):
            return headers[self.header].strip()
        now = time.monotonic()
        if now - self._ignored_logged.get(peer, -PROXY_LOG_EVERY_S) >= PROXY_LOG_EVERY_S:
            if len(self._ignored_logged) >= 4096:
                self._ignored_logged.clear()
            self._ignored_logged[peer] = now
            log.warning("auth.proxy_header_ignored", peer=peer, header=self.header, reason="peer not in proxy_trusted")
        return None

    def _trusted(self, peer: str) -> bool:
        try:
            addr = ipaddress.ip_address(peer)
        except ValueError:
            return False  # a Unix socket, or unknown: never a trusted proxy
        return any(addr in net for net in self.trusted)


# --------------------------------------------------------------------------- who sees what


def visible(user: User, owner: str | None) -> bool:
    return user.admin or (owner is not None and owner == user.name)


def check_owner(user: User, thread_id: str, owner: str | None) -> None:
    """``thread_not_found``, worded as for a thread that does not exist, unless ``user``
    may see the thread."""
    if not visible(user, owner):
        raise NotFound(f"no thread {thread_id}", code="thread_not_found")


def current_user(conn: HTTPConnection) -> User:
    """The caller of a request that passed auth (``require_auth`` put it there)."""
    user = getattr(conn.state, "user", None)
    assert isinstance(user, User), "route without require_auth"
    return user


# --------------------------------------------------------------------------- open streams


class Streams:
    """Each user's open WebSocket and SSE streams, as callables that end them."""

    def __init__(self) -> None:
        self._open: dict[str, set[Callable[[], None]]] = {}

    @contextlib.contextmanager
    def held(self, user: User, close: Callable[[], None]) -> Iterator[None]:
        if user.owner is None:  # token mode, or the operator: never revoked
            yield
            return
        self._open.setdefault(user.name, set()).add(close)
        try:
            yield
        finally:
            mine = self._open.get(user.name)
            if mine is not None:
                mine.discard(close)
                if not mine:
                    del self._open[user.name]

    def users(self) -> list[str]:
        return list(self._open)

    def close_user(self, name: str) -> int:
        closers = self._open.pop(name, set())
        for close in closers:
            close()
        return len(closers)


async def watch_revocations(store: Store, streams: Streams, on_revoked: Callable[[str], None]) -> None:
    """Every REVOKE_POLL_S, while any stream is open: end the streams of users who are
    revoked or gone (``agent-bridge users revoke`` on any host writes only the store)."""
    while True:
        await asyncio.sleep(REVOKE_POLL_S)
        names = streams.users()
        if not names:
            continue
        try:
            active = {u.name for u in await store.list_users() if u.revoked_at is None}
        except Exception as exc:
            log.warning("auth.revocation_check_failed", error=str(exc)[:200])
            continue
        for name in names:
            if name not in active:
                closed = streams.close_user(name)
                on_revoked(name)
                log.info("auth.user_revoked", user=name, streams_closed=closed)


def me_view(user: User, mode: str) -> dict[str, Any]:
    return {"name": user.name, "admin": user.admin, "mode": mode}
