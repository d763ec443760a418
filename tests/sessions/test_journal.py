"""The journal through its public API, on a real SQLite store in a temp dir (its writer
on a thread: no process to start), with no agent and no conversation: numbering,
commit-before-publish, the pipeline of bursts in flight, a seq taken by a row the daemon
did not write, fencing, long-polls, the history and following another writer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from support.stores import thread

from bridge.errors import LeaseLost
from bridge.protocols.events import Event, Record
from bridge.sessions.fanout import Fanout, Subscriber
from bridge.sessions.journal import Journal, Renumber
from bridge.store.sqlite import SqliteStore

pytestmark = pytest.mark.timeout(20)

TID = "thr_journal"
TS = "2026-12-06T00:00:00.000Z"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "bridge.db", writer="thread")
    await s.open()
    await s.create_thread(thread(TID, TS))  # type: ignore[arg-type]
    try:
        yield s
    finally:
        await s.close()


async def journal_of(store: SqliteStore, **kw: Any) -> Journal:
    row = await store.get_thread(TID)
    assert row is not None
    return Journal(row, store, Fanout(), **kw)


def deltas(n: int, tag: str = "d") -> list[Event]:
    return [Event("agent", "message.delta", {"text": f"{tag}{i}"}) for i in range(n)]


async def stored(store: SqliteStore) -> list[Record]:
    return await store.read_events(TID, 0, 1000)


def buffered(sub: Subscriber) -> list[int]:
    return [r.seq for r in sub.buf]


class Checking:
    """An announcer that checks every record it is given is in the store already."""

    def __init__(self, store: SqliteStore, inner: Any) -> None:
        self.store, self.inner, self.seen, self.early = store, inner, [], []

    def committed(self, records: Sequence[Record]) -> None:
        self.seen.extend(r.seq for r in records)
        self.inner.committed(records)

    async def check(self) -> None:
        have = {r.seq for r in await stored(self.store)}
        assert set(self.seen) <= have


async def test_an_emit_is_numbered_after_the_newest_seq_and_published_once_committed(store: SqliteStore) -> None:
    journal = await journal_of(store)
    sub = journal.fanout.subscribe()
    first = await journal.emit(deltas(2), {"title": "t"})
    second = await journal.emit(deltas(1, "x"))
    assert [r.seq for r in first + second] == [1, 2, 3]
    assert [r.seq for r in await stored(store)] == [1, 2, 3]
    assert buffered(sub) == [1, 2, 3]
    assert journal.last_seq == 3 == journal.thread["last_seq"] and journal.thread["title"] == "t"
    assert journal.numbered == 3 and journal.in_flight == 0 and journal.settled


async def test_bursts_in_flight_commit_in_order_and_the_lock_waits_for_them(store: SqliteStore) -> None:
    journal = await journal_of(store)
    checking = Checking(store, journal.announcer)
    journal.announcer = checking
    sub = journal.fanout.subscribe(limit=100)
    async with journal.lock.undrained:
        for i in range(3):
            await journal.submit(deltas(20, f"b{i}"), {})
        assert journal.numbered == 60
    async with journal.lock:  # entering drains: nothing in flight, last_seq the transcript's
        assert journal.in_flight == 0 and journal.last_seq == 60
    await checking.check()
    assert checking.seen == list(range(1, 61)) == buffered(sub)
    texts = [r.data["text"] for r in await stored(store)]
    assert texts == [f"b{i}{j}" for i in range(3) for j in range(20)]


async def test_a_seq_taken_by_a_row_not_written_here_is_read_again_after_a_notice(store: SqliteStore) -> None:
    journal = await journal_of(store)
    sub = journal.fanout.subscribe()
    await journal.emit(deltas(1))
    foreign = Record(2, TS, "agent", "message", {"role": "assistant", "text": "forged"}, None, False)
    await store.append(TID, [foreign], [None], {})
    [rec] = await journal.emit(deltas(1, "mine"))
    kinds = [(r.seq, r.kind) for r in await stored(store)]
    assert kinds == [(1, "message.delta"), (2, "message"), (3, "notice"), (4, "message.delta")]
    assert rec.seq == 4 == journal.last_seq
    assert sub.lagging  # the rows found were never sent live: it re-reads from the store


async def test_an_emit_that_names_its_own_seq_is_given_back_to_be_numbered_anew(store: SqliteStore) -> None:
    journal = await journal_of(store)
    foreign = Record(1, TS, "agent", "message", {"role": "assistant", "text": "forged"}, None, False)
    await store.append(TID, [foreign], [None], {})
    prompt = [
        Event("client", "message", {"role": "user", "text": "hi", "turn_id": "t1"}),
        Event("bridge", "turn.started", {"turn_id": "t1", "prompt_seq": 1}),
    ]
    with pytest.raises(Renumber):
        await journal.emit(prompt)
    assert journal.last_seq == 2  # after the notice: the next numbering starts there
    assert [r.kind for r in await stored(store)] == ["message", "notice"]


async def test_an_append_under_a_stale_epoch_is_fenced_and_reported(store: SqliteStore) -> None:
    epoch = await store.acquire_lease(TID, store.replica_id, 30.0)
    assert epoch is not None
    fenced: list[bool] = []
    held = [epoch]

    async def hold() -> int | None:
        return held[0]

    journal = await journal_of(store, hold=hold, on_fenced=lambda: fenced.append(True))
    await journal.emit(deltas(1))
    held[0] = epoch + 1  # not the database's
    with pytest.raises(LeaseLost):
        await journal.emit(deltas(1))
    assert fenced == [True] and journal.last_seq == 1 and len(await stored(store)) == 1


async def test_a_long_poll_wakes_on_the_next_commit(store: SqliteStore) -> None:
    journal = await journal_of(store)
    poll = asyncio.ensure_future(journal.wait_beyond(0, 10.0))
    await asyncio.sleep(0)
    assert not poll.done()
    await journal.emit(deltas(1))
    async with asyncio.timeout(2):
        await poll


async def test_the_history_is_kept_at_commit(store: SqliteStore) -> None:
    journal = await journal_of(store)
    await journal.emit([Event("client", "message", {"role": "user", "text": "hi", "turn_id": "t1"})])
    await journal.emit(deltas(2))
    page = await journal.history_page(None, 1000)
    items, last = page.items, page.last_seq
    assert last == 3 and [(i["type"], i["text"]) for i in items] == [("message", "hi"), ("message", "d0d1")]


async def test_following_publishes_what_another_writer_committed(store: SqliteStore) -> None:
    journal = await journal_of(store)
    sub = journal.fanout.subscribe()
    other = [Record(s, TS, "agent", "message.delta", {"text": str(s)}, None, False) for s in (1, 2, 3)]
    await store.append(TID, other, [None] * 3, {})
    async with journal.lock:
        assert await journal.follow() == 3
        assert await journal.follow() == 0
    assert buffered(sub) == [1, 2, 3] and journal.last_seq == 3


async def test_a_burst_refused_for_a_taken_seq_is_committed_again_after_the_rows_found(store: SqliteStore) -> None:
    journal = await journal_of(store)
    foreign = Record(1, TS, "agent", "message", {"role": "assistant", "text": "forged"}, None, False)
    await store.append(TID, [foreign], [None], {})
    async with journal.lock.undrained:
        await journal.submit(deltas(20), {})  # numbered 1..20: refused in flight
    async with journal.lock:  # entering drains: the refused burst is committed again
        assert journal.settled and journal.failure is None
    kinds = [r.kind for r in await stored(store)]
    assert kinds == ["message", "notice", *["message.delta"] * 20] and journal.last_seq == 22
