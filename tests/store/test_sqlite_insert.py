"""An append's rows go into SQLite INSERT_CHUNK at a time in one statement (issue #22). What
is stored must be exactly what one statement a row stores, and a row SQLite refuses —
wherever it sits, in a whole chunk or in the rest — must refuse its append alone while the
rest of the batch commits. Real SQLite files, no daemon."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bridge.protocols.events import Record
from bridge.store import sqlite_sql as sql

pytestmark = pytest.mark.timeout(60)
TS = "2026-12-05T00:00:00.000Z"
SIZES = (1, sql.INSERT_CHUNK - 1, sql.INSERT_CHUNK, sql.INSERT_CHUNK + 1, 2 * sql.INSERT_CHUNK + 5)


@pytest.fixture
def db_at() -> Iterator[Callable[[Path], sqlite3.Connection]]:
    """Opens write connections with three threads in their database; closes them after."""
    opened: list[sqlite3.Connection] = []

    def at(path: Path) -> sqlite3.Connection:
        opened.append(_db(path))
        return opened[-1]

    yield at
    for db in opened:
        db.close()


def _db(path: Path) -> sqlite3.Connection:
    db = sql.open_writer(path, 2000)
    for tid in ("thr_a", "thr_b", "thr_c"):
        sql.create_thread(
            db,
            {"id": tid, "agent": "a", "protocol": "stream-json", "cwd": "/", "title": "", "state": "idle"}
            | {"turn_active": 0, "last_seq": 0, "created_at": TS, "updated_at": TS, "options": "{}"},
        )
    return db


def rows(tid: str, first: int, n: int, client_at: int | None = None) -> sql.Rows:
    """n events of thread tid from seq first; the one at index client_at carries client id "c"."""
    seqs = range(first, first + n)
    records = [
        Record(seq, TS, "agent", "message", {"text": f"{tid} {seq} é"}, None if seq % 3 else '{"x":1}', bool(seq % 2))
        for seq in seqs
    ]
    return sql.rows_of(records, ["c" if i == client_at else None for i in range(n)])


def one_row_a_statement(db: sqlite3.Connection, batch: list[sql._Append]) -> None:
    db.execute("BEGIN IMMEDIATE")
    for item in batch:
        db.executemany(sql.INSERT_EVENTS, sql._insert_rows(item.thread_id, item.rows))
    db.execute("COMMIT")


def stored(db: sqlite3.Connection) -> list[tuple[Any, ...]]:
    return db.execute("SELECT * FROM events ORDER BY thread_id, seq").fetchall()


@pytest.mark.parametrize("n", SIZES)
def test_chunked_inserts_store_what_one_row_a_statement_stores(
    db_at: Callable[[Path], sqlite3.Connection], tmp_path: Path, n: int
) -> None:
    chunked, plain = db_at(tmp_path / "chunked.db"), db_at(tmp_path / "plain.db")
    batch = [
        sql._Append("thr_a", rows("thr_a", 1, n, client_at=n - 1), {}, None),
        sql._Append("thr_b", rows("thr_b", 1, n + 3), {}, None),
    ]
    assert sql._commit(chunked, batch) == {}
    one_row_a_statement(plain, batch)
    got = stored(chunked)
    assert len(got) == 2 * n + 3 and got == stored(plain)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("where", ["first", "last"])
def test_a_refused_row_anywhere_refuses_its_append_alone(
    db_at: Callable[[Path], sqlite3.Connection], tmp_path: Path, n: int, where: str
) -> None:
    db = db_at(tmp_path / "db.sqlite")
    assert sql._commit(db, [sql._Append("thr_b", rows("thr_b", 1, 1, client_at=0), {}, None)]) == {}
    # thr_b's second append repeats client id "c" in its first or last row: in the first
    # whole chunk, or in the rows after the last one.
    bad = rows("thr_b", 2, n, client_at=0 if where == "first" else n - 1)
    batch = [
        sql._Append("thr_a", rows("thr_a", 1, n), {}, None),
        sql._Append("thr_b", bad, {}, None),
        sql._Append("thr_c", rows("thr_c", 1, n), {}, None),
    ]
    failed = sql._commit(db, batch)
    assert list(failed) == [1] and "UNIQUE" in failed[1]
    seqs = db.execute("SELECT thread_id, count(*), max(seq) FROM events GROUP BY thread_id").fetchall()
    assert seqs == [("thr_a", n, n), ("thr_b", 1, 1), ("thr_c", n, n)]
    # Alone in its batch (no savepoint), the same append is rolled back whole too.
    assert list(sql._commit(db, [sql._Append("thr_b", bad, {}, None)])) == [0]
    assert db.execute("SELECT count(*) FROM events WHERE thread_id='thr_b'").fetchone() == (1,)
    assert not db.in_transaction


def test_columns_of_different_lengths_refuse_their_append_alone(
    db_at: Callable[[Path], sqlite3.Connection], tmp_path: Path
) -> None:
    """``Rows`` whose columns disagree (a bug, or a damaged frame) are never half-inserted."""
    with pytest.raises(ValueError, match="2 records and 1 client ids"):
        sql.rows_of(sql_records(2), [None])
    db = db_at(tmp_path / "db.sqlite")
    ragged = rows("thr_a", 1, 3)
    ragged[sql.DATA].pop()
    batch = [sql._Append("thr_a", ragged, {}, None), sql._Append("thr_b", rows("thr_b", 1, 3), {}, None)]
    assert list(sql._commit(db, batch)) == [0]
    assert db.execute("SELECT thread_id, count(*) FROM events GROUP BY thread_id").fetchall() == [("thr_b", 3)]


def sql_records(n: int) -> list[Record]:
    return [Record(seq, TS, "agent", "message", {}, None, False) for seq in range(1, n + 1)]


def test_one_record_makes_the_columns_many_make() -> None:
    """``rows_of`` builds one record's columns without its loops: the same columns."""
    one, two = sql_records(2)
    two.raw, two.relay = '{"x":1}', True
    assert sql.rows_of([two], ["c"]) == tuple(col[1:] for col in sql.rows_of([one, two], [None, "c"]))
    assert sql.rows_of([], []) == ()
