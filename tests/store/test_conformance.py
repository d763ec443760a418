"""The store conformance suite: one set of behavioural assertions that every store must
pass, run on SQLite and on a real PostgreSQL (the ``opened`` / ``store_url`` fixtures of
tests/conftest.py: a file in the test's tmp dir, or a fresh database on the test server).
A new store is done when this module passes on it. Only the public Store protocol is used,
plus, for the stored envelope's version, a statement from outside the store (what an
older daemon could have left in the database)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.stores import StoreFactory, records, thread

from bridge.errors import InvalidRequest, StoreError
from bridge.protocols.events import Record
from bridge.store import rows
from bridge.store.base import ChangesPruned, StoreListeners, ThreadRow
from bridge.store.factory import make_store

pytestmark = pytest.mark.timeout(60)
TS = "2026-12-01T00:00:00.000Z"


def row(tid: str, ts: str = TS, **extra: Any) -> ThreadRow:
    return thread(tid, ts, **extra)  # type: ignore[return-value]


async def execute(store_url: str, stmt: str, params: tuple[Any, ...] = ()) -> list[Any]:
    """A statement on the store's database from outside the store (``%s`` placeholders)."""
    if store_url.startswith("sqlite"):
        db = sqlite3.connect(Path(store_url.removeprefix("sqlite:///")))
        try:
            found = db.execute(stmt.replace("%s", "?"), params).fetchall()
            db.commit()
            return found
        finally:
            db.close()
    async with await psycopg.AsyncConnection.connect(store_url, autocommit=True) as conn:
        cur = await conn.execute(stmt, params)  # type: ignore[arg-type]
        return await cur.fetchall() if cur.description else []


# ---------------------------------------------------------------------- capabilities


async def test_the_shared_flag_says_whether_other_replicas_may_use_the_store(
    opened: StoreFactory, store_kind: str
) -> None:
    async with opened() as store:
        assert store.shared is (store_kind == "postgresql")


async def test_a_healthy_store_answers_ping(opened: StoreFactory) -> None:
    async with opened() as store:
        await store.ping()
        assert store.healthy


# ---------------------------------------------------------------------- thread rows


async def test_a_thread_is_created_read_updated_and_deleted(opened: StoreFactory) -> None:
    async with opened() as store:
        assert await store.get_thread("thr_1") is None
        await store.create_thread(row("thr_1", title="first", options={"a": [1]}, owner="ann"))
        got = await store.get_thread("thr_1")
        assert got is not None
        assert (got["title"], got["options"], got["owner"], got["turn_active"]) == ("first", {"a": [1]}, "ann", False)
        assert got["last_exit"] is None and got["agent_info"] is None
        await store.update_thread(
            "thr_1", {"title": "second", "turn_active": True, "last_exit": {"code": 0}, "state": "running"}
        )
        got = await store.get_thread("thr_1")
        assert got is not None
        assert (got["title"], got["turn_active"], got["last_exit"], got["state"]) == (
            "second",
            True,
            {"code": 0},
            "running",
        )
        with pytest.raises(ValueError, match="unknown thread columns"):
            await store.update_thread("thr_1", {"no_such_column": 1})
        assert await store.delete_thread("thr_1") is True
        assert await store.get_thread("thr_1") is None
        assert await store.delete_thread("thr_1") is False


@pytest.mark.parametrize("column", ["title", "cwd", "model"])
async def test_a_nul_in_a_thread_column_is_refused_alike_and_the_store_stays_healthy(
    opened: StoreFactory, column: str
) -> None:
    async with opened() as store:
        with pytest.raises(InvalidRequest) as at_creation:
            await store.create_thread(row("thr_1", **{column: "a\x00b"}))
        assert (at_creation.value.code, at_creation.value.status) == ("invalid_request", 400)
        assert await store.get_thread("thr_1") is None
        await store.create_thread(row("thr_1"))
        with pytest.raises(InvalidRequest) as at_update:
            await store.update_thread("thr_1", {column: "\x00"})
        assert at_update.value.code == "invalid_request"
        # In JSON columns a NUL is escaped: kept.
        await store.update_thread("thr_1", {"options": {"note": "a\x00b"}})
        got = await store.get_thread("thr_1")
        assert got is not None and got["options"] == {"note": "a\x00b"} and got[column] != "\x00"  # type: ignore[literal-required]
        await store.ping()
        assert store.healthy


