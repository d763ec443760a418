"""A row written into a thread's transcript at its next seq by something other than the
daemon (issue #32 B8: an agent with the database file, another process): the thread
reads its seq again and goes on, with a ``notice`` ``seq_conflict`` after the rows it
found, instead of refusing every later prompt with 503 until a restart. Through a real
daemon and the scripted stream-json fake, on SQLite and on PostgreSQL (leases: the
conflict comes under this replica's own live epoch)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import STEP_TIMEOUT, base_config, new_thread

MARK = "written-by-someone-else-7f3a"
FORGED = json.dumps({"role": "assistant", "text": MARK})


async def transcript(d: Any, thread_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    async with d.http() as http:
        while True:
            r = await http.get(f"/v1/threads/{thread_id}/events", params={"after": len(events), "limit": 1000})
            assert r.status_code == 200, r.text
            if not r.json()["events"]:
                return events
            events += r.json()["events"]


def forge_sqlite(d: Any, thread_id: str, seq: int) -> None:
    with sqlite3.connect(d.data_dir / "bridge.db", timeout=STEP_TIMEOUT) as db:
        db.execute(
            "INSERT INTO events (thread_id, seq, ts, source, kind, data) VALUES (?, ?, ?, 'agent', 'message', ?)",
            (thread_id, seq, "2026-12-01T00:00:00.000Z", FORGED),
        )
    db.close()


async def forge_postgres(url: str, thread_id: str, seq: int) -> None:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        await conn.execute(
            "INSERT INTO events (thread_id, seq, ts, source, kind, data) VALUES (%s, %s, %s, 'agent', 'message', %s)",
            (thread_id, seq, "2026-12-01T00:00:00.000Z", FORGED),
        )


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
async def test_a_row_forged_at_the_next_seq_is_read_past_and_the_thread_goes_on(
    store: str, daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str], request: pytest.FixtureRequest
) -> None:
    env: dict[str, str] = {}
    if store == "postgresql":
        url = str(request.getfixturevalue("pg_url"))
        env = {"AGENT_BRIDGE_STORE_URL": url, "AGENT_BRIDGE_REPLICA_ID": "a"}
    d = await daemon_factory(base_config(tmp_path, agent_env), extra_env=env)
    thread = await new_thread(d, "stream-json")
    tid = thread["id"]
    c = await d.ws(tid)  # connected throughout: what it is sent must have no gap or duplicate
    assert (await c.turn("hello"))["data"]["status"] == "success"
    before = await transcript(d, tid)
    taken = before[-1]["seq"] + 1
    if store == "sqlite":
        forge_sqlite(d, tid, taken)
    else:
        await forge_postgres(url, tid, taken)

    async with d.http() as http:
        r = await http.post(f"/v1/threads/{tid}/messages", json={"text": "again", "client_id": "c-again"})
        assert r.status_code == 202, r.text
        accepted = r.json()
    end = await c.kind("turn.ended", turn_id=accepted["turn_id"])
    assert end["data"]["status"] == "success"
    # And the thread keeps going: another turn on the same connection.
    assert (await c.turn("and again"))["data"]["status"] == "success"

    stored = await transcript(d, tid)
    assert [e["seq"] for e in stored] == list(range(1, len(stored) + 1))
    assert stored[: len(before)] == before
    forged, notice, prompt = stored[taken - 1 : taken + 2]
    assert forged["data"] == {"role": "assistant", "text": MARK}
    assert notice["kind"] == "notice" and notice["source"] == "bridge"
    assert notice["data"]["code"] == "seq_conflict" and "did not write" in notice["data"]["text"]
    assert prompt["kind"] == "message" and prompt["data"]["text"] == "again"
    assert accepted["seq"] == prompt["seq"] == taken + 2
    assert len([e for e in stored if e["kind"] == "notice"]) == 1
    # The client saw every stored event once, in order: the forged row and the notice too.
    await c.upto(stored[-1]["seq"])
    assert c.seqs() == [e["seq"] for e in stored]
    await c.close()
    logs = d.stderr()
    assert "thread.seq_conflict" in logs and MARK not in logs  # a warning, without the row's content
