"""Clients are told the truth while PostgreSQL is down (issue #35 item 3): a real daemon on
a PostgreSQL server of the test's own, which is stopped and started again.

While the store cannot be read, a WebSocket to a thread (one this daemon has loaded, and
one it has never seen) is closed 1013 ``store_unavailable`` after a ``store_unavailable``
notice, never 4404 "no such thread" or a silent 1000; the change stream's WebSocket is
closed 1013 too; REST and long-poll answer 503 ``store_unavailable`` with ``Retry-After``;
an SSE stream is refused 503 or ends with ``event: close`` reason ``store_unavailable``.
Once the store is back the same WebSocket replays the whole transcript."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import websockets
from conftest import STEP_TIMEOUT, Daemon

pytestmark = pytest.mark.timeout(90)


async def frames_until_close(d: Daemon, path: str) -> tuple[list[dict[str, Any]], int | None, str]:
    """Every frame a fresh WebSocket on ``path`` gets, then its close code and reason."""
    frames: list[dict[str, Any]] = []
    async with asyncio.timeout(STEP_TIMEOUT):
        async with websockets.connect(f"{d.ws_url}{path}", additional_headers=d.headers) as ws:
            try:
                async for text in ws:
                    frames.append(json.loads(text))
            except websockets.ConnectionClosed:
                pass
            assert ws.close_code is not None, "the daemon never closed the WebSocket"
            return frames, ws.close_code, ws.close_reason or ""


async def test_clients_opened_during_a_store_outage_are_told_store_unavailable(
    own_postgres: Any, daemon_factory: Any
) -> None:
    env = {"AGENT_BRIDGE_STORE_URL": own_postgres.create_database("outage"), "AGENT_BRIDGE_REPLICA_ID": "a"}
    d = await daemon_factory("", extra_env=env)
    async with d.http() as http:
        tid = (await http.post("/v1/threads", json={})).json()["id"]
    c = await d.ws(tid)
    await c.turn("hello")
    await c.close()
    stored = [f for f in c.frames if f.get("seq")]

    await asyncio.to_thread(own_postgres.stop)
    for path in (f"/v1/threads/{tid}/ws", "/v1/threads/thr_never_seen_here/ws"):
        frames, code, reason = await frames_until_close(d, path)
        assert (code, reason) == (1013, "store_unavailable"), (path, code, reason, frames)
        notices = [f for f in frames if f.get("kind") == "notice"]
        assert [n["data"]["code"] for n in notices] == ["store_unavailable"], frames
        assert notices[0]["seq"] is None
    _, code, reason = await frames_until_close(d, f"/v1/threads/{tid}/ws?mode=raw")
    assert (code, reason) == (1013, "store_unavailable")  # raw mode: the close alone
    _, code, reason = await frames_until_close(d, "/v1/ws")
    assert (code, reason) == (1013, "store_unavailable")

    async with d.http() as http:
        r = await http.get(f"/v1/threads/{tid}/events", params={"after": 0, "wait": 1})
        assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable", r.text
        assert r.headers["retry-after"] == "2"
        r = await http.get("/v1/threads/thr_never_seen_here/events")
        assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable", r.text
        async with http.stream("GET", f"/v1/threads/{tid}/events/stream") as sse:
            body = (await sse.aread()).decode()
            if sse.status_code == 200:  # the thread was loaded: the replay failed, and said so
                assert 'event: close\ndata: {"reason":"store_unavailable"}' in body, body
            else:
                assert sse.status_code == 503 and "store_unavailable" in body, body
        async with http.stream("GET", "/v1/events") as sse:
            body = (await sse.aread()).decode()
            assert 'event: close\ndata: {"reason":"store_unavailable"}' in body, body

    await asyncio.to_thread(own_postgres.start_server)
    loop = asyncio.get_running_loop()
    end = loop.time() + STEP_TIMEOUT
    while True:  # the pool reconnects by itself; then the same WebSocket replays everything
        frames, code, _ = await frames_until_close_or_replay(d, tid, len(stored))
        if code is None:
            break
        assert code == 1013 and loop.time() < end, (code, frames)
        await asyncio.sleep(0.2)
    assert [(f["seq"], f["kind"]) for f in frames[: len(stored)]] == [(f["seq"], f["kind"]) for f in stored]


async def frames_until_close_or_replay(d: Daemon, tid: str, count: int) -> tuple[list[dict[str, Any]], int | None, str]:
    """The first ``count`` transcript frames of a replay (close code None), or the close."""
    frames: list[dict[str, Any]] = []
    async with asyncio.timeout(STEP_TIMEOUT):
        async with websockets.connect(f"{d.ws_url}/v1/threads/{tid}/ws?after=0", additional_headers=d.headers) as ws:
            try:
                async for text in ws:
                    frame = json.loads(text)
                    if frame.get("seq"):
                        frames.append(frame)
                    if len(frames) >= count:
                        return frames, None, ""
            except websockets.ConnectionClosed:
                pass
            return frames, ws.close_code, ws.close_reason or ""
