"""GET /v1/threads/{id}/history (docs/api.md §4.16) on a real daemon with the fake agent:
the compacted history of real turns, whose `last_seq` a client continues live from."""

from __future__ import annotations

import pytest
from conftest import Daemon, new_thread

pytestmark = pytest.mark.timeout(60)


async def test_history_merges_a_streamed_turn_and_continues_from_its_last_seq(daemon: Daemon) -> None:
    tid = (await new_thread(daemon, "stream-json"))["id"]
    c = await daemon.ws(tid)
    await c.turn("tool")
    end = await c.turn("count 40")
    async with daemon.http() as http:
        r = await http.get(f"/v1/threads/{tid}/history")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["last_seq"] == end["seq"]
        items = body["items"]
        kinds = [(i["type"], i.get("role")) for i in items]
        assert kinds == [
            ("message", "user"),
            ("tool", None),
            ("message", "assistant"),
            ("turn", None),
            ("message", "user"),
            ("message", "assistant"),
            ("turn", None),
        ], kinds
        assert items[1]["name"] == "Bash" and items[1]["output"] == "hi" and items[1]["status"] == "completed"
        assert items[5]["text"] == "".join(f"{n} " for n in range(40))  # 40 deltas, one item
        assert all(i["from"] <= i["to"] <= end["seq"] for i in items)
        # Nothing after last_seq yet: a client continues live from there.
        page = (await http.get(f"/v1/threads/{tid}/events", params={"after": body["last_seq"]})).json()
        assert page["events"] == []
        # A second read (compacted before: only newer records are read) is the same.
        assert (await http.get(f"/v1/threads/{tid}/history")).json() == body
        end2 = await c.turn("after")
        grown = (await http.get(f"/v1/threads/{tid}/history")).json()
        assert grown["items"][: len(items)] == items and grown["last_seq"] == end2["seq"]
        assert (await http.get("/v1/threads/thr_nope/history")).status_code == 404
