"""The store's change log (GET /v1/events), both stores: cursors in commit order, one entry
per thread at its newest cursor, tombstones for deleted threads, a horizon below which a
cursor is refused, and the migration of a database written before it existed. Real SQLite
files and a real PostgreSQL server, no daemon. On PostgreSQL, two replicas committing at
once still give a reader cursors it never skips."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.stores import StoreFactory, opened_at, thread

import bridge.store.postgres as pg_store
import bridge.store.sqlite as sqlite_store
from bridge.protocols.events import Record
from bridge.store import pg_schema
from bridge.store.base import Change, ChangesPruned, Store, StoreListeners, ThreadRow
from bridge.store.sqlite import SqliteStore

pytestmark = pytest.mark.timeout(60)


def row(tid: str, ts: str = "2026-11-30T00:00:00.000Z", **extra: Any) -> ThreadRow:
    return thread(tid, ts, **extra)  # type: ignore[return-value]


def recs(first: int, n: int, ts: str = "2026-11-30T00:00:01.000Z") -> list[Record]:
    return [Record(s, ts, "agent", "message.delta", {"text": str(s)}, None, False) for s in range(first, first + n)]


@contextlib.asynccontextmanager
async def watched(opened: StoreFactory, replica_id: str = "local") -> AsyncIterator[tuple[Store, list[int]]]:
    """A store and the list its change listener appends to (one item per wake-up)."""
    async with opened(replica_id=replica_id) as store:
        wakes: list[int] = []
        store.listeners.add(change=lambda: wakes.append(1))
        yield store, wakes


@contextlib.asynccontextmanager
async def sqlite_opened(path: Path) -> AsyncIterator[tuple[SqliteStore, list[int]]]:
    wakes: list[int] = []
    store = SqliteStore(path, listeners=StoreListeners(change=[lambda: wakes.append(1)]))
    await store.open()
    try:
        yield store, wakes
    finally:
        await store.close()


async def execute(store_kind: str, store_url: str, sql: str) -> None:
    """One statement on the test's database, behind the store's back."""
    if store_kind == "sqlite":
        db = sqlite3.connect(store_url.removeprefix("sqlite:///"))
        try:
            db.execute(sql)
            db.commit()
        finally:
            db.close()
        return
    async with await psycopg.AsyncConnection.connect(store_url, autocommit=True) as conn:
        await conn.execute(sql)  # type: ignore[arg-type]


def summary(changes: list[Change]) -> list[tuple[int, str, str]]:
    return [(c.cursor, c.kind, c.thread_id) for c in changes]


async def test_changes_come_in_cursor_order_one_per_thread_at_its_newest_cursor(opened: StoreFactory) -> None:
    async with watched(opened) as (store, wakes):
        assert await store.latest_change() == 0 and await store.read_changes(0, 10) == []
        await store.create_thread(row("thr_a"))
        await store.create_thread(row("thr_b"))
        assert summary(await store.read_changes(0, 10)) == [
            (1, "thread.created", "thr_a"),
            (2, "thread.created", "thr_b"),
        ]
        for i in range(100):
            await store.update_thread("thr_a", {"title": f"t{i}"})
        changes = await store.read_changes(0, 10)
        # thr_a changed 100 times: it appears once, at its newest cursor, still as created
        # for a reader from before its creation and as updated for one from after it.
        assert summary(changes) == [(2, "thread.created", "thr_b"), (102, "thread.created", "thr_a")]
        assert changes[1].thread is not None and changes[1].thread["title"] == "t99"
        assert summary(await store.read_changes(1, 10)) == [
            (2, "thread.created", "thr_b"),
            (102, "thread.updated", "thr_a"),
        ]
        assert summary(await store.read_changes(2, 10)) == [(102, "thread.updated", "thr_a")]
        assert await store.read_changes(102, 10) == []
        assert summary(await store.read_changes(0, 1)) == [(2, "thread.created", "thr_b")]  # limit
        assert await store.latest_change() == 102
        assert len(wakes) == 102  # every commit that changed a row woke the readers
        # A write of columns no client sees is not a change.
        await store.update_thread("thr_a", {"pid": 123, "tasks": "{}"})
        assert await store.latest_change() == 102 and len(wakes) == 102


async def test_appends_reach_the_log_once_per_thread_per_commit_not_per_event(opened: StoreFactory) -> None:
    async with watched(opened) as (store, _):
        await store.create_thread(row("thr_a"))
        await store.create_thread(row("thr_b"))
        before = await store.latest_change()
        for first in range(1, 301, 3):
            await store.append("thr_a", recs(first, 3), [None] * 3, {"updated_at": "2026-11-30T00:00:01.000Z"})
        got = await store.get_thread("thr_a")
        assert got is not None and got["last_seq"] == 300
        # 300 events, 100 appends: at most one counter step per append (SQLite: one, at the
        # flush of the row; PostgreSQL: one per commit), never one per event.
        assert before < await store.latest_change() <= before + 100
        changes = await store.read_changes(before, 10)
        assert [(c.kind, c.thread_id) for c in changes] == [("thread.updated", "thr_a")]
        assert changes[0].thread is not None and changes[0].thread["last_seq"] == 300
        mark = await store.latest_change()
        # An append with a visible field changes the row in its own commit, once.
        await store.append(
            "thr_b", recs(1, 2), [None, None], {"updated_at": "2026-11-30T00:00:02.000Z", "state": "running"}
        )
        changes = await store.read_changes(mark, 10)
        assert summary(changes) == [(mark + 1, "thread.updated", "thr_b")]
        assert changes[0].thread is not None and changes[0].thread["state"] == "running"
        assert changes[0].thread["last_seq"] == 2


async def test_the_sqlite_transcript_reaches_the_log_with_the_row_flush(tmp_path: Path) -> None:
    async with sqlite_opened(tmp_path / "b.db") as (store, wakes):
        await store.create_thread(row("thr_a"))
        before = await store.latest_change()
        # Plain appends owe the row its last_seq/updated_at: no change (and no counter step)
        # until the row is written.
        for first in range(1, 301, 3):
            await store.append("thr_a", recs(first, 3), [None] * 3, {"updated_at": "2026-11-30T00:00:01.000Z"})
        assert await store.latest_change() == before and len(wakes) == 1
        got = await store.get_thread("thr_a")  # a read flushes what the row owes
        assert got is not None and got["last_seq"] == 300
        assert summary(await store.read_changes(before, 10)) == [(before + 1, "thread.updated", "thr_a")]
        assert len(wakes) == 2


async def test_concurrent_appends_group_commit_with_distinct_cursors(opened: StoreFactory) -> None:
    async with watched(opened) as (store, wakes):
        tids = [f"thr_{i:02d}" for i in range(20)]
        for tid in tids:
            await store.create_thread(row(tid))
        batches, woken = store.batches, len(wakes)
        await asyncio.gather(
            *(
                store.append(tid, recs(1, 1), [None], {"state": "running", "pending_permissions": i})
                for i, tid in enumerate(tids)
            )
        )
        assert store.batches - batches < len(tids)  # some were committed together
        assert 0 < len(wakes) - woken < len(tids)  # one wake-up per commit, not per thread
        changes = await store.read_changes(len(tids), 100)
        cursors = [c.cursor for c in changes]
        assert sorted(cursors) == cursors == list(range(len(tids) + 1, 2 * len(tids) + 1))
        # pending_permissions round-trips in the row, both in the log and in a plain read.
        assert {c.thread_id: c.thread["pending_permissions"] for c in changes if c.thread} == {
            tid: i for i, tid in enumerate(tids)
        }
        got = await store.get_thread(tids[7])
        assert got is not None and got["pending_permissions"] == 7
        mark = await store.latest_change()  # (SQLite: after the read's flush of the rows)
        await store.update_thread(tids[7], {"pending_permissions": 0})
        assert summary(await store.read_changes(mark, 10)) == [(mark + 1, "thread.updated", tids[7])]


async def test_a_deleted_thread_leaves_a_tombstone_at_a_new_cursor(opened: StoreFactory) -> None:
    async with watched(opened) as (store, wakes):
        await store.create_thread(row("thr_a"))
        await store.create_thread(row("thr_b"))
        assert await store.delete_thread("thr_a") is True
        changes = await store.read_changes(0, 10)
        assert summary(changes) == [(2, "thread.created", "thr_b"), (3, "thread.deleted", "thr_a")]
        assert changes[1].thread is None and changes[1].deleted_at is not None
        assert changes[1].deleted_at.endswith("Z")
        assert await store.delete_thread("thr_a") is False  # nothing deleted: no change
        assert await store.delete_thread("thr_nope") is False
        await store.update_thread("thr_nope", {"title": "x"})  # no such row: no change either
        assert await store.latest_change() <= 4 and len(wakes) <= 4
        assert summary(await store.read_changes(2, 10)) == [(3, "thread.deleted", "thr_a")]


async def test_old_tombstones_are_pruned_and_raise_the_horizon(
    opened: StoreFactory, store_kind: str, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in (sqlite_store, pg_store):
        monkeypatch.setattr(module, "TOMBSTONE_KEEP", 2)
    async with watched(opened) as (store, _):
        for i in range(4):
            await store.create_thread(row(f"thr_{i}"))
        for i in range(4):
            await store.delete_thread(f"thr_{i}")  # tombstones at cursors 5, 6, 7, 8
        # The newest two are kept; the horizon is the newest pruned one.
        assert await store.change_horizon() == 6
        assert summary(await store.read_changes(6, 10)) == [
            (7, "thread.deleted", "thr_2"),
            (8, "thread.deleted", "thr_3"),
        ]
        for after in (0, 5):
            with pytest.raises(ChangesPruned) as exc:
                await store.read_changes(after, 10)
            assert exc.value.horizon == 6
    # Age: a tombstone older than TOMBSTONE_MAX_AGE_S goes at the next delete.
    for module in (sqlite_store, pg_store):
        monkeypatch.setattr(module, "TOMBSTONE_KEEP", 100)
    await execute(
        store_kind,
        store_url,
        "UPDATE thread_tombstones SET deleted_at='2000-01-01T00:00:00.000Z' WHERE thread_id='thr_2'",
    )
    async with watched(opened) as (store, _):
        await store.create_thread(row("thr_x"))
        await store.delete_thread("thr_x")
        assert await store.change_horizon() == 7
        assert summary(await store.read_changes(7, 10)) == [
            (8, "thread.deleted", "thr_3"),
            (10, "thread.deleted", "thr_x"),
        ]


async def test_a_daemon_killed_before_its_flush_still_logs_the_change_at_the_next_open(tmp_path: Path) -> None:
    """SQLite only: PostgreSQL writes the transcript columns in the append's transaction."""
    path = tmp_path / "b.db"
    async with sqlite_opened(path) as (store, _):
        await store.create_thread(row("thr_a"))
        await store.append("thr_a", recs(1, 5), [None] * 5, {"updated_at": "2026-11-30T00:00:05.000Z"})
        store._dirty.clear()  # as if killed: the row never got what it owed
    async with sqlite_opened(path) as (store, _):
        changes = await store.read_changes(1, 10)
        assert summary(changes) == [(2, "thread.updated", "thr_a")]
        assert changes[0].thread is not None and changes[0].thread["last_seq"] == 5


