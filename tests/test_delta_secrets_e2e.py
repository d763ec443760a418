"""A profile's secret that the agent streams split across two deltas, read by the daemon
apart (docs/api.md §6.9): redacted whole in the stored transcript, in what a WebSocket
client joins, in the search index and the database file, and absent from the logs."""

from __future__ import annotations

from typing import Any

from conftest import new_thread
from test_permissions_e2e import cfg

SECRET = "sk-test-0123456789abcdef"
SAID = "the value of FAKE_API_KEY is [redacted], keep it"


def joined(frames: list[dict[str, Any]]) -> str:
    return "".join(f["data"]["text"] for f in frames if f.get("kind") == "message.delta" and f.get("source") == "agent")


async def test_a_secret_split_across_two_deltas_is_redacted_whole(
    daemon_factory: Any, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(cfg({**agent_env, "FAKE_API_KEY": SECRET}))
    thread = await new_thread(d, "sj")
    c = await d.ws(thread["id"])
    await c.turn("splitleak FAKE_API_KEY")
    deltas = [f for f in c.frames if f.get("kind") == "message.delta"]
    assert len(deltas) >= 2  # (the fake's two lines, each in its own read)
    assert joined(c.frames) == SAID
    assert [f for f in c.seen("message") if f["source"] == "agent"][-1]["data"]["text"] == SAID
    assert SECRET not in "".join(c.texts)
    async with d.http() as http:
        page = await http.get(f"/v1/threads/{thread['id']}/events", params={"limit": 1000})
        assert page.status_code == 200
        stored = page.json()["events"]
        assert joined(stored) == SAID  # the transcript's deltas, as a later client reads them
        assert SECRET not in page.text
        for q in ("0123456789abcdef", f'"{SECRET}"'):  # the secret's words: found nowhere
            found = await http.get("/v1/search", params={"q": q})
            assert found.status_code == 200 and found.json()["hits"] == [], q
        hits = (await http.get("/v1/search", params={"q": '"redacted keep"'})).json()["hits"]
        assert hits and all(h["thread"] == thread["id"] and SECRET not in h["snippet"] for h in hits)
    # A later client replaying the thread joins the same text.
    late = await d.ws(thread["id"])
    await late.kind("turn.ended")
    assert joined(late.frames) == SAID
    assert SECRET not in d.stderr()
    for db_file in d.data_dir.glob("bridge.db*"):  # the database, its WAL and the search index
        assert SECRET.encode() not in db_file.read_bytes(), db_file.name
