"""The timers and background tasks one conversation owns: created, cancelled and awaited
by it (nothing fire-and-forget). A timer that fires calls back with its key; a timer
disarmed after it fired but before its callback ran is recognised by :meth:`claim`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any


class Owned:
    def __init__(self, label: str, fire: Callable[[str], Awaitable[None]]) -> None:
        self._label = label
        self._fire = fire
        self._timers: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=f"{name}-{self._label}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def arm(self, key: str, delay_s: float) -> None:
        self.disarm(key)
        self._timers[key] = asyncio.create_task(self._timer(key, delay_s), name=f"timer-{key}-{self._label}")

    def disarm(self, key: str) -> None:
        task = self._timers.pop(key, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def claim(self, key: str) -> bool:
        """In a timer's callback: True when this timer is still the one armed under
        ``key`` (it is then forgotten), False when it was disarmed or re-armed meanwhile."""
        if self._timers.get(key) is not asyncio.current_task():
            return False
        del self._timers[key]
        return True

    async def _timer(self, key: str, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        await self._fire(key)

    async def cancel_all(self) -> None:
        """Cancel and await every timer and background task (close, daemon shutdown)."""
        tasks = [*self._timers.values(), *self._background]
        self._timers.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
