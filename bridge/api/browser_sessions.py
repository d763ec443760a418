"""Browser sessions (docs/security.md "Browser sessions"): the cookie a page holds instead
of the token, which JavaScript cannot read (HttpOnly) and other sites cannot send
(SameSite=Strict).

:class:`Sessions` is the table of live sessions: in memory for the check every request
makes, and in the store so that a restart (or, on a shared store, another replica) signs
nobody out. Signing in and out is api/signin.py; reading the cookie of a request is
api/auth.py.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import time
from collections.abc import Callable

import structlog

from bridge.store.base import SessionStore

log = structlog.get_logger("bridge.security")

RELOAD_S = 1.0  # a shared store's sessions are re-read at most this often (sign-ins and sign-outs elsewhere)
COOKIE_NAME = "agent_bridge_session"


def session_cookie(value: str, max_age: int, *, secure: bool) -> str:
    """The ``Set-Cookie`` value that hands a browser its session (or, empty with
    ``max_age`` 0, takes it back)."""
    cookie = f"{COOKIE_NAME}={value}; Max-Age={max_age}; Path=/; HttpOnly; SameSite=Strict"
    return cookie + "; Secure" if secure else cookie


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

    async def create(self, user: str | None = None, *, not_after: float | None = None) -> str:
        """A new session for ``user``, living ``ttl_s`` or until ``not_after`` if sooner (a
        session signed in by a code another session minted ends with that one)."""
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
        expiry = now + self.ttl_s if not_after is None else min(now + self.ttl_s, not_after)
        self._expiry[key] = (expiry, user)
        if self._store is not None:
            await self._store.save_session(key, expiry, evicted, user=user)
        return sid

    def expiry(self, sid: str | None) -> float | None:
        """When the live session ``sid`` ends (this daemon's clock), or None if it is not live."""
        if not self.lookup(sid)[0]:
            return None
        return self._expiry[self._key(str(sid))][0]

    def seconds_left(self, sid: str | None) -> float:
        """How long the session ``sid`` has left (0 when it is not live): its cookie's Max-Age."""
        end = self.expiry(sid)
        return 0.0 if end is None else max(0.0, end - self._clock())

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
