"""What turns used, in both stores (issue #38 item 5): each ``turn.ended`` recorded in the
append's transaction (the thread's totals read back at once, and after the store is
reopened), summed by ``usage_report`` per thread, agent, user and day within a time window
and for one owner, costs of different currencies never added together; gone with a deleted
thread; an upgraded store counts the turn ends it already held."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import psycopg
import pytest
from support.stores import StoreFactory, thread

from bridge.protocols.events import Record

pytestmark = pytest.mark.timeout(60)
DAY1, DAY2 = "2026-12-01T10:00:00.000Z", "2026-12-02T10:00:00.000Z"


def end(seq: int, ts: str = DAY1, **usage: Any) -> Record:
    return Record(
        seq, ts, "agent", "turn.ended", {"turn_id": f"t{seq}", "status": "success", "usage": usage}, None, False
    )


def usd(amount: float) -> dict[str, Any]:
    return {"amount": amount, "currency": "USD"}


# Claude Code's usage as stream-json gives it (with its cost share), then an ACP agent's.
CLAUDE = {
    "input_tokens": 50,
    "output_tokens": 12,
    "cache_read_input_tokens": 7,
    "cache_creation_input_tokens": 3,
    "server_tool_use": {"web_search_requests": 0},
    "cost": usd(0.5),
    "session_cost": usd(0.5),
}
ACP = {
    "input_tokens": 10,
    "output_tokens": 5,
    "cache_read_input_tokens": 2,
    "thought_tokens": 4,
    "total_tokens": 21,
    "context": {"used": 1200, "size": 200000},
    "cost": {"amount": 2.0, "currency": "EUR"},
    "session_cost": usd(9),
}


async def totals(store: Any, tid: str) -> dict[str, Any]:
    row = await store.get_thread(tid)
    assert row is not None
    return dict(row["usage"] or {})


async def test_totals_kept_at_commit_and_after_reopen(opened: StoreFactory) -> None:
    async with asyncio.timeout(30):
        async with opened() as store:
            await store.create_thread(thread("t1"))  # type: ignore[arg-type]
            prompt = Record(1, DAY1, "client", "message", {"role": "user", "text": "hi"}, None, False)
            await store.append("t1", [prompt, end(2, **CLAUDE)], [None, None], {})
            assert await totals(store, "t1") == {
                "turns": 1,
                "input_tokens": 50,
                "output_tokens": 12,
                "cache_read_input_tokens": 7,
                "cache_creation_input_tokens": 3,
                "thought_tokens": 0,
                "cost": {"USD": 0.5},
            }
            # two turn ends in one append; one reports nothing, one a count that is not one
            await store.append("t1", [end(3, **CLAUDE), end(4), end(5, input_tokens=True)], [None] * 3, {})
        async with opened() as store:
            got = await totals(store, "t1")
            assert (got["turns"], got["input_tokens"], got["cost"]) == (4, 100, {"USD": 1.0})
            await store.append("t1", [end(6, **ACP)], [None], {})
            got = await totals(store, "t1")
            assert got["cost"] == {"USD": 1.0, "EUR": 2.0}  # never added together
            assert (got["thought_tokens"], got["input_tokens"]) == (4, 110)


async def test_report_groups_windows_and_owners(opened: StoreFactory) -> None:
    async with asyncio.timeout(30), opened() as store:
        for tid, owner, agent in (("ta", "alice", "claude"), ("tb", "bob", "claude"), ("tc", "alice", "gemini")):
            await store.create_thread(thread(tid, owner=owner, agent=agent))  # type: ignore[arg-type]
        await store.append("ta", [end(1, DAY1, **CLAUDE), end(2, DAY2, **CLAUDE)], [None, None], {})
        await store.append("tb", [end(1, DAY2, **CLAUDE)], [None], {})
        await store.append("tc", [end(1, DAY2, **ACP)], [None], {})

        async def report(group_by: str, **kw: Any) -> dict[str, Any]:
            args = {"owner": None, "since": None, "until": None, "limit": 100, **kw}
            return dict(await store.usage_report(group_by=group_by, **args))

        by_thread = await report("thread")
        assert [(g["key"], g["usage"]["turns"]) for g in by_thread["groups"]] == [("ta", 2), ("tb", 1), ("tc", 1)]
        assert by_thread["total"]["turns"] == 4 and by_thread["total"]["cost"] == {"USD": 1.5, "EUR": 2.0}
        assert by_thread["truncated"] is False
        by_agent = await report("agent")
        assert {g["key"]: g["usage"]["cost"] for g in by_agent["groups"]} == {
            "claude": {"USD": 1.5},
            "gemini": {"EUR": 2.0},
        }
        by_user = await report("user")
        assert {g["key"]: g["usage"]["input_tokens"] for g in by_user["groups"]} == {"alice": 110, "bob": 50}
        by_day = await report("day")
        assert [(g["key"], g["usage"]["turns"]) for g in by_day["groups"]] == [("2026-12-02", 3), ("2026-12-01", 1)]
        since = await report("thread", since="2026-12-02T00:00:00.000Z")
        assert [(g["key"], g["usage"]["turns"]) for g in since["groups"]] == [("ta", 1), ("tb", 1), ("tc", 1)]
        until = await report("day", until="2026-12-02T00:00:00.000Z")
        assert [g["key"] for g in until["groups"]] == ["2026-12-01"]
        alice = await report("thread", owner="alice")
        assert [g["key"] for g in alice["groups"]] == ["ta", "tc"] and alice["total"]["turns"] == 3
        assert (await report("thread", owner="carol"))["groups"] == []
        top = await report("thread", limit=1)
        assert [g["key"] for g in top["groups"]] == ["ta"] and top["truncated"] and top["total"]["turns"] == 4
        assert await store.delete_thread("ta")
        assert [g["key"] for g in (await report("thread"))["groups"]] == ["tb", "tc"]


async def test_an_upgraded_store_counts_the_turn_ends_it_held(opened: StoreFactory, store_url: str) -> None:
    async with asyncio.timeout(30):
        async with opened() as store:
            await store.create_thread(thread("t1", owner="alice"))  # type: ignore[arg-type]
            await store.append("t1", [end(1, **CLAUDE), end(2, **ACP)], [None, None], {})
        await forget_usage(store_url)
        async with opened() as store:
            got = await totals(store, "t1")
            assert (got["turns"], got["input_tokens"], got["cost"]) == (2, 60, {"USD": 0.5, "EUR": 2.0})
            found = await store.usage_report(group_by="user", owner=None, since=None, until=None, limit=10)
            assert [(g["key"], g["usage"]["turns"]) for g in found["groups"]] == [("alice", 2)]
            await store.append("t1", [end(3, **CLAUDE)], [None], {})
            assert (await totals(store, "t1"))["turns"] == 3


async def forget_usage(store_url: str) -> None:
    """The database as the version before usage left it."""
    drop = ["DROP TABLE turn_usage", "ALTER TABLE threads DROP COLUMN usage"]
    drop += ["ALTER TABLE threads DROP COLUMN forked_from", "ALTER TABLE threads DROP COLUMN worktree"]  # (the next)
    drop += ["DROP TABLE push_subscriptions"]
    if store_url.startswith("sqlite"):
        db = sqlite3.connect(store_url.removeprefix("sqlite:///"))
        try:
            for stmt in [*drop, "PRAGMA user_version=13"]:
                db.execute(stmt)
            db.commit()
        finally:
            db.close()
        return
    async with await psycopg.AsyncConnection.connect(store_url, autocommit=True) as conn:
        for stmt in [*drop, "DELETE FROM schema_version WHERE version >= 9"]:
            await conn.execute(stmt)  # type: ignore[arg-type]