async def test_the_list_is_newest_activity_first_paged_and_filtered(opened: StoreFactory) -> None:
    async with opened() as store:
        for i in range(5):
            agent = "a" if i % 2 == 0 else "b"
            owner = "ann" if i < 3 else "bob"
            await store.create_thread(row(f"thr_{i}", f"2026-12-01T00:00:0{i}.000Z", agent=agent, owner=owner))
        page, cursor = await store.list_threads(limit=2, cursor=None, agent=None)
        assert [r["id"] for r in page] == ["thr_4", "thr_3"] and cursor is not None
        page, cursor = await store.list_threads(limit=2, cursor=cursor, agent=None)
        assert [r["id"] for r in page] == ["thr_2", "thr_1"] and cursor is not None
        page, cursor = await store.list_threads(limit=2, cursor=cursor, agent=None)
        assert [r["id"] for r in page] == ["thr_0"] and cursor is None
        page, _ = await store.list_threads(limit=10, cursor=None, agent="a")
        assert [r["id"] for r in page] == ["thr_4", "thr_2", "thr_0"]
        page, _ = await store.list_threads(limit=10, cursor=None, agent=None, owner="ann")
        assert [r["id"] for r in page] == ["thr_2", "thr_1", "thr_0"]
        page, _ = await store.list_threads(limit=10, cursor=None, agent="b", owner="bob")
        assert [r["id"] for r in page] == ["thr_3"]
        # The same activity: the id decides, and no row is lost between pages.
        for tid in ("thr_x", "thr_y", "thr_z"):
            await store.create_thread(row(tid, "2026-12-02T00:00:00.000Z", agent="c"))
        seen: list[str] = []
        cursor = None
        while True:
            page, cursor = await store.list_threads(limit=1, cursor=cursor, agent="c")
            seen += [r["id"] for r in page]
            if cursor is None:
                break
        assert seen == ["thr_z", "thr_y", "thr_x"]
        with pytest.raises(InvalidRequest) as bad:
            await store.list_threads(limit=1, cursor="not a cursor", agent=None)
        assert bad.value.code == "invalid_cursor"


# ---------------------------------------------------------------------- the transcript


async def test_appends_read_back_as_records_and_as_frames_in_both_modes(opened: StoreFactory) -> None:
    relayed = Record(4, TS, "agent", "message", {"text": "é"}, '{"type":"x","t":"✓"}', True)
    async with opened() as store:
        await store.create_thread(row("thr_1"))
        await store.append("thr_1", records(1, 3, TS), [None, "c2", None], {})
        await store.append("thr_1", [relayed], ["c4"], {"title": "now titled"})
        got = await store.read_events("thr_1", 0, 100)
        assert [r.seq for r in got] == [1, 2, 3, 4]
        assert [r.data for r in got] == [{"text": "1"}, {"text": "2"}, {"text": "3"}, {"text": "é"}]
        assert got[3].raw == relayed.raw and got[3].relay
        assert [r.seq for r in await store.read_events("thr_1", 2, 1)] == [3]
        assert [r.raw for r in await store.read_events("thr_1", 3, 10, with_raw=False)] == [None]
        frames = await store.read_frames("thr_1", 0, 100, raw=False)
        assert frames.texts == [r.envelope().encode() for r in [*records(1, 3, TS), relayed]]
        assert (frames.count, frames.last) == (4, 4)
        page = await store.read_frames("thr_1", 1, 2, raw=False)
        assert (page.count, page.last) == (2, 3)
        raw = await store.read_frames("thr_1", 0, 100, raw=True)
        assert raw.texts == [relayed.raw.encode()] and (raw.count, raw.last) == (4, 4)  # type: ignore[union-attr]
        empty = await store.read_frames("thr_1", 4, 100, raw=False)
        assert (empty.texts, empty.count, empty.last) == ([], 0, 4)
        got_row = await store.get_thread("thr_1")
        assert got_row is not None and got_row["title"] == "now titled" and got_row["last_seq"] == 4


async def test_a_client_event_is_found_by_its_client_id_and_is_unique_per_thread(opened: StoreFactory) -> None:
    async with opened() as store:
        await store.create_thread(row("thr_1"))
        await store.create_thread(row("thr_2"))
        await store.append("thr_1", records(1, 2, TS), ["c1", "c2"], {})
        await store.append("thr_2", records(1, 1, TS), ["c1"], {})
        assert await store.find_client_event("thr_1", "c2") == 2
        assert await store.find_client_event("thr_2", "c1") == 1
        assert await store.find_client_event("thr_1", "c3") is None
        with pytest.raises(StoreError):
            await store.append("thr_1", records(3, 1, TS), ["c1"], {})
        assert [r.seq for r in await store.read_events("thr_1", 0, 10)] == [1, 2]
        assert store.healthy


# ---------------------------------------------------------------------- the change log


async def test_changes_are_told_in_cursor_order_once_per_thread_and_heard_by_the_listeners(store_url: str) -> None:
    heard: list[int] = []
    store = make_store(store_url, listeners=StoreListeners(change=[lambda: heard.append(1)]))
    await store.open()
    try:
        assert (await store.latest_change(), await store.change_horizon()) == (0, 0)
        await store.create_thread(row("thr_a"))
        await store.create_thread(row("thr_b"))
        await store.update_thread("thr_a", {"title": "again"})
        await store.update_thread("thr_b", {"pid": 42})  # not a column clients see: no change
        assert await store.delete_thread("thr_b")
        changes = await store.read_changes(0, 10)
        assert [(c.cursor, c.kind, c.thread_id) for c in changes] == [
            (3, "thread.created", "thr_a"),
            (4, "thread.deleted", "thr_b"),
        ]
        assert changes[0].thread is not None and changes[0].thread["title"] == "again"
        assert changes[1].thread is None and changes[1].deleted_at is not None
        assert [(c.cursor, c.kind) for c in await store.read_changes(1, 10)] == [
            (3, "thread.updated"),
            (4, "thread.deleted"),
        ]
        assert [c.cursor for c in await store.read_changes(0, 1)] == [3]
        assert await store.read_changes(4, 10) == []
        assert await store.latest_change() == 4
        assert len(heard) == 4  # one wake-up per commit that changed a row
    finally:
        await store.close()


