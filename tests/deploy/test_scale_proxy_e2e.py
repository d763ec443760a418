"""The scale-out form of deploy/compose run as local processes: two replicas sharing a real
PostgreSQL and Redis behind Caddy with deploy/compose/Caddyfile.scale (adapted to JSON, with
only its admin endpoint turned off and its listener put on a free loopback port). Through
the proxy: both replicas answer, the sticky cookie keeps a client on one, a thread runs a
turn over a proxied WebSocket while the proxied SSE change stream hears of it, and once its
replica drains (SIGTERM) the proxy sends the same client to the survivor, which serves the
same transcript from the shared store and runs the thread's next turn, its agent resuming
its session from the shared HOME."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from conftest import STEP_TIMEOUT, TOKEN, Client, Daemon
from test_events_e2e import sse_changes

from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.timeout(150)

ROOT = Path(__file__).resolve().parents[2]
CADDYFILE = ROOT / "deploy" / "compose" / "Caddyfile.scale"
COOKIE = "agent_bridge_replica"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def caddy_env(tmp: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp), "XDG_DATA_HOME": str(tmp), "XDG_CONFIG_HOME": str(tmp)}


def adapted(caddy: str, tmp: Path, port: int, upstreams: list[str]) -> dict[str, Any]:
    """Caddyfile.scale as Caddy's JSON, for a plain-HTTP site on ``port`` in front of
    ``upstreams``; the admin endpoint off (tests run side by side), the listener on loopback."""
    env = {
        **caddy_env(tmp),
        "BRIDGE_HOSTNAME": f"http://127.0.0.1:{port}",
        "BRIDGE_UPSTREAMS": " ".join(upstreams),
    }
    r = subprocess.run(
        [caddy, "adapt", "--adapter", "caddyfile", "--config", str(CADDYFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    config: dict[str, Any] = json.loads(r.stdout)
    (server,) = config["apps"]["http"]["servers"].values()
    assert server["listen"] == [f":{port}"], server["listen"]
    server["listen"] = [f"127.0.0.1:{port}"]
    config["admin"] = {"disabled": True}
    return config


@contextlib.contextmanager
def running_caddy(caddy: str, tmp: Path, config: dict[str, Any]) -> Iterator[subprocess.Popen[bytes]]:
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "caddy.json"
    path.write_text(json.dumps(config))
    log = (tmp / "caddy.log").open("wb")
    proc = subprocess.Popen(
        [caddy, "run", "--config", str(path)], stdout=log, stderr=subprocess.STDOUT, env=caddy_env(tmp)
    )
    log.close()
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Front:
    """A client of the proxy: the token, and the sticky cookie once the proxy has set one."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.cookie: str | None = None

    def headers(self, *, sticky: bool = True) -> dict[str, str]:
        h = {"Authorization": f"Bearer {TOKEN}"}
        if sticky and self.cookie:
            h["Cookie"] = f"{COOKIE}={self.cookie}"
        return h

    async def request(self, method: str, path: str, *, sticky: bool = True, **kw: Any) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.url, timeout=STEP_TIMEOUT) as http:
            r = await http.request(method, path, headers=self.headers(sticky=sticky), **kw)
        if sticky and COOKIE in r.cookies:
            self.cookie = r.cookies[COOKIE]
        return r

    async def replica(self, *, sticky: bool = True) -> str:
        r = await self.request("GET", "/v1/cluster", sticky=sticky)
        assert r.status_code == 200, r.text
        return str(r.json()["replica_id"])

    async def ws(self, thread_id: str, *, after: int | None = None) -> Client:
        q = "" if after is None else f"?after={after}"
        conn = await websockets.connect(
            f"{self.url.replace('http://', 'ws://', 1)}/v1/threads/{thread_id}/ws{q}",
            additional_headers=self.headers(),
            max_size=None,
            open_timeout=STEP_TIMEOUT,
        )
        return Client(conn)


async def wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + STEP_TIMEOUT
    while True:
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        if proc.poll() is not None or loop.time() > end:
            raise AssertionError(f"caddy did not listen on {port}: {log.read_text(errors='replace')[-2000:]}")
        await asyncio.sleep(0.05)


