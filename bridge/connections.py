"""Connection bounds for the HTTP server (issue #15 item 3), below the ASGI app.

uvicorn's ``limit_concurrency`` only answers 503 once a request's headers are complete, so
connections that send nothing (or send headers a byte at a time) would each hold a file
descriptor for ever. :func:`guarded_protocol` wraps uvicorn's h11 protocol so that:

* a connection whose request headers are not complete within ``header_timeout_s`` is
  closed (a WebSocket upgrade request included; the keep-alive timeout of uvicorn covers
  the time between requests), and so is one whose request body is not complete within
  ``body_timeout_s`` of its headers;
* at most ``limit`` connections are open: at the limit, a new connection evicts the oldest
  one waiting for request headers — a new connection, or a kept-alive one between
  requests — (so a flood of silent connections, or of quickly refused requests, cannot lock
  out a client that sends its request promptly), and is itself refused only when every
  open connection is busy with a request in progress or a WebSocket;
* what is refused or timed out is logged once per interval with a count, never per
  connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from collections import OrderedDict
from typing import Any

import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

log = structlog.get_logger("bridge.connections")

LOG_INTERVAL_S = 10.0
# Descriptors kept back from the connection limit: the database, agents' pipes (three
# per agent), log files, the listening socket and some slack.
FD_RESERVE = 64
FD_PER_AGENT = 4
MIN_CONNECTIONS = 16


def connection_limit(configured: int, max_conversations: int) -> int:
    """``configured``, capped so that connections can never take the descriptors that
    agents and the store need (the soft RLIMIT_NOFILE, already raised by cli.serve)."""
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return configured
    if soft == resource.RLIM_INFINITY:
        return configured
    room = soft - FD_RESERVE - FD_PER_AGENT * max_conversations
    return max(MIN_CONNECTIONS, min(configured, room))


class _Counter:
    """Counts an event; logs it at most once per LOG_INTERVAL_S, with the count since."""

    def __init__(self, event: str) -> None:
        self.event = event
        self.count = 0
        self.last = 0.0

    def hit(self, **fields: Any) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.last >= LOG_INTERVAL_S:
            log.warning(self.event, count=self.count, interval_s=LOG_INTERVAL_S, **fields)
            self.last, self.count = now, 0


class ConnectionGuard:
    def __init__(self, limit: int, header_timeout_s: float, body_timeout_s: float = 30.0) -> None:
        self.limit = limit
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self._open: dict[asyncio.Transport, None] = {}  # insertion-ordered
        self._waiting: OrderedDict[asyncio.Transport, asyncio.TimerHandle] = OrderedDict()
        # Requests whose body is still arriving: transport → (the request, its deadline).
        self._bodies: dict[asyncio.Transport, tuple[object, asyncio.TimerHandle]] = {}
        self._refused = _Counter("connections.refused_at_limit")
        self._evicted = _Counter("connections.evicted_waiting_for_headers")
        self._timed_out = _Counter("connections.header_timeout")
        self._body_timed_out = _Counter("connections.body_timeout")

    def __len__(self) -> int:
        return len(self._open)

    def opened(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> bool:
        """A new connection; False if it was refused (already closed)."""
        if len(self._open) >= self.limit:
            for t in [t for t in self._open if t.is_closing()]:  # e.g. WebSockets that ended
                self._forget(t)
        if len(self._open) >= self.limit:
            if self._waiting:
                oldest = next(iter(self._waiting))
                self._forget(oldest)
                oldest.abort()
                self._evicted.hit(limit=self.limit)
            else:
                self._refused.hit(limit=self.limit)
                transport.abort()
                return False
        self._open[transport] = None
        self._waiting[transport] = loop.call_later(self.header_timeout_s, self._header_timeout, transport)
        return True

    def _header_timeout(self, transport: asyncio.Transport) -> None:
        if self._waiting.pop(transport, None) is not None:
            self._timed_out.hit(timeout_s=self.header_timeout_s)
            self._open.pop(transport, None)
            transport.abort()

    def idle(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        """A response is complete and the connection is kept alive: evictable again until
        the next request's headers are complete (uvicorn closes it after its keep-alive)."""
        body = self._bodies.pop(transport, None)
        if body is not None:
            body[1].cancel()
        if transport in self._open and transport not in self._waiting:
            self._waiting[transport] = loop.call_later(self.header_timeout_s, self._header_timeout, transport)

    def started(self, transport: asyncio.Transport) -> None:
        """The request's headers are complete (or it was upgraded to a WebSocket)."""
        timer = self._waiting.pop(transport, None)
        if timer is not None:
            timer.cancel()

    def body(
        self, transport: asyncio.Transport, request: object, complete: bool, loop: asyncio.AbstractEventLoop
    ) -> None:
        """``request`` (uvicorn's cycle) is reading its body: bounded in time until complete."""
        current = self._bodies.get(transport)
        if current is not None and (current[0] is not request or complete):
            current[1].cancel()
            del self._bodies[transport]
            current = None
        if current is None and not complete:
            timer = loop.call_later(self.body_timeout_s, self._body_timeout, transport, request)
            self._bodies[transport] = (request, timer)

    def _body_timeout(self, transport: asyncio.Transport, request: object) -> None:
        current = self._bodies.get(transport)
        if current is not None and current[0] is request:
            del self._bodies[transport]
            self._body_timed_out.hit(timeout_s=self.body_timeout_s)
            self._open.pop(transport, None)
            transport.abort()

    def _forget(self, transport: asyncio.Transport) -> None:
        self._open.pop(transport, None)
        timer = self._waiting.pop(transport, None)
        if timer is not None:
            timer.cancel()
        body = self._bodies.pop(transport, None)
        if body is not None:
            body[1].cancel()

    def closed(self, transport: asyncio.Transport) -> None:
        self._forget(transport)


def guarded_protocol(guard: ConnectionGuard) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol, reporting to ``guard``."""

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if not guard.opened(transport, self.loop):
                self.connections.discard(self)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            transport = self.transport
            if transport.get_protocol() is not self:  # upgraded: the WebSocket's own timeouts apply
                guard.started(transport)
            elif self.cycle is not None and not self.cycle.response_complete:
                guard.started(transport)
                guard.body(transport, self.cycle, not self.cycle.more_body, self.loop)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                guard.idle(self.transport, self.loop)

        def connection_lost(self, exc: Exception | None) -> None:
            with contextlib.suppress(Exception):
                guard.closed(self.transport)
            super().connection_lost(exc)

    return GuardedH11Protocol