async def test_a_cursor_below_the_horizon_is_refused(opened: StoreFactory, store_url: str) -> None:
    async with opened() as store:
        await execute(store_url, "UPDATE change_log SET horizon = 5, latest = 7")
        assert (await store.latest_change(), await store.change_horizon()) == (7, 5)
        with pytest.raises(ChangesPruned) as pruned:
            await store.read_changes(4, 10)
        assert (pruned.value.after, pruned.value.horizon) == (4, 5)
        assert await store.read_changes(5, 10) == []


# ---------------------------------------------------------------------- users and secrets


async def test_users_and_secrets_read_the_same(opened: StoreFactory) -> None:
    async with opened() as store:
        assert await store.add_user("bob", "h-bob", admin=False)
        assert await store.add_user("ann", "h-ann", admin=True)
        found = await store.user_by_token("h-ann")
        assert found is not None and found[0].name == "ann" and found[0].admin and found[1] == "h-ann"
        assert [u.name for u in await store.list_users()] == ["ann", "bob"]
        bob = await store.get_user("bob")
        assert bob is not None and not bob.admin and bob.revoked_at is None
        assert await store.get_user("carl") is None
        for profile, key in (("p2", "K"), ("p1", "B"), ("p1", "A")):
            assert await store.put_secret("bob", profile, key, b"n", b"c", max_per_user=10)
        assert [(s.profile, s.key) for s in await store.list_secrets("bob")] == [("p1", "A"), ("p1", "B"), ("p2", "K")]
        assert [s.key for s in await store.list_secrets("bob", "p2")] == ["K"]
        assert await store.revoke_user("bob")
        assert await store.user_by_token("h-bob") is None and await store.list_secrets("bob") == []


# ---------------------------------------------------------------------- the stored envelope's version


async def test_new_rows_carry_the_wire_version_and_rows_without_it_read_as_version_one(
    opened: StoreFactory, store_url: str
) -> None:
    recs = [*records(1, 2, TS), Record(3, TS, "agent", "message", {"t": "ü"}, '{"x":"é"}', True)]
    async with opened() as store:
        await store.create_thread(row("thr_1"))
        await store.append("thr_1", recs, [None, None, None], {})
        marks = await execute(store_url, "SELECT wire FROM events WHERE thread_id = %s ORDER BY seq", ("thr_1",))
        assert [m[0] for m in marks] == [rows.WIRE_VERSION] * 3
        # What a daemon from before the marker wrote: the same envelope, no version.
        await execute(store_url, "UPDATE events SET wire = NULL WHERE thread_id = %s AND seq = 2", ("thr_1",))
        page = await store.read_frames("thr_1", 0, 100, raw=False)
        assert page.texts == [r.envelope().encode() for r in recs]
        assert [r.data_json for r in await store.read_events("thr_1", 0, 100)] == [r.data_json for r in recs]


async def test_a_row_of_another_wire_version_is_rebuilt_from_its_parts_at_read_time(
    opened: StoreFactory, store_url: str
) -> None:
    """The read-time branch: a row whose version is not the current one is never sent as
    stored; its envelope is built again from its data and raw (cut out by their offsets),
    so a wire change needs no rewrite of stored rows."""
    recs = [*records(1, 3, TS), Record(4, TS, "agent", "message", {"t": "ü"}, '{"x":"é"}', True)]
    async with opened() as store:
        await store.create_thread(row("thr_1"))
        await store.append("thr_1", recs, [None] * 4, {})
        # Another version's marker, on an envelope whose head (its year, byte 19) is not what
        # the current format makes of the row: were it sent as stored, the page would differ.
        changed = (
            "CAST(substr(env, 1, 18) || '7' || substr(env, 20) AS BLOB)"
            if store_url.startswith("sqlite")
            else "overlay(env PLACING '7'::bytea FROM 19 FOR 1)"
        )
        await execute(
            store_url,
            f"UPDATE events SET wire = %s, env = {changed} WHERE thread_id = %s AND seq IN (2, 4)",
            (rows.WIRE_VERSION + 1, "thr_1"),
        )
        stored = await execute(store_url, "SELECT env FROM events WHERE thread_id = %s AND seq = 2", ("thr_1",))
        assert bytes(stored[0][0]).startswith(b'{"seq":2,"ts":"2027')
        page = await store.read_frames("thr_1", 0, 100, raw=False)
        assert page.texts == [r.envelope().encode() for r in recs]
        assert (page.count, page.last) == (4, 4)
