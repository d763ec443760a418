"""A thread's lease through its public API (hold, adopt, lose, release), on a real SQLite
store's leases (the same SQL as PostgreSQL's) with a journal beside it, no agent."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support.stores import thread

from bridge.errors import HeldElsewhere, LeaseLost
from bridge.protocols.events import Event, Record
from bridge.sessions.fanout import Fanout
from bridge.sessions.journal import Journal
from bridge.sessions.lease import ThreadLease
from bridge.sessions.ownership import Ownership
from bridge.store.base import ThreadRow
from bridge.store.sqlite import SqliteStore

pytestmark = pytest.mark.timeout(20)

TID = "thr_lease"
TS = "2026-12-06T00:00:00.000Z"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "bridge.db", writer="thread")
    await s.open()
    try:
        yield s
    finally:
        await s.close()


class Holder:
    """What a conversation wires around its lease: the journal, the refresh, the loss."""

    def __init__(self, row: ThreadRow, store: SqliteStore, ownership: Ownership | None) -> None:
        self.refreshed: list[ThreadRow] = []
        self.lost = 0
        self.journal = Journal(row, store, Fanout(), hold=lambda: self.lease.hold())
        self.lease = ThreadLease(self.journal, ownership, refresh=self.refresh, on_lost=self.on_lost)

    def refresh(self, row: ThreadRow) -> None:
        self.refreshed.append(row)
        self.journal.reset(row["last_seq"])

    def on_lost(self) -> None:
        self.lost += 1
        self.lease.lose()


async def holder(store: SqliteStore, replica: str = "local", **row: Any) -> Holder:
    await store.create_thread(thread(TID, TS, **row))  # type: ignore[arg-type]
    fresh = await store.get_thread(TID)
    assert fresh is not None
    return Holder(fresh, store, Ownership(store, replica, 30.0))


async def test_without_leases_a_hold_is_none_and_nothing_is_read(store: SqliteStore) -> None:
    await store.create_thread(thread(TID, TS))  # type: ignore[arg-type]
    row = await store.get_thread(TID)
    assert row is not None
    h = Holder(row, store, None)
    assert await h.lease.hold() is None and h.lease.held and h.refreshed == []
    await h.lease.release()  # nothing to give back
    assert [r.seq for r in await h.journal.emit([Event("bridge", "notice", {"code": "x"})])] == [1]


async def test_a_first_hold_adopts_the_epoch_once_and_appends_under_it(store: SqliteStore) -> None:
    h = await holder(store)
    assert not h.lease.held
    epoch = await h.lease.hold()
    assert epoch is not None and h.lease.epoch == epoch and h.lease.held
    assert await h.lease.hold() == epoch and len(h.refreshed) == 1  # read again once, not per hold
    await h.journal.emit([Event("bridge", "notice", {"code": "x"})])
    assert h.journal.last_seq == 1


async def test_adopting_a_thread_whose_holder_died_mid_turn_closes_its_books(store: SqliteStore) -> None:
    h = await holder(store, state="running", turn_active=True, pid=4242)
    opened = [
        Record(1, TS, "client", "message", {"role": "user", "text": "hi", "turn_id": "t1"}, None, False),
        Record(2, TS, "bridge", "turn.started", {"turn_id": "t1", "prompt_seq": 1}, None, False),
    ]
    await store.append(TID, opened, [None, None], {})
    await h.lease.hold(reason="owner_lost")
    tail = await store.read_events(TID, 2, 10)
    assert [r.kind for r in tail] == ["process.exited", "turn.ended"]
    assert tail[1].data["turn_id"] == "t1" and tail[1].data["reason"] == "owner_lost"
    row = await store.get_thread(TID)
    assert row is not None and row["state"] == "exited" and not row["turn_active"]


async def test_a_thread_another_replica_holds_is_refused_and_nothing_is_lost(store: SqliteStore) -> None:
    await store.create_thread(thread(TID, TS))  # type: ignore[arg-type]
    assert await Ownership(store, "other", 30.0).ensure(TID) is not None
    row = await store.get_thread(TID)
    assert row is not None
    h = Holder(row, store, Ownership(store, "local", 30.0))
    with pytest.raises(HeldElsewhere):
        await h.lease.hold()
    assert h.lost == 0 and not h.lease.lost


async def test_a_lost_lease_refuses_every_later_hold(store: SqliteStore) -> None:
    h = await holder(store)
    await h.lease.hold()
    assert h.lease.lose() is True and h.lease.lose() is False
    with pytest.raises(LeaseLost):
        await h.lease.hold()
    assert h.lease.ownership is not None and not h.lease.ownership.holds(TID)


async def test_a_released_lease_lets_another_replica_run_the_thread(store: SqliteStore) -> None:
    h = await holder(store)
    epoch = await h.lease.hold()
    assert epoch is not None
    await h.lease.release()
    assert h.lease.epoch is None and not h.lease.held
    other = await Ownership(store, "other", 30.0).ensure(TID)
    assert other == epoch + 1
