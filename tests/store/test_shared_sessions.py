"""Browser sessions across replicas (issue #20 with #18), on both stores: a session one
replica signs in is honoured by another sharing the store, and an unknown cookie reads the
store at most once a second, however many arrive."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.api.auth import RELOAD_S, Sessions

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Counting:
    """The store, counting the session loads."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.loads = 0

    async def load_sessions(self, now: float) -> Any:
        self.loads += 1
        return await self.store.load_sessions(now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


async def test_a_session_signed_in_on_one_replica_is_honoured_by_another(opened: Any) -> None:
    clock = Clock()
    async with opened("a") as sa, opened("b") as sb:
        a = Sessions(3600, 16, secret="tok", store=sa, clock=clock)
        shared = Counting(sb)
        b = Sessions(3600, 16, secret="tok", store=shared, clock=clock)  # type: ignore[arg-type]
        await a.load()
        await b.load()
        sid = await a.create(user="alice")
        assert b.lookup(sid) == (False, None)  # not in b's memory
        assert await b.lookup_shared(sid) == (True, "alice")  # but in the shared store
        # Unknown cookies: the store is read at most once per RELOAD_S.
        before = shared.loads
        for n in range(50):
            assert await b.lookup_shared(f"forged-{n}") == (False, None)
        assert shared.loads - before <= 1
        clock.now += RELOAD_S + 0.01
        assert await b.lookup_shared("forged-again") == (False, None)
        assert shared.loads - before <= 2
        # Logged out where it was made: gone from the store too.
        await a.revoke(sid)
        fresh = Sessions(3600, 16, secret="tok", store=sb, clock=clock)
        assert await fresh.lookup_shared(sid) == (False, None)
