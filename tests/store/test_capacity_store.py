"""What the [capacity] caps read from a store (issue #36): the threads it holds (all, or one
owner's), and what each thread's transcript holds (``transcript_bytes``), kept by the appends,
right after a killed daemon, and counted once when a batch is sent again. Both stores."""

from __future__ import annotations

import asyncio

import pytest
from support.stores import StoreFactory, records, thread

import bridge.store.sqlite as sqlite_store
from bridge.protocols.events import Record
from bridge.store.base import EVENT_OVERHEAD, transcript_size

TS = "2026-12-06T00:00:01.000Z"


@pytest.fixture
def no_timed_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_store, "TOUCH_FLUSH_S", 3600.0)


async def test_threads_are_counted_all_and_by_owner(opened: StoreFactory) -> None:
    async with asyncio.timeout(30):
        async with opened() as store:
            assert await store.count_threads() == 0
            for i, owner in enumerate(["ann", "ann", "bob", None]):
                await store.create_thread(thread(f"thr_{i}", owner=owner))  # type: ignore[arg-type]
            assert await store.count_threads() == 4
            assert (await store.count_threads("ann"), await store.count_threads("bob")) == (2, 1)
            assert await store.count_threads("eve") == 0
            await store.delete_thread("thr_0")  # a deleted thread frees its place
            assert (await store.count_threads(), await store.count_threads("ann")) == (3, 1)


def test_the_size_of_records_counts_data_raw_and_each_event() -> None:
    recs = [
        Record(1, TS, "agent", "message.delta", {"text": "abc"}, '{"line":1}', False),
        Record(2, TS, "bridge", "notice", {}, None, False),
    ]
    assert transcript_size(recs) == len('{"text":"abc"}') + len('{"line":1}') + len("{}") + 2 * EVENT_OVERHEAD
    assert transcript_size([]) == 0


async def test_appends_keep_the_transcript_size(opened: StoreFactory, no_timed_flush: None) -> None:
    async with asyncio.timeout(30):
        async with opened() as store:
            await store.create_thread(thread("thr_a"))  # type: ignore[arg-type]
            await store.create_thread(thread("thr_b"))  # type: ignore[arg-type]
            first, second = records(1, 5, TS), records(6, 300, TS)
            await store.append("thr_a", first, [None] * 5, {"updated_at": TS})
            # with a visible field: the row is written in the append's own transaction
            await store.append("thr_a", second, [None] * 300, {"updated_at": TS, "state": "running"})
            await store.append("thr_b", records(1, 1, TS), [None], {"updated_at": TS})
            row = await store.get_thread("thr_a")
            assert row is not None and row["transcript_bytes"] == transcript_size(first + second)
            other = await store.get_thread("thr_b")
            assert other is not None and other["transcript_bytes"] == transcript_size(records(1, 1, TS))
        async with opened() as again:  # written at close, read back
            row = await again.get_thread("thr_a")
            assert row is not None and row["transcript_bytes"] == transcript_size(first + second)


async def test_a_daemon_killed_before_its_flush_loses_no_size(opened: StoreFactory, no_timed_flush: None) -> None:
    """SQLite owes the size to the row (like last_seq); the next open adds what the events
    after ``transcript_seq`` hold, measured by their stored rows."""
    async with asyncio.timeout(30):
        async with opened() as first:
            await first.create_thread(thread("thr_a"))  # type: ignore[arg-type]
            await first.append("thr_a", records(1, 3, TS), [None] * 3, {"updated_at": TS})
            row = await first.get_thread("thr_a")  # flushed: 3 events counted
            assert row is not None
            counted = row["transcript_bytes"]
            await first.append("thr_a", records(4, 2, TS), [None] * 2, {"updated_at": TS, "state": "running"})
            await first.append("thr_a", records(6, 4, TS), [None] * 4, {"updated_at": TS})
            if isinstance(first, sqlite_store.SqliteStore):
                assert first._dirty  # owed, and dropped below: as if the process were killed
                first._dirty.clear()
        async with opened() as second:
            row = await second.get_thread("thr_a")
            assert row is not None
            # The repair measures stored rows (their envelopes), the live count the records:
            # both about the same, never the six events forgotten.
            added = row["transcript_bytes"] - counted
            assert transcript_size(records(4, 6, TS)) <= added <= transcript_size(records(4, 6, TS)) + 6 * 100


