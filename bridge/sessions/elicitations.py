"""Pending elicitations of one conversation (an agent's structured question to the user):
pure state and the core's part of the flow, no I/O, no clock of its own.

They work as permission requests do (sessions/permissions.py): an ``elicitation.requested``
waits here once stored until a client answers, its deadline passes (``permission_timeout_s``,
answered ``cancel`` by ``timeout``), the agent withdraws it, an interrupt cancels it or the
process ends — whichever comes first. The first answer wins; a later one is refused
``already_resolved`` (the ids of recently resolved requests are remembered, bounded). An
``accept`` of a form carries ``content``, checked against the form's schema
(protocols/elicitation.py) before the agent sees it: a violation is the client's error
(400 ``invalid_elicitation_content``) and leaves the request pending.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from bridge.errors import Conflict, InvalidRequest, NotFound
from bridge.protocols.codec import Codec
from bridge.protocols.elicitation import ACTIONS, Elicitor, Refused, check_content
from bridge.protocols.events import Event, Record
from bridge.sessions.actions import Action, ArmTimer, CancelTimer, Emit, Limits, Write

RESOLVED_MEMORY = 256
TIMER_PREFIX = "elicitation:"
REQUESTED = "elicitation.requested"
RESOLVED = "elicitation.resolved"
# What a client is shown of a request (and the transcript's event keeps).
VIEW_KEYS = (
    "request_id",
    "mode",
    "message",
    "scope",
    "tool_call_id",
    "requested_schema",
    "url",
    "url_host",
    "url_warning",
    "elicitation_id",
)


def timer_key(request_id: str) -> str:
    return TIMER_PREFIX + request_id


def view_of(data: dict[str, Any], seq: int, created_at: str) -> dict[str, Any]:
    """A pending request as ``GET …/elicitations`` lists it."""
    out = {k: data[k] for k in VIEW_KEYS if data.get(k) is not None}
    return {**out, "seq": seq, "created_at": created_at}


def cancelled(request_id: str, by: str) -> Event:
    return Event("bridge", RESOLVED, {"request_id": request_id, "action": "cancel", "by": by})


@dataclass(slots=True)
class Pending:
    request_id: str
    data: dict[str, Any]  # the request's event data
    seq: int
    created_at: str
    deadline: float  # on the core's monotonic clock

    def view(self) -> dict[str, Any]:
        return view_of(self.data, self.seq, self.created_at)


class ElicitationTable:
    def __init__(self) -> None:
        self._pending: dict[str, Pending] = {}
        self._resolved: dict[str, str] = {}  # request_id → who settled it (bounded, oldest dropped)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._pending

    def __len__(self) -> int:
        return len(self._pending)

    def views(self) -> list[dict[str, Any]]:
        return [p.view() for p in self._pending.values()]

    def hold(self, pending: Pending) -> None:
        self._pending[pending.request_id] = pending

    def _forget(self, request_id: str, by: str) -> None:
        self._resolved[request_id] = by
        while len(self._resolved) > RESOLVED_MEMORY:
            self._resolved.pop(next(iter(self._resolved)))

    def take(self, request_id: str, action: str, content: Any, by: str) -> tuple[Pending, dict[str, Any] | None]:
        """The request a client answers, removed (the first answer wins), and the content
        the agent gets; raises the error the client gets otherwise (the request stays)."""
        if action not in ACTIONS:
            raise InvalidRequest("action must be 'accept', 'decline' or 'cancel'", code="invalid_action")
        pending = self._pending.get(request_id)
        if pending is None:
            earlier = self._resolved.get(request_id)
            if earlier is not None:
                raise Conflict(f"elicitation {request_id} was already resolved (by {earlier})", code="already_resolved")
            raise NotFound(f"no pending elicitation {request_id}", code="elicitation_not_found")
        checked: dict[str, Any] | None = None
        if action == "accept" and pending.data.get("mode") == "form":
            try:
                checked = check_content(pending.data.get("requested_schema") or {}, content)
            except Refused as exc:
                raise InvalidRequest(str(exc), code="invalid_elicitation_content") from None
        elif action == "accept" and content is not None:
            raise InvalidRequest("a URL elicitation's accept carries no content", code="invalid_elicitation_content")
        del self._pending[request_id]
        self._forget(request_id, by)
        return pending, checked

    def withdraw(self, request_id: str) -> bool:
        if self._pending.pop(request_id, None) is None:
            return False
        self._forget(request_id, "agent")
        return True

    def drop_all(self, by: str) -> tuple[list[str], list[Event]]:
        """Every pending request ends (interrupt, process exit): resolved as ``cancel``."""
        ids = list(self._pending)
        for rid in ids:
            self._forget(rid, by)
        self._pending.clear()
        return ids, [cancelled(rid, by) for rid in ids]

    def expired(self, request_id: str, now: float) -> bool:
        pending = self._pending.get(request_id)
        return pending is not None and now >= pending.deadline


class _Core(Protocol):
    """What of the conversation core the flow reads (core.py, output.py)."""

    codec: Codec | None
    elicitations: ElicitationTable
    options: dict[str, Any]
    limits: Limits
    clock: Callable[[], float]


# ---------------------------------------------------------------------- agent output


def on_requested(
    core: _Core, ev: Event, out: list[Event], fields: dict[str, Any], after: list[Action], asks: list[int]
) -> bool:
    """An agent's request: held for clients once stored (output.py's ``_hold``) — unless
    the profile sends no prompts to clients (a stream-json profile without
    ``permission_prompts``): then nobody would see it, and it is declined at once (``by:
    "policy"``), as a permission request is denied, so the agent never waits for it."""
    out.append(ev)
    codec = core.codec
    if codec is None or codec.prompts_to_clients(core.options):
        asks.append(len(out) - 1)
        return False
    rid = str(ev.data.get("request_id"))
    out.append(Event("bridge", RESOLVED, {"request_id": rid, "action": "decline", "by": "policy"}))
    line = codec.answer_elicitation(rid, "decline", None) if isinstance(codec, Elicitor) else None
    if line is not None:
        out.append(Event("client", "client.other", {"op": "elicitation", "action": "decline"}, line))
        after.append(Write(line))
    return False


def on_withdrawn(
    core: _Core, ev: Event, out: list[Event], fields: dict[str, Any], after: list[Action], asks: list[int]
) -> bool:
    """The agent withdrew its request ($/cancel_request): nothing more is written back."""
    out.append(ev)
    rid = str(ev.data.get("request_id"))
    if core.elicitations.withdraw(rid):
        after.append(CancelTimer(timer_key(rid)))
    else:
        ev.kind = "agent.other"
    return False


def withdrawn_instead(core: _Core, ev: Event, after: list[Action]) -> bool:
    """A stream-json agent's ``control_cancel_request`` reads as a permission request's
    withdrawal (``permission.resolved`` by ``agent``): when it names a pending elicitation
    instead, it becomes that elicitation's ``cancel``. True if it did."""
    rid = str(ev.data.get("request_id"))
    if not core.elicitations.withdraw(rid):
        return False
    ev.kind, ev.data = RESOLVED, {"request_id": rid, "action": "cancel", "by": "agent"}
    after.append(CancelTimer(timer_key(rid)))
    return True


