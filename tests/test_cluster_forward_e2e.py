"""Any replica serves any thread (docs/api.md §6): two daemons sharing one PostgreSQL and
one Redis. A client on the replica that does not run a thread's agent prompts,
interrupts, answers permissions and deletes it — its input reaches the holder through the
bus, the answer comes back to that client — and it sees the same events, with the same
seq, in the same order, as a client on the holder. ``client_id`` holds across replicas.
With Redis down, events still reach the other replica (it reads the shared store), input
for the holder is refused with a clear error, and it all comes back with Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    FAKE_AGENT,
    STEP_TIMEOUT,
    Client,
    Daemon,
    new_thread,
    profile_toml,
)
from test_cluster_e2e import get, metric, replica_pair, wait_until_bus
from test_transport_e2e import sse

from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.timeout(150)


@pytest.fixture
async def pair(pg_url: str, redis_server: RedisServer, tmp_path: Path) -> AsyncIterator[tuple[Daemon, Daemon]]:
    state = tmp_path / "agent-state"  # the agents' own history: shared, as a shared HOME is
    state.mkdir()
    marker = str(tmp_path / "agent.log")
    env = {"FAKE_AGENT_LOG": marker, "FAKE_AGENT_STATE": str(state)}
    agent = profile_toml("sj", "stream-json", env, permission_prompts=True)
    shared = {"AGENT_BRIDGE_STORE_URL": pg_url, "AGENT_BRIDGE_BUS_URL": redis_server.url}
    server = "stop_grace_s = 2\nmax_conversations = 100\n"
    async with replica_pair(tmp_path, shared, agent, server, marker, str(FAKE_AGENT)) as both:
        yield both


def events(c: Client, upto: int) -> list[tuple[int, str, Any]]:
    """What a client was shown of the transcript, up to ``upto``: (seq, kind, data)."""
    return [(f["seq"], f["kind"], f.get("data")) for f in c.frames if f.get("seq") is not None and f["seq"] <= upto]


async def rejected(c: Client, op: str) -> dict[str, Any]:
    return await c.next(lambda f: f.get("kind") == "client.rejected" and f["data"].get("op") == op)


async def test_a_client_on_the_other_replica_drives_the_thread_and_sees_what_the_holder_sees(
    pair: tuple[Daemon, Daemon],
) -> None:
    a, b = pair
    thread = await new_thread(a, "sj", title="shared")
    tid = thread["id"]
    on_a, on_b = await a.ws(tid), await b.ws(tid)
    first = await on_a.turn("first")  # A runs the agent now, and holds the lease
    assert (await get(a, f"/v1/threads/{tid}"))["state"] == "running"
    await on_b.upto(first["seq"])  # B was told of A's commits and read them from the store

    # A prompt sent to B reaches A's agent; the answer comes back to B's client.
    acc = await on_b.prompt("second", client_id="twice")
    assert acc["kind"] == "client.accepted" and acc["data"]["duplicate"] is False, acc
    end = await on_b.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    assert end["data"]["status"] == "success"
    await on_a.upto(end["seq"])
    assert any("echo: second" in str(f.get("data")) for f in on_b.frames)
    # The same client_id again, through the holder and through B: accepted once.
    for c in (on_a, on_b):
        again = await c.prompt("second", client_id="twice")
        assert again["kind"] == "client.accepted" and again["data"]["duplicate"] is True, again
        assert again["data"]["seq"] == acc["data"]["seq"]

    # An interrupt sent to B stops A's turn.
    acc = await on_b.prompt("count 400")
    assert acc["kind"] == "client.accepted", acc
    await on_b.kind("message.delta")
    await on_b.send(op="interrupt")
    answer = await on_b.next(lambda f: f.get("kind") == "client.accepted" and f["data"].get("op") == "interrupt")
    assert answer["data"]["active"] is True
    end = await on_b.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    assert end["data"]["status"] == "cancelled"

    # A permission request of A's agent, answered from B.
    acc = await on_b.prompt("ask")
    req = await on_b.kind("permission.requested")
    await on_b.send(op="permission", request_id=req["data"]["request_id"], decision="allow")
    answer = await on_b.next(
        lambda f: f.get("kind") in ("client.accepted", "client.rejected") and f["data"].get("op") == "permission"
    )
    assert answer["kind"] == "client.accepted", answer["data"]
    assert answer["data"]["request_id"] == req["data"]["request_id"]
    end = await on_b.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    assert end["data"]["status"] == "success"
    assert on_b.seen("permission.resolved", request_id=req["data"]["request_id"], decision="allow")
    assert any("permission: allow" in str(f.get("data")) for f in on_b.frames)  # A's agent was told
    await on_a.upto(end["seq"])

    # Both clients were shown one transcript: the same events, same seq, same order, no gap.
    seen_a, seen_b = events(on_a, end["seq"]), events(on_b, end["seq"])
    assert seen_a == seen_b
    assert [s for s, _, _ in seen_a] == list(range(1, end["seq"] + 1))
    async with b.http() as http:  # and it is the stored one, read through B
        stored = (await http.get(f"/v1/threads/{tid}/events", params={"after": 0, "limit": 1000})).json()
    assert [(e["seq"], e["kind"]) for e in stored["events"] if e["seq"] <= end["seq"]] == [(s, k) for s, k, _ in seen_a]
    # What B forwarded is recorded on A as its caller's, as a client's own input on A is.
    by = [(e["kind"], e["data"].get("op"), e["data"].get("by")) for e in stored["events"] if e["source"] == "client"]
    assert {("client.other", "interrupt"), ("client.other", "permission")} <= {(k, op) for k, op, _ in by}, by
    assert {who for _, _, who in by} == {"operator"}, by
    assert (await get(b, f"/v1/threads/{tid}"))["last_seq"] >= end["seq"]
    assert await metric(b, "agent_bridge_forwarded_total") >= 6  # B's prompts, interrupt, answer
    assert await metric(b, "agent_bridge_followed_events_total") >= end["seq"]
    assert await metric(a, "agent_bridge_forwarded_total") == 0

    # Deleted through B: A stops the agent, and the thread is gone everywhere.
    async with b.http() as http:
        r = await http.delete(f"/v1/threads/{tid}")
        assert r.status_code == 204, r.text
    for d in (a, b):
        async with d.http() as http:
            assert (await http.get(f"/v1/threads/{tid}")).status_code == 404


async def test_without_the_bus_events_still_cross_and_input_for_the_holder_is_refused_clearly(
    pair: tuple[Daemon, Daemon], redis_server: RedisServer
) -> None:
    a, b = pair
    tid = (await new_thread(a, "sj"))["id"]
    on_a, on_b = await a.ws(tid), await b.ws(tid)
    await on_a.turn("before")
    redis_server.stop()
    for d in (a, b):
        await wait_until_bus(d, "down")
    # The holder's turn still reaches B's clients — WebSocket, SSE and a long-poll — as B
    # reads the shared store while the bus is away.
    async with b.http() as http, sse(http, tid, after=0) as stream:
        before = (await get(b, f"/v1/threads/{tid}"))["last_seq"]
        poll = asyncio.create_task(
            http.get(f"/v1/threads/{tid}/events", params={"after": before, "wait": STEP_TIMEOUT})
        )
        end = await on_a.turn("while redis is down")
        await on_b.upto(end["seq"], timeout=STEP_TIMEOUT)
        await stream.until_seq(end["seq"])
        polled = (await poll).json()["events"]
        assert polled and polled[0]["seq"] == before + 1
    assert stream.ids() == list(range(1, end["seq"] + 1))
    # Input for the holder cannot travel without the bus: refused, and nothing is recorded.
    await on_b.send(op="prompt", text="lost?", client_id="no-bus")
    refused = await rejected(on_b, "prompt")
    assert refused["data"]["code"] == "bus_unavailable", refused
    assert "retry" in refused["data"]["message"]
    redis_server.start()
    for d in (a, b):
        await wait_until_bus(d, "ok")
    # The same client_id once the bus is back: it is a first time, not a duplicate.
    acc = await on_b.prompt("back", client_id="no-bus")
    assert acc["kind"] == "client.accepted" and acc["data"]["duplicate"] is False, acc
    end = await on_b.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    await on_a.upto(end["seq"])
    assert events(on_a, end["seq"]) == events(on_b, end["seq"])


ANSWER_ROUNDS = 12
QUEUED = 4


def early_events(c: Client, acc: dict[str, Any], since: int) -> list[tuple[int, str]]:
    """The events with a ``seq`` at or after the one an answer names (its prompt's own
    event, and all that came after it) that reached the client before that answer, among
    the frames from index ``since`` on."""
    at = next(i for i in range(since, len(c.frames)) if c.frames[i] is acc)
    return [
        (f["seq"], f["kind"]) for f in c.frames[since:at] if f.get("seq") is not None and f["seq"] >= acc["data"]["seq"]
    ]


async def test_a_forwarded_frames_answer_comes_before_every_event_it_caused(pair: tuple[Daemon, Daemon]) -> None:
    """The answer first (docs/api.md §5.4) on a replica that forwards: the answer comes back
    over the bus, the events through the store, and the events wait for the answer. The
    race is made likely without any hook: while a flood turn streams, B reads the thread's
    new events back to back, so a prompt's own event (committed on A before A answers) is
    often read by B before A's answer reaches B."""
    a, b = pair
    tid = (await new_thread(a, "sj"))["id"]
    on_a = await a.ws(tid)
    await on_a.turn("start")  # A runs the agent and holds the lease
    await on_a.close()  # (a client that stops reading would hold up A's shutdown)
    on_b = await b.ws(tid)
    answered = 0
    for i in range(ANSWER_ROUNDS):
        last = None
        for j, text in enumerate(["flood 3000", *(f"fast {i}.{k}" for k in range(QUEUED))]):
            since = len(on_b.frames)
            acc = await on_b.prompt(text)
            assert acc["kind"] == "client.accepted" and acc["data"]["duplicate"] is False, acc
            assert early_events(on_b, acc, since) == [], f"round {i}, prompt {j}: events before their answer"
            answered += acc["data"]["queued"] is True
            last = acc
        assert last is not None
        end = await on_b.kind("turn.ended", turn_id=last["data"]["turn_id"])
        assert end["data"]["status"] == "success"
    assert answered >= ANSWER_ROUNDS  # prompts were queued behind a streaming turn
    assert await metric(b, "agent_bridge_forwarded_total") >= ANSWER_ROUNDS * (QUEUED + 1)


