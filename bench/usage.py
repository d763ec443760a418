"""What turns used (issue #38 item 5, docs/benchmarks.md "Usage"): how long ``GET
/v1/usage``'s store query takes over a store of many turns, and what recording a turn's
end adds to its append.

    python -m bench.usage             # 1,000 threads of 100 turns: 100,000 turns (a minute)
    python -m bench.usage --quick     # a smoke run (seconds); numbers are not meaningful
    python -m bench.usage --url URL   # another store (a PostgreSQL URL: an empty database)
    python -m bench.usage --json F    # the report written to F too (the store's log shares stdout)

The store is filled through its own appends (a turn is a prompt, its start, the answer and
its ``turn.ended`` with Claude Code's usage and a cost), a thread's turns spread over thirty
days, five agents and ten owners; then each grouping (the whole store, a week of it, one
owner's) is asked ``--queries`` times: the median in milliseconds. ``record`` is the
SQLite writer's step for an append (``usage_sqlite.record``), for one turn end and for a
64-delta append that holds none, in microseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bridge.protocols.events import Record
from bridge.store import usage_sqlite
from bridge.store.factory import make_store

CASES = (
    ("thread", None, None),
    ("agent", None, None),
    ("user", None, None),
    ("day", None, None),
    ("day", None, "2026-11-24T00:00:00.000Z"),
    ("thread", "user3", None),
    ("day", "user3", "2026-11-24T00:00:00.000Z"),
)


def turn(seq: int, ts: str, i: int) -> list[Record]:
    usd = {"amount": 0.00055, "currency": "USD"}
    used = {"input_tokens": 50 + i, "output_tokens": 12, "cache_read_input_tokens": 7, "cost": usd}
    return [
        Record(seq, ts, "client", "message", {"role": "user", "text": f"prompt {i}"}, None, False),
        Record(seq + 1, ts, "bridge", "turn.started", {"turn_id": f"t{i}", "prompt_seq": seq}, None, False),
        Record(seq + 2, ts, "agent", "message", {"role": "assistant", "text": f"answer {i}"}, None, False),
        Record(
            seq + 3, ts, "agent", "turn.ended", {"turn_id": f"t{i}", "status": "success", "usage": used}, None, False
        ),
    ]


def row(tid: str, n: int) -> dict[str, Any]:
    ts = "2026-11-01T00:00:00.000Z"
    return {"id": tid, "agent": f"agent{n % 5}", "protocol": "stream-json", "cwd": "/", "title": "",
            "state": "idle", "turn_active": False, "last_seq": 0, "created_at": ts, "updated_at": ts,
            "options": {}, "owner": f"user{n % 10}"}  # fmt: skip


async def queries(url: str, threads: int, turns: int, rounds: int) -> dict[str, Any]:
    store = make_store(url, replica_id="bench")
    await store.open()
    try:
        started = time.perf_counter()
        for t in range(threads):
            tid = f"thr_{t:016x}"
            await store.create_thread(row(tid, t))  # type: ignore[arg-type]
            recs: list[Record] = []
            for i in range(turns):
                day = 1 + (t * turns + i) * 30 // (threads * turns)
                recs += turn(4 * i + 1, f"2026-11-{day:02d}T12:00:00.000Z", i)
            await store.append(tid, recs, [None] * len(recs), {})
        out: dict[str, Any] = {"turns": threads * turns, "fill_s": round(time.perf_counter() - started, 1)}
        for group_by, owner, since in CASES:
            times, found = [], 0
            for _ in range(rounds):
                at = time.perf_counter()
                got = await store.usage_report(group_by=group_by, owner=owner, since=since, until=None, limit=100)
                times.append(time.perf_counter() - at)
                found = got["total"]["turns"]
            name = f"{group_by}{' one owner' if owner else ''}{' since ' + since[:10] if since else ''}"
            out[name] = {"ms": round(statistics.median(times) * 1000, 1), "turns": found}
        return out
    finally:
        await store.close()


def record_cost(path: Path, n: int) -> dict[str, float]:
    """``usage_sqlite.record`` alone, in one rolled-back transaction of the filled store."""
    db = sqlite3.connect(path, isolation_level=None)
    data = json.dumps({"turn_id": "t", "status": "success", "usage": {"input_tokens": 50, "output_tokens": 12}})
    tid = "thr_0000000000000000"
    db.execute("BEGIN")
    try:
        at = time.perf_counter()
        for i in range(n):
            usage_sqlite.record(db, tid, ([10**9 + i], ["2026-12-01T00:00:00.000Z"], ["agent"], ["turn.ended"], [data]))
        one = (time.perf_counter() - at) / n
        deltas = ([1] * 64, ["t"] * 64, ["agent"] * 64, ["message.delta"] * 64, ["{}"] * 64)
        at = time.perf_counter()
        for _ in range(n):
            usage_sqlite.record(db, tid, deltas)
        none = (time.perf_counter() - at) / n
    finally:
        db.execute("ROLLBACK")
        db.close()
    return {"one turn end (us)": round(one * 1e6, 1), "64 deltas, no turn end (us)": round(none * 1e6, 2)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.usage")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--url", default=None)
    ap.add_argument("--queries", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None, help="also write the report to this file")
    args = ap.parse_args(argv)
    threads, turns = (20, 10) if args.quick else (1000, 100)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bridge.db"
        url = args.url or f"sqlite:///{path}"
        out = asyncio.run(queries(url, threads, turns, args.queries))
        if args.url is None:
            out["record"] = record_cost(path, 200 if args.quick else 2000)
    print(json.dumps(out, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(out))


if __name__ == "__main__":
    main()
