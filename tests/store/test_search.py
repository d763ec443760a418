"""Full-text search in both stores (issue #38 item 4): indexed in the append's transaction
(found as soon as the append returns), still found after the store is reopened, gone with
its thread, limited to one owner's threads, paged by an opaque cursor; streamed deltas
joined into one document (or replaced by the complete message); hostile queries refused
with a clear error or taken as plain words, never a store error."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import psycopg
import pytest
from support.stores import StoreFactory, thread

from bridge.errors import InvalidRequest
from bridge.protocols.events import Record
from bridge.store.search_text import MAX_DOC_TEXT, MAX_QUERY

pytestmark = pytest.mark.timeout(60)
TS = "2026-12-01T00:00:00.000Z"


def ev(seq: int, kind: str, source: str = "agent", **data: Any) -> Record:
    return Record(seq, TS, source, kind, data, None, False)


def conversation(first: int = 1) -> list[Record]:
    s = first
    return [
        ev(s, "message", "client", role="user", text="please deploy the staging server", turn_id="t1"),
        ev(s + 1, "turn.started", "bridge", turn_id="t1", prompt_seq=s),
        ev(s + 2, "tool.call", tool_call_id="c1", name="Bash", input={"command": "kubectl rollout restart zebra"}),
        ev(s + 3, "tool.result", tool_call_id="c1", output="deployment.apps/zebra restarted", is_error=False),
        ev(s + 4, "message.delta", text="The rollout of ", channel="text"),
        ev(s + 5, "message.delta", text="giraffe finished", channel="text"),
        ev(s + 6, "turn.ended", turn_id="t1", status="success"),
    ]


async def seqs(store: Any, q: str, owner: str | None = None) -> list[tuple[str, int, str]]:
    hits, _ = await store.search(q, owner=owner, limit=100, cursor=None)
    return [(h["thread"], h["seq"], h["kind"]) for h in hits]


async def test_indexed_at_commit_and_after_reopen(opened: StoreFactory) -> None:
    async with asyncio.timeout(30):
        async with opened() as store:
            await store.create_thread(thread("t1"))  # type: ignore[arg-type]
            recs = conversation()
            await store.append("t1", recs, [None] * len(recs), {})
            assert await seqs(store, "staging") == [("t1", 1, "message")]
            assert await seqs(store, "kubectl") == [("t1", 3, "tool.call")]
            assert await seqs(store, "restarted") == [("t1", 4, "tool.result")]
            # the two deltas are one document, at the first one's seq: a phrase across them
            assert await seqs(store, '"rollout of giraffe"') == [("t1", 5, "message.delta")]
            assert await seqs(store, "zebra") == [("t1", 4, "tool.result"), ("t1", 3, "tool.call")]
            hits, _ = await store.search("giraffe", owner=None, limit=10, cursor=None)
            snippet, marks = hits[0]["snippet"], hits[0]["marks"]
            assert snippet == "The rollout of giraffe finished" and hits[0]["ts"] == TS
            assert [snippet[a : a + n] for a, n in marks] == ["giraffe"]
        async with opened() as store:
            assert await seqs(store, "giraffe") == [("t1", 5, "message.delta")]
            # a stream open when the store closed goes on where it was
            more = [ev(8, "message.delta", text="half an ans"), ev(9, "message.delta", text="wer okapi")]
            await store.append("t1", more, [None, None], {})
        async with opened() as store:
            assert await seqs(store, "okapi") == []  # still streaming: not yet a document
            await store.append("t1", [ev(10, "turn.ended", turn_id="t2", status="success")], [None], {})
            assert await seqs(store, '"half an answer okapi"') == [("t1", 8, "message.delta")]


async def test_complete_message_replaces_its_stream(opened: StoreFactory) -> None:
    async with asyncio.timeout(30), opened() as store:
        await store.create_thread(thread("t1"))  # type: ignore[arg-type]
        recs = [
            ev(1, "message.delta", text="hello wom"),
            ev(2, "message.stream", event="message_stop"),
            ev(3, "message", role="assistant", text="hello wombat", message_id="m1"),
            ev(4, "message", role="user", text="please deploy", origin="replay"),
        ]
        for r in recs:  # one append each: the stream is carried between appends
            await store.append("t1", [r], [None], {})
        assert await seqs(store, "wombat") == [("t1", 3, "message")]
        assert await seqs(store, "deploy") == []  # stream-json's echo of a prompt


async def test_delete_and_owners(opened: StoreFactory) -> None:
    async with asyncio.timeout(30), opened() as store:
        for tid, owner in (("ta", "alice"), ("tb", "bob"), ("tc", "alice")):
            await store.create_thread(thread(tid, owner=owner))  # type: ignore[arg-type]
            recs = conversation()
            await store.append(tid, recs, [None] * len(recs), {})
        assert {t for t, _, _ in await seqs(store, "staging")} == {"ta", "tb", "tc"}
        assert [t for t, _, _ in await seqs(store, "staging", "alice")] == ["tc", "ta"]  # newest first
        assert await seqs(store, "staging", "carol") == []
        assert await store.delete_thread("tc")
        assert [t for t, _, _ in await seqs(store, "staging", "alice")] == ["ta"]
        assert await seqs(store, "giraffe", "bob") == [("tb", 5, "message.delta")]


async def test_pages(opened: StoreFactory) -> None:
    async with asyncio.timeout(30), opened() as store:
        await store.create_thread(thread("t1"))  # type: ignore[arg-type]
        recs = [ev(i, "message", "client", role="user", text=f"capybara number {i}") for i in range(1, 8)]
        await store.append("t1", recs, [None] * len(recs), {})
        found: list[int] = []
        cursor = None
        for _ in range(10):
            hits, cursor = await store.search("capybara", owner=None, limit=3, cursor=cursor)
            found += [h["seq"] for h in hits]
            if cursor is None:
                break
        assert found == [7, 6, 5, 4, 3, 2, 1]
        with pytest.raises(InvalidRequest) as err:
            await store.search("capybara", owner=None, limit=3, cursor="not-a-cursor")
        assert err.value.code == "invalid_cursor"


async def test_hostile_queries(opened: StoreFactory) -> None:
    async with asyncio.timeout(30), opened() as store:
        await store.create_thread(thread("t1"))  # type: ignore[arg-type]
        big = "ünïcödé 日本語 " + "x" * (MAX_DOC_TEXT * 2) + " tailword"
        recs = [
            ev(1, "message", "client", role="user", text='say "NEAR(a b)" AND col:x * ^ ( unbalanced'),
            ev(2, "message", "client", role="user", text=big),
            ev(3, "tool.result", output={"nested": ["bytes", "\ue000marker\ue001"]}),
            ev(4, "message", text="nul\x00inside"),  # PostgreSQL text holds no NUL
            Record(5, TS, "agent", "message", None, None, False, '{"text":"lone \\ud800 surrogate"}'),
        ]
        await store.append("t1", recs, [None] * len(recs), {})
        # FTS5 operators in the query are words to look for, never syntax
        for q in ["NEAR(a b)", "col:x", '"unbalanced', "AND", "( unbalanced", "unbalanced*", "x OR", "-x unbalanced"]:
            await store.search(q, owner=None, limit=5, cursor=None)
        assert await seqs(store, '"near a b"') == [("t1", 1, "message")]
        assert await seqs(store, "ünïcödé") == [("t1", 2, "message")]
        assert await seqs(store, "tailword") == []  # past the bounded document
        assert await seqs(store, "marker") == [("t1", 3, "tool.result")]
        assert await seqs(store, "unbalanced -near") == []
        assert await seqs(store, "unbalanced or tailword") == [("t1", 1, "message")]
        assert await seqs(store, "inside") == [("t1", 4, "message")]
        assert await seqs(store, "surrogate") == [("t1", 5, "message")]
        assert store.healthy
        for q, why in (("", "no word"), ("!!! ***", "no word"), ("-x", "no word"), ("y" * (MAX_QUERY + 1), "longer")):
            with pytest.raises(InvalidRequest) as err:
                await store.search(q, owner=None, limit=5, cursor=None)
            assert err.value.code == "invalid_query" and why in str(err.value)


async def test_an_upgraded_store_indexes_what_it_already_held(opened: StoreFactory, store_url: str) -> None:
    """The migration that makes the index indexes the events already stored, as the appends
    would have (a streamed answer joined; one still streaming carried on after)."""
    async with asyncio.timeout(30):
        async with opened() as store:
            await store.create_thread(thread("t1"))  # type: ignore[arg-type]
            await store.create_thread(thread("t2"))  # type: ignore[arg-type]
            recs = conversation()
            await store.append("t1", recs, [None] * len(recs), {})
            await store.append("t2", [ev(1, "message.delta", text="still stre")], [None], {})
        await forget_the_index(store_url)
        async with opened() as store:
            assert await seqs(store, "staging") == [("t1", 1, "message")]
            assert await seqs(store, '"rollout of giraffe"') == [("t1", 5, "message.delta")]
            assert await seqs(store, "zebra") == [("t1", 4, "tool.result"), ("t1", 3, "tool.call")]
            await store.append("t2", [ev(2, "message.delta", text="aming capybara")], [None], {})
            await store.append("t2", [ev(3, "turn.ended", turn_id="x", status="success")], [None], {})
            assert await seqs(store, '"still streaming capybara"') == [("t2", 1, "message.delta")]


async def forget_the_index(store_url: str) -> None:
    """The database as the version before the index left it."""
    drop = ["DROP TABLE search_docs", "DROP TABLE search_streams", "ALTER TABLE threads DROP COLUMN archived"]
    drop += ["DROP TABLE turn_usage", "ALTER TABLE threads DROP COLUMN usage"]  # (the migration after it)
    drop += ["ALTER TABLE threads DROP COLUMN forked_from", "ALTER TABLE threads DROP COLUMN worktree"]  # (and after)
    drop += ["DROP TABLE push_subscriptions"]
    if store_url.startswith("sqlite"):
        db = sqlite3.connect(store_url.removeprefix("sqlite:///"))
        try:
            for stmt in ["DROP TABLE search_fts", *drop, "PRAGMA user_version=12"]:
                db.execute(stmt)
            db.commit()
        finally:
            db.close()
        return
    async with await psycopg.AsyncConnection.connect(store_url, autocommit=True) as conn:
        for stmt in [*drop, "DELETE FROM schema_version WHERE version >= 8"]:
            await conn.execute(stmt)  # type: ignore[arg-type]


def test_event_data_with_a_lone_surrogate_escape_is_still_read_for_the_index() -> None:
    # The fast parser refuses "\ud800"; the index falls back to the standard one, as the
    # transcript stored it, so such an event is searchable like any other.
    from bridge.store import search_text

    assert search_text._data('{"text": "a\\ud800b"}') == {"text": "a\ud800b"}
    assert search_text._data("not json") == {}
