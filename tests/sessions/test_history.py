"""The compacted history (sessions/history.py), in-process: deltas merge into one message
(the complete message wins), tools join their updates and results, permissions their
resolution, plans replace each other within a turn; every item names the seqs it covers;
feeding in several pages gives what one page gives; arbitrary records never raise."""

from __future__ import annotations

import random
from typing import Any

import pytest

from bridge.protocols.events import Record
from bridge.sessions.history import _HANDLERS, Compactor, committed

pytestmark = pytest.mark.timeout(20)


def records(*events: tuple[str, str, dict[str, Any]]) -> list[Record]:
    return [
        Record(i, "2026-12-01T00:00:00.000Z", src, kind, data, None, False)
        for i, (src, kind, data) in enumerate(events, 1)
    ]


TURN = records(
    ("bridge", "process.started", {"pid": 1}),
    ("client", "message", {"role": "user", "text": "fix it", "turn_id": "t1", "client_id": "c1"}),
    ("bridge", "turn.started", {"turn_id": "t1", "prompt_seq": 2}),
    ("agent", "message.delta", {"text": "Let me ", "channel": "thought"}),
    ("agent", "message.delta", {"text": "look", "channel": "thought"}),
    ("agent", "message", {"role": "assistant", "text": "Let me look.", "channel": "thought"}),
    ("agent", "tool.call", {"tool_call_id": "k1", "name": "Bash", "input": {"command": "ls"}}),
    ("agent", "permission.requested", {"request_id": "p1", "tool": "Bash", "input": {"command": "ls"}}),
    ("bridge", "permission.resolved", {"request_id": "p1", "decision": "allow", "by": "web"}),
    ("agent", "tool.result", {"tool_call_id": "k1", "output": "a\nb", "is_error": False}),
    ("agent", "plan", {"entries": [{"content": "one", "status": "pending"}]}),
    ("agent", "plan", {"entries": [{"content": "one", "status": "completed"}]}),
    ("agent", "message.delta", {"text": "Done", "channel": "text"}),
    ("agent", "message.delta", {"text": " now", "channel": "text"}),
    ("agent", "agent.status", {"status": "requesting"}),
    ("agent", "turn.ended", {"turn_id": "t1", "status": "success", "usage": {"output_tokens": 3}}),
)


def test_a_turn_compacts_to_what_a_reader_sees() -> None:
    comp = Compactor()
    comp.feed(TURN)
    items = comp.snapshot()
    assert [(i["type"], i["from"], i["to"]) for i in items] == [
        ("message", 2, 2),
        ("message", 4, 6),
        ("tool", 7, 10),
        ("permission", 8, 9),
        ("plan", 11, 12),
        ("message", 13, 14),
        ("turn", 16, 16),
    ]
    user, thought, tool, perm, plan, reply, end = items
    assert user == {
        "type": "message",
        "role": "user",
        "text": "fix it",
        "turn_id": "t1",
        "client_id": "c1",
        "from": 2,
        "to": 2,
    }
    assert thought["text"] == "Let me look." and thought["channel"] == "thought"  # the complete message wins
    assert tool["output"] == "a\nb" and tool["status"] == "completed" and tool["input"] == {"command": "ls"}
    assert perm["decision"] == "allow" and perm["by"] == "web"
    assert plan["entries"] == [{"content": "one", "status": "completed"}]
    assert reply["text"] == "Done now" and "_parts" not in reply  # deltas only: merged
    assert end["status"] == "success" and end["usage"] == {"output_tokens": 3}
    assert comp.last_seq == 16


def test_a_message_still_streaming_shows_its_text_so_far_and_then_grows() -> None:
    comp = Compactor()
    comp.feed(TURN[:13])
    assert comp.snapshot()[-1]["text"] == "Done"
    comp.feed(TURN[13:])
    assert [i["text"] for i in comp.snapshot() if i["type"] == "message"][-1] == "Done now"


@pytest.mark.parametrize("cut", range(1, len(TURN)))
def test_pages_of_any_size_give_the_same_history(cut: int) -> None:
    whole, paged = Compactor(), Compactor()
    whole.feed(TURN)
    paged.feed(TURN[:cut])
    paged.feed(TURN[cut - 1 :])  # one record read twice: skipped by seq
    assert paged.snapshot() == whole.snapshot()


