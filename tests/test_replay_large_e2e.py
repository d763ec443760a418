"""A replay goes past events larger than a page (issue #34 item 7).

A transcript page stops at the event that brings it to PAGE_BYTES (4 MiB), so a page
holding one large prompt is short by count without being the end of the transcript.
Every reader that pages through the transcript must read on after such a page: the
WebSocket replay (events mode, coalesced too), the SSE stream, the compacted history and
the REST pages. Before the fix the WebSocket and SSE replays stopped after the first
large prompt and waited for live events that were already stored, and the history of a
restarted daemon ended there.

A real daemon with a real agent, restarted before the reads so that everything comes
from the store, as in the report (which had twelve prompts of 8 MiB; one of 3 MiB, whose
stored envelope holds its text twice, is enough to fill a page).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import websockets
from conftest import Daemon, base_config, new_thread

from bridge.store.base import PAGE_BYTES

pytestmark = pytest.mark.timeout(120)

REPLAY_DEADLINE = 10.0  # silence that counts as a stall: the whole replay takes well under a second
BIG = 3 * 1024 * 1024  # characters: text plus the line written to the agent > PAGE_BYTES


@pytest.fixture(params=["sqlite", "postgresql"])
def store_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """The daemon's store: the default SQLite file, or a fresh database on the test
    PostgreSQL server (its pages are measured and read by statements of their own)."""
    if request.param == "sqlite":
        return {}
    return {"AGENT_BRIDGE_STORE_URL": request.getfixturevalue("pg_url"), "AGENT_BRIDGE_REPLICA_ID": "a"}


async def _transcript_with_a_large_prompt(
    daemon_factory: Any, tmp_path: Any, agent_env: Any, store_env: dict[str, str]
) -> tuple[Daemon, str]:
    d = await daemon_factory(base_config(tmp_path, agent_env), extra_env=store_env)
    tid = (await new_thread(d, "stream-json"))["id"]
    c = await d.ws(tid)
    await c.turn("x" * BIG)
    await c.turn("a small one after it")
    await c.close()
    await d.stop()
    await d.start()  # a fresh daemon: the replay and the history come from the store
    return d, tid


async def _ws_seqs(d: Daemon, tid: str, query: str, last: int) -> list[int]:
    """The seqs a WebSocket replay with ``query`` sends, up to ``last`` or until it stalls
    (NDJSON frames split)."""
    seqs: list[int] = []
    async with websockets.connect(
        f"{d.ws_url}/v1/threads/{tid}/ws?{query}", additional_headers=d.headers, max_size=None
    ) as conn:
        while not seqs or seqs[-1] < last:
            try:
                text = await asyncio.wait_for(conn.recv(), REPLAY_DEADLINE)
            except TimeoutError:
                break
            seqs += [s for line in text.split("\n") if (s := json.loads(line).get("seq")) is not None]
    return seqs


async def _sse_ids(d: Daemon, tid: str, last: int) -> list[int]:
    """The event ids the SSE stream sends from ``after=0``, up to ``last`` or until it stalls."""
    ids: list[int] = []
    async with d.http() as http, http.stream("GET", f"/v1/threads/{tid}/events/stream?after=0") as r:
        lines = r.aiter_lines()
        while not ids or ids[-1] < last:
            try:
                line = await asyncio.wait_for(anext(lines), REPLAY_DEADLINE)
            except TimeoutError:
                break
            if line.startswith("id: "):
                ids.append(int(line[4:]))
    return ids


async def test_a_replay_from_a_fresh_daemon_goes_past_a_prompt_larger_than_a_page(
    daemon_factory: Any, tmp_path: Any, agent_env: Any, store_env: dict[str, str]
) -> None:
    d, tid = await _transcript_with_a_large_prompt(daemon_factory, tmp_path, agent_env, store_env)
    got: dict[str, Any] = {}
    async with d.http() as http:
        last = (await http.get(f"/v1/threads/{tid}")).json()["last_seq"]
        everything = list(range(1, last + 1))
        page = (await http.get(f"/v1/threads/{tid}/events", params={"after": 0})).json()["events"]
        assert [e["seq"] for e in page] == [1, 2] and len(json.dumps(page[1])) > PAGE_BYTES  # cut by bytes
        # The REST pages: paging on by ``after`` covers all.
        seen: list[int] = []
        while page := (await http.get(f"/v1/threads/{tid}/events", params={"after": len(seen)})).json()["events"]:
            seen += [e["seq"] for e in page]
        got["rest pages"] = seen
        # The compacted history of a daemon that has not read it yet reaches the newest seq.
        got["history last_seq"] = (await http.get(f"/v1/threads/{tid}/history")).json()["last_seq"]

    # The WebSocket replay, one envelope a frame and coalesced; the SSE stream.
    got["ws"] = await _ws_seqs(d, tid, "after=0", last)
    got["ws coalesce=1"] = await _ws_seqs(d, tid, "after=0&coalesce=1", last)
    got["sse"] = await _sse_ids(d, tid, last)
    want = {"rest pages": everything, "history last_seq": last, "ws": everything, "ws coalesce=1": everything}
    want["sse"] = everything
    wrong = {
        k: (v if isinstance(v, int) else f"{len(v)} events, the last {v[-1:]}") for k, v in got.items() if v != want[k]
    }
    assert not wrong, f"of seqs 1..{last}: {wrong}"
