"""The thread row's derived columns (updated_at, last_seq) are written lazily (issue #8):
reads see them fresh, and a daemon killed before the flush loses nothing."""

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
from bridge.store.sqlite import SqliteStore


def thread(tid: str, ts: str) -> dict[str, Any]:
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
    }


def records(first: int, n: int, ts: str) -> list[Record]:
    return [
        Record(seq, ts, "agent", "message.delta", {"text": str(seq)}, None, False) for seq in range(first, first + n)
    ]


@contextlib.asynccontextmanager
async def opened(path: Path) -> AsyncIterator[SqliteStore]:
    store = SqliteStore(path)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def killed_later(path: Path) -> AsyncIterator[SqliteStore]:
    """A store whose owed thread columns are never written while the test looks: as if its
    process were killed before the flush (they are dropped before it closes)."""
    store = SqliteStore(path)
    await store.open()
    try:
        yield store
    finally:
        store._dirty.clear()
        await store.close()


@pytest.fixture
def no_timed_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_store, "TOUCH_FLUSH_S", 3600.0)


async def test_reads_see_the_newest_activity_and_order(tmp_path: Path, no_timed_flush: None) -> None:
    async with asyncio.timeout(30):
        async with opened(tmp_path / "bridge.db") as store:
            await store.create_thread(thread("thr_a", "2026-11-30T00:00:00.000Z"))
            await store.create_thread(thread("thr_b", "2026-11-30T00:00:01.000Z"))
            await store.append(
                "thr_a",
                records(1, 3, "2026-11-30T00:00:02.000Z"),
                [None] * 3,
                {"updated_at": "2026-11-30T00:00:02.000Z"},
            )
            rows, _ = await store.list_threads(limit=10, cursor=None, agent=None)
            assert [r["id"] for r in rows] == ["thr_a", "thr_b"]
            assert (rows[0]["last_seq"], rows[0]["updated_at"]) == (3, "2026-11-30T00:00:02.000Z")
            await store.append(
                "thr_b", records(1, 1, "2026-11-30T00:00:03.000Z"), [None], {"updated_at": "2026-11-30T00:00:03.000Z"}
            )
            got = await store.get_thread("thr_b")
            assert got is not None and (got["last_seq"], got["updated_at"]) == (1, "2026-11-30T00:00:03.000Z")
            rows, _ = await store.list_threads(limit=10, cursor=None, agent=None)
            assert [r["id"] for r in rows] == ["thr_b", "thr_a"]


async def test_a_store_that_never_flushed_is_repaired_at_open(tmp_path: Path, no_timed_flush: None) -> None:
    async with asyncio.timeout(30):
        path = tmp_path / "bridge.db"
        async with killed_later(path) as first:
            await first.create_thread(thread("thr_a", "2026-11-30T00:00:00.000Z"))
            await first.append(
                "thr_a",
                records(1, 5, "2026-11-30T00:00:07.000Z"),
                [None] * 5,
                {"updated_at": "2026-11-30T00:00:07.000Z"},
            )
            await first.append(
                "thr_a",
                records(6, 2, "2026-11-30T00:00:09.000Z"),
                [None] * 2,
                {"updated_at": "2026-11-30T00:00:09.000Z", "state": "running"},
            )
            await first.append(
                "thr_a", records(8, 1, "2026-11-30T00:00:11.000Z"), [None], {"updated_at": "2026-11-30T00:00:11.000Z"}
            )
            assert first._dirty  # owed, not written: as if the process were killed now
            # A second daemon opening the same file (the first one "killed"): the derived
            # columns come from the stored events.
            async with opened(path) as second:
                got = await second.get_thread("thr_a")
                assert got is not None
                assert (got["last_seq"], got["updated_at"], got["state"]) == (8, "2026-11-30T00:00:11.000Z", "running")


async def test_close_writes_what_is_owed(tmp_path: Path, no_timed_flush: None) -> None:
    async with asyncio.timeout(30):
        path = tmp_path / "bridge.db"
        store = SqliteStore(path)
        await store.open()
        await store.create_thread(thread("thr_a", "2026-11-30T00:00:00.000Z"))
        await store.append(
            "thr_a", records(1, 4, "2026-11-30T00:00:05.000Z"), [None] * 4, {"updated_at": "2026-11-30T00:00:05.000Z"}
        )
        await store.close()
        db = sqlite3.connect(path)
        try:
            assert db.execute("SELECT last_seq, updated_at FROM threads").fetchone() == (4, "2026-11-30T00:00:05.000Z")
        finally:
            db.close()


@pytest.mark.parametrize("last_kind", ["turn.started", "turn.ended"])
async def test_a_turn_in_flight_is_found_from_the_events(tmp_path: Path, no_timed_flush: None, last_kind: str) -> None:
    async with asyncio.timeout(30):
        path = tmp_path / "bridge.db"
        async with killed_later(path) as first:
            await first.create_thread(thread("thr_a", "2026-11-30T00:00:00.000Z"))
            ts = "2026-11-30T00:00:01.000Z"
            await first.append(
                "thr_a",
                [Record(1, ts, "bridge", "process.started", {"pid": 1}, None, False)],
                [None],
                {"updated_at": ts, "state": "running"},
            )
            turn = [
                Record(2, ts, "client", "message", {"text": "hi"}, None, False),
                Record(3, ts, "bridge", "turn.started", {"turn_id": "t1"}, None, False),
            ]
            await first.append("thr_a", turn, [None, None], {"updated_at": ts, "turn_active": True})
            await first.append("thr_a", records(4, 3, ts), [None] * 3, {"updated_at": ts})
            if last_kind == "turn.ended":
                end = Record(7, ts, "agent", "turn.ended", {"turn_id": "t1", "status": "success"}, None, True)
                await first.append("thr_a", [end], [None], {"updated_at": ts, "turn_active": False})
            assert first._dirty
            async with opened(path) as second:
                live = await second.live_threads()
                assert [r["id"] for r in live] == ["thr_a"]
                assert live[0]["turn_active"] is (last_kind == "turn.started")
                assert live[0]["last_seq"] == (7 if last_kind == "turn.ended" else 6)
