"""Each event's envelope is stored at commit (issue #22): a replayed row is that one column,
byte-identical to the live envelope; ``data`` and ``raw`` are derived from it. Rows written
before the migration (no stored envelope) replay as before, mixed with new ones in one
page; a stored envelope that is not one for its row (another replica wrote it, or a disk
damaged it) is never sent. Both stores (tests/store/conftest.py)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.stores import StoreFactory, opened_at, thread

from bridge.errors import StoreError
from bridge.protocols.envelope import stored_envelope
from bridge.protocols.events import Record
from bridge.store import pg_schema
from bridge.store import sqlite_sql as sql

pytestmark = pytest.mark.timeout(60)
TS = "2026-12-01T00:00:00.000Z"


def live() -> list[Record]:
    return [
        Record(1, TS, "agent", "message.delta", {"text": 'é "q" \\ \n', "n": 1}, '{"type":"x","t":"é ✓"}', True),
        Record(2, TS, "agent", "message", {"text": "lone \ud800 surrogate"}, None, False),
        Record(3, TS, "bridge", "turn.ended", {"status": "success", "n": 2**70}, None, False),
        Record(4, TS, "agent", 'odd"kind', {}, None, False),
        Record(5, 'odd"ts', "client", "client.other", {"op": "ü"}, '{"a":[1,{}],"raw":1}', False),
        Record(6, TS, "agent", "message", {"text": ',"raw":null}'}, '{"x":",\\"raw\\":"}', True),
    ]


async def execute(store_url: str, stmt: str, params: tuple[Any, ...] = ()) -> None:
    """A statement on the store's database from outside it (what another replica, an older
    daemon or a damaged disk could have written)."""
    if store_url.startswith("sqlite"):
        db = sqlite3.connect(Path(store_url.removeprefix("sqlite:///")))
        try:
            db.execute(stmt.replace("%s", "?"), params)
            db.commit()
        finally:
            db.close()
        return
    async with await psycopg.AsyncConnection.connect(store_url, autocommit=True) as conn:
        await conn.execute(stmt, params)


async def test_replayed_frames_are_the_stored_envelopes_and_data_is_derived(opened: StoreFactory) -> None:
    records = live()
    async with opened() as store:
        await store.create_thread(thread("thr_1"))  # type: ignore[arg-type]
        await store.append("thr_1", records, [None, None, None, None, "c5", None], {})
        page = await store.read_frames("thr_1", 0, 100, raw=False)
        assert page.texts == [r.envelope().encode() for r in records]
        assert (page.count, page.last) == (6, 6)
        for text in page.texts:
            json.loads(text)
        got = await store.read_events("thr_1", 0, 100)
        assert [(r.data_json, r.raw, r.relay) for r in got] == [(r.data_json, r.raw, r.relay) for r in records]
        assert [r.envelope() for r in got] == [r.envelope() for r in records]
        bare = await store.read_events("thr_1", 0, 100, with_raw=False)
        assert [(r.data_json, r.raw) for r in bare] == [(r.data_json, None) for r in records]
        raw = await store.read_frames("thr_1", 0, 100, raw=True)
        assert raw.texts == [records[0].raw.encode(), records[5].raw.encode()]  # type: ignore[union-attr]
        assert (raw.count, raw.last) == (6, 6)
        assert await store.find_client_event("thr_1", "c5") == 5


def legacy_rows(records: list[Record]) -> list[tuple[Any, ...]]:
    return [("thr_1", r.seq, r.ts, r.source, r.kind, r.data_json, r.raw, r.relay) for r in records]


LEGACY_INSERT = "INSERT INTO events (thread_id,seq,ts,source,kind,data,raw,relay) VALUES (%s,%s,%s,%s,%s,%s,%s,%s)"


async def old_database(store_kind: str, store_url: str, records: list[Record]) -> None:
    """A database as the previous schema left it (SQLite 8, PostgreSQL 3), with a thread
    whose events have no stored envelope."""
    if store_kind == "sqlite":
        path = Path(store_url.removeprefix("sqlite:///"))
        db = sqlite3.connect(path)
        for i, ddl in enumerate(sql._MIGRATIONS[:8], start=1):
            db.executescript(ddl)
            db.execute(f"PRAGMA user_version={i}")
        db.commit()
        db.close()
    else:
        async with await psycopg.AsyncConnection.connect(store_url, autocommit=True) as conn:
            assert await pg_schema.migrate(conn, pg_schema.MIGRATIONS[:3]) == [1, 2, 3]
    row = thread("thr_1")
    cols = ",".join(k for k in row if k != "options")
    await execute(
        store_url,
        f"INSERT INTO threads ({cols}) VALUES ({','.join('%s' for k in row if k != 'options')})",
        tuple(v for k, v in row.items() if k != "options"),
    )
    for r in legacy_rows(records):
        await execute(store_url, LEGACY_INSERT, r)


async def test_rows_from_before_the_migration_replay_as_before_mixed_with_new_ones(
    store_kind: str, store_url: str
) -> None:
    records = live()
    await old_database(store_kind, store_url, records[:4])
    async with opened_at(store_url) as store:
        await store.append("thr_1", records[4:], [None, None], {})
        page = await store.read_frames("thr_1", 0, 100, raw=False)
        assert page.texts == [r.envelope().encode() for r in records]
        assert (page.count, page.last) == (6, 6)
        page = await store.read_frames("thr_1", 3, 2, raw=False)  # one old, one new
        assert page.texts == [r.envelope().encode() for r in records[3:5]]
        got = await store.read_events("thr_1", 0, 100)
        assert [r.envelope() for r in got] == [r.envelope() for r in records]
        raw = await store.read_frames("thr_1", 0, 100, raw=True)
        assert raw.texts == [records[0].raw.encode(), records[5].raw.encode()]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "env",
    [
        b'{"seq":9,"ts":"t","source":"agent","kind":"k","data":{},"raw":null}',  # another seq
        b'{"seq":22,"ts":"t","source":"agent","kind":"k","data":{},"raw":null}',  # a prefix of it
        b'{"seq":2,"ts":"t","source":"agent","kind":"k","data":{}}\n{"seq":3}',  # a second line
        b'{"seq":2,"ts":"t","source":"agent","kind":"k","data":{"a":1',  # cut short
        b"",
    ],
)
async def test_a_hostile_stored_envelope_is_never_sent(opened: StoreFactory, store_url: str, env: bytes) -> None:
    records = live()
    async with opened() as store:
        await store.create_thread(thread("thr_1"))  # type: ignore[arg-type]
        await store.append("thr_1", records, [None] * 6, {})
        await execute(store_url, "UPDATE events SET env = %s WHERE thread_id = 'thr_1' AND seq = 2", (env,))
        with pytest.raises(StoreError, match="stored event 2 is not a well-formed envelope"):
            await store.read_frames("thr_1", 0, 100, raw=False)
        page = await store.read_frames("thr_1", 2, 100, raw=False)  # the rows after it still replay
        assert page.texts == [r.envelope().encode() for r in records[2:]]


async def test_a_hostile_relayed_line_is_never_sent(opened: StoreFactory, store_url: str) -> None:
    records = live()
    async with opened() as store:
        await store.create_thread(thread("thr_1"))  # type: ignore[arg-type]
        await store.append("thr_1", records, [None] * 6, {})
        bad = records[0].envelope().encode()[:-1].replace(b'{"type":"x"', b'{"type":"x"}\n{"type":"y"') + b"}"
        await execute(store_url, "UPDATE events SET env = %s WHERE thread_id = 'thr_1' AND seq = 1", (bad,))
        with pytest.raises(StoreError, match="stored event 1"):
            await store.read_frames("thr_1", 0, 100, raw=True)
        with pytest.raises(StoreError, match="stored event 1"):
            await store.read_frames("thr_1", 0, 100, raw=False)


async def test_text_that_cannot_be_utf8_is_refused_as_before(opened: StoreFactory) -> None:
    async with opened() as store:
        await store.create_thread(thread("thr_1"))  # type: ignore[arg-type]
        bad = Record(1, TS, "client", "client.other", {}, '{"a":"\ud800"}', False)
        with pytest.raises(StoreError, match="append refused"):
            await store.append("thr_1", [bad], [None], {})
        await store.append("thr_1", live()[:1], [None], {})
        assert (await store.read_frames("thr_1", 0, 10, raw=False)).count == 1


async def test_a_row_that_is_neither_envelope_nor_old_is_never_sent(tmp_path: Path) -> None:
    """SQLite keeps any type in any column: an envelope that is a number is not taken for a
    row from before the migration (that has no envelope at all)."""
    url = f"sqlite:///{tmp_path / 'bridge.db'}"
    async with opened_at(url) as store:
        await store.create_thread(thread("thr_1"))  # type: ignore[arg-type]
        await store.append("thr_1", live(), [None] * 6, {})
        await execute(url, "UPDATE events SET env = 12 WHERE thread_id = 'thr_1' AND seq = 3")
        with pytest.raises(StoreError, match="stored event 3"):
            await store.read_frames("thr_1", 0, 100, raw=False)


async def test_a_new_row_without_its_offsets_in_a_page_of_old_rows_is_never_sent(tmp_path: Path) -> None:
    """A page holding old rows is read from columns; a new row there whose ``data`` cannot
    be cut out of its envelope (its offset gone) fails the read instead of going out."""
    url = f"sqlite:///{tmp_path / 'bridge.db'}"
    records = live()
    await old_database("sqlite", url, records[:4])
    async with opened_at(url) as store:
        await store.append("thr_1", records[4:], [None, None], {})
        await execute(url, "UPDATE events SET data_at = NULL WHERE thread_id = 'thr_1' AND seq = 6")
        with pytest.raises(StoreError, match="stored event 6"):
            await store.read_frames("thr_1", 0, 100, raw=False)
        page = await store.read_frames("thr_1", 0, 5, raw=False)
        assert page.texts == [r.envelope().encode() for r in records[:5]]


@pytest.mark.parametrize("writer", ["thread", "process"])
async def test_every_sqlite_writer_path_stores_the_same_envelopes(tmp_path: Path, writer: str) -> None:
    """The envelope is built where the write connection is: inline on the event loop (a
    small batch when the store is idle), on the writer thread or in the writer process."""
    from bridge.store.sqlite import SqliteStore

    store = SqliteStore(tmp_path / "bridge.db", writer=writer)  # type: ignore[arg-type]
    await store.open()
    try:
        await store.create_thread(thread("thr_1"))  # type: ignore[arg-type]
        small = live()
        await store.append("thr_1", small, [None] * 6, {})  # inline when idle
        many = [Record(seq, TS, "agent", "message.delta", {"text": "é" * seq}, None, False) for seq in range(7, 200)]
        await store.append("thr_1", many, [None] * len(many), {})  # over INLINE_MAX_ROWS: the writer
        page = await store.read_frames("thr_1", 0, 1000, raw=False)
        assert page.texts == [r.envelope().encode() for r in small + many]
        got = await store.read_events("thr_1", 0, 1000)
        assert [r.data_json for r in got] == [r.data_json for r in small + many]
    finally:
        await store.close()


_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["2026-12-05T00:00:00.000Z", "2026-12-05T00:00:01.000Z"]) | _TEXT,
            st.sampled_from(["agent", "bridge", "client"]) | _TEXT,
            st.sampled_from(["message.delta", "turn.ended"]) | _TEXT,
            st.dictionaries(_TEXT, _TEXT | st.integers(), max_size=3),
            st.none() | _TEXT.map(lambda t: json.dumps({"type": "x", "t": t}, ensure_ascii=False)),
        ),
        max_size=6,
    )
)
def test_the_writers_envelopes_are_record_envelopes_byte_for_byte(events: list[tuple[Any, ...]]) -> None:
    """``sqlite_sql._insert_rows`` (an append's rows at once, ``ts`` shared, offsets counted)
    stores exactly ``stored_envelope(Record.envelope())`` for every event: any text, any
    ``ts``, a ``raw`` line or none; ``data`` and ``raw`` cut out of it are the event's own."""
    rows = []
    expected = []
    records = []
    for seq, (ts, source, kind, data, raw) in enumerate(events, 1):
        rec = Record(seq, ts, source, kind, data, raw, False)
        records.append(rec)
        rows.append(("thr_a", seq, ts, source, kind, rec.data_json, raw, 0, None))
        expected.append(("thr_a", seq, ts, source, kind, *stored_envelope(rec.envelope(), rec.data_json, raw), 0, None))
    columns = sql.rows_of(records, [None] * len(records))
    got = sql._insert_rows("thr_a", columns)
    assert got == expected
    for (_, _, _, _, _, env, data_at, raw_at, _, _), (_, _, _, _, _, data_json, raw, _, _) in zip(
        got, rows, strict=True
    ):
        end = len(env) - len(b',"raw":null}') if raw_at is None else raw_at - len(b',"raw":')
        assert env[data_at:end].decode() == data_json
        assert (None if raw_at is None else env[raw_at:-1].decode()) == raw
    # The characters of text the batch cap counts: data and raw, whatever they hold.
    item = sql._Append("thr_a", columns, {}, None)
    assert sql.text_size(item) == sum(len(r[5]) + len(r[6] or "") for r in rows)
