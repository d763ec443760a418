"""The SQLite store's full-text index (bridge/store/search_text.py says what is indexed):
an FTS5 table over ``search_docs``, written in the transaction of the append whose
events it indexes (``index``, called by sqlite_sql._write_item wherever that runs: the
writer process, the writer thread or the inline commit), so a search sees what has
committed and a crash leaves the index and the transcript agreeing.

``search_docs`` holds each document's text (at most 8 KiB) and where it came from;
``search_fts`` is an external-content FTS5 table over it (the text is stored once, and
``snippet()`` reads it from there); ``search_streams`` the deltas being joined, a row per
thread. The documents are numbered in commit order (``id``): a search lists the newest
first and pages by that number. No asyncio here: the writer process imports this.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from bridge.store import search_text as st

# The migration (sqlite_sql._MIGRATIONS).
MIGRATION = """
    CREATE TABLE search_docs (
        id INTEGER PRIMARY KEY,
        thread_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        kind TEXT NOT NULL,
        ts TEXT NOT NULL,
        text TEXT NOT NULL
    );
    CREATE INDEX search_docs_by_thread ON search_docs(thread_id);
    CREATE VIRTUAL TABLE search_fts USING fts5(text, content='search_docs', content_rowid='id',
        tokenize='unicode61 remove_diacritics 2');
    CREATE TABLE search_streams (
        thread_id TEXT PRIMARY KEY,
        seq INTEGER NOT NULL,
        ts TEXT NOT NULL,
        channel TEXT NOT NULL,
        text TEXT NOT NULL
    ) WITHOUT ROWID;
    ALTER TABLE threads ADD COLUMN archived INTEGER NOT NULL DEFAULT 0;
