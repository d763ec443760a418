"""The SQLite store's transcript reads, on its reader thread: pages of records, and pages
of frames joined straight from the stored rows (issue #8: no Record per replayed row, no
text decoded) in events mode (each row's stored envelope, issue #22) or raw mode (the
agent's relayed lines). Every page is bounded by PAGE_BYTES, measured before it is read
(``extent``), and says whether events may follow it (``more``).
"""

from __future__ import annotations

import operator
import sqlite3
from collections.abc import Iterator
from typing import Any

from bridge.protocols.envelope import CorruptEvent, Frames, Page, checked_envelopes, checked_lines, stored_envelopes
from bridge.protocols.events import Record
from bridge.store import rows
from bridge.store import sqlite_sql as sql
from bridge.store.base import PAGE_BYTES
from bridge.store.rows import ENV_SQL

# A page of records is one pass (see _chunks): each row's columns with its size, its data
# and raw only when the row is at most _SMALL bytes; a larger row is read alone, only
# while the page has room for it.
_SMALL = 64 * 1024  # bytes of a row read with the others; a larger one is read on its own
_COLUMNS = f"seq,ts,source,kind,{sql.DATA_SQL},{sql.RAW_SQL},relay"
_READ_EVENTS = (
    f"SELECT seq,ts,source,kind,CASE WHEN n<=?1 THEN d END,CASE WHEN n<=?1 THEN r END,relay,n FROM"  # noqa: S608
    f" (SELECT seq,ts,source,kind,{sql.DATA_SQL} AS d,{sql.RAW_SQL} AS r,relay,{rows.ROW_SIZE} AS n FROM events"
    " WHERE thread_id=?2 AND seq>?3 ORDER BY seq LIMIT ?4)"
)
_READ_EVENTS_NO_RAW = _READ_EVENTS.replace(sql.RAW_SQL, "NULL", 1)
_READ_ONE = f"SELECT {_COLUMNS} FROM events WHERE thread_id=? AND seq=?"  # noqa: S608
_READ_ONE_NO_RAW = _READ_ONE.replace(sql.RAW_SQL, "NULL", 1)


_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)
_DATA = operator.itemgetter(4)
_LAST = operator.itemgetter(-1)


def _chunks(cur: sqlite3.Cursor) -> Iterator[list[Any]]:
    """The cursor's rows, 8 at first and twice as many each time up to 128. A page stops
    in the chunk that reaches PAGE_BYTES, and SQLite has by then stepped through the rest
    of that chunk: in this table (WITHOUT ROWID) it loads a row's whole record to step
    past it (the row's key is compared with the loop's bound), so every row stepped
    through costs as much as reading it (measured: 12 ms a 16 MiB row). Small chunks first
    keep that waste to a few rows when the rows are large; larger ones after keep the
    calls few when they are not."""
    size = 8
    while chunk := cur.fetchmany(size):
        yield chunk
        size = min(size * 2, 128)


def extent(db: sqlite3.Connection, thread_id: str, after: int, limit: int) -> tuple[int, bool]:
    """How many rows the page after ``after`` holds (at most ``limit``, cut at PAGE_BYTES by
    the rows' stored sizes: rows.PAGE_EXTENT) and whether events may follow it, for a page
    read with its parts (``_rebuilt``). Only sizes reach Python."""
    cur = db.execute(rows.PAGE_EXTENT[0], (thread_id, after, limit))
    n = total = 0
    for chunk in _chunks(cur):
        size = sum(map(_FIRST, chunk))
        if total + size < PAGE_BYTES:
            n += len(chunk)
            total += size
            continue
        return n + rows.page_cut(list(map(_FIRST, chunk)), PAGE_BYTES - total), True
    return n, n == limit


def events_page(db: sqlite3.Connection, thread_id: str, after: int, limit: int, with_raw: bool) -> Page:
    """Records after ``after``. The stored text is kept as it is: a replay relays it without
    parsing it. (Assembling the whole envelope in SQL instead was measured slower.)"""
    cur = db.execute(_READ_EVENTS if with_raw else _READ_EVENTS_NO_RAW, (_SMALL, thread_id, after, limit))
    found: list[Any] = []
    total = 0
    for chunk in _chunks(cur):
        size = sum(map(_LAST, chunk))
        if total + size < PAGE_BYTES and None not in map(_DATA, chunk):
            found += chunk
            total += size
            continue
        for row in chunk:
            if row[4] is None:  # a large row, read alone
                one = db.execute(_READ_ONE if with_raw else _READ_ONE_NO_RAW, (thread_id, row[0])).fetchone()
                row = (*one, row[7])
            found.append(row)
            total += row[7]
            if total >= PAGE_BYTES:
                return _records(found, more=True)
    return _records(found, more=len(found) == limit)


def _records(found: list[Any], *, more: bool) -> Page:
    return Page(
        (
            Record(seq, ts, source, kind, None, raw, relay == 1, data)
            for seq, ts, source, kind, data, raw, relay, _ in found
        ),
        more=more,
    )


