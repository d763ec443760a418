"""Shutdown as a hand-over (issue #35 item 4: D5, D6), across real daemons: two replicas on
one PostgreSQL and one Redis, a 3 s lease, the fake agent keeping its history on disk
in a state dir both replicas' agents share.

The owner gets SIGTERM in the middle of a turn while prompts for the thread are sent
through the other replica. Each prompt either runs on the survivor — its turn ends
``success`` and the agent there is resumed with its history — or is refused 503 with a
``Retry-After``; none is accepted and then ended "not started". The draining owner never
starts an agent nor takes a lease after SIGTERM, it stops its agent and lets the lease go
as soon as the exit is recorded, so the survivor adds no phantom ``process.exited`` or
``turn.ended`` over a life the owner already closed; the transcript stays gapless.

* The agent exits at once when asked, and an unrelated long-poll holds the owner's HTTP
  shutdown for up to 5 s (uvicorn's graceful wait): the agent is still stopped at SIGTERM,
  not after that wait (D5).
* The agent takes its whole ``stop_grace_s`` to exit (it ignores its closed stdin): input
  forwarded to the owner while it stops is refused ``draining`` and the sender waits for
  the lease to be let go, instead of the owner starting a new agent once the old one has
  gone (D6)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import STEP_TIMEOUT, Daemon, agent_log, new_thread

from tests.cluster.test_takeover_e2e import Cluster, check_consistent, metric, start_long_turn, transcript
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.timeout(120)

# How long after SIGTERM prompts keep being sent through the survivor: past the owner's
# whole drain (stop_grace_s is 2 s in these tests' config, the held HTTP shutdown 5 s).
SEND_FOR_S = 6.0
SEND_EVERY_S = 1.5
RETRYABLE = ("draining", "owner_unreachable", "bus_unavailable")


@pytest.fixture
async def cluster(
    request: pytest.FixtureRequest, pg_url: str, redis_server: RedisServer, tmp_path: Path, agent_env: dict[str, str]
) -> AsyncIterator[Cluster]:
    """Two replicas' cluster; parametrized True ("slow-exit"), the agent ignores its closed
    stdin, so a stop takes the whole stop_grace_s (2 s) and ends with SIGTERM."""
    env = {**agent_env, "FAKE_IGNORE_EOF": "1"} if getattr(request, "param", False) else agent_env
    c = Cluster(tmp_path, pg_url, redis_server.url, env)
    try:
        yield c
    finally:
        await c.close()


async def long_poll(d: Daemon, tid: str) -> None:
    async with d.http() as http:
        await http.get(f"/v1/threads/{tid}/events", params={"after": 0, "wait": 20}, timeout=30)


async def send_prompt(d: Daemon, tid: str, client_id: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=d.url, headers=d.headers, timeout=60) as http:
        return await http.post(f"/v1/threads/{tid}/messages", json={"text": "recall", "client_id": client_id})


async def prompts_during_drain(survivor: Daemon, tid: str) -> list[tuple[str, httpx.Response]]:
    """Prompts sent through ``survivor`` every SEND_EVERY_S for SEND_FOR_S, each awaited
    in its own task (a prompt may wait for the owner to let the thread go)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + SEND_FOR_S
    sent: list[tuple[str, asyncio.Task[httpx.Response]]] = []
    while loop.time() < end:
        cid = f"during-drain-{len(sent)}"
        sent.append((cid, asyncio.create_task(send_prompt(survivor, tid, cid))))
        await asyncio.sleep(SEND_EVERY_S)
    return [(cid, await task) for cid, task in sent]


def spawned_after(d: Daemon, mark: int) -> list[dict[str, Any]]:
    """The ``agent.spawned`` records ``d`` logged past byte ``mark`` of its stderr."""
    found = []
    for line in d.stderr()[mark:].splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("event") == "agent.spawned":
            found.append(rec)
    return found


