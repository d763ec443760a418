"""The server-wide change stream end to end: a real daemon, real agents (the bundled demo
and the fake stream-json agent asking permission), real SSE and WebSocket clients.

Nothing sleeps to wait for a condition: tests wait on frames (with timeouts)."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from conftest import STEP_TIMEOUT, TOKEN, Daemon, new_thread, profile_toml
from test_transport_e2e import SSE

Frame = dict[str, Any]


def cfg(env: dict[str, str]) -> str:
    return "[server]\nstop_grace_s = 1\n" + profile_toml("sj", "stream-json", env, permission_prompts=True)


class Changes:
    """A change stream's frames (SSE or WebSocket), each checked against its envelope."""

    def __init__(self, sse: SSE | None = None, ws: Any = None) -> None:
        self.sse, self.ws = sse, ws
        self.frames: list[Frame] = []
        self._next = 0

    async def _read(self, timeout: float) -> Frame:
        if self.ws is not None:
            frame: Frame = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        else:
            assert self.sse is not None
            ev = await self.sse.next_event(timeout)
            assert ev is not None, "the stream ended"
            if ev["event"] == "close":
                frame = {"kind": "close", **json.loads(ev["data"] or "{}")}
            else:
                frame = json.loads(ev["data"] or "")
                # The SSE envelope: id is the cursor (what Last-Event-ID resumes from), event the kind.
                assert ev["id"] == str(frame["cursor"]) and ev["event"] == frame["kind"], ev
        self.frames.append(frame)
        return frame

    async def next(self, pred: Callable[[Frame], bool] = lambda f: True, timeout: float = STEP_TIMEOUT) -> Frame:
        """The next frame (after the last one matched) satisfying ``pred``."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            while self._next < len(self.frames):
                frame = self.frames[self._next]
                self._next += 1
                if pred(frame):
                    return frame
            left = end - loop.time()
            if left <= 0:
                raise AssertionError(f"no matching change within {timeout}s; saw {self.frames}")
            try:
                await self._read(left)
            except TimeoutError:
                raise AssertionError(f"no matching change within {timeout}s; saw {self.frames}") from None

    async def thread(self, tid: str, timeout: float = STEP_TIMEOUT, **want: Any) -> Frame:
        """The next change of thread ``tid`` whose thread object has the fields ``want``."""
        return await self.next(
            lambda f: f.get("thread", {}).get("id") == tid and all(f["thread"].get(k) == v for k, v in want.items()),
            timeout,
        )

    def cursors(self) -> list[int]:
        return [f["cursor"] for f in self.frames if "cursor" in f]


@asynccontextmanager
async def sse_changes(
    d: Daemon,
    *,
    since: int | None = None,
    last_event_id: int | None = None,
    headers: dict[str, str] | None = None,
    auth: bool = True,
) -> AsyncIterator[Changes]:
    params = {"since": since} if since is not None else {}
    hdrs = {**(d.headers if auth else {}), **(headers or {})}
    if last_event_id is not None:
        hdrs["Last-Event-ID"] = str(last_event_id)
    async with (
        httpx.AsyncClient(base_url=d.url, timeout=httpx.Timeout(STEP_TIMEOUT, read=None)) as http,
        http.stream("GET", "/v1/events", params=params, headers=hdrs) as r,
    ):
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"].startswith("text/event-stream")
        yield Changes(sse=SSE(r))


@asynccontextmanager
async def ws_changes(d: Daemon, *, since: int | None = None, **kw: Any) -> AsyncIterator[Changes]:
    q = f"?since={since}" if since is not None else ""
    kw.setdefault("additional_headers", d.headers)
    async with websockets.connect(f"{d.ws_url}/v1/ws{q}", open_timeout=STEP_TIMEOUT, **kw) as conn:
        yield Changes(ws=conn)


async def get_thread(d: Daemon, tid: str) -> dict[str, Any]:
    async with d.http() as http:
        r = await http.get(f"/v1/threads/{tid}")
        assert r.status_code == 200, r.text
        return dict(r.json())


async def test_a_client_sees_threads_created_updated_through_turns_and_permissions_and_deleted(
    daemon_factory: Any, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(cfg(agent_env))
    async with sse_changes(d) as ch:
        ready = await ch.next()
        assert ready == {"cursor": 0, "kind": "ready"}  # no since: from now on
        assert ch.sse is not None and ch.sse.retry == [2000]
        demo = await new_thread(d, "demo", title="demo")
        created = await ch.thread(demo["id"])
        assert created["kind"] == "thread.created" and created["thread"] == await get_thread(d, demo["id"])
        assert created["thread"]["pending_permissions"] == 0 and created["thread"]["state"] == "idle"

        # A turn: the process starts, the turn is active while the reply streams, then ends.
        c = await d.ws(demo["id"])
        acc = await c.prompt("slow")
        active = await ch.thread(demo["id"], turn_active=True)
        assert active["kind"] == "thread.updated" and active["thread"]["state"] == "running"
        await c.send(op="interrupt")
        await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
        last = c.seqs()[-1]
        done = await ch.thread(demo["id"], turn_active=False, last_seq=last)
        assert done["thread"] == await get_thread(d, demo["id"])

        # A permission request: the count goes up while it waits and down once answered.
        sj = await new_thread(d, "sj")
        a = await d.ws(sj["id"])
        await a.prompt("ask")
        req = await a.kind("permission.requested")
        waiting = await ch.thread(sj["id"], pending_permissions=1)
        # Counted in the commit that stored the request.
        assert waiting["thread"]["last_seq"] >= req["seq"] and waiting["kind"] == "thread.updated"
        await a.send(op="permission", request_id=req["data"]["request_id"], decision="allow")
        await a.kind("turn.ended")
        await ch.thread(sj["id"], pending_permissions=0)

        async with d.http() as http:
            for t in (demo, sj):
                assert (await http.delete(f"/v1/threads/{t['id']}")).status_code == 204
        for t in (demo, sj):
            gone = await ch.next(lambda f, tid=t["id"]: f["kind"] == "thread.deleted" and f["thread"]["id"] == tid)
            assert set(gone["thread"]) == {"id", "deleted_at"}
        cursors = ch.cursors()
        assert cursors == sorted(set(cursors)), cursors  # strictly increasing


async def test_a_reconnect_with_the_last_cursor_misses_nothing_and_repeats_nothing(
    daemon_factory: Any, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(cfg(agent_env))
    async with sse_changes(d) as always:  # connected throughout: sees every change
        await always.next()
        one = await new_thread(d, "demo", title="one")
        async with sse_changes(d) as b:
            await b.next()
            two = await new_thread(d, "demo", title="two")
            seen = await b.thread(two["id"])
        cut = seen["cursor"]
        # While b is away: changes to a thread it knows, one it never saw, and a deletion.
        three = await new_thread(d, "demo", title="three")
        async with d.http() as http:
            for title in ("one-a", "one-b", "one-c"):
                await http.patch(f"/v1/threads/{one['id']}", json={"title": title})
            await http.delete(f"/v1/threads/{two['id']}")
            await http.patch(f"/v1/threads/{three['id']}", json={"title": "three-a"})
        await always.thread(three["id"], title="three-a")
        latest = always.frames[-1]["cursor"]
        missed: dict[str, Frame] = {}  # each thread's newest change after the cut
        for f in always.frames:
            if f.get("cursor", 0) > cut and "thread" in f:
                missed[f["thread"]["id"]] = f

        # An EventSource reconnects with Last-Event-ID: it wins over ?since=.
        async with sse_changes(d, since=0, last_event_id=cut) as back:
            assert await back.next() == {"cursor": cut, "kind": "ready"}
            await back.next(lambda f: f["cursor"] == latest)
            got = back.frames[1:]
            assert all(f["cursor"] > cut for f in got)  # nothing repeated
            assert [f["cursor"] for f in got] == sorted({f["cursor"] for f in got})
            # One entry per thread: its newest state at its newest cursor, exactly what the
            # connected client ended with (the kind is relative to the reader's cursor).
            by_id = {f["thread"]["id"]: f for f in got}
            assert len(got) == len(missed) == 3
            assert {k: (f["cursor"], f["thread"]) for k, f in by_id.items()} == {
                k: (f["cursor"], f["thread"]) for k, f in missed.items()
            }
            assert by_id[two["id"]]["kind"] == "thread.deleted"
            assert by_id[three["id"]]["kind"] == "thread.created"  # created after the cut
            assert by_id[one["id"]]["kind"] == "thread.updated"
            assert by_id[one["id"]]["thread"]["title"] == "one-c"

        # At the newest cursor: nothing but ready, and then the next change.
        async with sse_changes(d, since=latest) as again:
            assert await again.next() == {"cursor": latest, "kind": "ready"}
            four = await new_thread(d, "demo", title="four")
            nxt = await again.next()
            assert nxt["kind"] == "thread.created" and nxt["thread"]["id"] == four["id"]


async def test_a_cursor_the_store_cannot_serve_gets_one_resync_then_changes(
    daemon_factory: Any, agent_env: dict[str, str], tmp_path: Path
) -> None:
    d = await daemon_factory(cfg(agent_env))
    for title in ("a", "b", "c"):
        await new_thread(d, "demo", title=title)
    assert await d.stop() == 0
    # As after tombstones were pruned: cursors below 2 can no longer be served.
    db = sqlite3.connect(d.data_dir / "bridge.db")
    db.execute("UPDATE change_log SET horizon = 2")
    db.commit()
    db.close()
    d = await daemon_factory(cfg(agent_env))
    async with sse_changes(d, since=1) as old, ws_changes(d, since=99) as ahead, sse_changes(d, since=2) as edge:
        assert await old.next() == {"cursor": 3, "kind": "resync", "reason": "cursor_expired"}
        assert await ahead.next() == {"cursor": 3, "kind": "resync", "reason": "cursor_unknown"}
        assert await edge.next() == {"cursor": 2, "kind": "ready"}
        assert (await edge.next())["thread"]["title"] == "c"
        t = await new_thread(d, "demo", title="after")
        for ch in (old, ahead, edge):
            frame = await ch.next()
            assert frame["kind"] == "thread.created" and frame["thread"]["id"] == t["id"] and frame["cursor"] == 4


async def test_the_websocket_carries_the_same_frames_as_sse(daemon_factory: Any, agent_env: dict[str, str]) -> None:
    d = await daemon_factory(cfg(agent_env))
    subprotocol = {"additional_headers": {}, "subprotocols": ["agent-bridge.v1", f"bearer.{TOKEN}"]}
    async with sse_changes(d, since=0) as s, ws_changes(d, since=0) as w, ws_changes(d, **subprotocol) as browser:
        assert browser.ws.subprotocol == "agent-bridge.v1"
        assert await browser.next() == {"cursor": 0, "kind": "ready"}
        # Each step waits until every stream has seen the one before: a change log reports a
        # row's latest state, so a stream that reads late would see one change for two.
        t = await new_thread(d, "demo", title="x")
        for ch in (s, w, browser):
            await ch.next(lambda f: f["kind"] == "thread.created")
        async with d.http() as http:
            await http.patch(f"/v1/threads/{t['id']}", json={"title": "y"})
            for ch in (s, w, browser):
                await ch.next(lambda f: f["kind"] == "thread.updated")
            await http.delete(f"/v1/threads/{t['id']}")
        for ch in (s, w, browser):
            await ch.next(lambda f: f["kind"] == "thread.deleted")
        assert w.frames == s.frames
        assert browser.frames == s.frames
        assert [f["kind"] for f in s.frames] == ["ready", "thread.created", "thread.updated", "thread.deleted"]
    # A cursor that is not one: closed with 4400, as the thread WebSocket does.
    conn = await websockets.connect(
        f"{d.ws_url}/v1/ws?since=x1", additional_headers=d.headers, open_timeout=STEP_TIMEOUT
    )
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await asyncio.wait_for(conn.recv(), STEP_TIMEOUT)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4400


async def test_credentials_and_origin_are_checked_as_for_every_route(
    daemon_factory: Any, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(cfg(agent_env))
    async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as anon:
        r = await anon.get("/v1/events")
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        r = await anon.get("/v1/events", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        with pytest.raises(websockets.InvalidStatus) as exc:
            await websockets.connect(f"{d.ws_url}/v1/ws", additional_headers=headers, open_timeout=STEP_TIMEOUT)
        assert exc.value.response.status_code == 401
        assert json.loads(exc.value.response.body)["error"]["code"] == "unauthorized"
    # A page on another origin cannot open it, even with the token (cross-site hijacking).
    with pytest.raises(websockets.InvalidStatus) as exc:
        await websockets.connect(
            f"{d.ws_url}/v1/ws", additional_headers=d.headers, origin="http://evil.example", open_timeout=STEP_TIMEOUT
        )
    assert exc.value.response.status_code == 403
    assert json.loads(exc.value.response.body)["error"]["code"] == "origin_not_allowed"
    # The bundled page's session cookie works, from the daemon's own origin.
    async with d.http() as http:
        r = await http.post("/v1/session")
        assert r.status_code == 204, r.text
        cookie = {"Cookie": f"agent_bridge_session={r.cookies['agent_bridge_session']}"}
    async with ws_changes(d, additional_headers=cookie, origin=d.url) as page:
        assert (await page.next())["kind"] == "ready"
    async with sse_changes(d, headers=cookie, auth=False) as page_sse:
        assert (await page_sse.next())["kind"] == "ready"


async def test_a_daemon_that_stops_tells_its_change_streams(daemon_factory: Any, agent_env: dict[str, str]) -> None:
    d = await daemon_factory(cfg(agent_env))
    async with sse_changes(d) as s, ws_changes(d) as w:
        await s.next()
        await w.next()
        d.proc.send_signal(signal.SIGTERM)
        assert await s.next() == {"kind": "close", "reason": "daemon_shutdown"}
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(w.ws.recv(), STEP_TIMEOUT)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
        assert await asyncio.wait_for(d.proc.wait(), STEP_TIMEOUT) == 0
