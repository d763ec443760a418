"""A long thread against short ones, in one run (issue #36 item 4): a row per operation —
the thread list, the thread itself, the history's first page (without a limit, with
limit=100 and limit=10), the history walked whole by pages, a WebSocket replay from 100
events before the end, and a turn (its append) — timed on a small thread, on "page" (a
thread just long enough, 12,000 events, to fill a whole first page of 1000 items) and on
a large one, printed as the ratios large ÷ small and large ÷ page; then the round trip of
echo turns on a fourth thread while two clients read the large one's history by pages,
against the same turns idle.

The threads' events are written straight through the store API (SqliteStore.append,
batches of 5,000 events of a turn's shapes), not by an agent: a million events build in
7-40 s here, as the load allows. The daemon is started on that store afterwards, so no
compaction is kept in memory for any of them: every history page is read from the store.

    python -m bench.long_thread [--events 1000000] [--small 100] [--page 12000] [--samples 15] [--echo 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from bench.run import TURN_END_MARK, Bridge, event_turns, pct, until
from bridge.protocols.events import Record
from bridge.store.sqlite import SqliteStore

TS = "2026-12-01T00:00:00.000Z"
SIZES = ("small", "page", "large")
BATCH = 5000


def turn_shapes(turn: int) -> list[tuple[str, str, dict[str, Any]]]:
    """One turn as an agent streams it: a prompt, its start, 50 deltas, the whole message,
    a tool call and its result, status lines and the end (60 events, 5 items)."""
    tid = f"turn_{turn}"
    shapes: list[tuple[str, str, dict[str, Any]]] = [
        ("client", "message", {"role": "user", "text": f"go {turn}", "turn_id": tid}),
        ("bridge", "turn.started", {"turn_id": tid, "prompt_seq": 0}),
    ]
    shapes += [("agent", "message.delta", {"text": "x" * 40, "channel": "text"})] * 50
    shapes += [
        ("agent", "message", {"role": "assistant", "text": "x" * 2000}),
        ("agent", "agent.status", {"status": "requesting"}),
        ("agent", "tool.call", {"tool_call_id": f"k{turn}", "name": "Bash", "input": {"command": "ls"}}),
        ("agent", "tool.result", {"tool_call_id": f"k{turn}", "output": "a\nb", "is_error": False}),
        ("agent", "agent.status", {"status": "requesting"}),
        ("agent", "message", {"role": "assistant", "text": "done"}),
        ("agent", "agent.status", {"status": "idle"}),
        ("agent", "turn.ended", {"turn_id": tid, "status": "success"}),
    ]
    return shapes


async def fill(store: SqliteStore, thread_id: str, events: int) -> None:
    seq = turn = 0
    batch: list[Record] = []
    while seq < events:
        turn += 1
        for src, kind, data in turn_shapes(turn):
            seq += 1
            if kind == "turn.started":
                data = {**data, "prompt_seq": seq - 1}
            batch.append(Record(seq, TS, src, kind, data, None, False))
            if len(batch) == BATCH or seq == events:
                await store.append(thread_id, batch, [None] * len(batch), {"last_seq": seq, "updated_at": TS})
                batch = []
            if seq == events:
                break


async def interleaved(fn: Callable[[str], Awaitable[Any]], ids: dict[str, str], samples: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {name: [] for name in SIZES}
    for name in SIZES:
        await fn(ids[name])  # warm
    for _ in range(samples):
        for name in SIZES:
            t0 = time.perf_counter()
            await fn(ids[name])
            out[name].append(time.perf_counter() - t0)
    return out


async def walk(http: httpx.AsyncClient, tid: str, limit: int) -> list[float]:
    """The whole history by pages, newest first; returns each page's time."""
    params: dict[str, Any] = {"limit": limit}
    times = []
    while True:
        t0 = time.perf_counter()
        r = await http.get(f"/v1/threads/{tid}/history", params=params)
        r.raise_for_status()
        body = r.json()
        times.append(time.perf_counter() - t0)
        if not body["more"]:
            return times
        params["before"] = body["before"]


async def replay_tail(b: Bridge, http: httpx.AsyncClient, tid: str) -> None:
    last = await b.last_seq(http, tid)
    ws = await b.ws(tid, after=last - 100)
    try:
        await until(ws, f'"seq":{last},'.encode())
    finally:
        await ws.close()


async def turns(b: Bridge, tid: str, n: int, http: httpx.AsyncClient) -> list[float]:
    ws = await b.ws(tid, after=await b.last_seq(http, tid))
    try:
        return await event_turns(ws, n)
    finally:
        await ws.close()