LOAD_THREADS = 100


async def test_load_a_hundred_threads_across_two_replicas_each_watched_from_both(
    pair: tuple[Daemon, Daemon],
) -> None:
    """100 threads, half made (and so run) on each replica, each with one client on A and
    one on B; every thread gets a turn prompted from the replica that does not run it.
    Every pair of clients receives exactly the same events in the same order."""
    a, b = pair
    made = await asyncio.gather(*(new_thread(a if i % 2 else b, "sj") for i in range(LOAD_THREADS)))
    holders = [a if i % 2 else b for i in range(LOAD_THREADS)]
    clients = await asyncio.gather(*(d.ws(t["id"]) for t in made for d in (a, b)))
    pairs = [(clients[2 * i], clients[2 * i + 1]) for i in range(LOAD_THREADS)]

    async def drive(i: int) -> None:
        on_a, on_b = pairs[i]
        here, there = (on_a, on_b) if holders[i] is a else (on_b, on_a)
        first = await here.turn(f"first {i}")  # started by the replica that made it
        await there.upto(first["seq"])
        end = await there.turn(f"second {i}")  # forwarded to it
        await here.upto(end["seq"])
        assert events(on_a, end["seq"]) == events(on_b, end["seq"])
        assert [s for s, _, _ in events(on_a, end["seq"])] == list(range(1, end["seq"] + 1))
        assert any(f"echo: second {i}" in str(f.get("data")) for f in on_a.frames)

    loop = asyncio.get_running_loop()
    began = loop.time()
    await asyncio.wait_for(asyncio.gather(*(drive(i) for i in range(LOAD_THREADS))), 100)
    took = loop.time() - began
    cluster = await get(a, "/v1/cluster")
    held = {r["replica_id"]: r["threads"] for r in cluster["replicas"]}
    assert held == {"a": LOAD_THREADS // 2, "b": LOAD_THREADS // 2}, held
    print(f"\n{LOAD_THREADS} threads x 2 turns x 2 replicas: {took:.1f} s")
