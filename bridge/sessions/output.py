"""The conversation core's handling of agent output (a part of
:class:`~bridge.sessions.core.ConversationCore`, kept apart for size): one read of stdout
in, one Emit and what follows from it out. Pure, like the core."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from bridge.process.launch import valid_session_id
from bridge.protocols.codec import AgentInfo, AgentRequest, Codec, Control, Decoded, Fatal, Ready, RoutedReply
from bridge.protocols.events import Event, Record, mark_interrupted
from bridge.sessions import elicitations as elicit
from bridge.sessions.actions import Action, ArmTimer, CancelTimer, Emit, Limits, Route, Serve, Stop, Turn, Write
from bridge.sessions.elicitations import ElicitationTable
from bridge.sessions.permissions import Pending, PermissionTable, timer_key

if TYPE_CHECKING:
    from bridge.sessions.tasks import TaskTable


def _raw_obj(raw: str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


class AgentOutput:
    # State of the core this part reads and writes (declared here for the type checker).
    codec: Codec | None
    active: Turn | None
    interrupting: bool
    exit_reason: str | None
    exit_error: tuple[str, str] | None
    native_session_id: str | None
    options: dict[str, Any]
    limits: Limits
    tasks: TaskTable
    permissions: PermissionTable
    elicitations: ElicitationTable
    clock: Callable[[], float]
    wall_clock: Callable[[], float]

    def pump(self) -> list[Action]:
        raise NotImplementedError

    def _end_turn(self) -> list[Action]:
        raise NotImplementedError

    def _keep_model(self, info: dict[str, Any]) -> list[Action]:
        raise NotImplementedError

    def agent_output(self, decoded: Sequence[Decoded]) -> list[Action]:
        """Everything one read of stdout brought: one Emit, then what it implies."""
        out: list[Event] = []
        fields: dict[str, Any] = {}
        after: list[Action] = []  # performed after the commit, in order
        asks: list[int] = []  # indexes in ``out`` of permission requests held for clients
        ended = False
        handlers = _AGENT_HANDLERS
        for d in decoded:
            for ev in d.events:
                # _on_event, inlined for the events no handler takes (a flood's deltas).
                if (ev.source != "agent" or ev.kind not in handlers) and ev.kind != "session.started":
                    out.append(ev)
                else:
                    ended = self._on_event(ev, out, fields, after, asks) or ended
            for reply in d.replies:
                out.append(Event("client", "client.other", {"op": "auto_reply"}, reply))
                after.append(Write(reply))
            for item in d.control:
                ended = self._on_control(item, fields, after) or ended
        actions: list[Action] = []
        self._count_asks(out, asks, fields)
        if out or fields:
            actions.append(Emit(out, fields, committed=self._hold(asks) if asks else None))
        actions += after
        if ended:
            actions += self.pump()
        return actions

    def _on_control(self, item: Control, fields: dict[str, Any], after: list[Action]) -> bool:
        if isinstance(item, Ready):
            return True  # queued prompts may go now
        if isinstance(item, AgentInfo):
            fields["agent_info"] = item.info
            after += self._keep_model(item.info)
        elif isinstance(item, AgentRequest):
            after.append(Serve(item))
        elif isinstance(item, RoutedReply):
            after.append(Route(item.route, item.text))
        elif isinstance(item, Fatal):
            # The agent failed to start: the exit says so, and what the agent gave as the cause.
            self.exit_reason, self.exit_error = item.reason, (item.reason, item.message)
            after.append(Stop(item.reason, min(self.limits.stop_grace_s, 1.0)))
        return False

    def _on_event(
        self, ev: Event, out: list[Event], fields: dict[str, Any], after: list[Action], asks: list[int]
    ) -> bool:
        """Record one decoded event; True when it ended the active turn."""
        handler = _AGENT_HANDLERS.get(ev.kind) if ev.source == "agent" else None
        if handler is not None:
            return handler(self, ev, out, fields, after, asks)
        out.append(ev)
        if ev.kind == "session.started":
            self._adopt(ev, out, fields)
        return False

    def _adopt(self, ev: Event, out: list[Event], fields: dict[str, Any]) -> None:
        sid = ev.data.get("native_session_id")
        if sid is not None and not valid_session_id(sid):
            text = "agent reported a native session id that is not valid; ignored"
            out.append(Event("bridge", "diagnostic", {"stream": "protocol", "text": text}))
        elif sid and sid != self.native_session_id:
            self.native_session_id = sid
            fields["native_session_id"] = sid

    def _turn_ended(
        self, ev: Event, out: list[Event], fields: dict[str, Any], after: list[Action], _: list[int]
    ) -> bool:
        out.append(ev)
        if self.active is None:
            # No turn pending (e.g. after a background task): record it, never assign it
            # to the next turn.
            ev.kind = "agent.other"
            ev.data = {"unsolicited": "turn.ended", **ev.data}
            return False
        ev.data["turn_id"] = self.active.turn_id
        if (
            self.interrupting
            and ev.data.get("status") == "error"
            and ev.data.get("subtype") == "error_during_execution"
        ):
            # The end reads as what happened; what the agent said about it (its raw line
            # keeps it too) is a diagnostic (docs/api.md §6.5).
            said = mark_interrupted(ev.data)
            told = len(out) > 1 and out[-2].kind == "diagnostic" and out[-2].raw == ev.raw  # by the codec
            if isinstance(said, str) and said and not told:
                out.insert(len(out) - 1, Event("agent", "diagnostic", {"stream": "protocol", "text": said}, ev.raw))
        after += self._end_turn()
        fields["turn_active"] = False
        return True

    def _permission_requested(
        self, ev: Event, out: list[Event], fields: dict[str, Any], after: list[Action], asks: list[int]
    ) -> bool:
        out.append(ev)
        codec = self.codec
        if codec is None or codec.prompts_to_clients(self.options):
            asks.append(len(out) - 1)  # pending until a client, the timeout or the agent decides
            return False
        # Prompts are off for this profile: deny by policy so the agent never hangs.
        rid = str(ev.data.get("request_id"))
        answer = codec.answer_permission(
            rid,
            "deny",
            options=ev.data.get("options") or (),
            updated_input=ev.data.get("input") or {},
            message="Permission prompts are not enabled for this agent profile",
        )
        out.append(Event("bridge", "permission.resolved", {"request_id": rid, "decision": "deny", "by": "policy"}))
        if answer is not None:
            out.append(Event("client", "client.other", {"op": "permission"}, answer))
            after.append(Write(answer))
        return False

    def _permission_withdrawn(
        self, ev: Event, out: list[Event], fields: dict[str, Any], after: list[Action], asks: list[int]
    ) -> bool:
        # The agent withdrew its request (control_cancel_request): nothing is written back.
        out.append(ev)
        rid = str(ev.data.get("request_id"))
        if self.permissions.withdraw(rid):
            after.append(CancelTimer(timer_key(rid)))
        elif elicit.withdrawn_instead(self, ev, after):  # the request was an elicitation
            pass
        else:
            ev.kind = "agent.other"
        return False

    def _task_updated(self, ev: Event, out: list[Event], fields: dict[str, Any], *_: Any) -> bool:
        # The task table decides: snapshots replace, patches patch, only the notification is
        # terminal, and late or duplicate events are recorded but do not change the task.
        out.append(ev)
        verdict = self.tasks.apply(ev.data, _raw_obj(ev.raw), self.wall_clock())
        if not verdict.accepted or verdict.task is None:
            ev.kind = "agent.other"
            ev.data = {"task_event_ignored": verdict.reason, **ev.data}
        else:
            ev.data["status"] = verdict.task["status"]
            fields["tasks"] = self.tasks.to_json()
        return False

    def _count_asks(self, out: list[Event], asks: list[int], fields: dict[str, Any]) -> None:
        """Requests are held once stored (``_hold``): the thread row's count, written in the
        same commit, already includes them."""
        if asks:
            held = {str(out[i].data.get("request_id")) for i in asks if out[i].kind == "permission.requested"}
            fields["pending_permissions"] = self.permissions.count_with(held)

    def _hold(self, asks: list[int]) -> Callable[[list[Record]], list[Action]]:
        """Once stored, the held requests are pending (with their seq and time) and their
        deadlines armed."""

        def held(records: list[Record]) -> list[Action]:
            timeout = self.limits.permission_timeout_s
            timers: list[Action] = []
            for i in asks:
                rec = records[i]
                if rec.kind == elicit.REQUESTED:  # held the same way, in its own table
                    timers.append(elicit.hold(self, rec))
                    continue
                data = rec.data
                self.permissions.hold(
                    Pending(
                        str(data.get("request_id")),
                        data.get("tool"),
                        data.get("input") or {},
                        list(data.get("options") or []),
                        rec.seq,
                        rec.ts,
                        self.clock() + timeout,
                    )
                )
                timers.append(ArmTimer(timer_key(str(data.get("request_id"))), timeout))
            return timers

        return held


_Handler = Callable[["AgentOutput", Event, list[Event], dict[str, Any], list[Action], list[int]], bool]
_AGENT_HANDLERS: dict[str, _Handler] = {
    "turn.ended": AgentOutput._turn_ended,
    "permission.requested": AgentOutput._permission_requested,
    "permission.resolved": AgentOutput._permission_withdrawn,
    "task.updated": AgentOutput._task_updated,
    elicit.REQUESTED: elicit.on_requested,
    elicit.RESOLVED: elicit.on_withdrawn,
}
