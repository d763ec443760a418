"""The PostgreSQL store's full-text index (bridge/store/search_text.py says what is
indexed): ``search_docs`` with each document's text and its ``tsvector`` (``simple``
configuration: words as written, case folded, no language's stemming, as SQLite's index)
under a GIN index. Written by the group commit (pg_commit._write) in the batch's
transaction, in three statements whatever the batch's size: the open streams of the
batch's threads taken out, the documents inserted, the streams still open put back.
Words are what FTS5 takes for words (search_text.words: the ``tsvector`` is made of the
document's letters and digits, accents off), so both stores find the same documents; the
query is ``phraseto_tsquery`` of each term, joined by the tsquery operators
(search_text.tsquery_sql); snippets by ``ts_headline`` on the page's documents only.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

from bridge.store import search_text as st

# pg_schema.MIGRATIONS: SQLite's migration 13 (search_sqlite.MIGRATION).
MIGRATION = """
CREATE TABLE search_docs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    thread_id text NOT NULL,
    owner text,
    seq bigint NOT NULL,
    kind text NOT NULL,
    ts text NOT NULL,
    body text NOT NULL,
    tsv tsvector NOT NULL
);
CREATE INDEX search_docs_by_thread ON search_docs (thread_id);
CREATE INDEX search_docs_by_owner ON search_docs (owner, id);
CREATE INDEX search_docs_fts ON search_docs USING gin (tsv);
CREATE TABLE search_streams (
    thread_id text PRIMARY KEY,
    seq bigint NOT NULL,
    ts text NOT NULL,
    channel text NOT NULL,
    body text NOT NULL
);
ALTER TABLE threads ADD COLUMN archived boolean NOT NULL DEFAULT false;
"""

_TAKE_STREAMS = "DELETE FROM search_streams WHERE thread_id = ANY(%s) RETURNING thread_id, seq, ts, channel, body"
_INSERT_DOCS = (
    "INSERT INTO search_docs (thread_id, owner, seq, kind, ts, body, tsv) "
    "SELECT v.t, (SELECT owner FROM threads WHERE id = v.t), v.s, v.k, v.ts, v.b, to_tsvector('simple', v.w) "
    "FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::text[], %s::text[], %s::text[]) WITH ORDINALITY "
    "AS v(t, s, k, ts, b, w, n) ORDER BY v.n"  # (the ids in the order the documents come)
)
_PUT_STREAMS = (
    "INSERT INTO search_streams (thread_id, seq, ts, channel, body) "
    "SELECT * FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::text[], %s::text[])"
)


def _data_json(env: bytes, data_at: int, raw_at: int | None) -> str:
    """An event's data cut out of its stored envelope (rows.DATA_SQL's offsets)."""
    end = raw_at - 7 if raw_at is not None else len(env) - 12
    return env[data_at:end].decode()


def _relevant_rows(rows: list[tuple[Any, ...]]) -> dict[str, list[tuple[int, str, str, str, str]]]:
    """The batch's rows the index looks at, by thread, in order (``event_rows`` tuples)."""
    out: dict[str, list[tuple[int, str, str, str, str]]] = {}
    for tid, seq, ts, source, kind, env, data_at, raw_at, *_ in rows:
        if kind in st.RELEVANT:
            out.setdefault(tid, []).append((seq, ts, source, kind, _data_json(env, data_at, raw_at)))
    return out


async def index(conn: AsyncConnection[Any], rows: list[tuple[Any, ...]]) -> None:
    """Index a batch's event rows, in the caller's transaction."""
    by_thread = _relevant_rows(rows)
    if not by_thread:
        return
    cur = await conn.execute(_TAKE_STREAMS, (list(by_thread),))
    streams = {r[0]: st.Stream(*r[1:]) for r in await cur.fetchall()}
    docs: list[tuple[str, int, str, str, str, str]] = []
    still: list[tuple[str, int, str, str, str]] = []
    for tid, found in by_thread.items():
        made, stream = st.index_plan(streams.get(tid), found)
        docs += [(tid, d.seq, d.kind, d.ts, d.text, st.words(d.text)) for d in made]
        if stream is not None:
            still.append((tid, stream.seq, stream.ts, stream.channel, stream.text))
    if docs:
        await conn.execute(_INSERT_DOCS, [list(c) for c in zip(*docs, strict=True)])
    if still:
        await conn.execute(_PUT_STREAMS, [list(c) for c in zip(*still, strict=True)])


