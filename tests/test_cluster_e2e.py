"""Two daemons sharing one PostgreSQL and one Redis (issue #18, the part built so far): a
thread created on one is listed and read on the other, the other's server-wide change
stream (GET /v1/events) hears of it through the bus, GET /v1/cluster lists both replicas,
and with Redis stopped the change still arrives (the stream polls the shared store) and
readiness reports the bus without failing; Redis back, the bus reconnects by itself."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import STEP_TIMEOUT, Daemon, new_thread, processes_with_environ, wait_until
from test_events_e2e import sse_changes

from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.timeout(120)


@contextlib.asynccontextmanager
async def replica_pair(
    tmp_path: Path, shared: dict[str, str], agent_toml: str, server: str, marker: str, executable: str
) -> AsyncIterator[tuple[Daemon, Daemon]]:
    """Replicas a and b of one service (``shared``: the store and bus URLs), each with
    ``server`` in its [server] table and a 6 s lease; on the way out both are stopped and no
    agent (its ``marker`` in the environment, ``executable`` on its command line) outlives them."""
    started: list[Daemon] = []
    try:
        for rid in ("a", "b"):
            (tmp_path / rid).mkdir()
            config = f"[server]\n{server}[cluster]\nlease_ttl_s = 6\n\n{agent_toml}"
            d = Daemon(tmp_path / rid, config, extra_env={**shared, "AGENT_BRIDGE_REPLICA_ID": rid})
            await d.start()
            started.append(d)
        yield started[0], started[1]
    finally:
        for d in started:
            for c in d.clients:
                await c.conn.close()
            if d.proc is not None and d.proc.returncode is None:
                await d.stop()
    await wait_until(lambda: not processes_with_environ(marker.encode(), executable), what="agents to exit")


@pytest.fixture
async def replicas(pg_url: str, redis_server: RedisServer, tmp_path: Path) -> AsyncIterator[tuple[Daemon, Daemon]]:
    env = {"AGENT_BRIDGE_STORE_URL": pg_url, "AGENT_BRIDGE_BUS_URL": redis_server.url}
    started: list[Daemon] = []
    try:
        for rid in ("a", "b"):
            (tmp_path / rid).mkdir()
            d = Daemon(
                tmp_path / rid, "[cluster]\nlease_ttl_s = 3\n", extra_env={**env, "AGENT_BRIDGE_REPLICA_ID": rid}
            )
            await d.start()
            started.append(d)
        yield started[0], started[1]
    finally:
        for d in started:
            if d.proc is not None and d.proc.returncode is None:
                await d.stop()


async def get(d: Daemon, path: str) -> Any:
    async with d.http() as http:
        r = await http.get(path)
        assert r.status_code == 200, r.text
        return r.json()


async def metric(d: Daemon, name: str) -> float:
    async with d.http() as http:
        text = (await http.get("/metrics")).text
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


async def bus_state(d: Daemon) -> str:
    async with d.http() as http:
        r = await http.get("/readyz")
        assert r.status_code == 200, r.text  # the bus never fails readiness
        return str(r.json()["bus"])


async def test_a_thread_made_on_one_replica_is_seen_on_the_other_through_the_bus_and_without_it(
    replicas: tuple[Daemon, Daemon], redis_server: RedisServer
) -> None:
    a, b = replicas
    async with sse_changes(b) as changes:
        assert (await changes.next())["kind"] == "ready"
        thread = await new_thread(a, "demo", title="made on a")
        created = await changes.thread(thread["id"])
        assert created["kind"] == "thread.created" and created["thread"]["title"] == "made on a"
        # The shared store: B lists and reads what A made.
        assert thread["id"] in [t["id"] for t in (await get(b, "/v1/threads"))["threads"]]
        assert (await get(b, f"/v1/threads/{thread['id']}"))["title"] == "made on a"
        assert await metric(b, "agent_bridge_bus_received_total") >= 1  # woken by the bus
        assert await metric(b, "agent_bridge_bus_healthy") == 1

        cluster = await get(a, "/v1/cluster")
        assert cluster["replica_id"] == "a" and cluster["bus"] == {"configured": True, "healthy": True}
        seen = {r["replica_id"]: r for r in cluster["replicas"]}
        assert set(seen) == {"a", "b"} and all(r["on_bus"] for r in seen.values())
        assert all(r["heartbeat_age_s"] < 30 for r in seen.values())

        # Redis down: readiness says so and stays 200; changes still arrive (polling).
        redis_server.stop()
        for d in (a, b):
            await wait_until_bus(d, "down")
        second = await new_thread(a, "demo", title="while redis was down")
        assert (await changes.thread(second["id"], timeout=STEP_TIMEOUT))["kind"] == "thread.created"
        assert (await get(a, "/v1/cluster"))["bus"]["healthy"] is False

        # Redis back: both reconnect by themselves and wake-ups flow again.
        redis_server.start()
        for d in (a, b):
            await wait_until_bus(d, "ok")
        before = await metric(b, "agent_bridge_bus_received_total")
        third = await new_thread(a, "demo", title="after redis came back")
        assert (await changes.thread(third["id"]))["kind"] == "thread.created"
        await wait_until_metric_above(b, "agent_bridge_bus_received_total", before)
        assert await metric(b, "agent_bridge_bus_reconnects_total") >= 1


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll an HTTP-visible condition until it holds; fail after STEP_TIMEOUT."""
    loop = asyncio.get_running_loop()
    end = loop.time() + STEP_TIMEOUT
    while not await check():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def wait_until_bus(d: Daemon, want: str) -> None:
    async def check() -> bool:
        return await bus_state(d) == want

    await eventually(check, f"bus {want} on {d.url}")


async def wait_until_metric_above(d: Daemon, name: str, value: float) -> None:
    async def check() -> bool:
        return await metric(d, name) > value

    await eventually(check, f"{name} above {value} on {d.url}")
