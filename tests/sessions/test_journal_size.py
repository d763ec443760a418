"""What a thread's transcript holds, as the journal counts it (issue #36, [capacity]
max_transcript_mb): the same figure the store keeps on the row, the appends in flight
counted before they commit, and ``full`` once the cap is reached. A real SQLite store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support.stores import thread

from bridge.protocols.events import Event
from bridge.sessions.fanout import Fanout
from bridge.sessions.journal import Journal
from bridge.store.base import transcript_size
from bridge.store.sqlite import SqliteStore

pytestmark = pytest.mark.timeout(20)

TID = "thr_size"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "bridge.db", writer="thread")
    await s.open()
    await s.create_thread(thread(TID))  # type: ignore[arg-type]
    try:
        yield s
    finally:
        await s.close()


def deltas(n: int, tag: str = "d") -> list[Event]:
    return [Event("agent", "message.delta", {"text": f"{tag}{i}" * 10}, f'{{"line":{i}}}') for i in range(n)]


async def test_the_journal_counts_what_the_store_keeps_and_is_full_at_the_cap(store: SqliteStore) -> None:
    async with asyncio.timeout(10):
        row = await store.get_thread(TID)
        assert row is not None and row["transcript_bytes"] == 0
        journal = Journal(row, store, Fanout(), max_bytes=5_000)
        first = await journal.emit(deltas(3))
        assert journal.size == transcript_size(first) and not journal.full
        # A burst submitted and not yet committed counts already: the reader checks it
        # right after handing it over, so no read after the cap is taken.
        async with journal.lock.undrained:
            await journal.submit(deltas(60, "b"), {})
            assert journal.full
            await journal.drain_reader()
        stored = await store.read_events(TID, 0, 1000)
        assert journal.size == transcript_size(list(stored)) >= 5_000
        row = await store.get_thread(TID)
        assert row is not None and row["transcript_bytes"] == journal.size
        # A journal made from the row later (a loaded thread) starts full.
        assert Journal(row, store, Fanout(), max_bytes=5_000).full
        assert not Journal(row, store, Fanout()).full  # no cap: never full
