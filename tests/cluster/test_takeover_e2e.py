"""Leased ownership across real daemons (issue #18 items 1 and 4): two replicas share one
PostgreSQL and one Redis, with a 3 s lease. The fake agent keeps its history on disk in a
state dir both replicas' agents share (standing for a shared HOME) and honours --resume.

* SIGKILL the holder mid-turn: a prompt sent to the survivor while the holder lived was
  forwarded to it and queued; the survivor takes the thread within the lease ttl (plus the
  agent's start) — a prompt sent to it meanwhile waits for the dead holder's lease to end,
  then runs there — the interrupted turn and the queued one each have exactly one terminal
  event (owner_lost), the transcript is gapless and keeps every event a client saw with
  its seq, the resumed agent has its history, and no agent process of the dead replica is
  left.
* SIGSTOP the holder past its lease, another takes over, SIGCONT: the stale holder's appends
  are refused, it kills its agent, its clients are told (owner_lost, close 1012), and the
  transcript is one consistent sequence.
* SIGTERM drains: the holder's leases are released at once, so the other replica runs the
  thread immediately (no wait for expiry).
* Start-up: a replica restarted while another owns its old thread leaves it alone."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from conftest import STEP_TIMEOUT, Client, Daemon, agent_log, alive, base_config, new_thread, wait_until

from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.timeout(120)

TTL = 3.0
RESUME_S = 5.0  # the fake agent's start plus the bridge's spawn, generously (a loaded machine)


class Cluster:
    def __init__(self, tmp: Path, pg_url: str, redis_url: str, agent_env: dict[str, str]) -> None:
        self.tmp = tmp
        self.env = {"AGENT_BRIDGE_STORE_URL": pg_url, "AGENT_BRIDGE_BUS_URL": redis_url}
        self.config = base_config(tmp, agent_env) + f"\n[cluster]\nlease_ttl_s = {TTL}\n"
        self.daemons: dict[str, Daemon] = {}

    async def start(self, rid: str) -> Daemon:
        (self.tmp / rid).mkdir(exist_ok=True)
        d = Daemon(self.tmp / rid, self.config, extra_env={**self.env, "AGENT_BRIDGE_REPLICA_ID": rid})
        await d.start()
        self.daemons[rid] = d
        return d

    async def close(self) -> None:
        for d in self.daemons.values():
            dead = d.proc is None or d.proc.returncode is not None
            for c in d.clients:
                if dead:  # no close handshake to wait for
                    c.conn.transport.abort()
                    continue
                with _quiet():
                    await asyncio.wait_for(c.close(), 2)
            if d.proc is not None and d.proc.returncode is None:
                with _quiet():
                    d.proc.send_signal(signal.SIGCONT)
                await d.stop()
        # and no agent of any replica is left behind (the fake agents log their starts)
        starts = [e["pid"] for e in agent_log(self.tmp) if e["event"] == "start"]
        await wait_until(lambda: not any(alive(p) for p in starts), what=f"the agents of {self.tmp} to exit")


def _quiet() -> Any:
    import contextlib

    return contextlib.suppress(Exception)


@pytest.fixture
async def cluster(
    pg_url: str, redis_server: RedisServer, tmp_path: Path, agent_env: dict[str, str]
) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, pg_url, redis_server.url, agent_env)
    try:
        yield c
    finally:
        await c.close()


async def transcript(d: Daemon, tid: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    async with d.http() as http:
        while True:
            r = await http.get(f"/v1/threads/{tid}/events", params={"after": len(events), "limit": 1000})
            assert r.status_code == 200, r.text
            if not r.json()["events"]:
                return events
            events += r.json()["events"]


async def post_prompt(d: Daemon, tid: str, text: str, client_id: str) -> httpx.Response:
    async with d.http() as http:
        return await http.post(f"/v1/threads/{tid}/messages", json={"text": text, "client_id": client_id})


async def take_over(d: Daemon, tid: str, text: str, client_id: str, within: float) -> tuple[dict[str, Any], float]:
    """Prompt ``d`` until it accepts (a prompt waits, forwarded, for a dead holder's lease
    to end; it may be refused not_owner or owner_unreachable meanwhile); the answer and
    how long it took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        r = await post_prompt(d, tid, text, client_id)
        if r.status_code in (200, 202):
            return r.json(), loop.time() - start
        assert r.json()["error"]["code"] in ("not_owner", "owner_unreachable"), r.text
        assert loop.time() - start < within, f"not taken over within {within}s"
        await asyncio.sleep(0.05)


