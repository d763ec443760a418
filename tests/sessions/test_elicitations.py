"""Pending elicitations, pure: the table (first answer wins, content checked, the request
kept on a refused answer), the timeout's cancel, and the books a lost owner's life leaves
open closed for elicitations as for permission requests."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.errors import Conflict, InvalidRequest, NotFound
from bridge.protocols.elicitation import form_schema
from bridge.protocols.events import Record
from bridge.sessions import elicitations as elicit
from bridge.sessions.actions import ArmTimer, CancelTimer, Emit, Limits
from bridge.sessions.elicitations import ElicitationTable, Pending
from bridge.sessions.ownership import open_requests, takeover_events

SCHEMA = form_schema({"properties": {"name": {"type": "string"}}, "required": ["name"]})


def asked(rid: str = "1", mode: str = "form") -> dict[str, Any]:
    data: dict[str, Any] = {"request_id": rid, "mode": mode, "message": "m"}
    if mode == "form":
        data["requested_schema"] = SCHEMA
    return data


def rec(seq: int, kind: str, **data: Any) -> Record:
    return Record(seq, "2026-01-01T00:00:00Z", "agent", kind, data, None, False)


def test_first_answer_wins_and_bad_content_leaves_it_pending() -> None:
    table = ElicitationTable()
    table.hold(Pending("1", asked(), 5, "t", 10.0))
    with pytest.raises(InvalidRequest) as bad:
        table.take("1", "accept", {"name": 3}, "rest")
    assert bad.value.code == "invalid_elicitation_content" and "1" in table
    with pytest.raises(InvalidRequest):
        table.take("1", "maybe", None, "rest")
    _, content = table.take("1", "accept", {"name": "Ada"}, "rest")
    assert content == {"name": "Ada"}
    with pytest.raises(Conflict):
        table.take("1", "decline", None, "web")
    with pytest.raises(NotFound):
        table.take("2", "decline", None, "web")


def test_a_url_accept_carries_no_content() -> None:
    table = ElicitationTable()
    table.hold(Pending("u", asked("u", "url"), 5, "t", 10.0))
    with pytest.raises(InvalidRequest):
        table.take("u", "accept", {"x": 1}, "rest")
    assert table.take("u", "accept", None, "rest")[1] is None


class Core:
    codec = None
    limits = Limits(permission_timeout_s=30.0)

    def __init__(self) -> None:
        self.options: dict[str, Any] = {}
        self.elicitations = ElicitationTable()
        self.now = 100.0

    def clock(self) -> float:
        return self.now


def test_the_timeout_cancels_what_nobody_answered() -> None:
    core = Core()
    armed = elicit.hold(core, rec(3, "elicitation.requested", **asked()))
    assert armed == ArmTimer("elicitation:1", 30.0)
    assert core.elicitations.views()[0]["seq"] == 3
    assert elicit.timer_fired(core, "elicitation:1") == []  # not yet
    core.now += 30
    actions = elicit.timer_fired(core, "elicitation:1")
    assert isinstance(actions[0], CancelTimer) and isinstance(actions[1], Emit)
    [ev] = actions[1].events
    assert (ev.kind, ev.data) == ("elicitation.resolved", {"request_id": "1", "action": "cancel", "by": "timeout"})
    assert not core.elicitations.views()


def test_a_lost_owners_elicitation_is_cancelled_by_whoever_closes_its_books() -> None:
    tail = [
        rec(1, "process.started", pid=1),
        rec(2, "elicitation.requested", **asked("a")),
        rec(3, "elicitation.requested", **asked("b")),
        rec(4, "elicitation.resolved", request_id="a", action="decline", by="rest"),
        rec(5, "permission.requested", request_id="b"),
    ]
    left = open_requests(tail)
    assert left == [("elicitation.requested", "b"), ("permission.requested", "b")]
    events, _ = takeover_events({"state": "running", "pid": 1}, "owner_lost", None, (), left)  # type: ignore[typeddict-item]
    closed = [(e.kind, e.data) for e in events if e.kind.endswith(".resolved")]
    assert closed == [
        ("elicitation.resolved", {"request_id": "b", "action": "cancel", "by": "owner_lost"}),
        ("permission.resolved", {"request_id": "b", "decision": "cancelled", "by": "owner_lost"}),
    ]
