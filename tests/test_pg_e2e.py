"""``serve`` on the shared store (issue #18): a real daemon with AGENT_BRIDGE_STORE_URL at
the test PostgreSQL runs a thread and a demo turn; restarted, the transcript is intact and
the thread goes on. Two live daemons with one replica_id on one store: the second is
refused in one line; an unreachable store: one line, without the password."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
from conftest import STEP_TIMEOUT
from support.postgres import PASSWORD


async def events(d: Any, tid: str) -> list[dict[str, Any]]:
    async with d.http() as http:
        r = await http.get(f"/v1/threads/{tid}/events", params={"after": 0, "limit": 1000})
        assert r.status_code == 200, r.text
        body = r.json()
        return list(body["events"] if isinstance(body, dict) else body)


async def test_serve_on_postgres_keeps_the_transcript_across_a_restart(
    daemon_factory: Any, pg_url: str, tmp_path: Path
) -> None:
    env = {"AGENT_BRIDGE_STORE_URL": pg_url, "AGENT_BRIDGE_REPLICA_ID": "a"}
    d = await daemon_factory("", extra_env=env)
    async with d.http() as http:
        r = await http.post("/v1/threads", json={})
        assert r.status_code == 201, r.text
        thread = r.json()
        ready = await http.get("/readyz")
        assert ready.status_code == 200
    c = await d.ws(thread["id"])
    end = await c.turn("hello")
    assert end["data"]["status"] == "success"
    await c.close()
    before = await events(d, thread["id"])
    assert [e["seq"] for e in before] == list(range(1, len(before) + 1))
    assert {"turn.started", "turn.ended", "message.delta"} <= {e["kind"] for e in before}
    assert await d.stop() == 0
    # Nothing of it is in the data dir's SQLite file: the transcript lives in PostgreSQL.
    assert not (d.data_dir / "bridge.db").exists()
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        cur = await conn.execute("SELECT count(*), max(seq) FROM events WHERE thread_id = %s", (thread["id"],))
        stored, last = await cur.fetchone() or (0, 0)
        assert stored == last > len(before)  # and the agent's exit at shutdown
        cur = await conn.execute("SELECT replica_id FROM replicas")
        assert await cur.fetchall() == [("a",)]

    d2 = await daemon_factory("", extra_env=env)
    after_restart = await events(d2, thread["id"])
    assert after_restart[: len(before)] == before and len(after_restart) == stored
    assert after_restart[-1]["kind"] == "process.exited"
    c2 = await d2.ws(thread["id"], after=last)
    end = await c2.turn("what did I say?")
    assert end["data"]["status"] == "success"
    reply = [f for f in c2.seen("message", role="assistant") if f["source"] == "agent"][-1]
    assert "hello" in reply["data"]["text"]  # the demo agent resumed its session
    assert c2.seqs()[0] == last + 1
    await c2.close()
    assert PASSWORD not in d.stderr() + d2.stderr()
    assert "bridge:***@" in d2.stderr()  # the store is named, redacted


def serve(data_dir: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_BRIDGE_")}
    return subprocess.Popen(
        [sys.executable, "-m", "bridge", "serve", "--port", "0", "--no-auth", "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**base, **env},
    )


def started(proc: subprocess.Popen[str]) -> bool:
    assert proc.stdout is not None
    return proc.stdout.readline().startswith("agent-bridge listening on ")


def stopped(proc: subprocess.Popen[str]) -> int:
    proc.terminate()
    proc.communicate(timeout=30)
    return proc.returncode


def test_one_replica_id_cannot_run_twice_on_one_store(pg_url: str, tmp_path: Path) -> None:
    env = {"AGENT_BRIDGE_STORE_URL": pg_url, "AGENT_BRIDGE_REPLICA_ID": "same"}
    with serve(tmp_path / "a", env) as first:
        assert started(first)
        with serve(tmp_path / "b", env) as second:  # its own data dir: only the store is shared
            out, err = second.communicate(timeout=STEP_TIMEOUT * 2)
        assert second.returncode == 2 and "listening" not in out, (out, err)
        assert "replica_id 'same' is in use" in err and "Traceback" not in err
        with serve(tmp_path / "c", {**env, "AGENT_BRIDGE_REPLICA_ID": "other"}) as other:
            assert started(other)
            assert stopped(other) == 0
        assert stopped(first) == 0


def test_an_unreachable_store_stops_serve_with_one_line(postgres: Any, tmp_path: Path) -> None:
    url = postgres.url("postgres", password="wrong-" + PASSWORD)
    with serve(tmp_path / "a", {"AGENT_BRIDGE_STORE_URL": url}) as proc:
        out, err = proc.communicate(timeout=STEP_TIMEOUT * 2)
    assert proc.returncode == 2 and "listening" not in out, (out, err)
    assert "cannot connect to postgresql://bridge:***@127.0.0.1" in err and "Traceback" not in err
    assert PASSWORD not in out + err
