"""Where an agent's answer goes when the core says it is not the transcript's alone
(a :class:`~bridge.sessions.actions.Route` action): to a request of the daemon's own that
awaits it (a mode switch, sessions/local_port.py), or to the raw-mode client whose frame
asked for it.

The local port registers a route before it writes the request; the conversation delivers
what the core routes, and fails the awaited answers when the process exits (nothing will
answer them then). A table of its own, so neither side reaches into the other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from bridge.sessions.fanout import Subscriber


class Routes:
    def __init__(self) -> None:
        self._replies: dict[str, asyncio.Future[str]] = {}  # the daemon's own requests
        self._raw: dict[str, Subscriber] = {}  # raw-mode clients awaiting responses

    def __len__(self) -> int:
        """The daemon's own requests to the agent still awaiting its answer."""
        return len(self._replies)

    def expect(self, route: str) -> asyncio.Future[str]:
        """The answer routed to ``route``, once the agent gives it (:meth:`forget` after)."""
        reply: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._replies[route] = reply
        return reply

    def forget(self, route: str) -> None:
        self._replies.pop(route, None)

    def to_client(self, route: str, sub: Subscriber) -> None:
        """Answers routed to ``route`` go to ``sub`` (a raw-mode client), until it leaves."""
        self._raw[route] = sub

    def drop_client(self, sub: Subscriber) -> None:
        self._raw = {k: v for k, v in self._raw.items() if v is not sub}

    def deliver(self, route: str, text: str, seq: int) -> None:
        """The agent's answer ``text``, at transcript position ``seq``, to whoever awaits it."""
        if (reply := self._replies.pop(route, None)) is not None:
            if not reply.done():
                reply.set_result(text)
        elif (sub := self._raw.get(route)) is not None:
            sub.push_routed(text, seq)

    def fail_all(self, error: Callable[[], BaseException]) -> None:
        """The process is gone: every awaited answer is an ``error()`` instead."""
        for reply in self._replies.values():
            if not reply.done():
                reply.set_exception(error())
