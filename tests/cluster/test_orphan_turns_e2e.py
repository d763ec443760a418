"""Turns a dead owner left open end without anyone sending input (issue #35 item 2, faults
D2 and D3): real daemons on one PostgreSQL and one Redis, a 3 s lease.

* SIGKILL the holder mid-turn, three replicas, nobody sends input: within the lease's ttl
  plus the sweep's interval (sessions/sweep.py) the row says exited and no turn active, the
  transcript has exactly one terminal ``turn.ended`` (reason ``owner_lost``), one for the
  prompt that was queued behind it ("not started"), and one
  ``process.exited`` (``owner_lost``) however many replicas swept, nobody holds the lease
  afterwards, and no agent was started for it.
* A permission request pending at the SIGKILL is settled in the transcript
  (``permission.resolved`` ``cancelled`` by ``owner_lost``, seen live by a client of the
  survivor), the survivor lists none pending and its row counts none, and answering it is
  refused 409 ``already_resolved`` (by owner_lost), not ``permission_not_found``.
* A holder frozen (SIGSTOP) past its lease: the same, by the sweep; on waking it kills its
  agent and nothing it writes is kept.
* A database outage long enough to fence the only replica: once the database is back, the
  replica's own sweep ends the turn its fence left open, with no input.
* The same when the survivor takes the thread over for a new prompt (whichever of the
  prompt and the sweep gets the lease first closes the books): the request is settled once,
  before the new turn starts, and the new turn runs."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import STEP_TIMEOUT, Daemon, alive, new_thread, profile_toml, wait_until

from tests.cluster.test_takeover_e2e import (
    RESUME_S,
    TTL,
    Cluster,
    agent_pids,
    metric,
    post_prompt,
    readyz,
    start_long_turn,
    take_over,
    transcript,
    wait_until_async,
)
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.timeout(120)

SWEEP_S = min(5.0, max(0.5, TTL / 2)) * 1.2  # sessions/sweep.py: half a lease, with its jitter
# From the kill: the lease lives at most TTL more (renewed every TTL/3), then one sweep;
# the rest is slack for a loaded machine.
CLOSED_WITHIN = TTL + 2 * SWEEP_S + 4.0


@pytest.fixture
async def cluster(
    pg_url: str, redis_server: RedisServer, tmp_path: Path, agent_env: dict[str, str]
) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, pg_url, redis_server.url, agent_env)
    c.config += profile_toml("asker", "stream-json", agent_env, permission_prompts=True) + "\n"
    try:
        yield c
    finally:
        await c.close()


async def thread_row(d: Daemon, tid: str) -> dict[str, Any]:
    async with d.http() as http:
        r = await http.get(f"/v1/threads/{tid}")
        assert r.status_code == 200, r.text
        return dict(r.json())


async def closed_by_sweep(d: Daemon, tid: str) -> tuple[dict[str, Any], float]:
    """Wait, sending no input, until ``d`` reports the thread neither running nor in a
    turn; the row and how long it took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        row = await thread_row(d, tid)
        if row["state"] != "running" and not row["turn_active"]:
            return row, loop.time() - start
        assert loop.time() - start < CLOSED_WITHIN, f"still open after {CLOSED_WITHIN:.1f}s: {row}"
        await asyncio.sleep(0.1)


