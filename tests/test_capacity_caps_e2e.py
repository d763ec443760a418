"""The [capacity] caps on what the store holds, end to end (issue #36) with real daemons:
``max_threads`` refuses a creation past it with 429 ``thread_limit`` on every way in (REST,
the ACP gateway's session/new) and makes nothing (no row, no workspace directory), a
deleted thread frees its place; ``max_threads_per_user`` counts each user's own (users mode,
both stores); ``max_transcript_mb`` stops an agent that floods its output near the cap
(``process.exited`` reason ``transcript_full``, its turn ended once), the thread stays
readable and takes no new prompt (409 ``transcript_full``). /metrics shows all three."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from conftest import STEP_TIMEOUT, Daemon, base_config, new_thread
from test_users_e2e import add_user, bearer, transcript_until, users_config

pytestmark = pytest.mark.timeout(120)
MIB = 1024 * 1024
EVENT_OVERHEAD = 64  # bridge/store/base.py: what each event counts for besides its text


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def workspaces(d: Daemon) -> list[str]:
    root = d.data_dir / "workspaces"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


async def acp_new_session(d: Daemon, cwd: Path) -> dict[str, Any]:
    async with websockets.connect(f"{d.ws_url}/v1/acp/stream-json", additional_headers=d.headers) as conn:
        for i, (method, params) in enumerate(
            [("initialize", {"protocolVersion": 1}), ("session/new", {"cwd": str(cwd), "mcpServers": []})], 1
        ):
            await conn.send(json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}))
            got = dict(json.loads(await asyncio.wait_for(conn.recv(), STEP_TIMEOUT)))
        return got


async def test_max_threads_refuses_a_creation_past_it_everywhere_and_makes_nothing(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d: Daemon = await daemon_factory(base_config(tmp_path, agent_env) + "\n[capacity]\nmax_threads = 2\n")
    first = await new_thread(d, "stream-json")
    await new_thread(d, "stream-json")
    async with d.http() as http:
        made = workspaces(d)
        r = await http.post("/v1/threads", json={"agent": "stream-json"})
        assert r.status_code == 429, r.text
        error = r.json()["error"]
        assert error["code"] == "thread_limit"
        assert "2 threads" in error["message"] and "max_threads" in error["message"] and "delete" in error["message"]
        assert workspaces(d) == made  # no directory for the refused thread
        assert len((await http.get("/v1/threads")).json()["threads"]) == 2  # and no row
        # The ACP gateway's session/new creates a thread too: refused the same way.
        refused = await acp_new_session(d, tmp_path)
        assert refused["error"]["data"] == {"code": "thread_limit"}, refused
        assert len((await http.get("/v1/threads")).json()["threads"]) == 2
        page = (await http.get("/metrics")).text
        assert metric(page, "agent_bridge_threads") == 2 and metric(page, "agent_bridge_max_threads") == 2
        assert metric(page, "agent_bridge_thread_limit_refusals_total") == 2
        # A deleted thread frees its place.
        assert (await http.delete(f"/v1/threads/{first['id']}")).status_code == 204
        r = await http.post("/v1/threads", json={"agent": "stream-json"})
        assert r.status_code == 201, r.text


@pytest.fixture
def users_store(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """Where the users live: the daemon's own SQLite file, or a PostgreSQL database."""
    if store_kind == "sqlite":
        return f"sqlite:///{tmp_path / 'data' / 'bridge.db'}"
    return str(request.getfixturevalue("pg_url"))