async def test_a_flush_sent_again_counts_once(tmp_path: object) -> None:
    """The writer process died after committing a batch, before it answered: the batch is
    sent again (``commit_again``) and its flush must not add the size twice."""
    from pathlib import Path

    from bridge.store import sqlite_sql as sql

    path = Path(str(tmp_path)) / "bridge.db"
    db = sql.open_writer(path, 1000)
    try:
        sql.create_thread(db, {**thread("thr_a"), "options": "{}", "turn_active": 0})
        flush = sql._Append("thr_a", (), {}, None, (TS, 7, None, 1234), flush=True)
        sql._commit(db, [flush])
        sql.commit_again(db, [flush])
        got = db.execute("SELECT transcript_bytes, transcript_seq FROM threads WHERE id='thr_a'").fetchone()
        assert tuple(got) == (1234, 7)
    finally:
        db.close()


async def test_a_postgresql_database_of_the_previous_version_is_measured_by_migration_7(pg_url: str) -> None:
    """Migration 7 on rows an older daemon wrote: each thread gets its stored rows' size."""
    import psycopg

    from bridge.store import pg_schema, urls
    from bridge.store.postgres import PostgresStore

    async with asyncio.timeout(30):
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            assert await pg_schema.migrate(conn, pg_schema.MIGRATIONS[:6]) == [1, 2, 3, 4, 5, 6]
            await conn.execute(
                "INSERT INTO threads (id, agent, protocol, cwd, state, created_at, updated_at, change_seq) "
                "VALUES ('thr_1', 'a', 'stream-json', '/tmp', 'idle', 't', 't', 1), "
                "('thr_2', 'a', 'stream-json', '/tmp', 'idle', 't', 't', 2)"
            )
            await conn.execute(
                "INSERT INTO events (thread_id, seq, ts, source, kind, data, raw) VALUES "
                "('thr_1', 1, 't', 'client', 'message', '{}', NULL), "
                "('thr_1', 2, 't', 'agent', 'x', '{\"a\":1}', 'raw')"
            )
        store = PostgresStore(urls.parse(pg_url))
        await store.open()  # applies migration 7
        try:
            one, two = await store.get_thread("thr_1"), await store.get_thread("thr_2")
            assert one is not None and two is not None
            assert one["transcript_bytes"] == len("{}") + len('{"a":1}') + len("raw") + 2 * EVENT_OVERHEAD
            assert two["transcript_bytes"] == 0
            # and the appends carry on from there
            await store.append("thr_1", records(3, 2, TS), [None] * 2, {"updated_at": TS})
            again = await store.get_thread("thr_1")
            assert again is not None
            assert again["transcript_bytes"] == one["transcript_bytes"] + transcript_size(records(3, 2, TS))
        finally:
            await store.close()


async def test_replicas_on_one_postgresql_never_pass_max_threads_together(pg_url: str) -> None:
    """Two replicas (two stores, two Caps) create threads at the same moment: the store's
    creation lock makes their count-then-create one at a time, so exactly ``max_threads``
    are made. The window between the count and the row is widened (as a workspace directory
    being made would) so that without the lock both would pass the check together."""
    from support.stores import opened_at

    from bridge.config_capacity import CapacitySettings
    from bridge.errors import Busy
    from bridge.sessions.caps import Caps

    async def create(caps: Caps, tid: str) -> bool:
        try:
            async with caps.room_for_thread(None):
                await asyncio.sleep(0.02)  # the directory being made, widened
                await caps.store.create_thread(thread(tid))  # type: ignore[arg-type]
            return True
        except Busy as exc:
            assert exc.code == "thread_limit"
            return False

    async with asyncio.timeout(60), opened_at(pg_url, "a") as a, opened_at(pg_url, "b") as b:
        capacity = CapacitySettings(max_threads=5)
        ca, cb = Caps(capacity, a), Caps(capacity, b)
        made = await asyncio.gather(*(create(ca if i % 2 else cb, f"thr_{i}") for i in range(16)))
        assert sum(made) == 5 and await a.count_threads() == 5
        assert ca.refused + cb.refused == 11