def frames_page(db: sqlite3.Connection, thread_id: str, after: int, limit: int, raw: bool) -> Frames:
    """Read as UTF-8 bytes: the frames are sent without decoding or encoding any text, and
    without a Record per row (issue #8); in events mode each row is its stored envelope,
    one column (issue #22)."""
    db.text_factory = bytes
    try:
        return (_raw_page if raw else _envelope_page)(db, thread_id, after, limit)
    finally:
        db.text_factory = str


# Raw mode's relayed line of a row and its size; in a page, a line over _SMALL bytes comes
# as its size (a number) and is read alone, only while the page has room for it.
_LINE = "coalesce(substr(env,raw_at+1,length(env)-raw_at-1),raw)"
_LINE_SIZE = "coalesce(length(env)-raw_at-1,length(raw))"
_RAW_LINES = (
    f"SELECT seq,CASE WHEN source='agent' AND relay=1 THEN CASE WHEN {_LINE_SIZE}<=? THEN {_LINE}"  # noqa: S608
    f" ELSE {_LINE_SIZE} END END FROM events WHERE thread_id=? AND seq>? ORDER BY seq LIMIT ?"
)
_ONE_LINE = f"SELECT {_LINE} FROM events WHERE thread_id=? AND seq=?"  # noqa: S608
# The same for envelopes: one over _SMALL bytes comes as its size.
_ENVELOPES = (
    f"SELECT seq,CASE WHEN length(env)<=? THEN {ENV_SQL} ELSE length(env) END FROM events"  # noqa: S608
    " WHERE thread_id=? AND seq>? ORDER BY seq LIMIT ?"
)
_ONE_ENVELOPE = f"SELECT {ENV_SQL} FROM events WHERE thread_id=? AND seq=?"  # noqa: S608


def _raw_page(db: sqlite3.Connection, thread_id: str, after: int, limit: int) -> Frames:
    """Raw mode relays the agent's own lines, one per stdout line (``relay``); its other
    rows send nothing (None)."""
    found, more = _texts(db, (_RAW_LINES, _ONE_LINE), (thread_id, after, limit), none_ok=True) or ([], False)
    return Frames(checked_lines(found), len(found), found[-1][0] if found else after, more=more)


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
    page = None if old else _texts(db, (_ENVELOPES, _ONE_ENVELOPE), (thread_id, after, limit), none_ok=False)
    if page is None:
        n, more = extent(db, thread_id, after, limit)
        found = _rebuilt(db, thread_id, after, n) if n else []
    else:
        found, more = page
    return Frames(checked_envelopes(found), len(found), found[-1][0] if found else after, more=more)


def _texts(
    db: sqlite3.Connection, statements: tuple[str, str], page: tuple[str, int, int], *, none_ok: bool
) -> tuple[list[Any], bool] | None:
    """A page of ``(seq, text)`` rows read by ``statements`` (the page's, and one row's for
    a text that came as its size), and whether events may follow it. A row without text
    is kept (``none_ok``) or ends the read: None (an envelope to build from its parts). A
    chunk under the bound is taken whole, its sizes summed in C (a number or a NULL where
    there must be text fails the sum: that chunk is looked at row by row). CorruptEvent
    at a text that is not bytes."""
    thread_id, after, limit = page
    cur = db.execute(statements[0], (_SMALL, thread_id, after, limit))
    found: list[Any] = []
    total = 0
    for chunk in _chunks(cur):
        try:
            size = sum(map(len, filter(None, map(_SECOND, chunk)) if none_ok else map(_SECOND, chunk)))
        except TypeError:
            size = PAGE_BYTES
        if total + size < PAGE_BYTES:
            found += chunk
            total += size
            continue
        for seq, small in chunk:
            text = small if small is None or small.__class__ is bytes else _one(db, statements[1], thread_id, seq)
            if text is None and not none_ok:
                return None
            found.append((seq, text))
            total += len(text or b"")
            if total >= PAGE_BYTES:
                return found, True
    return found, len(found) == limit


def _one(db: sqlite3.Connection, statement: str, thread_id: str, seq: int) -> bytes | None:
    """One row's text, read alone (it was too large to come with the page)."""
    text = db.execute(statement, (thread_id, seq)).fetchone()[0]
    if text is not None and text.__class__ is not bytes:
        raise CorruptEvent(seq)
    return text


def _rebuilt(db: sqlite3.Connection, thread_id: str, after: int, n: int) -> list[tuple[int, bytes]]:
    """A page holding rows whose envelope is not sent as stored (from before migration 9,
    or of another wire version), each built from its parts by ``stored_envelopes``: the
    columns of an old row, the ``data`` and ``raw`` of a newer one cut out of its envelope
    (which joins a current one back byte for byte). A row whose data cannot be had:
    CorruptEvent."""
    found = db.execute(
        f"SELECT seq,ts,source,kind,{sql.DATA_SQL},{sql.RAW_SQL} FROM events"  # noqa: S608
        " WHERE thread_id=? AND seq>? ORDER BY seq LIMIT ?",
        (thread_id, after, n),
    ).fetchall()
    try:
        return list(zip([r[0] for r in found], stored_envelopes(found), strict=True))
    except TypeError:  # a NULL where data must be
        raise CorruptEvent(next(r[0] for r in found if not isinstance(r[4], bytes))) from None
