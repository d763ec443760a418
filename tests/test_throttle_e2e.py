"""Wrong credentials throttle their source, never a valid credential (issue #32 B7,
docs/security.md §1), through a real daemon, real HTTP and WebSocket clients and the real
``agent-bridge status`` / ``login-link``. Every client here shares the loopback address
with the flood of wrong tokens, as every local process does.

Nothing sleeps: every step waits on an answer, with a deadline."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import websockets
from conftest import STEP_TIMEOUT, TOKEN, Daemon, base_config, bridge_cli, new_thread

FLOOD = 25  # wrong tokens; the daemon throttles after 20 within 60 s


async def flood(d: Daemon, n: int = FLOOD, **headers: str) -> list[int]:
    """``n`` wrong tokens from this (loopback) address; the statuses they got."""
    statuses = []
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as http:
        for i in range(n):
            r = await http.get("/v1/threads", headers={"Authorization": f"Bearer wrong-{i}", **headers})
            statuses.append(r.status_code)
    return statuses


async def wrong_token(d: Daemon, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as http:
        return await http.get("/v1/threads", headers={"Authorization": "Bearer not-the-token", **headers})


async def upgrade(d: Daemon, tid: str, token: str) -> tuple[int, dict[str, str]]:
    """A WebSocket upgrade by hand (to read a refusal's status and headers)."""
    port = urlsplit(d.url).port
    assert port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            (
                f"GET /v1/threads/{tid}/ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                f"Authorization: Bearer {token}\r\n\r\n"
            ).encode()
        )
        await writer.drain()
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), STEP_TIMEOUT)
    finally:
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), STEP_TIMEOUT)
    status_line, *lines = raw.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines if x)}
    return int(status_line.split()[1]), headers


async def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    return await bridge_cli(*args, env=env)


@pytest.fixture
def make(daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str]) -> Callable[..., Any]:
    async def start(extra: str = "", **kw: Any) -> Daemon:
        d: Daemon = await daemon_factory(base_config(tmp_path, agent_env) + extra, **kw)
        return d

    return start


# --------------------------------------------------------------------------- the valid credential


async def test_after_a_flood_of_wrong_tokens_the_valid_token_code_and_upgrade_still_pass(
    make: Callable[..., Any],
) -> None:
    d = await make()
    thread = await new_thread(d, "stream-json")
    assert await flood(d) == [401] * 20 + [429] * (FLOOD - 20)
    r = await wrong_token(d)
    assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_failures"
    assert 0 < int(r.headers["retry-after"]) <= 60
    # The valid token, from the same address: REST, a login code and its redemption.
    async with d.http() as http:
        assert (await http.get("/v1/threads")).status_code == 200
        minted = await http.post("/v1/login-codes")
        assert minted.status_code == 201, minted.text
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as browser:
        assert (await browser.post("/v1/session", json={"code": "guessed"})).status_code == 429
        signed_in = await browser.post("/v1/session", json={"code": minted.json()["code"]})
        assert signed_in.status_code == 204, signed_in.text
        assert (await browser.get("/v1/threads")).status_code == 200  # with the cookie
    # A WebSocket upgrade with the valid token (header and subprotocol); a wrong one is 429.
    client = await d.ws(thread["id"])
    await client.close()
    async with websockets.connect(
        f"{d.ws_url}/v1/threads/{thread['id']}/ws",
        subprotocols=[websockets.Subprotocol("agent-bridge.v1"), websockets.Subprotocol(f"bearer.{TOKEN}")],
        open_timeout=STEP_TIMEOUT,
    ) as ws:
        assert ws.subprotocol == "agent-bridge.v1"
    status, headers = await upgrade(d, thread["id"], "not-the-token")
    assert status == 429 and int(headers["retry-after"]) > 0
    status, _ = await upgrade(d, thread["id"], TOKEN)
    assert status == 101


# --------------------------------------------------------------------------- behind a proxy


async def test_behind_a_trusted_proxy_each_forwarded_client_is_throttled_on_its_own(make: Callable[..., Any]) -> None:
    d = await make('[auth]\nproxy_trusted = ["127.0.0.1/32"]\n')
    assert await flood(d, **{"X-Forwarded-For": "198.51.100.7"}) == [401] * 20 + [429] * (FLOOD - 20)
    assert (await wrong_token(d, **{"X-Forwarded-For": "198.51.100.7"})).status_code == 429
    assert (await wrong_token(d, **{"X-Forwarded-For": "198.51.100.8"})).status_code == 401
    # What a client writes itself stands left of what the proxy appends: not believed.
    spoofed = await wrong_token(d, **{"X-Forwarded-For": "198.51.100.8, 198.51.100.7"})
    assert spoofed.status_code == 429
    async with d.http() as http:
        assert (await http.get("/v1/threads", headers={"X-Forwarded-For": "198.51.100.7"})).status_code == 200


async def test_without_a_trusted_proxy_x_forwarded_for_is_not_read(make: Callable[..., Any]) -> None:
    d = await make()
    assert await flood(d, **{"X-Forwarded-For": "198.51.100.7"}) == [401] * 20 + [429] * (FLOOD - 20)
    # Another claimed client from the same peer is the same source.
    assert (await wrong_token(d, **{"X-Forwarded-For": "198.51.100.8"})).status_code == 429


# --------------------------------------------------------------------------- status, login-link


async def test_status_and_login_link_reach_a_throttled_daemon_with_the_token_file(make: Callable[..., Any]) -> None:
    d = await make(token=None)  # the token is in <data dir>/token, as status reads it
    assert await flood(d) == [401] * 20 + [429] * (FLOOD - 20)
    rc, out, err = await cli("status", "--data-dir", str(d.data_dir), "--json")
    st = json.loads(out)
    assert rc == 0 and st["state"] == "running" and st["throttled"] is False, (st, err)
    assert st["live_agents"] == 0 and st["pid"] == d.proc.pid  # type: ignore[union-attr]
    rc, out, err = await cli("login-link", "--data-dir", str(d.data_dir))
    assert rc == 0 and out.startswith(f"{d.url}/#login="), err
    code = out.strip().split("#login=", 1)[1]
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as browser:
        assert (await browser.post("/v1/session", json={"code": code})).status_code == 204


async def test_status_and_login_link_with_a_wrong_token_say_running_and_throttled(make: Callable[..., Any]) -> None:
    d = await make()  # --token: no token file; status and login-link use AGENT_BRIDGE_TOKEN
    assert await flood(d) == [401] * 20 + [429] * (FLOOD - 20)
    wrong = {"AGENT_BRIDGE_TOKEN": "a-stale-token"}
    rc, out, err = await cli("status", "--data-dir", str(d.data_dir), "--json", env=wrong)
    st = json.loads(out)
    assert rc == 0 and st["state"] == "running" and st["running"] is True, (st, err)
    assert st["throttled"] is True and 0 < st["retry_after_s"] <= 60 and "throttled" in st["detail"], st
    rc, out, _ = await cli("status", "--data-dir", str(d.data_dir), env=wrong)
    assert rc == 0 and out.startswith(f"running: pid {d.proc.pid}") and "throttled" in out, out  # type: ignore[union-attr]
    rc, out, err = await cli("login-link", "--data-dir", str(d.data_dir), env=wrong)
    assert rc == 2 and not out and "runs" in err and "throttled" in err and "no daemon" not in err, err
    # With the right token, from the same address, both work.
    rc, out, err = await cli("login-link", "--data-dir", str(d.data_dir), env={"AGENT_BRIDGE_TOKEN": TOKEN})
    assert rc == 0 and out.startswith(f"{d.url}/#login="), err
