"""A hostile agent floods its stderr (issue #36: bounded by memory, not by luck). The daemon
reads all of it — a pipe left full would block the agent — but relays at most 50 lines a
second into the transcript, each cut to 4 KiB, says how much it dropped, and its own memory
does not grow with what the agent wrote. Another thread's turns go on meanwhile."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from conftest import STEP_TIMEOUT, new_thread, profile_toml

from bridge.process.agent_process import STDERR_LINE_BYTES, STDERR_LINES_PER_S

FLOOD_MIB = 96


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS line")


async def test_a_stderr_flood_is_read_rate_limited_and_costs_the_daemon_no_memory(
    daemon_factory: Any, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(profile_toml("noisy", "stream-json", agent_env))
    a, b = await new_thread(d, "noisy"), await new_thread(d, "noisy")
    ca, cb = await d.ws(a["id"]), await d.ws(b["id"])
    assert (await ca.turn("hello"))["data"]["status"] == "success"  # both agents up and warm
    assert (await cb.turn("hello"))["data"]["status"] == "success"
    before = rss_mib(d.pid)
    peak = before

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, rss_mib(d.pid))
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    started = time.monotonic()
    try:
        acc = await ca.prompt(f"stderr flood {FLOOD_MIB}")
        assert acc["kind"] == "client.accepted", acc
        # The other thread is served while the flood is read.
        assert (await cb.turn("hello while it floods"))["data"]["status"] == "success"
        ended = await ca.kind("turn.ended", timeout=STEP_TIMEOUT * 2, turn_id=acc["data"]["turn_id"])
        assert ended["data"]["status"] == "success"
        assert ca.seen("message", text="stderr flood done") or any(
            "stderr flood done" in str(f.get("data")) for f in ca.frames
        )
    finally:
        sampler.cancel()
    elapsed = time.monotonic() - started
    print(f"\nstderr flood: {FLOOD_MIB} MiB in {elapsed:.2f} s; daemon RSS {before:.1f} -> peak {peak:.1f} MiB")
    lines = [f["data"]["text"] for f in ca.seen("diagnostic", stream="stderr")]
    # At most the rate per started second, plus the "dropping" and "N dropped" markers.
    assert len(lines) <= (STDERR_LINES_PER_S + 2) * (int(elapsed) + 2), (len(lines), elapsed)
    assert any("stderr rate limit of" in t for t in lines), lines[:5]
    assert all(len(t) <= STDERR_LINE_BYTES + len(" …[cut]") for t in lines)
    # ~96 MiB went through the daemon; it may keep some buffers, never the flood.
    assert peak - before < 32, (before, peak)
    async with asyncio.timeout(STEP_TIMEOUT):  # the drop count is said when the agent stops
        async with d.http() as http:
            assert (await http.post(f"/v1/threads/{a['id']}/stop")).status_code in (200, 202)
        await ca.kind("process.exited")
    texts = [f["data"]["text"] for f in ca.seen("diagnostic")]
    assert any(t.endswith("stderr lines dropped: rate limit]") for t in texts)
