"""Batched WebSocket sends (issue #8, api/ws_transport.py): a burst of agent output leaves
as many frames per socket write, with or without permessage-deflate, and every client
still gets every frame intact, once, in order — in events mode and in raw mode."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import websockets
from conftest import STEP_TIMEOUT, base_config, new_thread

from bridge.api.ws_transport import PROTOCOL

N = 3000


def test_the_daemon_runs_the_batching_protocol_with_this_uvicorn() -> None:
    # Without it the daemon still works, one socket write per frame: this test is the
    # alarm that a uvicorn upgrade moved the class it extends.
    assert PROTOCOL is not None


@pytest.mark.parametrize("compression", ["deflate", None])
async def test_a_burst_reaches_every_client_whole_once_and_in_order(
    daemon_factory: Any, tmp_path: Any, agent_env: dict[str, str], compression: str | None
) -> None:
    server = 'ws_compression = "on"\n' if compression else ""
    daemon = await daemon_factory(base_config(tmp_path, agent_env, server=server))
    thread = await new_thread(daemon, "stream-json")
    tid = thread["id"]
    url = f"{daemon.ws_url}/v1/threads/{tid}/ws"
    events = await websockets.connect(
        url, additional_headers=daemon.headers, max_size=None, compression=compression, open_timeout=STEP_TIMEOUT
    )
    raw = await websockets.connect(
        url + "?mode=raw",
        additional_headers=daemon.headers,
        max_size=None,
        compression=compression,
        open_timeout=STEP_TIMEOUT,
    )
    try:
        negotiated = events.response.headers.get("Sec-WebSocket-Extensions") or ""
        assert ("permessage-deflate" in negotiated) == (compression is not None)
        await events.send(json.dumps({"op": "prompt", "text": f"flood {N}"}))
        frames: list[dict[str, Any]] = []
        while not frames or frames[-1].get("kind") != "turn.ended":
            frames.append(json.loads(await events.recv(decode=True)))
        seqs = [f["seq"] for f in frames if f["seq"] is not None]
        assert seqs == list(range(1, seqs[-1] + 1))
        deltas = [f["data"]["text"] for f in frames if f["kind"] == "message.delta"]
        assert deltas == [f"{i} " for i in range(N)]
        # Raw mode: exactly the agent's lines, one frame each, byte for byte as stored.
        lines: list[str] = []
        while not lines or json.loads(lines[-1]).get("type") != "result":
            lines.append(await raw.recv(decode=True))
        agent_raw = [f["raw"] for f in frames if f["source"] == "agent" and f["raw"] is not None]
        assert [json.loads(line) for line in lines] == agent_raw[-len(lines) :]
        assert sum(1 for line in lines if json.loads(line).get("type") == "stream_event") == N
    finally:
        await events.close()
        await raw.close()


async def test_answers_to_a_client_that_does_not_read_are_never_dropped_and_keep_their_order(daemon: Any) -> None:
    # Answers wait in the subscriber (fanout.Subscriber.replies) to leave with whatever else
    # is ready; beyond REPLY_LIMIT of them the daemon stops reading this client's frames
    # until they are out. None is dropped, none overtakes another.
    thread = await new_thread(daemon, "stream-json")
    url = f"{daemon.ws_url}/v1/threads/{thread['id']}/ws"
    ws = await websockets.connect(url, additional_headers=daemon.headers, open_timeout=STEP_TIMEOUT)
    try:
        n = 300
        for i in range(n):  # sent without reading a single answer
            op = "nope" if i % 3 == 2 else "interrupt"
            await ws.send(json.dumps({"op": op, "client_id": f"c{i}"}))
        answers: list[dict[str, Any]] = []
        while len(answers) < n:
            frame = json.loads(await asyncio.wait_for(ws.recv(), STEP_TIMEOUT))
            if frame["kind"] in ("client.accepted", "client.rejected"):
                answers.append(frame)
        assert [a["data"]["client_id"] for a in answers] == [f"c{i}" for i in range(n)]
        assert [a["kind"] for a in answers] == [
            "client.rejected" if i % 3 == 2 else "client.accepted" for i in range(n)
        ]
        assert all(a["data"]["code"] == "unknown_op" for a in answers if a["kind"] == "client.rejected")
    finally:
        await ws.close()


async def test_compression_is_not_negotiated_on_a_loopback_bind_by_default(daemon: Any) -> None:
    """Hardening II: per-client deflate cost a normal client 6x beside 50 stalled ones."""
    thread = await new_thread(daemon, "stream-json")
    ws = await websockets.connect(
        f"{daemon.ws_url}/v1/threads/{thread['id']}/ws",
        additional_headers=daemon.headers,
        compression="deflate",
        open_timeout=STEP_TIMEOUT,
    )
    try:
        assert "permessage-deflate" not in (ws.response.headers.get("Sec-WebSocket-Extensions") or "")
    finally:
        await ws.close()