async def metric(d: Daemon, name: str) -> float:
    async with d.http() as http:
        text = (await http.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def agent_pids(tmp: Path) -> list[int]:
    return [e["pid"] for e in agent_log(tmp) if e["event"] == "start"]


def check_consistent(stored: list[dict[str, Any]], seen: list[dict[str, Any]], turn_id: str) -> list[dict[str, Any]]:
    """Gapless, every seen event kept with its seq, one terminal event for ``turn_id``."""
    assert [e["seq"] for e in stored] == list(range(1, len(stored) + 1))
    by_seq = {e["seq"]: e for e in stored}
    for f in seen:
        assert by_seq[f["seq"]]["kind"] == f["kind"] and by_seq[f["seq"]]["data"] == f["data"]
    ended = [e for e in stored if e["kind"] == "turn.ended" and e["data"].get("turn_id") == turn_id]
    assert len(ended) == 1, ended
    return ended


async def start_long_turn(d: Daemon, tid: str) -> tuple[Client, str, str]:
    """A client on ``d``: one turn to remember, then a long one under way."""
    c = await d.ws(tid)
    await c.turn("remember kiwi")
    native = c.seen("session.started")[0]["data"]["native_session_id"]
    acc = await c.prompt("count 400")  # 12 s of deltas
    assert acc["kind"] == "client.accepted", acc
    await c.next(lambda f: f.get("kind") == "message.delta" and f["data"]["text"] == "10 ")
    return c, acc["data"]["turn_id"], native


async def recall_on(d: Daemon, tid: str, after: int, turn_id: str) -> str:
    c = await d.ws(tid, after=after)
    ended = await c.kind("turn.ended", turn_id=turn_id)
    assert ended["data"]["status"] == "success", ended
    return str([f for f in c.seen("message") if f["source"] == "agent"][-1]["data"]["text"])


async def test_sigkill_holder_mid_turn_survivor_takes_over_and_resumes(cluster: Cluster, tmp_path: Path) -> None:
    a = await cluster.start("a")
    b = await cluster.start("b")
    thread = await new_thread(a, "stream-json")
    tid = thread["id"]
    c, turn_id, native = await start_long_turn(a, tid)
    watcher = await b.ws(tid, after=0)  # a client of b's, from before the kill
    # While a owns it, a prompt sent to b is forwarded to a, where it waits its turn.
    r = await post_prompt(b, tid, "recall", "early")
    assert r.status_code == 202 and r.json()["queued"] is True, r.text
    queued = r.json()["turn_id"]
    assert await metric(a, "agent_bridge_leases_held") == 1 and await metric(b, "agent_bridge_leases_held") == 0

    await a.stop(signal.SIGKILL)
    seen = [f for f in c.frames if f.get("seq")]
    old_agent = agent_pids(tmp_path)[-1]
    # The dead replica's agent does not survive it (parent-death signal; nothing else reaps it).
    await wait_until(lambda: not alive(old_agent), what="the dead replica's agent to die")

    acc, took = await take_over(b, tid, "recall", "after-kill", within=TTL + RESUME_S)
    assert took <= TTL + RESUME_S
    text = await recall_on(b, tid, seen[-1]["seq"], acc["turn_id"])
    assert "remember kiwi" in text  # the resumed native session has its history
    starts = [e for e in agent_log(tmp_path) if e["event"] == "start"]
    assert len(starts) == 2 and f"--resume={native}" in starts[-1]["argv"]

    stored = await transcript(b, tid)
    (ended,) = check_consistent(stored, seen, turn_id)
    assert ended["data"]["status"] == "error" and ended["data"]["reason"] == "owner_lost"
    (never,) = check_consistent(stored, seen, queued)  # the queued prompt ends too, once
    assert never["data"]["reason"] == "owner_lost" and never["data"]["error"].startswith("not started")
    exits = [e for e in stored if e["kind"] == "process.exited" and e["seq"] > seen[-1]["seq"]]
    assert exits[0]["data"]["reason"] == "owner_lost" and exits[0]["seq"] < ended["seq"]
    # b's client saw the whole transcript, gapless, in order, whoever wrote each event
    await watcher.kind("turn.ended", turn_id=acc["turn_id"])
    got = [(f["seq"], f["kind"]) for f in watcher.frames if f.get("seq")]
    assert got == [(e["seq"], e["kind"]) for e in stored[: len(got)]] and got[-1][0] >= ended["seq"]


async def stale_holder_woke(
    a: Daemon, b: Daemon, c: Client, tid: str, seen_before: list[dict[str, Any]], turn_id: str
) -> list[dict[str, Any]]:
    """``a`` was frozen while ``b`` took the thread over, and runs again: it knows its lease
    is gone, tells its client (``c``: notice owner_lost, close 1012), holds no lease, and
    both replicas serve one consistent transcript, which is returned."""
    notice = await c.next(lambda f: f.get("kind") == "notice" and f["data"].get("code") == "owner_lost")
    assert notice.get("seq") is None  # a notice, not a transcript event
    with pytest.raises(websockets.ConnectionClosed) as closed:
        while True:
            await asyncio.wait_for(c.conn.recv(), STEP_TIMEOUT)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
    assert await metric(a, "agent_bridge_leases_held") == 0
    stored = await transcript(b, tid)
    seen = [f for f in c.frames if f.get("seq")]
    assert seen[: len(seen_before)] == seen_before
    (ended,) = check_consistent(stored, seen, turn_id)
    assert ended["data"]["reason"] == "owner_lost"
    assert await transcript(a, tid) == stored  # one transcript whichever replica is asked
    return stored


async def test_sigstop_holder_is_fenced_out_and_stops_its_agent_on_sigcont(cluster: Cluster, tmp_path: Path) -> None:
    a = await cluster.start("a")
    b = await cluster.start("b")
    tid = (await new_thread(a, "stream-json"))["id"]
    c, turn_id, _native = await start_long_turn(a, tid)
    old_agent = agent_pids(tmp_path)[-1]
    a.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
    try:
        seen_before = [f for f in c.frames if f.get("seq")]
        acc, took = await take_over(b, tid, "recall", "after-stop", within=TTL + RESUME_S + 1)
        assert took >= TTL * 0.5  # it had to wait for a's lease to expire
        text = await recall_on(b, tid, 0, acc["turn_id"])
        assert "remember kiwi" in text
    finally:
        a.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
    # a wakes up: it knows its lease is gone, kills its agent, tells its client and closes it
    await wait_until(lambda: not alive(old_agent), what="the stale holder to kill its agent")
    await stale_holder_woke(a, b, c, tid, seen_before, turn_id)
    # a serves the thread again, as a follower: its clients' input runs on b, the holder
    r = await post_prompt(a, tid, "hello", "on-a")
    assert r.status_code == 202, r.text
    assert await metric(a, "agent_bridge_leases_held") == 0 and await metric(b, "agent_bridge_leases_held") == 1
    assert "owner_lost" in a.stderr() and json.dumps("thread.owner_lost")[1:-1] in a.stderr()


async def test_sigterm_drains_and_releases_leases_at_once(cluster: Cluster, tmp_path: Path) -> None:
    a = await cluster.start("a")
    b = await cluster.start("b")
    tid = (await new_thread(a, "stream-json"))["id"]
    c = await a.ws(tid)
    await c.turn("remember kiwi")
    assert await metric(a, "agent_bridge_leases_held") == 1
    assert await metric(a, "agent_bridge_store_commit_seconds_count") >= 1
    assert await metric(b, "agent_bridge_store_commit_seconds_count") == 0  # b has appended nothing
    assert await a.stop(signal.SIGTERM) == 0
    # released on the way out: b runs it at once, no not_owner while a's lease would still live
    r = await post_prompt(b, tid, "recall", "after-drain")
    assert r.status_code == 202, r.text
    text = await recall_on(b, tid, 0, r.json()["turn_id"])
    assert "remember kiwi" in text
    stored = await transcript(b, tid)
    assert [e["seq"] for e in stored] == list(range(1, len(stored) + 1))
    assert next(e["data"]["reason"] for e in stored if e["kind"] == "process.exited") == "daemon_shutdown"


async def test_a_restarted_replica_leaves_a_thread_another_now_owns(cluster: Cluster, tmp_path: Path) -> None:
    a = await cluster.start("a")
    b = await cluster.start("b")
    tid = (await new_thread(a, "stream-json"))["id"]
    _c, turn_id, _native = await start_long_turn(a, tid)
    await a.stop(signal.SIGKILL)
    acc, _ = await take_over(b, tid, "count 150", "b-long", within=TTL + RESUME_S)
    cb = await b.ws(tid, after=acc["seq"])  # b's own turn, not a's replayed deltas
    await cb.next(lambda f: f.get("kind") == "message.delta" and f["data"]["text"] == "5 ")
    b_agent = agent_pids(tmp_path)[-1]
    assert len(agent_pids(tmp_path)) == 2
    # a comes back with the same replica id while b runs the thread: a's start-up recovery
    # must leave b's thread (and b's agent) alone
    a2 = await cluster.start("a")
    await asyncio.sleep(0.3)  # a2's recovery ran before it listened; let b stream a little more
    assert alive(b_agent)
    await cb.kind("turn.ended", turn_id=acc["turn_id"], timeout=30)
    stored = await transcript(a2, tid)
    check_consistent(stored, [], turn_id)
    assert not any(e["data"].get("reason") == "daemon_stopped" for e in stored)


async def readyz(d: Daemon) -> int:
    async with d.http() as http:
        return (await http.get("/readyz")).status_code


async def test_postgres_outage_fences_agents_refuses_input_and_resumes(
    own_postgres: Any, redis_server: RedisServer, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    cluster = Cluster(tmp_path, own_postgres.create_database("outage"), redis_server.url, agent_env)
    try:
        a = await cluster.start("a")
        tid = (await new_thread(a, "stream-json"))["id"]
        c = await a.ws(tid)
        await c.turn("remember kiwi")
        agent = agent_pids(tmp_path)[-1]
        seen = [f for f in c.frames if f.get("seq")]
        await asyncio.to_thread(own_postgres.stop)
        # no store: readiness fails, input is refused with a clear code, and the agent is
        # stopped before its lease (which it can no longer renew) could expire
        await wait_until_async(lambda: readyz(a), 503, "readyz to fail")
        r = await post_prompt(a, tid, "hello", "during-outage")
        assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable", r.text
        await wait_until(lambda: not alive(agent), timeout=TTL + 2, what="the agent to be fenced")
        notice = await c.next(lambda f: f.get("kind") == "notice" and f["data"].get("code") == "owner_lost")
        assert notice.get("seq") is None
        await asyncio.to_thread(own_postgres.start_server)
        await wait_until_async(lambda: readyz(a), 200, "readyz to recover")
        # service resumes: the thread runs again, resumed, and nothing committed was lost
        acc, _ = await take_over(a, tid, "recall", "after-outage", within=STEP_TIMEOUT)
        assert "remember kiwi" in await recall_on(a, tid, seen[-1]["seq"], acc["turn_id"])
        stored = await transcript(a, tid)
        check_consistent(stored, seen, acc["turn_id"])
    finally:
        await cluster.close()


async def wait_until_async(probe: Any, want: Any, what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + STEP_TIMEOUT
    while (got := await probe()) != want:
        assert loop.time() < end, f"timed out waiting for {what} (last {got})"
        await asyncio.sleep(0.05)