def test_acp_message_ids_split_messages_and_tool_updates_merge() -> None:
    comp = Compactor()
    comp.feed(
        records(
            ("agent", "message.delta", {"text": "a", "channel": "text", "message_id": "m1"}),
            ("agent", "message.delta", {"text": "b", "channel": "text", "message_id": "m2"}),
            ("agent", "tool.call", {"tool_call_id": "x", "title": "Read", "status": "pending"}),
            ("agent", "tool.call", {"tool_call_id": "x", "update": True, "status": "in_progress"}),
            ("agent", "tool.result", {"tool_call_id": "x", "output": "boom", "is_error": True}),
            ("bridge", "turn.ended", {"turn_id": "t", "status": "cancelled", "reason": "interrupted"}),
        )
    )
    items = comp.snapshot()
    assert [(i["type"], i.get("text")) for i in items[:2]] == [("message", "a"), ("message", "b")]
    assert items[2]["title"] == "Read" and items[2]["status"] == "failed" and items[2]["to"] == 5
    assert items[3] == {
        "type": "turn",
        "turn_id": "t",
        "status": "cancelled",
        "reason": "interrupted",
        "from": 6,
        "to": 6,
    }


KINDS = [
    "message",
    "message.delta",
    "tool.call",
    "tool.result",
    "permission.requested",
    "permission.resolved",
    "plan",
    "turn.ended",
    "notice",
]
VALUES: list[Any] = [None, "", "x", 0, True, [], {}, {"a": 1}, "m1", "thought"]


def test_arbitrary_records_never_raise_and_every_item_has_a_valid_range() -> None:
    rng = random.Random(18)
    for _ in range(300):
        recs = []
        for seq in range(1, rng.randint(1, 30)):
            data = {
                k: rng.choice(VALUES)
                for k in rng.sample(
                    [
                        "text",
                        "channel",
                        "role",
                        "message_id",
                        "tool_call_id",
                        "request_id",
                        "output",
                        "is_error",
                        "entries",
                        "status",
                    ],
                    rng.randint(0, 6),
                )
            }
            recs.append(
                Record(seq, "t", rng.choice(["agent", "client", "bridge"]), rng.choice(KINDS), data, None, False)
            )
        comp = Compactor()
        comp.feed(recs)
        for item in comp.snapshot():
            assert 1 <= item["from"] <= item["to"] <= len(recs)
            assert "_parts" not in item


def test_commits_fed_as_they_come_give_what_one_read_gives_and_a_gap_is_caught_up() -> None:
    whole = Compactor()
    whole.feed(TURN)
    live = Compactor()
    for rec in TURN[:5]:
        assert committed(live, [rec], 100) is live
    # Records 6..8 were committed while this compaction was not fed (another replica, or
    # a read in progress): the commit of 9.. does not follow on and is left alone...
    assert committed(live, TURN[8:10], 100) is live and live.last_seq == 5
    # ...until a read catches up from the store; then commits feed it again.
    live.feed(TURN[5:10])
    for rec in TURN[10:]:
        committed(live, [rec], 100)
    assert live.snapshot() == whole.snapshot() and live.last_seq == TURN[-1].seq


def test_a_snapshot_is_not_changed_by_later_commits_and_too_many_items_are_let_go() -> None:
    comp = Compactor()
    committed(comp, TURN[:7], 100)  # the tool call, still pending
    shot = comp.snapshot()
    committed(comp, TURN[7:], 100)
    tool = next(i for i in shot if i["type"] == "tool")
    assert tool["to"] == 7 and "output" not in tool
    assert committed(Compactor(), TURN, 3) is None  # seven items: more than three


def generic_feed(comp: Compactor, recs: list[Record]) -> None:
    """Compactor.feed without its inlined delta path (issue #22): each record to its handler."""
    for rec in recs:
        if rec.seq <= comp.last_seq:
            continue
        comp.last_seq = rec.seq
        handler = _HANDLERS.get(rec.kind)
        if handler is not None and isinstance(rec.data, dict):
            handler(comp, rec, rec.data)


def test_the_inlined_delta_path_compacts_as_the_handlers_do() -> None:
    rng = random.Random(22)
    kinds = ["message.delta"] * 6 + KINDS
    for _ in range(400):
        recs = []
        for seq in range(1, rng.randint(1, 40)):
            keys = rng.sample(["text", "channel", "message_id", "role", "tool_call_id"], rng.randint(0, 4))
            data: Any = {k: rng.choice([*VALUES, "a", "b"]) for k in keys}
            if rng.random() < 0.6:
                data["text"] = rng.choice(["a", "b", "", 1, None])
            if rng.random() < 0.05:
                data = rng.choice([[], "x", 0])
            recs.append(Record(seq, "t", rng.choice(["agent", "client"]), rng.choice(kinds), data, None, False))
        cut = rng.randint(0, len(recs))
        fast, slow = Compactor(), Compactor()
        fast.feed(recs[:cut])
        fast.feed(recs[max(0, cut - 3) :])  # a page read twice in part
        generic_feed(slow, recs)
        assert fast.snapshot() == slow.snapshot()
        assert fast.last_seq == slow.last_seq
