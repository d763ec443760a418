"""A profile's secret that the agent streams split across two deltas, read by the daemon
apart (docs/api.md §6.9): redacted whole in the stored transcript, in what a WebSocket
client joins, in the search index and the database file, and absent from the logs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from typing import Any

import psycopg
import pytest
from conftest import STEP_TIMEOUT, new_thread
from test_permissions_e2e import cfg

SECRET = "sk-test-0123456789abcdef"
SAID = "the value of FAKE_API_KEY is [redacted], keep it"


def joined(frames: list[dict[str, Any]]) -> str:
    return "".join(f["data"]["text"] for f in frames if f.get("kind") == "message.delta" and f.get("source") == "agent")


async def test_a_secret_split_across_two_deltas_is_redacted_whole(
    daemon_factory: Any, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(cfg({**agent_env, "FAKE_API_KEY": SECRET}))
    thread = await new_thread(d, "sj")
    c = await d.ws(thread["id"])
    await c.turn("splitleak FAKE_API_KEY")
    deltas = [f for f in c.frames if f.get("kind") == "message.delta"]
    assert len(deltas) >= 2  # (the fake's two lines, each in its own read)
    assert joined(c.frames) == SAID
    assert [f for f in c.seen("message") if f["source"] == "agent"][-1]["data"]["text"] == SAID
    assert SECRET not in "".join(c.texts)
    async with d.http() as http:
        page = await http.get(f"/v1/threads/{thread['id']}/events", params={"limit": 1000})
        assert page.status_code == 200
        stored = page.json()["events"]
        assert joined(stored) == SAID  # the transcript's deltas, as a later client reads them
        assert SECRET not in page.text
        for q in ("0123456789abcdef", f'"{SECRET}"'):  # the secret's words: found nowhere
            found = await http.get("/v1/search", params={"q": q})
            assert found.status_code == 200 and found.json()["hits"] == [], q
        hits = (await http.get("/v1/search", params={"q": '"redacted keep"'})).json()["hits"]
        assert hits and all(h["thread"] == thread["id"] and SECRET not in h["snippet"] for h in hits)
    # A later client replaying the thread joins the same text.
    late = await d.ws(thread["id"])
    await late.kind("turn.ended")
    assert joined(late.frames) == SAID
    assert SECRET not in d.stderr()
    for db_file in d.data_dir.glob("bridge.db*"):  # the database, its WAL and the search index
        assert SECRET.encode() not in db_file.read_bytes(), db_file.name


async def stored_anywhere(d: Any, pg_url: str | None) -> list[str]:
    """Where the secret is whole: the SQLite files' bytes, or any row of any table."""
    if pg_url is None:
        return [f.name for f in d.data_dir.glob("bridge.db*") if SECRET.encode() in f.read_bytes()]
    found = []
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        tables = await (
            await conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
        ).fetchall()
        for (table,) in tables:
            rows = await (await conn.execute(f'SELECT t::text FROM "{table}" t')).fetchall()
            found += [table for (row,) in rows if SECRET in row]
    return found


async def open_stream(d: Any, pg_url: str | None) -> str:
    """The text of the search index's row for the open stream ('' for none)."""
    if pg_url is None:
        with contextlib.closing(sqlite3.connect(f"file:{d.data_dir / 'bridge.db'}?mode=ro", uri=True)) as db:
            rows = db.execute("SELECT text FROM search_streams").fetchall()
    else:
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            rows = await (await conn.execute("SELECT body FROM search_streams")).fetchall()
    return "".join(str(r[0]) for r in rows)


async def test_the_open_streams_search_row_never_holds_it_whole(
    daemon_factory: Any, agent_env: dict[str, str], store_kind: str, request: pytest.FixtureRequest
) -> None:
    """While the stream is still open (the search index keeps its joined text in a row of
    its own, found by search as soon as it commits), and after it ends: both stores."""
    pg_url = None if store_kind == "sqlite" else str(request.getfixturevalue("pg_url"))
    store = "" if pg_url is None else f"\n[store]\nurl = {json.dumps(pg_url)}\n"
    d = await daemon_factory(cfg({**agent_env, "FAKE_API_KEY": SECRET}) + store)
    thread = await new_thread(d, "sj")
    c = await d.ws(thread["id"])
    await c.prompt("splitleak FAKE_API_KEY hold")
    await c.next(lambda f: f.get("kind") == "message.delta" and "keep it" in f["data"]["text"])
    async with d.http() as http:
        loop = asyncio.get_running_loop()
        end = loop.time() + STEP_TIMEOUT
        for _ in iter(int, 1):  # until the second delta's append has committed
            if "keep it" in (row := await open_stream(d, pg_url)) or loop.time() > end:
                break
            await asyncio.sleep(0.05)
        assert row == "the value of FAKE_API_KEY is [redacted], keep it", row
        assert (await http.get("/v1/search", params={"q": "0123456789abcdef"})).json()["hits"] == []
        assert await stored_anywhere(d, pg_url) == []
        await c.send(op="interrupt")
        assert (await c.kind("turn.ended"))["data"]["status"] == "cancelled"
        assert joined(c.frames) == SAID
        assert (await http.get("/v1/search", params={"q": "0123456789abcdef"})).json()["hits"] == []
        page = await http.get(f"/v1/threads/{thread['id']}/events", params={"limit": 1000})
        assert joined(page.json()["events"]) == SAID and SECRET not in page.text
    assert await stored_anywhere(d, pg_url) == []
    assert SECRET not in d.stderr() and SECRET not in "".join(c.texts)
