"""The wake-up of the server-wide change streams (``GET /v1/events``, ``GET /v1/ws``).

The store is the truth: a stream reads the change log itself (``Store.read_changes``) and
this notifier only tells it that there may be something new. The store calls
:meth:`ChangeNotifier.notify` after a commit that gave a thread row a new change_seq; a
cross-replica bus calls it too when another replica commits one. A wake that is missed
(or never sent) loses nothing: every stream also reads at a slow interval of its own.
"""

from __future__ import annotations

import asyncio
import contextlib


class ChangeNotifier:
    def __init__(self) -> None:
        self.generation = 0  # notifications so far: a stream waits for one after what it read
        self._event = asyncio.Event()
        self._streams = 0
        self._empty = asyncio.Event()
        self._empty.set()
        self.close_reason: str | None = None

    def __len__(self) -> int:
        return self._streams

    def notify(self) -> None:
        """Something may have changed: wake every waiting stream. Never blocks."""
        self.generation += 1
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, seen: int, timeout: float) -> None:
        """Return once there was a notification after ``seen`` (a generation read before the
        stream's last read of the store), the notifier was closed, or after ``timeout``."""
        if self.generation != seen or self.close_reason is not None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)

    def attach(self) -> None:
        self._streams += 1
        self._empty.clear()

    def detach(self) -> None:
        self._streams -= 1
        if self._streams <= 0:
            self._streams = 0
            self._empty.set()

    def close(self, reason: str) -> None:
        """Every stream ends (daemon shutdown): each tells its client and detaches."""
        self.close_reason = reason
        self.notify()

    async def wait_empty(self) -> None:
        await self._empty.wait()
