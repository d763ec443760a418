"""sessions/ownership.py in-process: acquire, HeldElsewhere, renew, self-fencing on a fake
clock (the fence is decided from the START of the last statement that extended a lease),
leases missing from a renew, strays released, release_all; then the same against a real
SQLite store, two Ownerships on one file standing for two replicas (the database's clock
decides expiry)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from support.stores import opened_at, thread

from bridge.errors import HeldElsewhere, NotFound, StoreError
from bridge.protocols.events import Record
from bridge.sessions.ownership import Ownership, open_turn, takeover_events
from bridge.store.base import Lease

pytestmark = pytest.mark.timeout(30)

TTL = 10.0  # margin 2: a lease is given up 8 s after the start of its last extension


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeLeases:
    """Leases in a dict, expiry on ``clock`` (standing for the database's). ``fail`` makes
    the next statements raise; ``gate`` holds renew_leases until set; ``during`` runs while a
    renew statement is in flight (the clock may move meanwhile)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.rows: dict[str, tuple[str | None, int, float]] = {}  # thread -> holder, epoch, expires
        self.fail: Exception | None = None
        self.gate: asyncio.Event | None = None
        self.released: list[tuple[str, str, int]] = []

    def add(self, tid: str) -> None:
        self.rows[tid] = (None, 0, 0.0)

    def _check(self) -> None:
        if self.fail is not None:
            raise self.fail

    async def acquire_lease(self, thread_id: str, replica_id: str, ttl_s: float) -> int | None:
        self._check()
        if thread_id not in self.rows:
            return None
        holder, epoch, expires = self.rows[thread_id]
        live = holder is not None and expires > self.clock.now
        if live and holder != replica_id:
            return None
        epoch = epoch if live else epoch + 1
        self.rows[thread_id] = (replica_id, epoch, self.clock.now + ttl_s)
        return epoch

    async def renew_leases(self, replica_id: str, ttl_s: float) -> dict[str, int]:
        self._check()
        if self.gate is not None:
            await self.gate.wait()
        out = {}
        for tid, (holder, epoch, expires) in self.rows.items():
            if holder == replica_id and expires > self.clock.now:
                self.rows[tid] = (holder, epoch, self.clock.now + ttl_s)
                out[tid] = epoch
        return out

    async def release_lease(self, thread_id: str, replica_id: str, epoch: int) -> bool:
        self._check()
        self.released.append((thread_id, replica_id, epoch))
        holder, held, _ = self.rows.get(thread_id, (None, 0, 0.0))
        if holder == replica_id and held == epoch:
            self.rows[thread_id] = (None, epoch, 0.0)
            return True
        return False

    async def lease_of(self, thread_id: str) -> Lease | None:
        self._check()
        if thread_id not in self.rows:
            return None
        holder, epoch, expires = self.rows[thread_id]
        left = expires - self.clock.now
        return Lease(holder, epoch, None if holder is None else left, holder is not None and left > 0)


def make(leases: FakeLeases, clock: Clock, replica: str = "a") -> tuple[Ownership, list[list[str]]]:
    lost: list[list[str]] = []
    own = Ownership(leases, replica, TTL, clock=clock, on_lost=lost.append)  # type: ignore[arg-type]
    return own, lost


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def leases(clock: Clock) -> FakeLeases:
    store = FakeLeases(clock)
    for tid in ("t1", "t2", "t3"):
        store.add(tid)
    return store


async def test_ensure_acquires_once_and_holds(leases: FakeLeases, clock: Clock) -> None:
    a, _ = make(leases, clock)
    assert (a.holds("t1"), a.epoch("t1"), a.count()) == (False, None, 0)
    assert await a.ensure("t1") == 1
    leases.fail = StoreError("down")  # a fresh lease is answered without the store
    assert await a.ensure("t1") == 1
    assert (a.holds("t1"), a.epoch("t1"), a.count()) == (True, 1, 1)


async def test_another_live_holder_is_named_and_a_missing_thread_is_not_found(leases: FakeLeases, clock: Clock) -> None:
    a, _ = make(leases, clock, "a")
    b, _ = make(leases, clock, "b")
    await a.ensure("t1")
    with pytest.raises(HeldElsewhere) as caught:
        await b.ensure("t1")
    assert (caught.value.holder, caught.value.code, caught.value.status) == ("a", "not_owner", 409)
    assert not b.holds("t1")
    with pytest.raises(NotFound):
        await b.ensure("nope")
    # a's lease expires (it stopped renewing): b takes over with a higher epoch
    clock.now += TTL + 0.1
    assert await b.ensure("t1") == 2


async def test_release_gives_the_lease_back_and_the_next_epoch_is_higher(leases: FakeLeases, clock: Clock) -> None:
    a, _ = make(leases, clock, "a")
    b, _ = make(leases, clock, "b")
    await a.ensure("t1")
    await a.release("t1")
    assert not a.holds("t1") and leases.released == [("t1", "a", 1)]
    assert await b.ensure("t1") == 2  # at once: no wait for expiry
    await a.release("t2")  # not held: nothing sent
    assert leases.released == [("t1", "a", 1)]


async def test_self_fence_from_the_start_of_the_last_successful_renew(leases: FakeLeases, clock: Clock) -> None:
    a, lost = make(leases, clock)
    await a.ensure("t1")
    await a.ensure("t2")
    clock.now += 3
    started = clock.now
    assert await a.renew_once()
    # renews fail from now on (the store is unreachable)
    leases.fail = StoreError("store down")
    clock.now = started + 4
    assert not await a.renew_once()
    assert a.check() == [] and lost == []
    # the deadline is 8 s (ttl - ttl/5) after the renew's START, not after it returned
    clock.now = started + 7.99
    assert a.check() == []
    clock.now = started + 8.0
    assert sorted(a.check()) == ["t1", "t2"]
    assert [sorted(x) for x in lost] == [["t1", "t2"]] and a.count() == 0
    # the database's lease is still live for another ttl/5: the agents were stopped before it can expire
    assert all(exp > clock.now for _o, _e, exp in leases.rows.values() if _o == "a")
    assert a.lost_total == 2 and a.renew_failures == 1


async def test_a_slow_renew_counts_from_when_it_started(leases: FakeLeases, clock: Clock) -> None:
    a, lost = make(leases, clock)
    await a.ensure("t1")
    acquired = clock.now
    leases.gate = asyncio.Event()
    renew = asyncio.create_task(a.renew_once())
    await asyncio.sleep(0)
    clock.now = acquired + 5  # the statement takes 5 s to come back
    leases.gate.set()
    assert await asyncio.wait_for(renew, 5)
    clock.now = acquired + 8  # 8 s after the renew's start, which was `acquired`
    assert a.check() == ["t1"] and lost == [["t1"]]


async def test_a_thread_missing_from_the_renew_is_lost_and_strays_are_released(
    leases: FakeLeases, clock: Clock
) -> None:
    a, lost = make(leases, clock)
    await a.ensure("t1")
    await a.ensure("t2")
    # t1's row was taken by someone else (its lease expired in the database meanwhile)
    leases.rows["t1"] = ("b", 2, clock.now + TTL)
    # t3 is held by "a" in the database but not known here (a release that failed)
    leases.rows["t3"] = ("a", 4, clock.now + TTL)
    assert await a.renew_once()
    assert lost == [["t1"]] and a.holds("t2") and not a.holds("t1")
    assert ("t3", "a", 4) in leases.released and leases.rows["t3"][0] is None


async def test_an_acquire_in_flight_during_a_renew_is_not_lost(leases: FakeLeases, clock: Clock) -> None:
    a, lost = make(leases, clock)
    leases.gate = asyncio.Event()
    renew = asyncio.create_task(a.renew_once())
    await asyncio.sleep(0)
    # while the renew is in flight, t1 is acquired (after the renew's statement ran)
    assert await a.ensure("t1") == 1
    leases.gate.set()
    assert await asyncio.wait_for(renew, 5)
    assert lost == [] and a.holds("t1")


async def test_release_all_and_a_failed_release_is_only_logged(leases: FakeLeases, clock: Clock) -> None:
    a, _ = make(leases, clock)
    for tid in ("t1", "t2"):
        await a.ensure(tid)
    await a.release_all()
    assert a.count() == 0 and {t for t, _r, _e in leases.released} == {"t1", "t2"}
    await a.ensure("t3")
    leases.fail = StoreError("down")
    await a.release("t3")  # logged; the lease expires by itself
    assert not a.holds("t3")


async def test_run_renews_and_the_watchdog_fences_while_a_renew_hangs() -> None:
    """The loop on the real clock with a short ttl: renews while the store answers; when a
    renew hangs, the watchdog still gives the lease up before ttl."""
    leases = FakeLeases(Clock())
    loop = asyncio.get_running_loop()
    leases.clock = type("C", (), {"now": property(lambda _self: loop.time())})()  # type: ignore[assignment]
    leases.add("t1")
    lost: list[list[str]] = []
    own = Ownership(leases, "a", 0.5, clock=loop.time, on_lost=lost.append)  # type: ignore[arg-type]
    await own.ensure("t1")
    task = asyncio.create_task(own.run())
    try:
        await asyncio.sleep(0.8)  # more than ttl: only renewals keep it
        assert own.holds("t1") and own.renewals >= 2 and lost == []
        leases.gate = asyncio.Event()  # the next renew hangs
        hung = loop.time()
        while not lost:
            await asyncio.wait_for(asyncio.sleep(0.01), 1)
            assert loop.time() - hung < 0.5 + 0.2, "not fenced in time"
        assert lost == [["t1"]]
        # fenced before the database's lease (extended by the last renew) could expire
        assert leases.rows["t1"][2] > loop.time()
    finally:
        leases.gate and leases.gate.set()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def rec(seq: int, kind: str, **data: Any) -> Record:
    return Record(seq, "2026-12-01T00:00:00.000Z", "bridge", kind, data, None, False)


def test_open_turn_and_takeover_events() -> None:
    tail = [rec(1, "turn.started", turn_id="turn_1"), rec(2, "turn.ended", turn_id="turn_1", status="success")]
    assert open_turn(tail) is None
    assert open_turn([*tail, rec(3, "turn.started", turn_id="turn_2"), rec(4, "message.delta")]) == "turn_2"
    assert open_turn([]) is None
    row: Any = {"id": "t", "state": "running", "turn_active": True, "pid": 42}
    events, fields = takeover_events(row, "owner_lost", "turn_2")
    assert [e.kind for e in events] == ["process.exited", "turn.ended"]
    assert events[0].data == {"pid": 42, "code": None, "signal": None, "reason": "owner_lost"}
    assert events[1].data["turn_id"] == "turn_2" and events[1].data["status"] == "error"
    assert events[1].data["reason"] == "owner_lost"
    assert fields["state"] == "exited" and fields["turn_active"] is False and fields["pid"] is None
    # no process recorded, a turn open: only the turn's end
    events, _ = takeover_events({"id": "t", "state": "idle", "turn_active": True}, "owner_lost", None)  # type: ignore[typeddict-item]
    assert [e.kind for e in events] == ["turn.ended"] and "turn_id" not in events[0].data


async def test_two_replicas_on_a_real_sqlite_store(tmp_path: Path) -> None:
    """The same protocol on a real store: the database's clock decides expiry."""
    url = f"sqlite:///{tmp_path / 'bridge.db'}"
    async with asyncio.timeout(20), opened_at(url, "a") as store:
        await store.create_thread(thread("thr_1"))  # type: ignore[arg-type]
        a = Ownership(store, "a", 0.3)
        b = Ownership(store, "b", 0.3)
        assert await a.ensure("thr_1") == 1
        with pytest.raises(HeldElsewhere):
            await b.ensure("thr_1")
        assert await store.renew_leases("a", 0.3) == {"thr_1": 1}
        await asyncio.sleep(0.35)  # a stops renewing: expired on the database's clock
        assert await b.ensure("thr_1") == 2
        assert await a.renew_once() and not a.holds("thr_1")  # a learns it lost it
        await b.release("thr_1")
        lease = await store.lease_of("thr_1")
        assert lease is not None and lease.holder is None and lease.epoch == 2
