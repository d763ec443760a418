"""Wrong credentials: whom they count against, the log line, and the 429 that slows a
guesser down (Hardening II #9; issue #32 B7). Pure but for the log line; the clock is
injected, so the tests drive time."""

from __future__ import annotations

import ipaddress
import math
import time
from collections import deque
from collections.abc import Callable, Iterable

import structlog

log = structlog.get_logger("bridge.security")


class Refusals:
    """Wrong credentials, counted per source (Hardening II #9; issue #32 B7).

    * The source is the socket peer, or, when that peer is a trusted proxy
      (``[auth] proxy_trusted``), the client the proxy names in ``X-Forwarded-For``
      (:meth:`source`). An IPv6 source counts as its /64 (one host holds a whole /64).
    * Logged: ``auth.refused`` with the source, what was refused and how many of that kind
      since the source's last line of it — at most one line per source and kind per
      ``log_every_s``, so a burst of one kind never hides the first of another (issue #34);
      never the secret.
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
        # (source, kind) → (its last line, refusals of that kind since): at most five kinds
        self._logged: dict[tuple[str, str], tuple[float, int]] = {}

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
        key = (peer, what)
        last, count = self._logged.get(key, (-math.inf, 0))
        if now - last >= self.log_every_s:
            log.warning("auth.refused", peer=peer, refused=what, count=count + 1)
            if key not in self._logged and len(self._logged) >= self.max_peers:
                self._logged.pop(next(iter(self._logged)))
            self._logged[key] = (now, 0)
        else:
            self._logged[key] = (last, count + 1)


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