"""

SEQ, TS, SOURCE, KIND, DATA = range(5)  # sqlite_sql.Rows' first columns


def after_migration(db: sqlite3.Connection, ddl: str) -> None:
    """Run by the migrations (sqlite_sql.open_writer) after each step, in its transaction:
    after this module's, the events already stored are indexed (search_text.backfill), so
    an upgraded store finds what was said before it."""
    if ddl is not MIGRATION:
        return
    from bridge.store.sqlite_sql import DATA_SQL  # (that module imports this one)

    kinds = ",".join(f"'{k}'" for k in sorted(st.RELEVANT))
    cur = db.execute(
        f"SELECT thread_id, seq, ts, source, kind, {DATA_SQL} FROM events "  # noqa: S608 (constants of the code)
        f"WHERE kind IN ({kinds}) ORDER BY thread_id, seq"
    )
    fill = st.Backfill()
    while chunk := cur.fetchmany(1000):
        for thread_id, doc in fill.feed(chunk):
            db.execute(
                "INSERT INTO search_docs (thread_id, seq, kind, ts, text) VALUES (?,?,?,?,?)",
                (thread_id, doc.seq, doc.kind, doc.ts, doc.text),
            )
    for thread_id, stream in fill.finish():
        db.execute(
            "INSERT INTO search_streams (thread_id, seq, ts, channel, text) VALUES (?,?,?,?,?)",
            (thread_id, stream.seq, stream.ts, stream.channel, stream.text),
        )
    db.execute("INSERT INTO search_fts (search_fts) VALUES ('rebuild')")


# An append of deltas that go on the thread's open stream (most of an answer's appends): one
# statement. Nothing comes back when they cannot (another channel, a full document): the
# general path then closes the stream.
_EXTEND = (
    "INSERT INTO search_streams (thread_id, seq, ts, channel, text) VALUES (?,?,?,?,?) "
    "ON CONFLICT (thread_id) DO UPDATE SET text = text || excluded.text "
    "WHERE channel = excluded.channel AND length(text) + length(excluded.text) <= ? RETURNING 1"
)


def index(db: sqlite3.Connection, thread_id: str, rows: Any) -> None:
    """Index an append's rows (``sqlite_sql.Rows``), in the caller's transaction."""
    if not st.relevant(rows[KIND]):
        return
    deltas = st.joined_deltas(rows[SOURCE], rows[KIND], rows[DATA])
    if deltas is not None:
        channel, text = deltas
        if db.execute(_EXTEND, (thread_id, rows[SEQ][0], rows[TS][0], channel, text, st.MAX_DOC_TEXT)).fetchone():
            return
    found = db.execute(
        "DELETE FROM search_streams WHERE thread_id=? RETURNING seq, ts, channel, text", (thread_id,)
    ).fetchall()
    stream = st.Stream(*found[0]) if found else None
    docs, stream = st.index_plan(stream, zip(rows[SEQ], rows[TS], rows[SOURCE], rows[KIND], rows[DATA], strict=True))
    if docs:
        # Numbered here, in the one writer's transaction, so that both tables take the
        # append's documents in one statement each (a statement per document cost more
        # than the rest of the append).
        (top,) = db.execute("SELECT coalesce(max(id), 0) FROM search_docs").fetchone()
        ids = range(top + 1, top + 1 + len(docs))
        db.executemany(
            "INSERT INTO search_docs (id, thread_id, seq, kind, ts, text) VALUES (?,?,?,?,?,?)",
            [(i, thread_id, doc.seq, doc.kind, doc.ts, doc.text) for i, doc in zip(ids, docs, strict=True)],
        )
        db.executemany(
            "INSERT INTO search_fts (rowid, text) VALUES (?, ?)",
            [(i, doc.text) for i, doc in zip(ids, docs, strict=True)],
        )
    if stream is not None:
        db.execute(
            "INSERT INTO search_streams (thread_id, seq, ts, channel, text) VALUES (?,?,?,?,?)",
            (thread_id, stream.seq, stream.ts, stream.channel, stream.text),
        )


def forget(db: sqlite3.Connection, thread_id: str) -> None:
    """A deleted thread's documents out of the index (in the delete's transaction)."""
    db.execute(
        "INSERT INTO search_fts (search_fts, rowid, text) SELECT 'delete', id, text FROM search_docs WHERE thread_id=?",
        (thread_id,),
    )
    db.execute("DELETE FROM search_docs WHERE thread_id=?", (thread_id,))
    db.execute("DELETE FROM search_streams WHERE thread_id=?", (thread_id,))


# The newest matching documents below a cursor, of threads ``owner`` may see. CROSS JOIN
# keeps the FTS5 table the outer loop: it walks its matches newest first and the page stops
# after ``limit`` that pass the owner's filter.
_SEARCH = (
    "SELECT d.id, d.thread_id, d.seq, d.kind, d.ts, snippet(search_fts, 0, ?, ?, '…', ?) "
    "FROM search_fts CROSS JOIN search_docs AS d CROSS JOIN threads AS t "
    "WHERE search_fts MATCH ? AND search_fts.rowid < ? AND d.id = search_fts.rowid AND t.id = d.thread_id "
    "AND (? IS NULL OR t.owner = ?) ORDER BY search_fts.rowid DESC LIMIT ?"
)
_NO_CURSOR = 1 << 62


def search(
    db: sqlite3.Connection, query: str, owner: str | None, limit: int, cursor: int | None
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of hits and the next page's cursor (``query``: the parsed query's FTS5 text)."""
    found = db.execute(
        _SEARCH,
        (
            st.MARK_START,
            st.MARK_END,
            st.SNIPPET_TOKENS,
            query,
            _NO_CURSOR if cursor is None else cursor,
            owner,
            owner,
            limit + 1,
        ),
    ).fetchall()
    hits = [st.hit(tid, seq, kind, ts, snip) for _, tid, seq, kind, ts, snip in found[:limit]]
    return hits, st.encode_cursor(found[limit - 1][0]) if len(found) > limit else None
