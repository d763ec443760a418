"""The store's change log (GET /v1/events): cursors in commit order, one entry per thread at
its newest cursor, tombstones for deleted threads, a horizon below which a cursor is refused,
and the migration of a database written before it existed. Real SQLite files, no daemon."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import bridge.store.sqlite as sqlite_store
from bridge.protocols.events import Record
from bridge.store.base import ChangesPruned
from bridge.store.sqlite import SqliteStore

pytestmark = pytest.mark.timeout(30)


def thread(tid: str, ts: str = "2026-11-30T00:00:00.000Z", **extra: Any) -> dict[str, Any]:
    return {
        "id": tid,
        "agent": "a",
        "protocol": "stream-json",
        "cwd": "/tmp",
        "title": "",
        "state": "idle",
        "turn_active": False,
        "last_seq": 0,
        "created_at": ts,
        "updated_at": ts,
        "options": {},
        **extra,
    }


def recs(first: int, n: int, ts: str = "2026-11-30T00:00:01.000Z") -> list[Record]:
    return [Record(s, ts, "agent", "message.delta", {"text": str(s)}, None, False) for s in range(first, first + n)]


@contextlib.asynccontextmanager
async def opened(path: Path) -> AsyncIterator[tuple[SqliteStore, list[int]]]:
    """A store and the list its on_change hook appends to (one item per wake-up)."""
    store = SqliteStore(path)
    await store.open()
    wakes: list[int] = []
    store.on_change = lambda: wakes.append(1)
    try:
        yield store, wakes
    finally:
        await store.close()


def summary(changes: list[Any]) -> list[tuple[int, str, str]]:
    return [(c.cursor, c.kind, c.thread_id) for c in changes]


async def test_changes_come_in_cursor_order_one_per_thread_at_its_newest_cursor(tmp_path: Path) -> None:
    async with opened(tmp_path / "b.db") as (store, wakes):
        assert await store.latest_change() == 0 and await store.read_changes(0, 10) == []
        await store.create_thread(thread("thr_a"))
        await store.create_thread(thread("thr_b"))
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


async def test_the_transcript_reaches_the_log_with_the_row_flush_not_per_event(tmp_path: Path) -> None:
    async with opened(tmp_path / "b.db") as (store, wakes):
        await store.create_thread(thread("thr_a"))
        await store.create_thread(thread("thr_b"))
        before = await store.latest_change()
        # Plain appends owe the row its last_seq/updated_at: no change (and no counter step)
        # until the row is written.
        for first in range(1, 301, 3):
            await store.append("thr_a", recs(first, 3), [None] * 3, {"updated_at": "2026-11-30T00:00:01.000Z"})
        assert await store.latest_change() == before and len(wakes) == 2
        row = await store.get_thread("thr_a")  # a read flushes what the row owes
        assert row is not None and row["last_seq"] == 300
        changes = await store.read_changes(before, 10)
        assert summary(changes) == [(before + 1, "thread.updated", "thr_a")]
        assert changes[0].thread is not None and changes[0].thread["last_seq"] == 300
        # An append with a visible field changes the row in its own commit, once.
        await store.append(
            "thr_b", recs(1, 2), [None, None], {"updated_at": "2026-11-30T00:00:02.000Z", "state": "running"}
        )
        changes = await store.read_changes(before + 1, 10)
        assert summary(changes) == [(before + 2, "thread.updated", "thr_b")]
        assert changes[0].thread is not None and changes[0].thread["state"] == "running"
        assert changes[0].thread["last_seq"] == 2


async def test_concurrent_appends_group_commit_with_distinct_cursors(tmp_path: Path) -> None:
    async with opened(tmp_path / "b.db") as (store, _):
        tids = [f"thr_{i:02d}" for i in range(20)]
        for tid in tids:
            await store.create_thread(thread(tid))
        batches = store.batches
        await asyncio.gather(
            *(
                store.append(tid, recs(1, 1), [None], {"state": "running", "pending_permissions": i})
                for i, tid in enumerate(tids)
            )
        )
        assert store.batches - batches < len(tids)  # some were committed together
        changes = await store.read_changes(len(tids), 100)
        cursors = [c.cursor for c in changes]
        assert sorted(cursors) == cursors == list(range(len(tids) + 1, 2 * len(tids) + 1))
        assert {c.thread_id: c.thread["pending_permissions"] for c in changes if c.thread} == {
            tid: i for i, tid in enumerate(tids)
        }


async def test_a_deleted_thread_leaves_a_tombstone_at_a_new_cursor(tmp_path: Path) -> None:
    async with opened(tmp_path / "b.db") as (store, wakes):
        await store.create_thread(thread("thr_a"))
        await store.create_thread(thread("thr_b"))
        assert await store.delete_thread("thr_a") is True
        changes = await store.read_changes(0, 10)
        assert summary(changes) == [(2, "thread.created", "thr_b"), (3, "thread.deleted", "thr_a")]
        assert changes[1].thread is None and changes[1].deleted_at is not None
        assert changes[1].deleted_at.endswith("Z")
        assert await store.delete_thread("thr_a") is False  # nothing deleted: no change
        assert await store.delete_thread("thr_nope") is False
        assert await store.latest_change() == 3 and len(wakes) == 3


async def test_old_tombstones_are_pruned_and_raise_the_horizon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_store, "TOMBSTONE_KEEP", 2)
    async with opened(tmp_path / "b.db") as (store, _):
        for i in range(4):
            await store.create_thread(thread(f"thr_{i}"))
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
    monkeypatch.setattr(sqlite_store, "TOMBSTONE_KEEP", 100)
    db = sqlite3.connect(tmp_path / "b.db")
    db.execute("UPDATE thread_tombstones SET deleted_at='2000-01-01T00:00:00.000Z' WHERE thread_id='thr_2'")
    db.commit()
    db.close()
    async with opened(tmp_path / "b.db") as (store, _):
        await store.create_thread(thread("thr_x"))
        await store.delete_thread("thr_x")
        assert await store.change_horizon() == 7
        assert summary(await store.read_changes(7, 10)) == [
            (8, "thread.deleted", "thr_3"),
            (10, "thread.deleted", "thr_x"),
        ]


async def test_a_daemon_killed_before_its_flush_still_logs_the_change_at_the_next_open(tmp_path: Path) -> None:
    path = tmp_path / "b.db"
    async with opened(path) as (store, _):
        await store.create_thread(thread("thr_a"))
        await store.append("thr_a", recs(1, 5), [None] * 5, {"updated_at": "2026-11-30T00:00:05.000Z"})
        store._dirty.clear()  # as if killed: the row never got what it owed
    async with opened(path) as (store, _):
        changes = await store.read_changes(1, 10)
        assert summary(changes) == [(2, "thread.updated", "thr_a")]
        assert changes[0].thread is not None and changes[0].thread["last_seq"] == 5


async def test_an_old_database_is_migrated_with_its_threads_in_the_log(tmp_path: Path) -> None:
    path = tmp_path / "b.db"
    db = sqlite3.connect(path)
    for ddl in sqlite_store._MIGRATIONS[:5]:
        db.executescript(ddl)
    for tid, ts in (("thr_new", "2026-11-30T00:00:09.000Z"), ("thr_old", "2026-11-30T00:00:01.000Z")):
        db.execute(
            "INSERT INTO threads (id,agent,protocol,cwd,state,created_at,updated_at) VALUES (?,?,?,?,?,?,?)",
            (tid, "a", "stream-json", "/tmp", "idle", ts, ts),
        )
    db.execute("PRAGMA user_version=5")
    db.commit()
    db.close()
    async with opened(path) as (store, _):
        # In order of activity, each as its own creation; the counter carries on from there.
        changes = await store.read_changes(0, 10)
        assert summary(changes) == [(1, "thread.created", "thr_old"), (2, "thread.created", "thr_new")]
        assert all(c.thread is not None and c.thread["pending_permissions"] == 0 for c in changes)
        assert await store.latest_change() == 2 and await store.change_horizon() == 0
        await store.update_thread("thr_old", {"title": "renamed"})
        assert summary(await store.read_changes(2, 10)) == [(3, "thread.updated", "thr_old")]
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == sqlite_store.SCHEMA_VERSION
        indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert {"threads_by_change", "tombstones_by_change"} <= indexes
    finally:
        db.close()
