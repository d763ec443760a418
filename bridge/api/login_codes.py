"""One-time login codes (docs/security.md "One-time link").

The daemon prints one in the link it shows at start-up (``/#login=<code>``: in the URL
fragment, which browsers never send to a server, so it stays out of access logs); the page
trades it once for the session cookie (``POST /v1/session {"code"}``, api/signin.py). A
holder of the token mints more with ``POST /v1/login-codes`` (``agent-bridge login-link``),
and a signed-in page with ``POST /v1/me/pairing`` (api/pairing.py): such a code names the
session that minted it, whose end bounds the session it makes.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Grant:
    """What a redeemed code signs in: a user (None: the operator) and, for a code a browser
    session minted, that session's id (the new session may not outlive it)."""

    user: str | None
    parent: str | None = None


class LoginCodes:
    """Single-use codes for the start-up link (docs/security.md "One-time link"). Each
    lives ``ttl_s`` (10 min by default); at most ``limit`` are live at once (the oldest goes
    first). Redeeming compares against every live code in constant time and consumes the
    one that matches. Codes are never logged."""

    def __init__(self, ttl_s: float = 600.0, limit: int = 8, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.limit = limit
        self._clock = clock
        # (code, expiry, what it signs in), oldest first
        self._codes: list[tuple[str, float, Grant]] = []

    def issue(self, user: str | None = None, *, parent: str | None = None) -> str:
        self._expire()
        while len(self._codes) >= self.limit:
            self._codes.pop(0)
        code = secrets.token_urlsafe(32)
        self._codes.append((code, self._clock() + self.ttl_s, Grant(user, parent)))
        return code

    def redeem(self, given: object) -> bool:
        return self.redeem_for(given)[0]

    def redeem_for(self, given: object) -> tuple[bool, str | None]:
        """Whether ``given`` was a live code (now spent), and the user it signs in."""
        grant = self.redeem_grant(given)
        return (False, None) if grant is None else (True, grant.user)

    def redeem_grant(self, given: object) -> Grant | None:
        """What ``given`` signs in if it was a live code (now spent), else None."""
        self._expire()
        if not isinstance(given, str) or not given or len(given) > 256:
            return None
        hit = None
        for i, (code, _, _) in enumerate(self._codes):
            # Every live code is compared (no early exit), each in constant time.
            if hmac.compare_digest(code.encode(), given.encode("utf-8", "replace")) and hit is None:
                hit = i
        if hit is None:
            return None
        grant = self._codes[hit][2]
        del self._codes[hit]
        return grant

    def _expire(self) -> None:
        now = self._clock()
        self._codes = [c for c in self._codes if c[1] > now]

    def __len__(self) -> int:
        self._expire()
        return len(self._codes)
