"""Full-text search on SQLite (issue #38 item 4, docs/benchmarks.md "Search"): what the
index adds to an append, and how long a query takes over a large store.

    python -m bench.search            # 1,000 threads and a million events (a few minutes)
    python -m bench.search --quick    # a smoke run (seconds); numbers are not meaningful
    python -m bench.search --pg URL   # the query part on PostgreSQL (an empty database)

* ``append``: the same appends committed through ``sqlite_sql._commit`` (the writer's
  transaction) with the index and without it (``search_sqlite.index`` replaced by a no-op),
  rounds interleaved: a chat's turn (a prompt, a tool call and its result, streamed deltas,
  the turn's end; one event an append, as a conversation commits them) and a flood (64
  deltas an append). CPU time per event, the minimum over the rounds; the ratio is what
  matters.
* ``query``: ``--threads`` threads of ``--events`` events each (made of a vocabulary of
  pseudo-words, a few of them rare), committed in batches, then the first page (20 hits)
  of a rare word, a common word, a phrase, two words, and a common word for one owner of
  ten: median and worst of ``--queries`` runs each, in milliseconds, and the database's
  size with and without the index.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bridge.protocols.events import Record
from bridge.store import search_sqlite, search_text
from bridge.store import sqlite_sql as sql

TS = "2026-12-01T00:00:00.000Z"
VOCAB = [f"w{i:04d}" for i in range(5000)]
RARE = ["quetzal", "axolotl", "pangolin"]


def _words(rng: random.Random, n: int) -> str:
    # Zipf-like: a few words are everywhere, most are seldom.
    return " ".join(VOCAB[min(int(rng.paretovariate(0.8)) - 1, len(VOCAB) - 1)] for _ in range(n))


def turn_events(rng: random.Random, first: int, deltas: int = 10) -> list[Record]:
    """One turn of a conversation: about ``deltas + 6`` events."""
    s = first
    out = [
        Record(s, TS, "client", "message", {"role": "user", "text": _words(rng, 20)}, None, False),
        Record(s + 1, TS, "bridge", "turn.started", {"turn_id": "t", "prompt_seq": s}, None, False),
        Record(s + 2, TS, "agent", "tool.call", {"name": "Bash", "input": {"command": _words(rng, 8)}}, None, False),
        Record(s + 3, TS, "agent", "tool.result", {"output": _words(rng, 60), "is_error": False}, None, False),
    ]
    seq = s + 4
    for _ in range(deltas):
        out.append(
            Record(seq, TS, "agent", "message.delta", {"text": _words(rng, 6) + " ", "channel": "text"}, None, False)
        )
        seq += 1
    out.append(Record(seq, TS, "agent", "turn.ended", {"turn_id": "t", "status": "success"}, None, False))
    return out


def _item(thread_id: str, records: Sequence[Record]) -> Any:
    return sql._Append(thread_id, sql.rows_of(records, [None] * len(records)), {}, None)


def _db(path: Path) -> sqlite3.Connection:
    return sql.open_writer(path, 5000)


def _new_thread(db: sqlite3.Connection, tid: str, owner: str | None = None) -> None:
    sql.create_thread(
        db,
        {"id": tid, "agent": "a", "protocol": "p", "cwd": "/", "state": "idle", "created_at": TS, "updated_at": TS}
        | ({"owner": owner} if owner else {}),
    )


def _no_index(db: sqlite3.Connection, thread_id: str, rows: Any) -> None:
    return None


def append_costs(work: Path, rounds: int, turns: int) -> dict[str, float]:
    """CPU µs per event of chat and flood appends, with the index and without it."""
    rng = random.Random(1)  # noqa: S311 (reproducible words, not secrets)
    chat = [e for t in range(turns) for e in turn_events(rng, 1 + t * 16)]
    flood = [
        Record(i, TS, "agent", "message.delta", {"text": _words(rng, 4)}, None, False) for i in range(1, turns * 64)
    ]
    real = search_sqlite.index
    best: dict[str, float] = {}
    for r in range(rounds):
        for indexed in (True, False):
            vars(search_sqlite)["index"] = real if indexed else _no_index  # (sqlite_sql calls it by name)
            for shape, records, per in (("chat", chat, 1), ("flood", flood, 64)):
                path = work / f"a{r}{indexed}{shape}.db"
                db = _db(path)
                _new_thread(db, "t1")
                t0 = time.process_time()
                for at in range(0, len(records), per):
                    sql._commit(db, [_item("t1", records[at : at + per])])
                us = (time.process_time() - t0) / len(records) * 1e6
                db.close()
                key = f"{shape}_{'indexed' if indexed else 'plain'}_us"
                best[key] = min(best.get(key, us), us)
    vars(search_sqlite)["index"] = real
    for shape in ("chat", "flood"):
        best[f"{shape}_ratio"] = best[f"{shape}_indexed_us"] / best[f"{shape}_plain_us"]
    return best


def build(path: Path, threads: int, events: int) -> tuple[int, float]:
    """The store for the queries: events and their documents, a batch of turns a commit."""
    rng = random.Random(2)  # noqa: S311 (reproducible words, not secrets)
    db = _db(path)
    t0 = time.perf_counter()
    total = 0
    for t in range(threads):
        tid = f"thr_{t:05d}"
        _new_thread(db, tid, owner=f"user{t % 10}")
        seq = 1
        batch: list[Record] = []
        while seq <= events:
            turn = turn_events(rng, seq)[: events - seq + 1]
            if rng.random() < 0.01:  # a rare word now and then
                first = turn[0]
                turn[0] = Record(
                    first.seq, TS, "client", "message", {"text": f"{rng.choice(RARE)} sighted"}, None, False
                )
            batch += turn
            seq += len(turn)
            if len(batch) >= 512:
                sql._commit(db, [_item(tid, batch)])
                total += len(batch)
                batch = []
        if batch:
            sql._commit(db, [_item(tid, batch)])
            total += len(batch)
    db.close()
    return total, time.perf_counter() - t0


QUERIES: list[tuple[str, str, str | None]] = [
    ("rare", "quetzal", None),
    ("common", "w0000", None),
    ("phrase", '"w0000 w0001"', None),
    ("two_words", "w0002 w0010", None),
    ("common_one_owner", "w0000", "user3"),
]


def query_times(path: Path, runs: int) -> dict[str, Any]:
    db = sqlite3.connect(path)
    out: dict[str, Any] = {}
    try:
        for name, q, owner in QUERIES:
            fts = search_text.fts5_query(search_text.parse_query(q))
            times = []
            hits: list[Any] = []
            for _ in range(runs):
                t0 = time.perf_counter()
                hits, _ = search_sqlite.search(db, fts, owner, 20, None)
                times.append((time.perf_counter() - t0) * 1000)
            out[name] = {"p50_ms": statistics.median(times), "max_ms": max(times), "hits": len(hits)}
        (docs,) = db.execute("SELECT count(*) FROM search_docs").fetchone()
        out["documents"] = docs
    finally:
        db.close()
    return out


def index_bytes(path: Path) -> dict[str, float]:
    db = sqlite3.connect(path)
    try:
        total = db.execute("PRAGMA page_count").fetchone()[0] * db.execute("PRAGMA page_size").fetchone()[0]
        try:
            (search,) = db.execute(
                "SELECT sum(pgsize) FROM dbstat WHERE name LIKE 'search%' OR name LIKE 'sqlite_autoindex_search%'"
            ).fetchone()
        except sqlite3.Error:  # no dbstat in this build
            search = None
    finally:
        db.close()
    return {"db_mb": total / 2**20, "index_mb": (search or 0) / 2**20}


async def pg_run(url: str, threads: int, events: int, runs: int) -> dict[str, Any]:
    """The query part on PostgreSQL (``--pg URL``, an empty database): the same store built
    through the store's own appends (batches of 512 events, the index in their
    transactions), then the same queries through ``store.search``."""
    from bridge.store.factory import make_store

    store = make_store(url)
    await store.open()
    out: dict[str, Any] = {}
    try:
        rng = random.Random(2)  # noqa: S311 (reproducible words, not secrets)
        t0 = time.perf_counter()
        total = 0
        for t in range(threads):
            tid = f"thr_{t:05d}"
            await store.create_thread(
                {
                    "id": tid,
                    "agent": "a",
                    "protocol": "p",
                    "cwd": "/",
                    "state": "idle",
                    "created_at": TS,
                    "updated_at": TS,
                    "owner": f"user{t % 10}",
                    "options": {},
                    "title": "",
                }
            )
            seq = 1
            while seq <= events:
                batch: list[Record] = []
                while len(batch) < 512 and seq <= events:
                    turn = turn_events(rng, seq)[: events - seq + 1]
                    if rng.random() < 0.01:  # a rare word now and then, as build() does
                        turn[0] = Record(
                            turn[0].seq, TS, "client", "message", {"text": f"{rng.choice(RARE)} sighted"}, None, False
                        )
                    batch += turn
                    seq += len(turn)
                await store.append(tid, batch, [None] * len(batch), {})
                total += len(batch)
        out["build_s"], out["events"] = time.perf_counter() - t0, total
        for name, q, owner in QUERIES:
            times = []
            hits: list[Any] = []
            for _ in range(runs):
                t1 = time.perf_counter()
                hits, _ = await store.search(q, owner=owner, limit=20, cursor=None)
                times.append((time.perf_counter() - t1) * 1000)
            out[name] = {"p50_ms": statistics.median(times), "max_ms": max(times), "hits": len(hits)}
    finally:
        await store.close()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.search", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=1000)
    ap.add_argument("--events", type=int, default=1000, help="events a thread")
    ap.add_argument("--queries", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--pg", metavar="URL", help="run the query part on this (empty) PostgreSQL database instead")
    args = ap.parse_args(argv)
    if args.pg:
        result = asyncio.run(pg_run(args.pg, args.threads, args.events, args.queries))
        print(f"postgresql: {result['events']} events in {args.threads} threads, built in {result['build_s']:.1f}s")
        for name, _, _ in QUERIES:
            r = result[name]
            print(f"query {name}: p50 {r['p50_ms']:.2f} ms, max {r['max_ms']:.2f} ms, {r['hits']} hits")
        if args.json:
            args.json.write_text(json.dumps(result))
        return 0
    if args.quick:
        args.threads, args.events, args.queries, args.rounds = 20, 200, 3, 1
    work = Path(tempfile.mkdtemp(prefix="bench-search-"))
    report: Callable[[str], None] = print
    try:
        appends = append_costs(work, args.rounds, 20 if args.quick else 200)
        report(
            "append (CPU µs/event, indexed / plain = ratio): "
            f"chat {appends['chat_indexed_us']:.1f} / {appends['chat_plain_us']:.1f} = {appends['chat_ratio']:.2f}; "
            f"flood {appends['flood_indexed_us']:.1f} / {appends['flood_plain_us']:.1f} = {appends['flood_ratio']:.2f}"
        )
        path = work / "q.db"
        total, took = build(path, args.threads, args.events)
        sizes = index_bytes(path)
        report(
            f"store: {args.threads} threads, {total} events, built in {took:.1f}s "
            f"({total / took:.0f} events/s with the index); {sizes['db_mb']:.0f} MiB, index {sizes['index_mb']:.0f} MiB"
        )
        queries = query_times(path, args.queries)
        report(f"documents: {queries.pop('documents')}")
        for name, r in queries.items():
            report(f"query {name}: p50 {r['p50_ms']:.2f} ms, max {r['max_ms']:.2f} ms, {r['hits']} hits")
        if args.json:
            args.json.write_text(
                json.dumps({"append": appends, "store": {"events": total, "build_s": took, **sizes}, "query": queries})
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
