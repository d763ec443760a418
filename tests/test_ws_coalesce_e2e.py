"""``?coalesce=1`` on the thread WebSocket (docs/api.md §5.1, issue #22): a backlog leaves
as NDJSON lines in few text frames, each line complete, at most 64 KiB a frame; split on
newlines, a coalescing client gets exactly what a plain client gets, live and in replay, in
raw mode and in events mode. A plain client still gets one line per frame."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import websockets
from conftest import STEP_TIMEOUT, new_thread

from bridge.api.ws_coalesce import COALESCE_BYTES

N = 3000


async def _frames_until(ws: Any, done: Any) -> list[str]:
    frames: list[str] = []
    while not frames or not done(frames[-1].rsplit("\n", 1)[-1]):
        frames.append(await asyncio.wait_for(ws.recv(decode=True), STEP_TIMEOUT))
    return frames


def _turn_ended(line: str) -> bool:
    return json.loads(line).get("kind") == "turn.ended"


def _result(line: str) -> bool:
    return json.loads(line).get("type") == "result"


def _lines(frames: list[str]) -> list[str]:
    return [line for frame in frames for line in frame.split("\n")]


def _check_bounded(frames: list[str]) -> None:
    for frame in frames:
        assert "\n" not in frame or len(frame.encode()) <= COALESCE_BYTES
        assert all(line and json.loads(line) is not None for line in frame.split("\n"))


@pytest.mark.parametrize("mode", ["events", "raw"])
async def test_a_burst_arrives_coalesced_whole_once_and_in_order(daemon: Any, mode: str) -> None:
    thread = await new_thread(daemon, "stream-json")
    url = f"{daemon.ws_url}/v1/threads/{thread['id']}/ws?mode={mode}"
    connect = {"additional_headers": daemon.headers, "max_size": None, "open_timeout": STEP_TIMEOUT}
    async with websockets.connect(url, **connect) as plain, websockets.connect(url + "&coalesce=1", **connect) as co:
        if mode == "raw":
            await plain.send(json.dumps({"type": "user", "message": {"role": "user", "content": f"flood {N}"}}))
            done = _result
        else:
            await plain.send(json.dumps({"op": "prompt", "text": f"flood {N}", "client_id": "c1"}))
            done = _turn_ended
        plain_frames = await _frames_until(plain, done)
        co_frames = await _frames_until(co, done)
    # The plain client: one line per frame, exactly as before coalescing existed.
    assert all("\n" not in frame for frame in plain_frames)
    # The coalescing one: the same lines, split back exactly, in fewer frames (how many
    # lines a read of the agent's stdout brings varies; the agent writes far faster than
    # the daemon relays, so its reads bring many).
    co_lines = _lines(co_frames)
    if mode == "events":  # the answer to the plain client's prompt is for it alone
        plain_frames = [f for f in plain_frames if json.loads(f)["seq"] is not None]
    assert co_lines == plain_frames
    assert len(co_frames) < len(co_lines) // 2
    _check_bounded(co_frames)
    if mode == "events":
        seqs = [json.loads(line)["seq"] for line in co_lines]
        assert seqs == list(range(1, seqs[-1] + 1))
        deltas = [json.loads(line)["data"]["text"] for line in co_lines if '"kind":"message.delta"' in line]
        assert deltas == [f"{i} " for i in range(N)]
    else:
        assert sum(1 for line in co_lines if json.loads(line)["type"] == "stream_event") == N


@pytest.mark.parametrize("mode", ["events", "raw"])
async def test_a_replay_arrives_coalesced_and_bounded(daemon: Any, mode: str) -> None:
    """Store pages (joined straight from the stored rows) coalesce too; a line over the
    bound (an envelope of a 100 KB prompt) is a frame of its own."""
    thread = await new_thread(daemon, "stream-json")
    url = f"{daemon.ws_url}/v1/threads/{thread['id']}/ws?mode={mode}"
    connect = {"additional_headers": daemon.headers, "max_size": None, "open_timeout": STEP_TIMEOUT}
    big = "b" * 100_000
    async with websockets.connect(f"{daemon.ws_url}/v1/threads/{thread['id']}/ws", **connect) as ws:
        for text in (big, f"flood {N}"):
            await ws.send(json.dumps({"op": "prompt", "text": text}))
            await _frames_until(ws, _turn_ended)
    done = _result if mode == "raw" else _turn_ended
    async with websockets.connect(url, **connect) as plain:
        plain_frames = await _frames_until(plain, lambda line: done(line) and "flooded" in line)
    async with websockets.connect(url + "&coalesce=1", **connect) as co:
        co_frames = await _frames_until(co, lambda line: done(line) and "flooded" in line)
    assert all("\n" not in frame for frame in plain_frames)
    assert _lines(co_frames) == plain_frames
    assert len(co_frames) < len(plain_frames) // 10
    _check_bounded(co_frames)
    alone = [f for f in co_frames if len(f.encode()) > COALESCE_BYTES]
    assert alone and all("\n" not in f for f in alone)  # _check_bounded: each one line
    if mode == "events":
        assert any(json.loads(f)["source"] == "client" and json.loads(f)["data"]["text"] == big for f in alone)


async def test_coalesce_takes_0_or_1(daemon: Any) -> None:
    thread = await new_thread(daemon, "stream-json")
    url = f"{daemon.ws_url}/v1/threads/{thread['id']}/ws?coalesce=yes"
    async with websockets.connect(url, additional_headers=daemon.headers, open_timeout=STEP_TIMEOUT) as bad:
        await bad.wait_closed()
        assert bad.close_code == 4400
