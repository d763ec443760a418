"""REST and WebSocket surface through a real daemon (docs/api.md §4–5)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
import websockets.exceptions
from conftest import TOKEN, Daemon, agent_log, new_thread


async def test_health_and_readiness_need_no_auth(daemon: Daemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url) as anon:
        assert (await anon.get("/healthz")).json() == {"status": "ok"}
        assert (await anon.get("/readyz")).json() == {"status": "ok", "store": "ok", "bus": "none"}
        metrics = await anon.get("/metrics")
        assert metrics.status_code == 200 and "agent_bridge_live_agents 0" in metrics.text


async def test_v1_routes_need_the_token_and_leak_nothing(daemon: Daemon) -> None:
    thread = await new_thread(daemon, "stream-json", title="secret title")
    async with httpx.AsyncClient(base_url=daemon.url) as anon:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            r = await anon.get(f"/v1/threads/{thread['id']}", headers=headers)
            assert r.status_code == 401
            assert r.json()["error"]["code"] == "unauthorized"
            assert "secret title" not in r.text and thread["id"] not in r.text
        r = await anon.post("/v1/threads", json={"agent": "stream-json"})
        assert r.status_code == 401


async def test_websocket_auth_by_header_or_subprotocol(daemon: Daemon) -> None:
    thread = await new_thread(daemon, "stream-json")
    url = f"{daemon.ws_url}/v1/threads/{thread['id']}/ws"
    for kwargs in (
        {},
        {"subprotocols": ["agent-bridge.v1", "bearer.nope"]},
        {"additional_headers": {"Authorization": "Bearer nope"}},
    ):
        with pytest.raises(websockets.exceptions.InvalidStatus) as info:
            await websockets.connect(url, open_timeout=10, **kwargs)
        assert info.value.response.status_code == 401
    conn = await websockets.connect(url, subprotocols=["agent-bridge.v1", f"bearer.{TOKEN}"], open_timeout=10)
    assert conn.subprotocol == "agent-bridge.v1"
    await conn.send(json.dumps({"op": "prompt", "text": "via subprotocol"}))
    while True:
        frame = json.loads(await asyncio.wait_for(conn.recv(), 10))
        if frame["kind"] == "turn.ended":
            break
    assert frame["data"]["status"] == "success"
    await conn.close()


async def test_unknown_thread_is_404_over_rest_and_closes_the_websocket(daemon: Daemon) -> None:
    async with daemon.http() as http:
        r = await http.get("/v1/threads/thr_0000000000000000")
        assert r.status_code == 404 and r.json()["error"]["code"] == "thread_not_found"
        r = await http.post("/v1/threads/nonsense/messages", json={"text": "x"})
        assert r.status_code == 404
    with pytest.raises(websockets.exceptions.ConnectionClosed) as info:
        c = await daemon.ws("thr_0000000000000000")
        await asyncio.wait_for(c.conn.recv(), 10)
    assert info.value.rcvd is not None and info.value.rcvd.code == 4404


async def test_thread_listing_is_newest_activity_first_with_cursor_pages(daemon: Daemon) -> None:
    ids = [(await new_thread(daemon, "stream-json", title=f"t{i}"))["id"] for i in range(5)]
    async with daemon.http() as http:
        # Activity on the oldest thread moves it to the front.
        r = await http.post(f"/v1/threads/{ids[0]}/messages", json={"text": "bump"})
        assert r.status_code == 202
        listed: list[str] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 2}
            if cursor:
                params["cursor"] = cursor
            page = (await http.get("/v1/threads", params=params)).json()
            listed += [t["id"] for t in page["threads"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert listed == [ids[0], *reversed(ids[1:])]
        other = (await http.post("/v1/threads", json={"agent": "awp-jsonl"})).json()
        only = (await http.get("/v1/threads", params={"agent": "awp-jsonl"})).json()["threads"]
        assert [t["id"] for t in only] == [other["id"]]
        bad = await http.get("/v1/threads", params={"cursor": "!!not-a-cursor"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_cursor"
        r = await http.patch(f"/v1/threads/{ids[1]}", json={"title": "renamed"})
        assert r.status_code == 200 and r.json()["title"] == "renamed"
        assert (await http.get(f"/v1/threads/{ids[1]}")).json()["title"] == "renamed"
        r = await http.post(f"/v1/threads/{ids[0]}/interrupt")
        assert r.status_code == 202


async def test_create_thread_validates_agent_cwd_and_options(daemon: Daemon, tmp_path: Path) -> None:
    async with daemon.http() as http:
        cases = [
            ({"agent": "nope"}, 404, "agent_not_found"),
            ({"agent": "stream-json", "cwd": "relative/dir"}, 400, "bad_cwd"),
            ({"agent": "stream-json", "cwd": str(tmp_path / "missing")}, 400, "bad_cwd"),
            ({"agent": "stream-json", "options": {"shell": "bash"}}, 400, "unknown_option"),
            ({"agent": "stream-json", "options": {"permission_mode": "yolo"}}, 400, "invalid_option"),
            ({"agent": "stream-json", "surprise": 1}, 400, "invalid_request"),
        ]
        for body, status, code in cases:
            r = await http.post("/v1/threads", json=body)
            assert (r.status_code, r.json()["error"]["code"]) == (status, code), body
        r = await http.post(
            "/v1/threads", json={"agent": "stream-json", "cwd": str(tmp_path), "options": {"permission_mode": "plan"}}
        )
        assert r.status_code == 201 and r.json()["cwd"] == str(tmp_path)
        tid = r.json()["id"]
        r = await http.post(f"/v1/threads/{tid}/messages", json={"text": "hi"})
        assert r.status_code == 202
    await _wait_for_agent_start(tmp_path)
    start = next(e for e in agent_log(tmp_path) if e["event"] == "start")
    argv = start["argv"]
    assert argv[argv.index("--permission-mode") + 1] == "plan" and start["cwd"] == str(tmp_path)


async def _wait_for_agent_start(tmp_path: Path) -> None:
    from conftest import wait_until

    await wait_until(lambda: any(e["event"] == "start" for e in agent_log(tmp_path)), what="the agent to start")


async def test_bad_messages_are_refused_and_leave_the_transcript_intact(daemon: Daemon) -> None:
    thread = await new_thread(daemon, "stream-json")
    url = f"/v1/threads/{thread['id']}/messages"
    async with daemon.http() as http:
        bad = [
            {},
            {"text": ""},
            {"text": "a", "content": []},
            {"content": "str"},
            {"content": [{"type": "video"}]},
            {
                "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "not base64!"}}
                ]
            },
            {"content": [{"type": "image", "source": {"type": "url", "url": "http://x"}}]},
            {
                "content": [
                    {"type": "document", "source": {"type": "base64", "media_type": "application/x-sh", "data": "aGk="}}
                ]
            },
        ]
        for body in bad:
            r = await http.post(url, json=body)
            assert r.status_code == 400, body
            assert r.json()["error"]["code"] in ("invalid_content", "invalid_request")
        t = (await http.get(f"/v1/threads/{thread['id']}")).json()
        assert t["last_seq"] == 0 and t["state"] == "idle"
        good = {
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
            ]
        }
        r = await http.post(url, json=good)
        assert r.status_code == 202
        page = (await http.get(f"/v1/threads/{thread['id']}/events", params={"after": 0, "wait": 10})).json()
        assert page["events"][0]["kind"] in ("process.started", "message")


async def test_events_endpoint_pages_and_long_polls(daemon: Daemon) -> None:
    thread = await new_thread(daemon, "stream-json")
    base = f"/v1/threads/{thread['id']}/events"
    async with daemon.http() as http:
        empty = (await http.get(base, params={"after": 0})).json()
        assert empty == {"events": [], "last_seq": 0}
        poll = asyncio.create_task(http.get(base, params={"after": 0, "wait": 10}))
        await asyncio.sleep(0)  # let the long-poll start before anything happens
        r = await http.post(f"/v1/threads/{thread['id']}/messages", json={"text": "hello"})
        assert r.status_code == 202
        got = (await asyncio.wait_for(poll, 15)).json()
        assert got["events"] and got["events"][0]["seq"] == 1
        c = await daemon.ws(thread["id"])
        await c.kind("turn.ended")
        total = c.seqs()[-1]
        page1 = (await http.get(base, params={"after": 0, "limit": 3})).json()
        page2 = (await http.get(base, params={"after": 3, "limit": 1000})).json()
        seqs = [e["seq"] for e in page1["events"] + page2["events"]]
        assert seqs == list(range(1, total + 1)) and page2["last_seq"] >= total
        assert (await http.get(base, params={"after": -1})).status_code == 400
        assert (await http.get(base, params={"limit": 0})).status_code == 400
        await c.close()


async def test_delete_stops_the_agent_closes_clients_and_forgets_the_thread(daemon: Daemon) -> None:
    thread = await new_thread(daemon, "stream-json")
    c = await daemon.ws(thread["id"])
    await c.turn("hello")
    async with daemon.http() as http:
        r = await http.delete(f"/v1/threads/{thread['id']}")
        assert r.status_code == 204
        with pytest.raises(websockets.exceptions.ConnectionClosed) as info:
            while True:
                await asyncio.wait_for(c.conn.recv(), 10)
        assert info.value.rcvd is not None and info.value.rcvd.code == 4410
        assert (await http.get(f"/v1/threads/{thread['id']}")).status_code == 404
        assert (await http.get(f"/v1/threads/{thread['id']}/events")).status_code == 404
        assert (await http.delete(f"/v1/threads/{thread['id']}")).status_code == 404
    assert daemon.proc is not None
    from test_chat_e2e import children

    assert children(daemon.proc.pid) == []


async def test_resume_starts_the_agent_without_a_prompt(daemon: Daemon) -> None:
    thread = await new_thread(daemon, "awp-jsonl")
    async with daemon.http() as http:
        r = await http.post(f"/v1/threads/{thread['id']}/resume")
        assert r.status_code == 202 and r.json()["state"] == "running"
        again = await http.post(f"/v1/threads/{thread['id']}/resume")
        assert again.status_code == 202
        page = (await http.get(f"/v1/threads/{thread['id']}/events")).json()
        assert [e["kind"] for e in page["events"]] == ["process.started"]


async def test_unknown_ops_and_bad_frames_get_a_clear_rejection(daemon: Daemon) -> None:
    thread = await new_thread(daemon, "stream-json")
    c = await daemon.ws(thread["id"])
    for frame in (
        "not json",
        "[1]",
        json.dumps({"op": "dance"}),
        json.dumps({"op": "prompt"}),
        json.dumps({"op": "prompt", "text": "x", "client_id": 5}),
        json.dumps({"op": "raw", "message": "str"}),
    ):
        await c.conn.send(frame)
        got = await c.next(lambda f: f.get("kind") in ("client.rejected", "client.accepted"))
        assert got["kind"] == "client.rejected" and got["data"]["code"], frame
    await c.send(op="raw", message={"type": "keep_alive"})
    got = await c.next(lambda f: f.get("kind") in ("client.rejected", "client.accepted"))
    assert got["kind"] == "client.accepted" and got["data"]["op"] == "raw"
    await c.close()
