"""What one flooded line costs on its way into SQLite, stage by stage (issue #22): the frame
that carries a batch to the writer process (pickle against marshal, and marshal of a
tuple a row, as before, against marshal of ``sqlite_sql.Rows``' columns, now), the stored
envelope built in the writer (one record at a time with ``record_envelope`` and
``stored_envelope``, as before, against ``sqlite_sql._insert_rows``, now), and the commit
of the batch (one INSERT a row, as before, against ``sqlite_sql.INSERT_CHUNK`` rows a
statement, now). One process, no daemon; the stages are interleaved round by round.

    python -m bench.writer_rows            # a few seconds
    python -m bench.writer_rows --quick    # a smoke run; numbers are not meaningful

Each figure is the minimum over ``--rounds`` rounds of CPU time per row (the least
disturbed round of a shared machine); compare the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import marshal
import pickle
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from bridge.protocols.envelope import record_envelope, stored_envelope
from bridge.protocols.events import Record
from bridge.store import sqlite_sql as sql

THREAD = "thr_0123456789abcdef"
TS = "2026-12-05T00:00:00.000Z"
LINE = (
    '{"type":"stream_event","event":{"type":"content_block_delta","index":0,'
    '"delta":{"type":"text_delta","text":"%s"}},"session_id":"4f0b6a8e-1c2d-4e5f-9a0b-1c2d3e4f5a6b"}'
)


def flood_records(first: int, n: int) -> list[Record]:
    """n 200-byte ``stream_event`` deltas, as the daemon numbers them."""
    records = []
    for seq in range(first, first + n):
        text = f"{seq:08d} " + "x" * 60
        records.append(Record(seq, TS, "agent", "message.delta", {"text": text, "channel": "text"}, LINE % text, True))
    for r in records:
        assert r.data_json  # (serialised once, as the daemon does before shipping them)
    return records


def tuple_rows(records: list[Record]) -> list[tuple[Any, ...]]:
    """An append's rows as the store shipped them before: a tuple a row."""
    return [(THREAD, r.seq, r.ts, r.source, r.kind, r.data_json, r.raw, int(r.relay), None) for r in records]


def per_row_envelopes(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The stored envelopes one record at a time (how the writer built them before)."""
    out = []
    for thread_id, seq, ts, source, kind, data, raw, relay, client_id in rows:
        env, data_at, raw_at = stored_envelope(record_envelope(seq, ts, source, kind, data, raw), data, raw)
        out.append((thread_id, seq, ts, source, kind, env, data_at, raw_at, relay, client_id))
    return out


def commit_row_by_row(db: sqlite3.Connection, item: sql._Append) -> None:
    """An append committed as the writer did before: one INSERT executed once a row."""
    db.execute("BEGIN IMMEDIATE")
    db.executemany(sql.INSERT_EVENTS, sql._insert_rows(item.thread_id, item.rows))
    db.execute("COMMIT")


def cpu_per_row(fn: Callable[[], object], rows: int) -> float:
    t0 = time.process_time()
    fn()
    return (time.process_time() - t0) / rows * 1e6


def measure(rounds: int, batch: int) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="agent-bridge-writer-rows-"))
    try:
        db = sql.open_writer(work / "bridge.db", 2000)
        db.execute("PRAGMA wal_autocheckpoint=0")
        sql.create_thread(
            db,
            {"id": THREAD, "agent": "a", "protocol": "stream-json", "cwd": str(work), "title": "", "state": "idle"}
            | {"turn_active": 0, "last_seq": 0, "created_at": TS, "updated_at": TS, "options": "{}"},
        )
        best: dict[str, float] = {}
        seq = 1
        for _ in range(rounds):
            records = flood_records(seq, batch)
            rows = sql.rows_of(records, [None] * batch)
            item = sql._Append(THREAD, rows, {}, None, (TS, seq + batch - 1, None, 0))
            seq += batch
            other = sql._Append(THREAD, sql.rows_of(flood_records(seq, batch), [None] * batch), {}, None)
            other.touch = (TS, seq + batch - 1, None, 0)
            msg = ("b", 1, False, [sql.wire_item(item)], 0)
            # Before: the same append as a tuple a row (the records stay alive, as in the
            # daemon, so marshal sees the strings shared and keeps a reference to each).
            tuples = tuple_rows(records)
            msg_before: tuple[Any, ...] = ("b", 1, False, [(THREAD, tuples, {}, item.touch, False, None, -1)], 0)
            pickled = pickle.dumps(msg_before, protocol=pickle.HIGHEST_PROTOCOL)
            marshalled = marshal.dumps(msg)
            marshalled_before = marshal.dumps(msg_before)
            stages: dict[str, Callable[[], object]] = {
                "frame out, pickle": partial(pickle.dumps, msg_before, protocol=pickle.HIGHEST_PROTOCOL),
                "frame out, marshal, a tuple a row": partial(marshal.dumps, msg_before),
                "frame out, marshal, columns": partial(marshal.dumps, msg),
                "frame in, pickle": partial(pickle.loads, pickled),
                "frame in, marshal, a tuple a row": partial(marshal.loads, marshalled_before),
                "frame in, marshal, columns": partial(marshal.loads, marshalled),
                "envelopes, one record at a time": partial(per_row_envelopes, tuples),
                "envelopes, _insert_rows": partial(sql._insert_rows, THREAD, rows),
                "commit, INSERT_CHUNK rows a statement": partial(sql._commit, db, [item]),
                "commit, one INSERT a row": partial(commit_row_by_row, db, other),
            }
            for name, fn in stages.items():
                best[name] = min(best.get(name, float("inf")), cpu_per_row(fn, batch))
            seq += batch
        db.close()
        return best
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(best: dict[str, float], rounds: int, batch: int) -> str:
    pairs = (
        ("frame out, marshal, a tuple a row", "frame out, pickle"),
        ("frame out, marshal, columns", "frame out, marshal, a tuple a row"),
        ("frame in, marshal, a tuple a row", "frame in, pickle"),
        ("frame in, marshal, columns", "frame in, marshal, a tuple a row"),
        ("envelopes, _insert_rows", "envelopes, one record at a time"),
        ("commit, INSERT_CHUNK rows a statement", "commit, one INSERT a row"),
    )
    out = [
        f"bench.writer_rows: batches of {batch} flood rows, minimum over {rounds} rounds (CPU µs per row)",
        "",
        "| stage | now | before | now ÷ before |",
        "|---|---:|---:|---:|",
    ]
    for now, before in pairs:
        out.append(f"| {now} | {best[now]:.3f} | {best[before]:.3f} | {best[now] / best[before]:.2f}× |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.writer_rows", description=__doc__)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--batch", type=int, default=1300, help="rows per batch (a 256 KiB read of 200-byte lines)")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    rounds, batch = (2, 100) if args.quick else (args.rounds, args.batch)
    print(report(measure(rounds, batch), rounds, batch))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
