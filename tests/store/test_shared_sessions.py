"""Browser sessions across replicas (issue #20 with #18), on both stores: a session one
replica signs in is honoured by another sharing the store, and an unknown cookie reads the
store at most once a second, however many arrive."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.api.browser_sessions import RELOAD_S, Sessions

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


async def test_a_session_signed_out_on_one_replica_ends_on_the_others_within_a_second(opened: Any) -> None:
    clock = Clock()
    async with opened("a") as sa, opened("b") as sb:
        a = Sessions(3600, 16, secret="tok", store=sa, shared=True, clock=clock)
        counted = Counting(sb)
        b = Sessions(3600, 16, secret="tok", store=counted, shared=True, clock=clock)  # type: ignore[arg-type]
        sid = await a.create(user="alice")
        clock.now += RELOAD_S + 0.01
        assert await b.lookup_shared(sid) == (True, "alice")  # known on b now
        before = counted.loads
        for _ in range(20):  # a known session costs the store nothing within RELOAD_S
            assert await b.lookup_shared(sid) == (True, "alice")
        assert counted.loads == before
        await a.revoke(sid)  # signed out on a
        assert await b.lookup_shared(sid) == (True, "alice")  # b re-reads at most once a second
        clock.now += RELOAD_S + 0.01
        assert await b.lookup_shared(sid) == (False, None)
        assert b.lookup(sid) == (False, None)


async def test_a_store_that_cannot_be_read_keeps_the_known_sessions(opened: Any) -> None:
    clock = Clock()

    class Failing(Counting):
        async def load_sessions(self, now: float) -> Any:
            self.loads += 1
            raise OSError("store down")

    async with opened("a") as sa:
        failing = Failing(sa)
        a = Sessions(3600, 16, secret="tok", store=failing, shared=True, clock=clock)  # type: ignore[arg-type]
        sid = await a.create(user="alice")
        clock.now += RELOAD_S + 0.01
        assert await a.lookup_shared(sid) == (True, "alice")
        assert failing.loads == 1
        assert await a.lookup_shared("forged") == (False, None)  # and no second read within RELOAD_S
        assert failing.loads == 1


async def test_an_unshared_store_is_not_read_for_a_known_session(opened: Any) -> None:
    clock = Clock()
    async with opened("a") as sa:
        counted = Counting(sa)
        a = Sessions(3600, 16, secret="tok", store=counted, clock=clock)  # type: ignore[arg-type]
        sid = await a.create(user="alice")
        clock.now += RELOAD_S + 0.01
        assert await a.lookup_shared(sid) == (True, "alice")
        assert counted.loads == 0