def hold(core: _Core, rec: Record) -> Action:
    """A stored request is pending (with its seq and time), its deadline armed."""
    timeout = core.limits.permission_timeout_s
    rid = str(rec.data.get("request_id"))
    core.elicitations.hold(Pending(rid, dict(rec.data), rec.seq, rec.ts, core.clock() + timeout))
    return ArmTimer(timer_key(rid), timeout)


# ---------------------------------------------------------------------- answers and endings


def answer(
    core: _Core, request_id: str, action: str, content: Any, *, by: str, actor: str | None = None
) -> tuple[dict[str, Any], list[Action]]:
    """A client's answer (or the timeout's): ``elicitation.resolved`` and the agent's
    answer. ``by``: how it came (rest, acp, a frame's client_id, timeout); ``actor``: who
    sent it, ``by`` in the client event of the line written."""
    _pending, checked = core.elicitations.take(request_id, action, content, by)
    data: dict[str, Any] = {"request_id": request_id, "action": action, "by": by}
    if checked is not None:
        data["content"] = checked
    events = [Event("bridge", RESOLVED, data)]
    codec = core.codec
    line = codec.answer_elicitation(request_id, action, checked) if isinstance(codec, Elicitor) else None
    if line is not None:
        sent: dict[str, Any] = {"op": "elicitation", "action": action}
        if actor is not None:
            sent["by"] = actor
        events.append(Event("client", "client.other", sent, line))
    actions: list[Action] = [CancelTimer(timer_key(request_id)), Emit(events)]
    if line is not None:
        actions.append(Write(line))
    return data, actions


def drop_all(core: _Core, by: str) -> tuple[list[Action], list[Event]]:
    """Every pending request cancelled (``by`` interrupt, agent_exited): its timers, its events."""
    ids, events = core.elicitations.drop_all(by)
    return [CancelTimer(timer_key(r)) for r in ids], events


def timer_fired(core: _Core, key: str) -> list[Action]:
    rid = key.removeprefix(TIMER_PREFIX)
    if not core.elicitations.expired(rid, core.clock()):
        return []
    return answer(core, rid, "cancel", None, by="timeout")[1]