async def test_sigkill_mid_turn_nobody_sends_input_the_sweep_ends_the_turn_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    a = await cluster.start("a")
    b = await cluster.start("b")
    c3 = await cluster.start("c")
    tid = (await new_thread(a, "stream-json"))["id"]
    c, turn_id, _native = await start_long_turn(a, tid)
    assert (await thread_row(b, tid))["turn_active"] is True
    r = await post_prompt(b, tid, "recall", "early")  # forwarded to a, queued behind the turn
    assert r.status_code == 202 and r.json()["queued"] is True, r.text
    queued = r.json()["turn_id"]
    await a.stop(signal.SIGKILL)
    seen = [f for f in c.frames if f.get("seq")]

    row, took = await closed_by_sweep(b, tid)
    assert row["state"] == "exited" and row["last_exit"]["reason"] == "owner_lost"
    stored = await transcript(b, tid)
    assert [e["seq"] for e in stored] == list(range(1, len(stored) + 1))
    for f in seen:  # every event a client saw is kept with its seq
        assert stored[f["seq"] - 1]["kind"] == f["kind"] and stored[f["seq"] - 1]["data"] == f["data"]
    ends = [e for e in stored if e["kind"] == "turn.ended" and e["data"].get("turn_id") == turn_id]
    assert len(ends) == 1 and ends[0]["data"]["reason"] == "owner_lost" and ends[0]["data"]["status"] == "error"
    exits = [e for e in stored if e["kind"] == "process.exited" and e["data"]["reason"] == "owner_lost"]
    assert len(exits) == 1 and exits[0]["seq"] < ends[0]["seq"]
    # the prompt that waited behind it ends too, once, "not started"
    (never,) = [e for e in stored if e["kind"] == "turn.ended" and e["data"].get("turn_id") == queued]
    assert never["data"]["reason"] == "owner_lost" and never["data"]["error"].startswith("not started")
    assert stored[-1]["seq"] == never["seq"]  # nothing after: the thread waits for its next prompt
    # the lease was given back at once, and no agent was started to close the books
    for d in (b, c3):
        assert await metric(d, "agent_bridge_leases_held") == 0
    assert len(agent_pids(tmp_path)) == 1
    assert await transcript(c3, tid) == stored
    print(f"closed {took:.2f}s after the SIGKILL (ttl {TTL}s)")


async def test_a_permission_pending_at_sigkill_is_cancelled_everywhere(cluster: Cluster) -> None:
    a = await cluster.start("a")
    b = await cluster.start("b")
    tid = (await new_thread(a, "asker"))["id"]
    c = await a.ws(tid)
    acc = await c.prompt("ask")
    asked = await c.kind("permission.requested")
    rid = asked["data"]["request_id"]
    watcher = await b.ws(tid, after=0)  # a client of the survivor, from before the kill
    await watcher.kind("permission.requested")
    assert (await thread_row(b, tid))["pending_permissions"] == 1
    async with b.http() as http:  # the survivor lists what the owner's agent asks, from the transcript
        (listed,) = (await http.get(f"/v1/threads/{tid}/permissions")).json()["permissions"]
    assert listed["request_id"] == rid and listed["seq"] == asked["seq"] and listed["tool"] == asked["data"]["tool"]
    await a.stop(signal.SIGKILL)

    row, _took = await closed_by_sweep(b, tid)
    assert row["pending_permissions"] == 0
    resolved = await watcher.kind("permission.resolved", request_id=rid)
    assert resolved["data"] == {"request_id": rid, "decision": "cancelled", "by": "owner_lost"}
    stored = await transcript(b, tid)
    settled = [e for e in stored if e["kind"] == "permission.resolved" and e["data"]["request_id"] == rid]
    assert len(settled) == 1 and settled[0]["seq"] > asked["seq"]
    ends = [e for e in stored if e["kind"] == "turn.ended" and e["data"].get("turn_id") == acc["data"]["turn_id"]]
    assert len(ends) == 1 and ends[0]["data"]["reason"] == "owner_lost" and settled[0]["seq"] < ends[0]["seq"]
    async with b.http() as http:
        listed = await http.get(f"/v1/threads/{tid}/permissions")
        assert listed.status_code == 200 and listed.json() == {"permissions": []}
        r = await http.post(f"/v1/threads/{tid}/permissions/{rid}", json={"decision": "allow"})
    assert r.status_code == 409, r.text
    err = r.json()["error"]
    assert err["code"] == "already_resolved" and "owner_lost" in err["message"]
    await asyncio.wait_for(watcher.close(), STEP_TIMEOUT)