async def check_migrated_log(store: Store) -> None:
    """In order of activity, each as its own creation; the counter carries on from there."""
    changes = await store.read_changes(0, 10)
    assert summary(changes) == [(1, "thread.created", "thr_old"), (2, "thread.created", "thr_new")]
    assert all(c.thread is not None and c.thread["pending_permissions"] == 0 for c in changes)
    assert await store.latest_change() == 2 and await store.change_horizon() == 0
    await store.update_thread("thr_old", {"title": "renamed"})
    assert summary(await store.read_changes(2, 10)) == [(3, "thread.updated", "thr_old")]


OLD_THREADS = (("thr_new", "2026-11-30T00:00:09.000Z"), ("thr_old", "2026-11-30T00:00:01.000Z"))


async def test_an_old_sqlite_database_is_migrated_with_its_threads_in_the_log(tmp_path: Path) -> None:
    path = tmp_path / "b.db"
    db = sqlite3.connect(path)
    for ddl in sqlite_store._MIGRATIONS[:5]:
        db.executescript(ddl)
    for tid, ts in OLD_THREADS:
        db.execute(
            "INSERT INTO threads (id,agent,protocol,cwd,state,created_at,updated_at) VALUES (?,?,?,?,?,?,?)",
            (tid, "a", "stream-json", "/tmp", "idle", ts, ts),
        )
    db.execute("PRAGMA user_version=5")
    db.commit()
    db.close()
    async with sqlite_opened(path) as (store, _):
        await check_migrated_log(store)
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == sqlite_store.SCHEMA_VERSION
        indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert {"threads_by_change", "tombstones_by_change"} <= indexes
    finally:
        db.close()


