"""The SQLite store's transcript reads, on its reader thread: pages of records, and pages
of frames joined straight from the stored rows (issue #8: no Record per replayed row, no
text decoded) in events mode (each row's stored envelope, issue #22) or raw mode (the
agent's relayed lines). Every page is bounded by PAGE_BYTES.
"""

from __future__ import annotations

import operator
import sqlite3
from collections.abc import Callable
from typing import Any

from bridge.protocols.envelope import CorruptEvent, Frames, checked_envelopes, checked_lines, stored_envelopes
from bridge.protocols.events import Record
from bridge.store import sqlite_sql as sql
from bridge.store.base import PAGE_BYTES
from bridge.store.rows import ENV_SQL

_READ_EVENTS = (
    f"SELECT seq,ts,source,kind,{sql.DATA_SQL},{sql.RAW_SQL},relay FROM events"  # noqa: S608
    " WHERE thread_id=? AND seq>? ORDER BY seq LIMIT ?"
)
_READ_EVENTS_NO_RAW = _READ_EVENTS.replace(sql.RAW_SQL, "NULL", 1)


def events_page(db: sqlite3.Connection, thread_id: str, after: int, limit: int, with_raw: bool) -> list[Record]:
    """Records after ``after``. The stored text is kept as it is: a replay relays it without
    parsing it. (Assembling the whole envelope in SQL instead was measured slower.)"""
    cur = db.execute(_READ_EVENTS if with_raw else _READ_EVENTS_NO_RAW, (thread_id, after, limit))
    return [
        Record(seq, ts, source, kind, None, raw, relay == 1, data)
        for seq, ts, source, kind, data, raw, relay in _bounded(cur, lambda r: len(r[4]) + len(r[5] or ""))
    ]


def frames_page(db: sqlite3.Connection, thread_id: str, after: int, limit: int, raw: bool) -> Frames:
    """Read as UTF-8 bytes: the frames are sent without decoding or encoding any text, and
    without a Record per row (issue #8); in events mode each row is its stored envelope,
    one column (issue #22)."""
    db.text_factory = bytes
    try:
        return (_raw_page if raw else _envelope_page)(db, thread_id, after, limit)
    finally:
        db.text_factory = str


def _raw_page(db: sqlite3.Connection, thread_id: str, after: int, limit: int) -> Frames:
    """Raw mode relays the agent's own lines, one per stdout line (``relay``)."""
    cur = db.execute(
        "SELECT seq,CASE WHEN source='agent' AND relay=1 THEN"
        " coalesce(substr(env,raw_at+1,length(env)-raw_at-1),raw) END FROM events"
        " WHERE thread_id=? AND seq>? ORDER BY seq LIMIT ?",
        (thread_id, after, limit),
    )
    rows: list[tuple[int, bytes | None]] = _bounded(cur, lambda r: len(r[1] or b""))
    return Frames(checked_lines(rows), len(rows), rows[-1][0] if rows else after)


def _envelope_page(db: sqlite3.Connection, thread_id: str, after: int, limit: int) -> Frames:
    """Each row's stored envelope, one column (issue #22), if it is of the current wire
    version (rows.ENV_SQL). A page that may hold rows from before migration 9 (the
    transcript is gapless, so its seqs are ``after+1 .. after+limit``; the partial index
    ``events_without_env`` answers), or that turns out to hold a row of another version,
    is read with their parts, and theirs are built from those (``_rebuilt``)."""
    old = db.execute(
        "SELECT 1 FROM events INDEXED BY events_without_env"
        " WHERE thread_id=? AND seq>? AND seq<=? AND env IS NULL LIMIT 1",
        (thread_id, after, after + limit),
    ).fetchone()
    rows = None
    if old is None:
        cur = db.execute(
            f"SELECT seq,{ENV_SQL} FROM events WHERE thread_id=? AND seq>? ORDER BY seq LIMIT ?",  # noqa: S608
            (thread_id, after, limit),
        )
        rows = _envelope_rows(cur)
    if rows is None:
        rows = _rebuilt(db, thread_id, after, limit)
    return Frames(checked_envelopes(rows), len(rows), rows[-1][0] if rows else after)


_SECOND = operator.itemgetter(1)


def _envelope_rows(cur: sqlite3.Cursor, max_bytes: int = PAGE_BYTES) -> list[tuple[int, bytes]] | None:
    """``_bounded`` for ``(seq, env)`` rows, a chunk at a time while no row of it can
    reach the bound (the sizes summed in C). None at a row with no envelope to send as it
    is (the page is read again with its parts); CorruptEvent at an envelope that is not
    bytes."""
    rows: list[tuple[int, bytes]] = []
    total = 0
    while total < max_bytes and (chunk := cur.fetchmany(128)):
        try:
            size = sum(map(len, map(_SECOND, chunk)))
        except TypeError:  # not bytes
            size = max_bytes
        if total + size < max_bytes:
            rows += chunk
            total += size
            continue
        for row in chunk:
            if row[1] is None:
                return None
            if row[1].__class__ is not bytes:
                raise CorruptEvent(row[0])
            rows.append(row)
            total += len(row[1])
            if total >= max_bytes:
                break
    return rows


def _rebuilt(db: sqlite3.Connection, thread_id: str, after: int, limit: int) -> list[tuple[int, bytes]]:
    """A page holding rows whose envelope is not sent as stored (from before migration 9,
    or of another wire version), each built from its parts by ``stored_envelopes``: the
    columns of an old row, the ``data`` and ``raw`` of a newer one cut out of its envelope
    (which joins a current one back byte for byte). A row whose data cannot be had:
    CorruptEvent."""
    cur = db.execute(
        f"SELECT seq,ts,source,kind,{sql.DATA_SQL},{sql.RAW_SQL} FROM events"  # noqa: S608
        " WHERE thread_id=? AND seq>? ORDER BY seq LIMIT ?",
        (thread_id, after, limit),
    )
    rows = _bounded(cur, lambda r: len(r[4] or b"") + len(r[5] or b""))
    try:
        return list(zip([r[0] for r in rows], stored_envelopes(rows), strict=True))
    except TypeError:  # a NULL where data must be
        raise CorruptEvent(next(r[0] for r in rows if not isinstance(r[4], bytes))) from None


def _bounded(cur: sqlite3.Cursor, size: Callable[[Any], int], max_bytes: int = PAGE_BYTES) -> list[Any]:
    """The cursor's rows, stopping after the row that brings the page to ``max_bytes``
    (so a page holds at least one row, and at most max_bytes plus one row's worth)."""
    rows: list[Any] = []
    total = 0
    while total < max_bytes and (chunk := cur.fetchmany(64)):
        for row in chunk:
            rows.append(row)
            total += size(row)
            if total >= max_bytes:
                break
    return rows