async def test_a_takeover_by_a_new_prompt_settles_the_pending_permission_first(cluster: Cluster) -> None:
    a = await cluster.start("a")
    b = await cluster.start("b")
    tid = (await new_thread(a, "asker"))["id"]
    c = await a.ws(tid)
    await c.prompt("ask")
    rid = (await c.kind("permission.requested"))["data"]["request_id"]
    await a.stop(signal.SIGKILL)

    acc, _ = await take_over(b, tid, "hello", "after-kill", within=TTL + RESUME_S)
    cb = await b.ws(tid, after=0)
    await cb.kind("turn.ended", turn_id=acc["turn_id"])
    stored = await transcript(b, tid)
    assert [e["seq"] for e in stored] == list(range(1, len(stored) + 1))
    settled = [e for e in stored if e["kind"] == "permission.resolved" and e["data"]["request_id"] == rid]
    assert len(settled) == 1 and settled[0]["data"]["by"] == "owner_lost"
    started = next(e for e in stored if e["kind"] == "turn.started" and e["data"]["turn_id"] == acc["turn_id"])
    assert settled[0]["seq"] < started["seq"]
    async with b.http() as http:
        assert (await http.get(f"/v1/threads/{tid}/permissions")).json() == {"permissions": []}


async def test_a_frozen_holders_turn_is_ended_by_the_sweep_and_it_is_fenced_on_waking(
    cluster: Cluster, tmp_path: Path
) -> None:
    a = await cluster.start("a")
    b = await cluster.start("b")
    tid = (await new_thread(a, "stream-json"))["id"]
    c, turn_id, _native = await start_long_turn(a, tid)
    old_agent = agent_pids(tmp_path)[-1]
    assert a.proc is not None
    a.proc.send_signal(signal.SIGSTOP)
    try:
        row, _took = await closed_by_sweep(b, tid)
        assert row["last_exit"]["reason"] == "owner_lost"
    finally:
        a.proc.send_signal(signal.SIGCONT)
    # a wakes: it knows its lease is gone and kills its agent; nothing it writes is kept
    await wait_until(lambda: not alive(old_agent), what="the stale holder to kill its agent")
    stored = await transcript(b, tid)
    assert [e["seq"] for e in stored] == list(range(1, len(stored) + 1))
    ends = [e for e in stored if e["kind"] == "turn.ended" and e["data"].get("turn_id") == turn_id]
    assert len(ends) == 1 and ends[0]["data"]["reason"] == "owner_lost"
    seen = [f for f in c.frames if f.get("seq")]
    for f in seen:
        assert stored[f["seq"] - 1]["kind"] == f["kind"] and stored[f["seq"] - 1]["data"] == f["data"]
    assert await transcript(a, tid) == stored
    assert len(agent_pids(tmp_path)) == 1  # the sweep started no agent


async def test_after_a_database_outage_the_fenced_turn_ends_without_input(
    own_postgres: Any, redis_server: RedisServer, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    cluster = Cluster(tmp_path, own_postgres.create_database("outage"), redis_server.url, agent_env)
    try:
        a = await cluster.start("a")
        tid = (await new_thread(a, "stream-json"))["id"]
        _c, turn_id, _native = await start_long_turn(a, tid)
        agent = agent_pids(tmp_path)[-1]
        await asyncio.to_thread(own_postgres.stop)
        await wait_until(lambda: not alive(agent), timeout=TTL + STEP_TIMEOUT, what="the agent to be fenced")
        await asyncio.to_thread(own_postgres.start_server)
        await wait_until_async(lambda: readyz(a), 200, "readyz to recover")
        # nobody sends anything: the replica's own sweep closes what its fence left open
        row, _took = await closed_by_sweep(a, tid)
        assert row["last_exit"]["reason"] == "owner_lost"
        stored = await transcript(a, tid)
        assert [e["seq"] for e in stored] == list(range(1, len(stored) + 1))
        ends = [e for e in stored if e["kind"] == "turn.ended" and e["data"].get("turn_id") == turn_id]
        assert len(ends) == 1 and ends[0]["data"]["reason"] == "owner_lost"
    finally:
        await cluster.close()
