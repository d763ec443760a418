"""The bus between replicas under faults (issue #35, D1), with two real daemons, one
PostgreSQL, one Redis and a 3 s lease: replica "a" runs a thread (a long turn streaming),
a client of replica "b" watches it, and b's clients send it input.

* Redis frozen (SIGSTOP) past every socket timeout, then thawed (SIGCONT): input sent to b
  for a's thread is refused at once with a retryable 503 while the bus is down (never the
  30 s forwarding timeout), b's client keeps getting a's events about every second, and
  within seconds of the thaw b forwards input to a again — no restart of anything.
* Only a's link to Redis stalls (a proxy that stops passing bytes), while b's bus is fine:
  b reads a's threads from the store every second (a holds leases but has no heartbeat on
  the bus), input for them is refused quickly because a is alive by its lease but not on
  the bus, and once the link flows again input reaches a within seconds.

Every test prints what it measured (pytest -s)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import pytest
from conftest import Client, Daemon, new_thread, wait_until

from tests.cluster import test_takeover_e2e as takeover
from tests.cluster.test_takeover_e2e import Cluster, check_consistent, metric, post_prompt, start_long_turn, transcript
from tests.support.redis_server import RedisServer

cluster = takeover.cluster  # its fixture: two replicas on one PostgreSQL and one Redis, a 3 s lease

pytestmark = pytest.mark.timeout(120)

FREEZE_S = 7.0  # past the bus's socket timeout (3 s) and its stall bound (2.5 s), like the fault run's 6 s
NOTICE_S = 4.5  # a replica's bus has noticed a stall by then (stall bound, one read slice, the poll)
FAST_S = 6.0  # a refusal while the bus is down comes at least this fast (the forwarding timeout is 30 s)
RECOVER_S = 8.0  # input is forwarded again this soon after the thaw (measured: about 1-3 s)
LAG_S = 2.0  # a's events reach b's client this soon while b cannot hear a on the bus (1 s polls)


class StallingLink:
    """A TCP proxy in front of Redis that can stall: while stalled it passes no byte either
    way and connections stay open — a frozen path, as a dropped network would be."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for w in self._writers:
            w.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.append(writer)
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers.append(up_w)
        await asyncio.gather(self._pipe(reader, up_w), self._pipe(up_r, writer), return_exceptions=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self.flowing.wait()
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()


@pytest.fixture
async def link(redis_server: RedisServer) -> AsyncIterator[StallingLink]:
    proxy = StallingLink(redis_server.port)
    await proxy.start()
    try:
        yield proxy
    finally:
        proxy.flowing.set()
        await proxy.close()


async def record_arrivals(c: Client, into: dict[int, float]) -> None:
    """When each transcript event reached the client (the test's clock)."""
    loop = asyncio.get_running_loop()
    while True:
        f = await c.next(lambda f: f.get("seq") is not None, timeout=3600)  # until cancelled
        into.setdefault(f["seq"], loop.time())


async def stop_recording(task: asyncio.Task[None]) -> None:
    """Cancel a recorder, waiting a bounded time for it to end: a receive cancelled inside
    the WebSocket library is not waited for forever (the test reads that client next)."""
    task.cancel()
    await asyncio.wait({task}, timeout=5)


async def refused_fast(b: Daemon, tid: str, client_id: str) -> float:
    """A prompt sent to b for a's thread while the bus cannot carry it: a quick, retryable
    503 ``bus_unavailable``; how long the refusal took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    r = await post_prompt(b, tid, "hello", client_id)
    took = loop.time() - start
    assert r.status_code == 503 and r.json()["error"]["code"] == "bus_unavailable", r.text
    assert r.headers.get("Retry-After") == "2", r.headers
    assert took < FAST_S, f"refused only after {took:.1f} s"
    return took


async def forwarded_again(b: Daemon, tid: str, client_id: str) -> float:
    """Prompt b until a (the holder) accepts the input through the bus; refusals meanwhile
    must be the quick retryable ones. How long it took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        t = loop.time()
        r = await post_prompt(b, tid, "hello again", client_id)
        if r.status_code == 202:
            assert r.json()["queued"] is True, r.text  # a's long turn runs: queued there
            return loop.time() - start
        assert r.status_code == 503 and r.json()["error"]["code"] == "bus_unavailable", r.text
        assert loop.time() - t < FAST_S
        assert loop.time() - start < RECOVER_S, f"not forwarded within {RECOVER_S} s: {r.text}"
        await asyncio.sleep(0.2)


async def worst_lag(on_a: dict[int, float], on_b: dict[int, float], since: float, until: float) -> float:
    """The longest an event that a's client got in [since, until] took to reach b's client."""
    window = [seq for seq, t in on_a.items() if since <= t <= until]
    assert len(window) >= 10, f"too few events in the window: {len(window)}"
    await wait_until(lambda: all(seq in on_b for seq in window), what="b's client to get every event a's got")
    return max(on_b[seq] - on_a[seq] for seq in window)


async def watched(
    a: Daemon, b: Daemon
) -> tuple[str, str, Client, Client, list[asyncio.Task[None]], dict[int, float], dict[int, float]]:
    tid = (await new_thread(a, "stream-json"))["id"]
    c, turn_id, _native = await start_long_turn(a, tid)  # 12 s of deltas from a
    watcher = await b.ws(tid, after=0)
    on_a: dict[int, float] = {}
    on_b: dict[int, float] = {}
    tasks = [asyncio.create_task(record_arrivals(c, on_a)), asyncio.create_task(record_arrivals(watcher, on_b))]
    return tid, turn_id, c, watcher, tasks, on_a, on_b


async def settled(
    b: Daemon, tid: str, turn_id: str, watcher: Client, tasks: list[asyncio.Task[None]], on_a: dict[int, float]
) -> None:
    """The long turn ends; what b's client saw is the stored transcript, gapless."""
    await stop_recording(tasks[1])  # b's client is read here from now on
    # (the recorder may already have read past it)
    seen = [f for f in watcher.frames if f.get("kind") == "turn.ended" and f["data"].get("turn_id") == turn_id]
    ended = seen[0] if seen else await watcher.kind("turn.ended", turn_id=turn_id, timeout=30)
    # a's client is read to the end too (a client with unread frames cannot close cleanly)
    await wait_until(lambda: ended["seq"] in on_a, what="a's client to see the turn end")
    await stop_recording(tasks[0])
    stored = await transcript(b, tid)
    check_consistent(stored, [f for f in watcher.frames if f.get("seq")], turn_id)


async def test_a_frozen_redis_refuses_input_fast_and_forwarding_resumes_after_the_thaw(
    cluster: Cluster, redis_server: RedisServer
) -> None:
    a = await cluster.start("a")
    b = await cluster.start("b")
    tid, turn_id, _c, watcher, tasks, on_a, on_b = await watched(a, b)
    assert redis_server.proc is not None
    loop = asyncio.get_running_loop()
    os.kill(redis_server.proc.pid, signal.SIGSTOP)
    frozen = loop.time()
    try:
        took = await refused_fast(b, tid, "during-freeze")
        await asyncio.sleep(max(0.0, FREEZE_S - (loop.time() - frozen)))
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
    thawed = loop.time()
    back = await forwarded_again(b, tid, "after-thaw")
    lag = await worst_lag(on_a, on_b, frozen + NOTICE_S, thawed)
    print(
        f"\nfrozen {thawed - frozen:.1f} s: refused in {took:.2f} s, lag <= {lag:.2f} s, forwarded {back:.2f} s after"
    )
    assert lag <= LAG_S, f"a's events reached b's client up to {lag:.2f} s late while the bus was down"
    assert await metric(a, "agent_bridge_bus_healthy") == 1 and await metric(b, "agent_bridge_bus_healthy") == 1
    await settled(b, tid, turn_id, watcher, tasks, on_a)


async def test_a_replica_cut_off_from_redis_is_followed_from_the_store_and_reached_again(
    cluster: Cluster, link: StallingLink
) -> None:
    direct = cluster.env["AGENT_BRIDGE_BUS_URL"]
    cluster.env["AGENT_BRIDGE_BUS_URL"] = link.url  # only a's bus goes through the link
    a = await cluster.start("a")
    cluster.env["AGENT_BRIDGE_BUS_URL"] = direct
    b = await cluster.start("b")
    tid, turn_id, _c, watcher, tasks, on_a, on_b = await watched(a, b)
    loop = asyncio.get_running_loop()
    link.flowing.clear()
    stalled = loop.time()
    try:
        await asyncio.sleep(NOTICE_S)  # a notices, and its heartbeat on the bus runs out (3 s)
        took = await refused_fast(b, tid, "during-stall")  # a renews its lease: alive, not on the bus
        await asyncio.sleep(max(0.0, FREEZE_S - (loop.time() - stalled)))
        assert await metric(b, "agent_bridge_bus_healthy") == 1  # b's own bus was fine all along
    finally:
        link.flowing.set()
    flowing = loop.time()
    back = await forwarded_again(b, tid, "after-stall")
    lag = await worst_lag(on_a, on_b, stalled + NOTICE_S, flowing)
    print(f"\ncut {flowing - stalled:.1f} s: refused in {took:.2f} s, lag <= {lag:.2f} s, forwarded {back:.2f} s after")
    assert lag <= LAG_S, f"a's events reached b's client up to {lag:.2f} s late while a was off the bus"
    await settled(b, tid, turn_id, watcher, tasks, on_a)
