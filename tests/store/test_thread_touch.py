"""A thread row's derived columns (updated_at, last_seq, turn_active) follow its
transcript: reads see them fresh, and a daemon killed before any flush loses nothing.
SQLite writes them lazily (issue #8) and repairs them at open; PostgreSQL writes them in
the append's own transaction (other replicas read them). Both stores."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from support.stores import StoreFactory, records, thread

import bridge.store.sqlite as sqlite_store
from bridge.protocols.events import Record
from bridge.store.base import Store


@contextlib.asynccontextmanager
async def killed_later(opened: StoreFactory) -> AsyncIterator[Store]:
    """A store whose owed thread columns are never written while the test looks: as if its
    process were killed before the flush (SQLite's are dropped before it closes;
    PostgreSQL owes nothing)."""
    async with opened() as store:
        try:
            yield store
        finally:
            getattr(store, "_dirty", {}).clear()


def owed(store: Store) -> None:
    """SQLite has not written the derived columns yet (the test would prove nothing else)."""
    if isinstance(store, sqlite_store.SqliteStore):
        assert store._dirty


@pytest.fixture
def no_timed_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_store, "TOUCH_FLUSH_S", 3600.0)


async def test_reads_see_the_newest_activity_and_order(opened: StoreFactory, no_timed_flush: None) -> None:
    async with asyncio.timeout(30):
        async with opened() as store:
            await store.create_thread(thread("thr_a", "2026-11-30T00:00:00.000Z"))  # type: ignore[arg-type]
            await store.create_thread(thread("thr_b", "2026-11-30T00:00:01.000Z"))  # type: ignore[arg-type]
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
            page, cursor = await store.list_threads(limit=1, cursor=None, agent=None)
            assert [r["id"] for r in page] == ["thr_b"] and cursor
            page, cursor = await store.list_threads(limit=1, cursor=cursor, agent=None)
            assert [r["id"] for r in page] == ["thr_a"] and cursor is None
            assert (await store.list_threads(limit=5, cursor=None, agent="other"))[0] == []


async def test_a_store_that_never_flushed_loses_nothing(opened: StoreFactory, no_timed_flush: None) -> None:
    async with asyncio.timeout(30):
        async with killed_later(opened) as first:
            await first.create_thread(thread("thr_a", "2026-11-30T00:00:00.000Z"))  # type: ignore[arg-type]
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
            owed(first)
            # A second daemon opening the same store (the first one "killed"): the derived
            # columns come from the stored events.
            async with opened() as second:
                got = await second.get_thread("thr_a")
                assert got is not None
                assert (got["last_seq"], got["updated_at"], got["state"]) == (8, "2026-11-30T00:00:11.000Z", "running")


async def test_close_writes_what_is_owed(opened: StoreFactory, no_timed_flush: None) -> None:
    async with asyncio.timeout(30):
        async with opened() as store:
            await store.create_thread(thread("thr_a", "2026-11-30T00:00:00.000Z"))  # type: ignore[arg-type]
            await store.append(
                "thr_a",
                records(1, 4, "2026-11-30T00:00:05.000Z"),
                [None] * 4,
                {"updated_at": "2026-11-30T00:00:05.000Z"},
            )
        async with opened() as again:
            got = await again.get_thread("thr_a")
            assert got is not None and (got["last_seq"], got["updated_at"]) == (4, "2026-11-30T00:00:05.000Z")


@pytest.mark.parametrize("last_kind", ["turn.started", "turn.ended"])
async def test_a_turn_in_flight_is_found_from_the_events(
    opened: StoreFactory, no_timed_flush: None, last_kind: str
) -> None:
    async with asyncio.timeout(30):
        async with killed_later(opened) as first:
            await first.create_thread(thread("thr_a", "2026-11-30T00:00:00.000Z"))  # type: ignore[arg-type]
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
            owed(first)
            async with opened() as second:
                live = await second.live_threads()
                assert [r["id"] for r in live] == ["thr_a"]
                assert live[0]["turn_active"] is (last_kind == "turn.started")
                assert live[0]["last_seq"] == (7 if last_kind == "turn.ended" else 6)
