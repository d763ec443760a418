"""GET /v1/threads/{id}/history?limit=&before= (docs/api.md §4.16, issue #36) on a real
daemon: the newest items first with a cursor toward older ones, the pages joining to the
whole history; the same after a restart, when the thread is paged from the store; a page
large enough to be sent in chunks is one JSON document; bad bounds are refused."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from conftest import Daemon, new_thread

pytestmark = pytest.mark.timeout(120)


async def walk(http: httpx.AsyncClient, tid: str, limit: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": limit}
    while True:
        r = await http.get(f"/v1/threads/{tid}/history", params=params)
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["items"]) <= limit
        items[:0] = body["items"]
        if not body["more"]:
            assert body["before"] is None
            return items
        params["before"] = body["before"]


async def test_history_pages_from_its_end_and_after_a_restart(daemon: Daemon) -> None:
    tid = (await new_thread(daemon, "stream-json"))["id"]
    c = await daemon.ws(tid)
    for n in range(36):  # 3 or 4 items a turn: more than one chunk of a sent page
        end = await c.turn("tool" if n % 3 == 0 else f"count {n}")
    await c.close()
    async with daemon.http() as http:
        whole = (await http.get(f"/v1/threads/{tid}/history")).json()  # no limit: up to 1000
        assert whole["more"] is False and whole["before"] is None and whole["last_seq"] == end["seq"]
        assert len(whole["items"]) > 100 and whole["items"][-1]["type"] == "turn"
        newest = (await http.get(f"/v1/threads/{tid}/history", params={"limit": 3})).json()
        assert newest["items"] == whole["items"][-3:] and newest["more"]
        assert newest["before"] == newest["items"][0]["from"] and newest["last_seq"] == end["seq"]
        for limit in (1, 7, 1000):
            assert await walk(http, tid, limit) == whole["items"], limit
        for bad in ({"limit": 0}, {"limit": 1001}, {"before": 0}, {"before": "x"}):
            r = await http.get(f"/v1/threads/{tid}/history", params=bad)
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", (bad, r.text)

    # A restarted daemon keeps no compaction: the pages are read from the store's last turns.
    assert await daemon.stop() == 0
    await daemon.start()
    async with daemon.http() as http:
        again = (await http.get(f"/v1/threads/{tid}/history")).json()
        assert again["items"] == whole["items"] and not again["more"]
        assert again["last_seq"] > end["seq"]  # the agent's exit at the stop was recorded since
        for limit in (2, 5):
            assert await walk(http, tid, limit) == whole["items"], limit
