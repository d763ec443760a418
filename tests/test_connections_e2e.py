"""Unauthenticated exhaustion (issue #15 item 3), through real daemons: request headers
must arrive in time, open connections are bounded (silent ones are evicted first, so a
client that sends its request keeps being served), the open-files limit is raised at
start, and repeated accept() errors are logged once per interval."""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import sys
from pathlib import Path
from typing import Any

import httpx
from conftest import STEP_TIMEOUT, TOKEN, base_config, new_thread

from bridge.connections import FD_PER_AGENT, FD_RESERVE, MIN_CONNECTIONS, connection_limit
from bridge.logs import RateLimit

LIMIT = 64
HEADER_TIMEOUT_S = 1.0


def server(header_timeout_s: float = HEADER_TIMEOUT_S) -> str:
    return f"max_connections = {LIMIT}\nheader_timeout_s = {header_timeout_s}\nbody_timeout_s = {HEADER_TIMEOUT_S}\n"


async def raw_connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


async def closed_by_server(reader: asyncio.StreamReader, within_s: float) -> bool:
    try:
        data = await asyncio.wait_for(reader.read(65536), within_s)
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return data == b""


async def test_connections_whose_headers_or_body_do_not_arrive_are_closed(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(base_config(tmp_path, agent_env, server=server()))
    host = d.url.removeprefix("http://")
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    partial = [
        b"",  # silent
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n",  # headers never finished
        b"GET /v1/threads HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a",  # slowloris
        # a WebSocket upgrade that never completes
        b"GET /v1/threads/x/ws HTTP/1.1\r\nHost: " + host.encode() + b"\r\nUpgrade: websocket\r\n",
        # a body that never arrives (authenticated, so it would be read)
        b"POST /v1/threads HTTP/1.1\r\nHost: "
        + host.encode()
        + b"\r\n"
        + auth
        + b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{",
    ]
    conns = [await raw_connect(d.url) for _ in range(3 * len(partial))]
    for i, (_r, w) in enumerate(conns):
        w.write(partial[i % len(partial)])
        await w.drain()
    try:
        results = await asyncio.gather(*(closed_by_server(r, HEADER_TIMEOUT_S + 4) for r, _w in conns))
        assert all(results), results
    finally:
        for _r, w in conns:
            w.close()
    async with d.http() as http:  # and a prompt request is still served
        assert (await http.get("/healthz")).status_code == 200


async def test_a_flood_of_silent_connections_neither_exhausts_nor_locks_out_clients(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(base_config(tmp_path, agent_env, server=server(30)))
    assert d.proc is not None
    thread = await new_thread(d, "stream-json")
    ws = await d.ws(thread["id"])  # an authenticated client connected before the flood
    flood = []
    try:
        for _ in range(4 * LIMIT):
            flood.append(await raw_connect(d.url))
        for _ in range(10):
            # New connections, each with a complete request: served, within bounded time.
            async with httpx.AsyncClient(
                base_url=d.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5.0
            ) as http:
                assert (await http.get("/v1/threads")).status_code == 200
        end = await ws.turn("during the flood")
        assert end["data"]["status"] == "success"
        fds = len(os.listdir(f"/proc/{d.proc.pid}/fd"))
        assert fds < LIMIT + 64, f"{fds} descriptors open with a connection limit of {LIMIT}"
        # Most of the flood was closed by the server to make room.
        closed = await asyncio.gather(*(closed_by_server(r, 0.5) for r, _w in flood))
        assert sum(closed) >= len(flood) - LIMIT, sum(closed)
    finally:
        for _r, w in flood:
            w.close()


async def test_kept_alive_refused_requests_do_not_lock_out_clients(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(base_config(tmp_path, agent_env, server=server(30)))
    host = d.url.removeprefix("http://").encode()
    flood = []
    try:
        for _ in range(2 * LIMIT):
            r, w = await raw_connect(d.url)
            # A complete request without credentials: answered 401, then kept alive.
            w.write(b"GET /v1/threads HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
            await w.drain()
            flood.append((r, w))
            try:
                head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), STEP_TIMEOUT)
            except (asyncio.IncompleteReadError, ConnectionError):
                continue  # closed to make room (or refused): what the flood gets
            assert head.startswith(b"HTTP/1.1 401"), head
        for _ in range(10):
            async with httpx.AsyncClient(
                base_url=d.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5.0
            ) as http:
                assert (await http.get("/v1/threads")).status_code == 200
    finally:
        for _r, w in flood:
            w.close()


async def test_the_soft_open_files_limit_is_raised_to_the_hard_one(tmp_path: Path) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(256, hard)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_BRIDGE_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bridge",
        "serve",
        "--port",
        "0",
        "--no-auth",
        "--data-dir",
        str(tmp_path / "data"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=env,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard)),
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), STEP_TIMEOUT)
        assert line.startswith(b"agent-bridge listening"), line
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        (row,) = [r for r in limits.splitlines() if r.startswith("Max open files")]
        soft_now = row.split()[3]
        assert soft_now == (str(hard) if hard != resource.RLIM_INFINITY else "1048576"), row
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), STEP_TIMEOUT)


def test_connection_limit_stays_below_the_descriptors_agents_need() -> None:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    room = soft - FD_RESERVE - FD_PER_AGENT * 64
    assert connection_limit(10**9, 64) == max(MIN_CONNECTIONS, room)
    assert connection_limit(100, 64) == min(100, max(MIN_CONNECTIONS, room))
    assert connection_limit(100, 10**9) == MIN_CONNECTIONS


def test_accept_errors_are_logged_once_per_interval() -> None:
    f = RateLimit(interval_s=3600)
    mk = lambda msg: logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, (), None)  # noqa: E731
    first = mk("socket.accept() out of system resource\nsocket: %s")
    assert f.filter(first)
    assert not any(f.filter(mk("socket.accept() out of system resource\nsocket: %s")) for _ in range(4000))
    assert f.filter(mk("something else"))  # other messages are never held back
    f.interval_s = 0
    again = mk("socket.accept() out of system resource\nsocket: %s")
    assert f.filter(again) and "4000 more like this" in str(again.msg)