async def test_max_threads_per_user_counts_each_users_own(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str], users_store: str
) -> None:
    tok = {n: await add_user(users_store, n) for n in ("alice", "bob")}
    config = users_config(tmp_path, agent_env, users_store) + "\n[capacity]\nmax_threads_per_user = 1\n"
    d: Daemon = await daemon_factory(config)
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as http:
        r = await http.post("/v1/threads", json={"agent": "stream-json"}, headers=bearer(tok["alice"]))
        assert r.status_code == 201, r.text
        mine = r.json()["id"]
        r = await http.post("/v1/threads", json={"agent": "stream-json"}, headers=bearer(tok["alice"]))
        assert r.status_code == 429 and r.json()["error"]["code"] == "thread_limit", r.text
        assert "you hold 1 threads" in r.json()["error"]["message"]
        assert "max_threads_per_user" in r.json()["error"]["message"]
        r = await http.post("/v1/threads", json={"agent": "stream-json"}, headers=bearer(tok["bob"]))
        assert r.status_code == 201, r.text  # bob's own count
        r = await http.delete(f"/v1/threads/{mine}", headers=bearer(tok["alice"]))
        assert r.status_code == 204
        r = await http.post("/v1/threads", json={"agent": "stream-json"}, headers=bearer(tok["alice"]))
        assert r.status_code == 201, r.text


def counted(e: dict[str, Any]) -> int:
    """What an event counts for in its thread's transcript size (bridge/store/base.py)."""
    data = json.dumps(e["data"], separators=(",", ":"), ensure_ascii=False)
    # (the agent's line as the API shows it, parsed: about its stored length)
    raw = "" if e["raw"] is None else json.dumps(e["raw"], separators=(",", ":"), ensure_ascii=False)
    return len(data) + len(raw) + EVENT_OVERHEAD


async def all_events(http: httpx.AsyncClient, tid: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        r = await http.get(f"/v1/threads/{tid}/events", params={"after": out[-1]["seq"] if out else 0, "limit": 1000})
        assert r.status_code == 200, r.text
        page = r.json()["events"]
        if not page:
            return out
        out += page


async def test_a_flooding_agent_is_stopped_at_the_transcript_cap_and_the_thread_stays_readable(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d: Daemon = await daemon_factory(base_config(tmp_path, agent_env) + "\n[capacity]\nmax_transcript_mb = 1\n")
    tid = (await new_thread(d, "stream-json"))["id"]
    async with d.http() as http:
        # 60,000 deltas are about 16 MiB of transcript: far past the cap, if nothing stopped them.
        r = await http.post(f"/v1/threads/{tid}/messages", json={"text": "flood 60000"})
        assert r.status_code == 202, r.text
        await transcript_until(http, tid, d.token or "", lambda e: e["kind"] == "turn.ended")
        events = await all_events(http, tid)
        exits = [e for e in events if e["kind"] == "process.exited"]
        assert [e["data"]["reason"] for e in exits] == ["transcript_full"]
        ends = [e for e in events if e["kind"] == "turn.ended"]
        assert len(ends) == 1 and ends[0]["data"]["status"] == "error", ends
        assert ends[0]["data"]["exit"]["reason"] == "transcript_full"
        notices = [e for e in events if e["kind"] == "notice" and e["data"].get("code") == "transcript_full"]
        assert len(notices) == 1 and "max_transcript_mb" in notices[0]["data"]["text"]
        assert not any("flooded" in json.dumps(e["data"]) for e in events)  # the flood never finished
        # How far past the cap: what one read of the agent's output stores (a read is at most
        # 512 KiB, kept as data and raw), never the rest of the flood.
        size = sum(map(counted, events))
        assert 0.9 * MIB <= size < 3 * MIB, size
        # Readable: the thread, its history and its events; a new prompt is refused, and why.
        assert (await http.get(f"/v1/threads/{tid}")).json()["last_exit"]["reason"] == "transcript_full"
        assert (await http.get(f"/v1/threads/{tid}/history")).status_code == 200
        r = await http.post(f"/v1/threads/{tid}/messages", json={"text": "more"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "transcript_full", r.text
        assert "max_transcript_mb" in r.json()["error"]["message"]
        assert (await all_events(http, tid))[-1]["seq"] == events[-1]["seq"]  # nothing written
        page = (await http.get("/metrics")).text
        assert metric(page, "agent_bridge_transcript_full_stops_total") == 1
    # The count is the store's: a restarted daemon refuses the same way.
    await d.stop()
    await d.start()
    async with d.http() as http:
        r = await http.post(f"/v1/threads/{tid}/messages", json={"text": "after a restart"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "transcript_full", r.text
