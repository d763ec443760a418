"""The SQLite store's writer process: ``python -m bridge.store.writer FD PATH BUSY_MS``.

Started by the store (bridge/store/writer_client.py) with one end of a socket pair as
``FD``; it owns the database's one write connection: migrations and repair at start, then
every batch of appends (group commit: one transaction a batch, as on the writer thread),
every other write (``sqlite_sql.OPS``) and the WAL checkpoints. The event loop of the
daemon keeps only reads. Frames: bridge/store/wire.py.

It exits when the pipe reaches end of file: the daemon closed it (a clean close: what was
sent is written first) or died (even by SIGKILL, the kernel closes its end). SIGINT and
SIGTERM are ignored: a terminal's Ctrl-C or a service manager's stop reaches the daemon's
whole process group, and the daemon drains its appends through this process before it
closes the pipe.

Checkpoints: the write connection never checkpoints (``wal_autocheckpoint=0``); a thread
of this process does, with a connection of its own (``Checkpointer``), so a checkpoint
never sits between a commit and its acknowledgement: SQLite lets a PASSIVE checkpoint run
beside a writer in WAL mode, and the sqlite3 module releases the GIL while it runs. One is
asked for once ``CHECKPOINT_EVERY`` commits or ``CHECKPOINT_BYTES`` of events have been
written since the last (and by the store after every 1,024 of its inline commits); a request
while one runs is folded into the next. Bounded by bytes, each checkpoint moves a few MiB.
Durations are in the statistics (``("s", id)``), logged by the daemon when the store
closes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bridge.store import sqlite_sql as sql
from bridge.store.wire import FrameReader, parse_request, reply

CHECKPOINT_EVERY = 256  # commits, or
CHECKPOINT_BYTES = 4 * 1024 * 1024  # bytes of events written: a checkpoint is asked for


class Checkpointer:
    """PASSIVE checkpoints on a thread of the writer process, with a connection of its own
    (opened on that thread): ``ask`` never waits; a request while one runs is folded into
    the next. Durations go into ``stats`` (shared with the writer, under ``lock``)."""

    def __init__(self, path: Path, busy_ms: int, stats: dict[str, float], lock: threading.Lock) -> None:
        self._path, self._busy_ms = path, busy_ms
        self._stats, self._lock = stats, lock
        self._wanted = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="checkpointer", daemon=True)
        self._thread.start()

    def ask(self) -> None:
        self._wanted.set()

    def close(self) -> None:
        """The thread ends (after the checkpoint it may be running) and closes its connection."""
        self._stop = True
        self._wanted.set()
        self._thread.join()

    def _run(self) -> None:
        db = sql.connect(self._path, self._busy_ms)
        try:
            while True:
                self._wanted.wait()
                self._wanted.clear()
                if self._stop:
                    return
                t0 = time.perf_counter()
                with contextlib.suppress(sqlite3.Error):  # PASSIVE: the next request tries again
                    sql.checkpoint(db)
                ms = (time.perf_counter() - t0) * 1000
                with self._lock:
                    st = self._stats
                    st["checkpoints"] += 1
                    st["checkpoint_total_ms"] += ms
                    st["checkpoint_max_ms"] = max(st["checkpoint_max_ms"], ms)
        finally:
            db.close()


class Writer:
    def __init__(self, db: sqlite3.Connection, path: Path, busy_ms: int) -> None:
        self.db = db
        self.since_checkpoint = 0  # commits
        self.since_bytes = 0
        self.failed_generation = -1  # batches of this generation or older are refused
        self.stats: dict[str, float] = {
            "commits": 0,
            "batches": 0,
            "appends": 0,
            "checkpoints": 0,
            "checkpoint_total_ms": 0.0,
            "checkpoint_max_ms": 0.0,
            "commit_max_ms": 0.0,
            "commit_total_ms": 0.0,
        }
        self._lock = threading.Lock()
        self.checkpointer = Checkpointer(path, busy_ms, self.stats, self._lock)

    def handle(self, msg: Any) -> bytes:
        kind, rid = msg[0], msg[1]
        try:
            if kind == "b":
                return self._batch(rid, msg[2], msg[3], msg[4])
            if kind == "c":
                if msg[2] == "checkpoint":
                    self.checkpoint()
                    return reply(rid, r=[])
                result = sql.OPS[msg[2]](self.db, *msg[3])
                self.since_checkpoint += 1
                return reply(rid, r=result)
            if kind == "s":
                with self._lock:
                    return reply(rid, r=dict(self.stats))
        except Exception as exc:
            if self.db.in_transaction:
                self.db.rollback()
            return reply(rid, e=f"store error: {exc}")
        return reply(rid, e=f"unknown request {kind!r}")

    def _batch(self, rid: int, again: bool, wire: list[tuple[Any, ...]], generation: int) -> bytes:
        # The store sends a batch before the one ahead of it is answered (sqlite.py
        # _write_loop): once one fails, none sent behind it is written, so nothing commits
        # out of order; the store sends them all again under a new generation.
        if generation <= self.failed_generation:
            return reply(rid, e="store error: a batch sent before this one failed; not written")
        batch = [sql.item_of(w) for w in wire]
        t0 = time.perf_counter()
        try:
            failed = sql.commit_again(self.db, batch) if again else sql._commit(self.db, batch)
        except Exception:
            self.failed_generation = generation
            raise
        ms = (time.perf_counter() - t0) * 1000
        with self._lock:
            st = self.stats
            st["commit_max_ms"] = max(st["commit_max_ms"], ms)
            st["commit_total_ms"] += ms
            st["commits"] += 1
            st["batches"] += 1
            st["appends"] += len(batch)
        self.since_checkpoint += 1
        self.since_bytes += sum(map(sql.text_size, batch))
        return reply(rid, f={str(k): v for k, v in failed.items()})

    def maybe_checkpoint(self) -> None:
        if self.since_checkpoint >= CHECKPOINT_EVERY or self.since_bytes >= CHECKPOINT_BYTES:
            self.checkpoint()

    def checkpoint(self) -> None:
        """A PASSIVE checkpoint, on the checkpointer's thread; the store asks for one too
        after ``sqlite.CHECKPOINT_EVERY`` of its inline commits."""
        self.since_checkpoint = self.since_bytes = 0
        self.checkpointer.ask()


def serve(sock: socket.socket, writer: Writer) -> None:
    """Requests in order, one answer each, until end of file."""
    frames = FrameReader()
    while True:
        data = sock.recv(1 << 20)
        if not data:
            return
        # Each answer as soon as it is ready: the store may have sent the next batch already,
        # and an answer held back until that one commits would stall the store for nothing.
        for f in frames.feed(data):
            sock.sendall(writer.handle(parse_request(f)))
        writer.maybe_checkpoint()


def _not_dumpable() -> None:
    """Like the daemon (process/sandbox.py harden_daemon): no other process of this user
    reads this one's memory (the database's rows pass through it) or ptraces it."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0


def main(argv: list[str]) -> int:
    _not_dumpable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    fd, path, busy_ms = int(argv[0]), Path(argv[1]), int(argv[2])
    os.closerange(fd + 1, 1 << 16)  # nothing of the daemon's but the pipe (e.g. its data dir lock)
    sock = socket.socket(fileno=fd)
    try:
        db = sql.open_writer(path, busy_ms)
    except sql.SchemaTooNew as exc:
        sock.sendall(reply(0, e=f"schema version {exc.version}", c="schema_too_new"))
        return 1
    except sqlite3.Error as exc:
        sock.sendall(reply(0, e=f"cannot open store {path}: {exc}"))
        return 1
    db.execute("PRAGMA wal_autocheckpoint=0")
    sock.sendall(reply(0, r="ready"))
    writer = Writer(db, path, busy_ms)
    try:
        serve(sock, writer)
    except (ConnectionError, OSError):
        pass  # the daemon is gone: nothing to answer
    finally:
        writer.checkpointer.close()
        db.close()  # the last connection: SQLite checkpoints and removes the WAL
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