_BACKFILL_BATCH = 1000  # documents an INSERT


async def migrate(conn: AsyncConnection[Any]) -> None:
    """Migration 8 (pg_schema.MIGRATIONS), in its transaction: the tables, then the events
    already stored indexed as the appends would have indexed them (search_text.backfill),
    read through a server-side cursor so a large store is never held in memory."""
    await conn.execute(MIGRATION)
    fill = st.Backfill()
    async with conn.cursor(name="search_backfill") as cur:
        await cur.execute(
            "SELECT thread_id, seq, ts, source, kind, CASE WHEN env IS NULL THEN data ELSE "
            "convert_from(substring(env FROM data_at + 1 FOR coalesce(raw_at - 7, length(env) - 12) - data_at), "
            "'UTF8') END FROM events WHERE kind = ANY(%s) ORDER BY thread_id, seq",
            (sorted(st.RELEVANT),),
        )
        while chunk := await cur.fetchmany(_BACKFILL_BATCH):
            docs = [(tid, d.seq, d.kind, d.ts, d.text, st.words(d.text)) for tid, d in fill.feed(chunk)]
            if docs:
                await conn.execute(_INSERT_DOCS, [list(c) for c in zip(*docs, strict=True)])
    streams = [(tid, *_stream_row(stream)) for tid, stream in fill.finish()]
    if streams:
        await conn.execute(_PUT_STREAMS, [list(c) for c in zip(*streams, strict=True)])


def _stream_row(stream: st.Stream) -> tuple[int, str, str, str]:
    return stream.seq, stream.ts, stream.channel, stream.text


async def forget(conn: AsyncConnection[Any], thread_id: str) -> None:
    """A deleted thread's documents out of the index (in the delete's transaction)."""
    await conn.execute("DELETE FROM search_docs WHERE thread_id = %s", (thread_id,))
    await conn.execute("DELETE FROM search_streams WHERE thread_id = %s", (thread_id,))


_HEADLINE = (
    f'StartSel="{st.MARK_START}", StopSel="{st.MARK_END}", MaxWords={st.SNIPPET_TOKENS}, '
    'MinWords=8, ShortWord=0, MaxFragments=1, FragmentDelimiter=" … "'
)
# The newest matching documents below a cursor, of threads ``owner`` may see; the
# headline is made for the page's documents only. A user's search filters on the
# document's own copy of its thread's owner (a thread's owner never changes), so the
# planner can walk that user's documents newest first (search_docs_by_owner) and stop
# after the page, where a join with threads read every match of a common word first
# (1.2 s against 1 ms: docs/benchmarks.md "Search").
_SEARCH = """
WITH q AS (SELECT {} AS q),
page AS (
    SELECT d.id, d.thread_id, d.seq, d.kind, d.ts, d.body FROM search_docs d, q
    WHERE d.tsv @@ q.q AND d.id < %s {}
    ORDER BY d.id DESC LIMIT %s
)
SELECT page.id, page.thread_id, page.seq, page.kind, page.ts, ts_headline('simple', page.body, q.q, %s)
FROM page, q ORDER BY page.id DESC
"""
_OWNER = "AND d.owner = %s"


async def search(
    conn: AsyncConnection[Any], groups: list[list[st.Term]], owner: str | None, limit: int, cursor: int | None
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of hits and the next page's cursor (``groups``: search_text.parse_query's).
    The statement is put together from constant fragments only (search_text.tsquery_sql):
    every word of the user's is a bound parameter."""
    expr, params = st.tsquery_sql(groups)
    below = (1 << 62) if cursor is None else cursor
    if owner is None:
        statement, args = _SEARCH.format(expr, ""), [*params, below, limit + 1, _HEADLINE]
    else:
        statement, args = _SEARCH.format(expr, _OWNER), [*params, below, owner, limit + 1, _HEADLINE]
    cur = await conn.execute(statement, args)
    found = await cur.fetchall()
    hits = [st.hit(tid, seq, kind, ts, snip) for _, tid, seq, kind, ts, snip in found[:limit]]
    return hits, st.encode_cursor(found[limit - 1][0]) if len(found) > limit else None
