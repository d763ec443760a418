"""A replayed event is byte-identical to the live one (issue #8: a stored record keeps
``data`` as the stored text, so a replay relays it without parsing or re-serialising)."""

from __future__ import annotations

import json
from pathlib import Path

from bridge.protocols.events import Record
from bridge.store.sqlite import SqliteStore

TS = "2026-11-30T01:02:03.456Z"


async def test_replayed_envelopes_are_byte_identical_to_live_ones(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "bridge.db")
    await store.open()
    try:
        await store.create_thread(
            {
                "id": "thr_1",
                "agent": "a",
                "protocol": "stream-json",
                "model": None,
                "cwd": str(tmp_path),
                "title": "",
                "native_session_id": None,
                "state": "idle",
                "turn_active": False,
                "last_seq": 0,
                "created_at": TS,
                "updated_at": TS,
                "last_exit": None,
                "options": {},
                "pid": None,
            }
        )
        live = [
            Record(
                1,
                TS,
                "agent",
                "message.delta",
                {"text": 'é "quoted" \\ \n', "channel": "text"},
                '{"type":"x","t":"é"}',
                True,
            ),
            Record(2, TS, "agent", "message", {"text": "lone \ud800 surrogate"}, None, False),
            Record(3, TS, "bridge", "turn.ended", {"status": "success", "n": 2**70, "f": 1.5}, None, False),
            # Names that need JSON escaping take the Python path; the result is the same.
            Record(4, TS, "agent", 'odd"kind', {}, None, False),
            Record(5, 'odd"ts', "client", "client.other", {"op": "raw"}, '{"a":[1,{}]}', False),
        ]
        await store.append("thr_1", live, [None] * len(live), {})
        stored = await store.read_events("thr_1", 0, 100)
        assert [r.envelope() for r in stored] == [r.envelope() for r in live]
        assert [r.data for r in stored] == [json.loads(r.envelope())["data"] for r in live]
        # The stored data text is relayed as it is: no parse, no second serialisation.
        assert all(r._data is None for r in await store.read_events("thr_1", 0, 100))
        for r in stored:
            json.loads(r.envelope())  # every envelope is one valid JSON object
        # A replay page is joined straight from the stored rows (no Record per row): the
        # very same frames, and in raw mode only the relayed agent lines.
        page = await store.read_frames("thr_1", 0, 100, raw=False)
        assert page.texts == [r.envelope().encode() for r in live]
        assert (page.count, page.last) == (5, 5)
        page = await store.read_frames("thr_1", 2, 2, raw=False)
        assert page.texts == [r.envelope().encode() for r in live[2:4]]
        assert (page.count, page.last) == (2, 4)
        page = await store.read_frames("thr_1", 0, 100, raw=True)
        assert page.texts == ['{"type":"x","t":"é"}'.encode()]
        assert (page.count, page.last) == (5, 5)
        page = await store.read_frames("thr_1", 1, 100, raw=True)
        assert page.texts == []
        assert (page.count, page.last) == (4, 5)
        page = await store.read_frames("thr_1", 5, 100, raw=True)
        assert (page.texts, page.count, page.last) == ([], 0, 5)
    finally:
        await store.close()
