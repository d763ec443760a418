"""WebSocket query options beyond mode and after (docs/api.md §5.1)."""

from __future__ import annotations

import json
from typing import Any

import websockets
from conftest import STEP_TIMEOUT, new_thread


async def test_omit_raw_gives_envelopes_without_raw_live_and_in_replay(daemon: Any) -> None:
    """Hardening II: an 8 MiB prompt is a 16 MiB frame with raw; a client with a smaller
    frame limit asks for envelopes without it."""
    thread = await new_thread(daemon, "stream-json")
    url = f"{daemon.ws_url}/v1/threads/{thread['id']}/ws"
    text = "p" * (2 * 1024 * 1024)
    async with daemon.http() as http:
        r = await http.post(f"/v1/threads/{thread['id']}/messages", json={"text": text})
        assert r.status_code == 202
    limit = 3 * 1024 * 1024  # below text + raw (> 4 MiB), above the text alone
    async with websockets.connect(
        url + "?omit_raw=1", additional_headers=daemon.headers, max_size=limit, open_timeout=STEP_TIMEOUT
    ) as lean:
        frames: list[dict[str, Any]] = []
        while not frames or frames[-1]["kind"] != "turn.ended":
            frames.append(json.loads(await lean.recv()))
        prompt = next(f for f in frames if f["kind"] == "message" and f["source"] == "client")
        assert prompt["data"]["text"] == text and prompt["raw"] is None
        assert all(f["raw"] is None for f in frames)
    async with websockets.connect(
        url, additional_headers=daemon.headers, max_size=None, open_timeout=STEP_TIMEOUT
    ) as full:
        first = json.loads(await full.recv())
        while first["kind"] != "message":
            first = json.loads(await full.recv())
        assert first["raw"]["message"]["content"][0]["text"] == text
    async with websockets.connect(url + "?omit_raw=yes", additional_headers=daemon.headers) as bad:
        await bad.wait_closed()
        assert bad.close_code == 4400