async def interleaved_turns(
    b: Bridge, http: httpx.AsyncClient, ids: dict[str, str], samples: int
) -> dict[str, list[float]]:
    """Turns on each sized thread in turn (the first of each starts its agent: not timed)."""
    conns = {name: await b.ws(ids[name], after=await b.last_seq(http, ids[name])) for name in SIZES}
    out: dict[str, list[float]] = {name: [] for name in SIZES}
    try:
        for i in range(samples + 1):
            for name, ws in conns.items():
                t0 = time.perf_counter()
                await ws.send_text(json.dumps({"op": "prompt", "text": f"turn {i}"}))
                await until(ws, TURN_END_MARK)
                if i:
                    out[name].append(time.perf_counter() - t0)
        return out
    finally:
        for ws in conns.values():
            await ws.close()


def ms(values: list[float]) -> str:
    return f"{sorted(values)[len(values) // 2] * 1e3:9.2f}"


async def measure(args: argparse.Namespace, work: Path) -> None:
    b = Bridge(work)
    await b.start()
    async with b.http() as http:
        ids = {name: await b.new_thread(http, "echo") for name in (*SIZES, "echo")}
    await b.stop()

    store = SqliteStore(b.data / "bridge.db", writer="thread")
    await store.open()
    t0 = time.perf_counter()
    sizes = {"small": args.small, "page": args.page, "large": args.events}
    for name, n in sizes.items():
        await fill(store, ids[name], n)
    built = time.perf_counter() - t0
    await store.close()
    size = sum(p.stat().st_size for p in b.data.glob("bridge.db*")) / 2**20
    print(f"built {' + '.join(map(str, sizes.values()))} events in {built:.1f} s; database {size:.0f} MiB")

    await b.start()
    rows: dict[str, dict[str, list[float]]] = {}
    try:
        async with b.http() as http:

            async def get(path: str, params: dict[str, Any] | None = None) -> None:
                (await http.get(path, params=params)).raise_for_status()

            ops: dict[str, Callable[[str], Awaitable[Any]]] = {
                "list (GET /v1/threads)": lambda tid: get("/v1/threads"),
                "thread (GET /v1/threads/{id})": lambda tid: get(f"/v1/threads/{tid}"),
                "history, first page (no limit: 1000 items)": lambda tid: get(f"/v1/threads/{tid}/history"),
                "history, first page (limit=100)": lambda tid: get(f"/v1/threads/{tid}/history", {"limit": 100}),
                "history, first page (limit=10)": lambda tid: get(f"/v1/threads/{tid}/history", {"limit": 10}),
                "replay from the end (WebSocket after=last-100)": lambda tid: replay_tail(b, http, tid),
            }
            # The sizes take turns sample by sample, so a change in the machine's load
            # falls on all three alike.
            for op, fn in ops.items():
                rows[op] = await interleaved(fn, ids, args.samples)
            for name in SIZES:
                pages = await walk(http, ids[name], 1000)
                rows.setdefault("history, whole walk by pages of 1000 (total)", {})[name] = [sum(pages)]
                rows.setdefault("history, whole walk by pages of 1000 (a page)", {})[name] = pages
            rows["turn on the thread (its append)"] = await interleaved_turns(b, http, ids, args.samples)
            head = f"{'small':>9} {'page':>9} {'large':>9} {'large÷small':>11} {'large÷page':>10}"
            print(f"\n{'operation (median ms)':50} {head}")
            for op, got in rows.items():
                mid = {name: sorted(got[name])[len(got[name]) // 2] for name in SIZES}
                print(
                    f"{op:50} {ms(got['small'])} {ms(got['page'])} {ms(got['large'])}"
                    f" {mid['large'] / mid['small']:11.2f} {mid['large'] / mid['page']:10.2f}"
                )

            idle = await turns(b, ids["echo"], args.echo, http)
            stop = asyncio.Event()
            walks = 0

            async def reader() -> None:
                nonlocal walks
                params: dict[str, Any] = {}
                async with b.http() as own:
                    while not stop.is_set():
                        r = await own.get(f"/v1/threads/{ids['large']}/history", params=params)
                        body = r.raise_for_status().json()
                        params = {"before": body["before"]} if body["more"] else {}
                        walks += 1

            readers = [asyncio.create_task(reader()) for _ in range(2)]
            try:
                loaded = await turns(b, ids["echo"], args.echo, http)
            finally:
                stop.set()
                for task in readers:
                    with contextlib.suppress(Exception):
                        await task
            print(f"\necho turns on another thread ({args.echo} each), ms: p50 / p90 / max")
            for label, lat in (("idle", idle), ("while 2 clients page the large history", loaded)):
                print(f"  {label:40} {pct(lat, 50) * 1e3:7.2f} / {pct(lat, 90) * 1e3:7.2f} / {max(lat) * 1e3:7.2f}")
            print(f"  ({walks} pages of 1000 items of the large history were read meanwhile)")
    finally:
        await b.stop()
    print(f"load average {os.getloadavg()}, {os.cpu_count()} CPUs")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--small", type=int, default=100)
    ap.add_argument("--page", type=int, default=12_000, help="events of the middle thread: 1000 items, one full page")
    ap.add_argument("--samples", type=int, default=15)
    ap.add_argument("--echo", type=int, default=2000)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="agent-bridge-long-thread-"))
    try:
        asyncio.run(measure(args, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