@pytest.fixture
async def replicas(
    pg_url: str, redis_server: RedisServer, tmp_path: Path
) -> AsyncIterator[tuple[dict[str, Daemon], int]]:
    """Replicas "a" and "b" on one store and bus, and the port the proxy will listen on
    (their allowed Host; "localhost" is Caddy's health check's)."""
    port = free_port()
    env = {
        "AGENT_BRIDGE_STORE_URL": pg_url,
        "AGENT_BRIDGE_BUS_URL": redis_server.url,
        "AGENT_BRIDGE_ALLOWED_HOSTS": f"127.0.0.1:{port},localhost",
        "AGENT_BRIDGE_TRUST_PROXY_HEADERS": "true",
        "HOME": str(tmp_path / "home"),  # one HOME for both, as the shared volume is
    }
    (tmp_path / "home").mkdir()
    started: dict[str, Daemon] = {}
    try:
        for rid in ("a", "b"):
            # Each its own data dir, but with the shared volume's two mounts in it, as in
            # compose.scale.yaml: the default cwd and the demo agent's sessions.
            (tmp_path / rid / "data").mkdir(parents=True, mode=0o700)
            for name in ("workspaces", "demo-agent"):
                (tmp_path / "shared" / name).mkdir(parents=True, exist_ok=True)
                (tmp_path / rid / "data" / name).symlink_to(tmp_path / "shared" / name)
            d = Daemon(
                tmp_path / rid, "[cluster]\nlease_ttl_s = 3\n", extra_env={**env, "AGENT_BRIDGE_REPLICA_ID": rid}
            )
            await d.start()
            started[rid] = d
        yield started, port
    finally:
        for d in started.values():
            if d.proc is not None and d.proc.returncode is None:
                await d.stop()


async def test_two_replicas_behind_caddy_serve_websocket_and_sse_and_survive_a_drain(
    replicas: tuple[dict[str, Daemon], int], tmp_path: Path
) -> None:
    caddy = shutil.which("caddy", path="/usr/bin:/usr/sbin:/bin")
    if caddy is None:
        pytest.skip("caddy is not installed (Debian package caddy; scripts/test installs it)")
    daemons, port = replicas
    upstreams = [d.url.removeprefix("http://") for d in daemons.values()]
    with running_caddy(caddy, tmp_path / "caddy", adapted(caddy, tmp_path, port, upstreams)) as proc:
        await wait_for_port(port, proc, tmp_path / "caddy" / "caddy.log")
        front = Front(f"http://127.0.0.1:{port}")

        # Both replicas are behind the proxy: cookieless requests reach each of them.
        seen: set[str] = set()
        loop = asyncio.get_running_loop()
        end = loop.time() + STEP_TIMEOUT
        while seen != {"a", "b"}:
            assert loop.time() < end, f"only {seen} answered through the proxy"
            seen.add(await front.replica(sticky=False))

        # The cookie pins a client to one replica.
        r = await front.request("POST", "/v1/threads", json={"agent": "demo", "title": "through caddy"})
        assert r.status_code == 201, r.text
        tid = r.json()["id"]
        assert front.cookie, "the proxy set its sticky cookie"
        pinned = {await front.replica() for _ in range(6)}
        assert len(pinned) == 1, pinned
        (home,) = pinned

        # A turn over the proxied WebSocket; the proxied SSE stream hears of the thread.
        (tmp_path / "front").mkdir()
        fake = Daemon(tmp_path / "front", "")  # only its url and token: sse_changes reads them
        fake.url, fake.token = front.url, TOKEN
        async with sse_changes(fake, headers=front.headers()) as changes:
            assert (await changes.next())["kind"] == "ready"  # flushed at once, not buffered
            c = await front.ws(tid, after=0)
            end_frame = await c.turn("hello through the proxy")
            assert end_frame["data"]["status"] == "success", end_frame
            change = await changes.thread(tid)
            assert change["thread"]["id"] == tid
            await c.close()
        before = [(f["seq"], f["kind"]) for f in c.frames if f.get("seq") is not None]
        assert [s for s, _ in before] == list(range(1, len(before) + 1)), before

        # The pinned replica drains; the same client is sent to the survivor, which serves
        # the thread and its transcript from the shared store.
        assert await daemons[home].stop(signal.SIGTERM) == 0
        other = ({"a", "b"} - {home}).pop()
        assert await front.replica() == other
        r = await front.request("GET", f"/v1/threads/{tid}")
        assert r.status_code == 200 and r.json()["title"] == "through caddy", r.text
        c2 = await front.ws(tid, after=0)
        await c2.upto(before[-1][0])
        again = [(f["seq"], f["kind"]) for f in c2.frames if f.get("seq") is not None]
        assert again[: len(before)] == before
        # And it runs the thread's next turn: the drained replica gave its lease back, and
        # the agent resumes its own session from the shared HOME.
        end_frame = await c2.turn("what did I say?")
        assert end_frame["data"]["status"] == "success", end_frame
        reply = [f for f in c2.seen("message", role="assistant") if f["source"] == "agent"][-1]
        assert "hello through the proxy" in reply["data"]["text"]
        await c2.close()
    assert proc.returncode is not None  # caddy is gone
