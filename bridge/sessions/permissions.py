"""Pending permission requests of one conversation: pure state, no I/O, no clock of its own.

An agent's request waits here until a client answers, its deadline passes, the agent
withdraws it, an interrupt cancels it or the process ends — whichever comes first; every
later answer is refused as ``already_resolved`` (the ids of recently resolved requests are
remembered, bounded, to tell "too late" from "unknown").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bridge.errors import Conflict, InvalidRequest, NotFound
from bridge.protocols.events import Event

RESOLVED_MEMORY = 256  # recently resolved request ids, to tell "too late" from "unknown"
DECISIONS = ("allow", "deny")


@dataclass(slots=True)
class Pending:
    request_id: str
    tool: str | None
    input: dict[str, Any]
    options: list[dict[str, Any]]
    seq: int
    created_at: str
    deadline: float  # on the core's monotonic clock

    def view(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "tool": self.tool,
            "input": self.input,
            "options": self.options,
            "seq": self.seq,
            "created_at": self.created_at,
        }


def timer_key(request_id: str) -> str:
    return f"permission:{request_id}"


class PermissionTable:
    def __init__(self) -> None:
        self._pending: dict[str, Pending] = {}
        self._resolved: dict[str, str] = {}  # request_id → who decided (bounded, oldest dropped)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._pending

    def __len__(self) -> int:
        return len(self._pending)

    def count_with(self, request_ids: set[str]) -> int:
        """How many will be pending once ``request_ids`` are held too."""
        return len(self._pending.keys() | request_ids)

    def views(self) -> list[dict[str, Any]]:
        return [p.view() for p in self._pending.values()]

    def hold(self, pending: Pending) -> None:
        self._pending[pending.request_id] = pending

    def was_resolved(self, request_id: str) -> str | None:
        return self._resolved.get(request_id)

    def _forget(self, request_id: str, channel: str) -> None:
        self._resolved[request_id] = channel  # how it was answered: the event's ``by``
        while len(self._resolved) > RESOLVED_MEMORY:
            self._resolved.pop(next(iter(self._resolved)))

    def take(self, request_id: str, decision: str, channel: str, option_id: str | None) -> Pending:
        """The request a client answers, removed: the first answer wins. Raises the
        error the client gets otherwise."""
        if decision not in DECISIONS:
            raise InvalidRequest("decision must be 'allow' or 'deny'", code="invalid_decision")
        pending = self._pending.get(request_id)
        if pending is None:
            earlier = self._resolved.get(request_id)
            if earlier is not None:
                raise Conflict(
                    f"permission request {request_id} was already resolved (by {earlier})", code="already_resolved"
                )
            raise NotFound(f"no pending permission request {request_id}", code="permission_not_found")
        if (
            option_id is not None
            and pending.options
            and not any(o.get("optionId") == option_id for o in pending.options)
        ):
            raise InvalidRequest(
                f"option_id {option_id!r} is not one of the request's options", code="invalid_option_id"
            )
        del self._pending[request_id]
        self._forget(request_id, channel)
        return pending

    def withdraw(self, request_id: str) -> bool:
        """The agent took its request back: True if it was pending."""
        if self._pending.pop(request_id, None) is None:
            return False
        self._forget(request_id, "agent")
        return True

    def drop_all(self, channel: str) -> tuple[list[str], list[Event]]:
        """Every pending request ends (interrupt, process exit): resolved as cancelled.
        Returns their ids and the events that say so."""
        ids = list(self._pending)
        events: list[Event] = []
        for rid in ids:
            self._forget(rid, channel)
            events.append(
                Event("bridge", "permission.resolved", {"request_id": rid, "decision": "cancelled", "by": channel})
            )
        self._pending.clear()
        return ids, events

    def expired(self, request_id: str, now: float) -> bool:
        pending = self._pending.get(request_id)
        return pending is not None and now >= pending.deadline

    def options_of(self, request_id: str) -> Sequence[dict[str, Any]]:
        pending = self._pending.get(request_id)
        return pending.options if pending else ()