async def test_an_old_postgres_database_is_migrated_with_its_threads_in_the_log(pg_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        assert await pg_schema.migrate(conn, pg_schema.MIGRATIONS[:1]) == [1]
        for tid, ts in OLD_THREADS:
            await conn.execute(
                "INSERT INTO threads (id, agent, protocol, cwd, state, created_at, updated_at) "
                "VALUES (%s, 'a', 'stream-json', '/tmp', 'idle', %s, %s)",
                (tid, ts, ts),
            )
    async with opened_at(pg_url) as store:
        await check_migrated_log(store)
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT max(version) FROM schema_version")
        assert (await cur.fetchone()) == (pg_schema.SCHEMA_VERSION,)
        cur = await conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")
        assert {"threads_by_change", "tombstones_by_change"} <= {r[0] for r in await cur.fetchall()}


# ---------------------------------------------------------------- two replicas at once

ROUNDS = 25
PER_REPLICA = 6


class Polls:
    """How many polls the reader has started; a writer's round waits for the next one, so
    the reader always reads while the writers run (however the machine schedules them)."""

    def __init__(self) -> None:
        self.started = 0
        self._next = asyncio.Event()

    def start(self) -> None:
        self.started += 1
        self._next.set()
        self._next = asyncio.Event()

    async def beyond(self, n: int) -> None:
        while self.started <= n:
            await self._next.wait()


async def replica_writes(store: Store, tids: list[str], polls: Polls) -> None:
    """Rounds of group-committed appends on every thread, a rename of one, then two deletes;
    round r once the reader has started poll r + 1."""
    for r in range(ROUNDS):
        await polls.beyond(r)
        ts = f"2026-11-30T00:{r // 60:02d}:{r % 60:02d}.000Z"
        await asyncio.gather(
            *(
                store.append(tid, recs(2 * r + 1, 2, ts), [None, None], {"updated_at": ts, "state": "running"})
                for tid in tids
            )
        )
        await store.update_thread(tids[r % len(tids)], {"title": f"{tids[r % len(tids)]} r{r}"})
    for tid in tids[:2]:
        assert await store.delete_thread(tid)


async def test_two_replicas_committing_at_once_give_cursors_a_reader_never_skips(pg_url: str) -> None:
    """A reader polling read_changes while two replicas race: every cursor it sees is above
    the last, and what it ends up with is every thread's final state (a change committed
    under a cursor the reader had already passed would be lost to it)."""
    async with (
        asyncio.timeout(50),
        opened_at(pg_url, "a") as a,
        opened_at(pg_url, "b") as b,
        opened_at(pg_url, "reader") as reader,
    ):
        mine = {a: [f"thr_a{i}" for i in range(PER_REPLICA)], b: [f"thr_b{i}" for i in range(PER_REPLICA)]}
        for store, tids in mine.items():
            for tid in tids:
                await store.create_thread(row(tid))
        seen: dict[str, ThreadRow | None] = {}
        cursors: list[int] = []
        started = Polls()
        writers = asyncio.gather(*(replica_writes(store, tids, started) for store, tids in mine.items()))
        polls = 0
        while True:
            finished = writers.done()  # read before the poll: a poll after it sees everything
            started.start()
            page = await reader.read_changes(cursors[-1] if cursors else 0, 10)
            polls += 1
            for change in page:
                assert not cursors or change.cursor > cursors[-1], (cursors[-5:], change.cursor)
                cursors.append(change.cursor)
                seen[change.thread_id] = change.thread
            if finished and not page:
                break
        await writers  # (raises what a writer raised)
        assert polls > 10  # it did read while the writers ran
        assert cursors[-1] == await reader.latest_change()
        for tid in (t for tids in mine.values() for t in tids):
            final = await reader.get_thread(tid)
            assert seen[tid] == final, tid
            if final is not None:
                assert final["last_seq"] == 2 * ROUNDS
        assert sum(1 for t in seen.values() if t is None) == 4  # two deleted per replica