async def check_handover(cluster: Cluster, tmp_path: Path, *, hold_shutdown: bool) -> None:
    a = await cluster.start("a")
    b = await cluster.start("b")
    tid = (await new_thread(a, "stream-json"))["id"]
    c, turn_id, native = await start_long_turn(a, tid)
    queued = await c.prompt("recall")  # accepted before SIGTERM, waiting behind the long turn
    assert queued["kind"] == "client.accepted" and queued["data"]["queued"] is True, queued
    watcher = await b.ws(tid, after=0)
    assert await metric(a, "agent_bridge_leases_held") == 1
    holding: asyncio.Task[None] | None = None
    if hold_shutdown:  # an unrelated long-poll keeps a's HTTP server in its graceful wait
        other = (await new_thread(b, "stream-json"))["id"]  # a loads it for the long-poll only
        loaded = await metric(a, "agent_bridge_loaded_threads")
        holding = asyncio.create_task(long_poll(a, other))
        end = asyncio.get_running_loop().time() + STEP_TIMEOUT
        while await metric(a, "agent_bridge_loaded_threads") == loaded:  # until the long-poll is in
            assert asyncio.get_running_loop().time() < end, "the long-poll never reached a"
            await asyncio.sleep(0.02)
    mark = len(a.stderr())
    assert a.proc is not None
    a.proc.send_signal(signal.SIGTERM)
    answers = await prompts_during_drain(b, tid)
    assert await asyncio.wait_for(a.proc.wait(), 30) == 0
    if holding is not None:
        holding.cancel()
        with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
            await holding
    # the draining owner started no agent after SIGTERM
    assert spawned_after(a, mark) == [], spawned_after(a, mark)

    ran = []
    for cid, r in answers:
        if r.status_code == 202:
            ran.append(r.json()["turn_id"])
            continue
        assert r.status_code == 503, (cid, r.status_code, r.text)
        assert r.json()["error"]["code"] in RETRYABLE and r.headers.get("Retry-After"), (cid, r.text)
    assert ran, [(cid, r.status_code, r.text) for cid, r in answers]

    # every accepted prompt runs on the survivor, the first one with the resumed history
    def ended() -> dict[str, dict[str, Any]]:
        return {f["data"]["turn_id"]: f["data"] for f in watcher.seen("turn.ended") if f["data"]["turn_id"] in ran}

    while len(ended()) < len(ran):  # in whatever order the waiting prompts ran
        await watcher.kind("turn.ended", timeout=STEP_TIMEOUT * 2)
    assert all(e["status"] == "success" for e in ended().values()), ended()
    first = next(
        i for i, f in enumerate(watcher.frames) if f.get("kind") == "turn.started" and f["data"]["turn_id"] == ran[0]
    )
    answer = next(f for f in watcher.frames[first:] if f.get("kind") == "message" and f["source"] == "agent")
    assert "remember kiwi" in answer["data"]["text"], answer
    starts = [e for e in agent_log(tmp_path) if e["event"] == "start"]
    assert len(starts) == 2 and f"--resume={native}" in starts[-1]["argv"], [e["argv"] for e in starts]

    stored = await transcript(b, tid)
    # gapless, and every event a's client saw is kept with its seq (one end for the long turn)
    check_consistent(stored, [f for f in c.frames if f.get("seq")], turn_id)
    ends = {}
    for e in stored:
        if e["kind"] == "turn.ended":
            assert e["data"]["turn_id"] not in ends, ("two terminal events", e)
            ends[e["data"]["turn_id"]] = e
    # the interrupted turn ended once, by the owner's shutdown; the queued one too
    assert ends[turn_id]["data"]["status"] == "error" and "daemon_shutdown" in json.dumps(ends[turn_id]["data"])
    waiting = ends[queued["data"]["turn_id"]]["data"]
    assert waiting["error"].startswith("not started") and "daemon_shutdown" in waiting["error"], waiting
    # no phantom: the survivor closed no life the owner had not closed itself
    exits = [e for e in stored if e["kind"] == "process.exited"]
    assert [e["data"]["reason"] for e in exits] == ["daemon_shutdown"], exits
    assert not any(
        e["data"].get("reason") in ("owner_lost", "daemon_stopped") for e in stored if e["kind"] == "turn.ended"
    )


@pytest.mark.parametrize("cluster", [False], ids=["quick-exit"], indirect=True)
async def test_prompts_during_the_owners_drain_run_on_the_survivor(cluster: Cluster, tmp_path: Path) -> None:
    """The owner's HTTP shutdown is held by a long-poll: its agent is stopped at SIGTERM anyway."""
    await check_handover(cluster, tmp_path, hold_shutdown=True)


@pytest.mark.parametrize("cluster", [True], ids=["slow-exit"], indirect=True)
async def test_a_draining_owner_takes_no_input_lease_or_agent(cluster: Cluster, tmp_path: Path) -> None:
    """Nothing holds the owner's shutdown: input forwarded to it while its agent stops is refused."""
    await check_handover(cluster, tmp_path, hold_shutdown=False)
