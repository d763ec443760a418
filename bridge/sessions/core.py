"""The conversation core: one thread's turn and permission logic, pure (no asyncio, no I/O,
clock injected), in the style of :class:`~bridge.sessions.tasks.TaskTable`.

Inputs are method calls (a prompt accepted, the agent's decoded output, an interrupt, a
permission answer, a timer fired, the process started or exited); each returns the
actions the shell (:mod:`bridge.sessions.conversation`) performs, in order, under the
conversation's lock: emit events (numbered, stored, then published), write a line to the
agent, arm or cancel a timer, serve an agent request, route a raw reply to one client,
stop the process.

Invariants (docs/api.md §6.2):

* a turn starts when its prompt is written to the agent, and every accepted prompt ends in
  exactly one ``turn.ended`` — from the agent's terminal line, or from the core when the
  process exits first (status ``error``, or ``cancelled`` when the user stopped it);
* a terminal line with no turn pending is recorded as ``agent.other`` and never ends the
  next turn;
* prompts sent during a turn wait in order (up to ``max_pending_prompts``) and are written
  one at a time; nothing accepted is dropped;
* a permission request is answered once: the first answer wins.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bridge.errors import Busy, Conflict, InvalidRequest
from bridge.ids import new_id
from bridge.protocols.codec import AgentRequest, Codec, ModeSetter, RawRefused, RoutedCancel
from bridge.protocols.events import Event, mark_interrupted
from bridge.sessions import elicitations as elicit
from bridge.sessions.actions import (
    INTERRUPT_TIMER,
    USER_ENDED,
    Accepted,
    Action,
    ArmTimer,
    CancelTimer,
    Emit,
    Limits,
    Stop,
    Turn,
    Write,
)
from bridge.sessions.config_options import config_request, model_option
from bridge.sessions.elicitations import ElicitationTable
from bridge.sessions.output import AgentOutput
from bridge.sessions.permissions import PermissionTable, timer_key
from bridge.sessions.tasks import TaskTable

# Exits the bridge caused to carry out a client's interrupt (core.interrupt, the interrupt timer).
INTERRUPT_EXITS = frozenset({"interrupted", "interrupt_timeout"})
# The exit of an agent restarted on another model (switch_model): its queued prompts wait
# for the next process instead of ending "not started".
MODEL_CHANGED = "model_changed"


def _by(data: dict[str, Any], actor: str | None) -> dict[str, Any]:
    """A client event's data with who sent it (its ``by``): a user's name, or "operator"
    (the daemon's own token), in every auth mode. None: the bridge wrote it by itself (a
    timeout's answer)."""
    if actor is not None:
        data["by"] = actor
    return data


def prompt_event_data(content: Sequence[dict[str, Any]], turn_id: str, client_id: str | None) -> dict[str, Any]:
    """The ``message`` event of a user prompt: its text, and what else it carried."""
    data: dict[str, Any] = {
        "role": "user",
        "text": "".join(b.get("text", "") for b in content if b.get("type") == "text"),
        "turn_id": turn_id,
    }
    if any(b.get("type") != "text" for b in content):
        data["content"] = [
            b
            if b.get("type") == "text"
            else {"type": b.get("type"), "media_type": (b.get("source") or {}).get("media_type")}
            for b in content
        ]
    if client_id is not None:
        data["client_id"] = client_id
    return data


class ConversationCore(AgentOutput):
    def __init__(
        self,
        *,
        last_seq: int,
        native_session_id: str | None,
        options: dict[str, Any],
        limits: Limits,
        tasks: TaskTable | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.last_seq = last_seq  # kept by the shell: the seq of the newest stored event
        self.native_session_id = native_session_id
        self.options = options
        self.limits = limits
        self.tasks = tasks if tasks is not None else TaskTable()
        self.clock = clock
        self.wall_clock = wall_clock
        self.codec: Codec | None = None
        self.active: Turn | None = None
        self.queue: deque[Turn] = deque()
        self.interrupting = False
        self.exit_reason: str | None = None
        self.exit_error: tuple[str, str] | None = None  # a failed start: (its reason, the agent's cause)
        self.permissions = PermissionTable()
        self.elicitations = ElicitationTable()  # the agent's questions to the user (sessions/elicitations.py)
        # A model switch waits for the turn boundary: no prompt is written to this process
        # any more, and once no turn is active it is stopped (switch_model).
        self.switching = False
        # The thread's model, which an agent with a model option is held to at each session
        # start (_keep_model; the shell sets it from the row); checked once per process.
        self.model: str | None = None
        self.model_kept = False

    @property
    def busy(self) -> bool:
        return self.active is not None or bool(self.queue)

    # ------------------------------------------------------------------ process life

    def process_started(self, codec: Codec, pid: int, pid_start: int | None, resume: str | None) -> list[Action]:
        self.codec, self.exit_reason, self.exit_error, self.interrupting = codec, None, None, False
        self.model_kept = False
        actions: list[Action] = [
            Emit(
                [Event("bridge", "process.started", {"pid": pid, "resume": resume})],
                {"state": "running", "pid": pid, "pid_start": pid_start},
            )
        ]
        # ACP: initialize; the rest of the handshake follows the agent's replies.
        actions += self._record_and_write(codec.start(), {"op": "handshake"})
        # Prompts carried over a model switch go now if the dialect needs no handshake
        # (else at its Ready).
        return actions + self.pump()

    def stopping(self, reason: str) -> None:
        """The shell is stopping the process: the exit gets this reason."""
        self.exit_reason = reason

    def _ended_by_exit(self, reason: str, status: str, last_exit: dict[str, Any]) -> dict[str, Any]:
        """The active turn's end when its process ended. A process the bridge stopped for an
        interrupt (awp-jsonl's way to interrupt, or an agent that ignored one) ends the turn
        as what happened, interrupted, as an agent's own end of an interrupted turn does."""
        assert self.active is not None
        data: dict[str, Any] = {"turn_id": self.active.turn_id, "status": status}
        if reason in INTERRUPT_EXITS:
            mark_interrupted(data)
        elif "error" in last_exit:  # the agent said why it ended (a startup_error result)
            data["error"], data["error_code"] = last_exit["error"], reason
        else:
            data["error"] = f"agent process ended: {reason}"
        data["exit"] = last_exit
        return data

    def process_exited(self, pid: int, code: int | None, sig: int | None) -> list[Action]:
        reason = self.exit_reason or ("exited" if code == 0 else "crashed")
        last_exit: dict[str, Any] = {"code": code, "signal": sig, "reason": reason}
        if self.exit_error is not None and self.exit_error[0] == reason:
            last_exit["error"] = self.exit_error[1]
        status = "cancelled" if reason in USER_ENDED else "error"
        dropped_ids, dropped = self.permissions.drop_all("agent_exited")
        asked_timers, asked = elicit.drop_all(self, "agent_exited")
        events = [Event("bridge", "process.exited", {"pid": pid, **last_exit}), *dropped, *asked]
        if self.active is not None:
            events.append(Event("bridge", "turn.ended", self._ended_by_exit(reason, status, last_exit)))
        carried = reason == MODEL_CHANGED and self.active is None
        for turn in () if carried else self.queue:
            events.append(
                Event(
                    "bridge",
                    "turn.ended",
                    {
                        "turn_id": turn.turn_id,
                        "status": status,
                        "error": f"not started: agent process ended ({reason})",
                    },
                )
            )
        if carried:
            for turn in self.queue:  # encoded again by the next process's codec
                turn.line = None
        else:
            self.queue.clear()
        actions: list[Action] = [CancelTimer(timer_key(r)) for r in dropped_ids] + asked_timers
        actions += self._end_turn()
        self.codec, self.switching = None, False
        fields = {"state": "exited", "turn_active": False, "last_exit": last_exit, "pid": None, "pid_start": None}
        actions.append(Emit(events, fields))
        return actions

    def stdout_closed(self) -> list[Action]:
        """The agent closed its stdout but kept running: nothing more can come of it."""
        self.exit_reason = "stdout_closed"
        text = "the agent closed its stdout but kept running; stopping it"
        return [Emit([Event("bridge", "diagnostic", {"stream": "protocol", "text": text})]), Stop("stdout_closed", 0.0)]

    def transcript_full(self, text: str) -> list[Action]:
        """The thread's transcript reached [capacity] max_transcript_mb: the agent is
        stopped at once, its turn ends once with that reason (docs/api.md §6.8)."""
        self.exit_reason = "transcript_full"
        return [
            Emit([Event("bridge", "notice", {"code": "transcript_full", "text": text})]),
            Stop("transcript_full", 0.0),
        ]

    def line_too_long(self, text: str) -> list[Action]:
        self.exit_reason = "line_too_long"
        return [Emit([Event("bridge", "diagnostic", {"stream": "protocol", "text": text})]), Stop("line_too_long", 0.0)]

    # ------------------------------------------------------------------ prompts

    def check_room(self) -> None:
        """Busy when a turn runs and the queue is full."""
        if self.busy and len(self.queue) >= self.limits.max_pending_prompts:
            raise Busy(f"a turn is in progress and {len(self.queue)} prompts are queued", code="busy")

    def prompt(
        self,
        content: list[dict[str, Any]],
        client_id: str | None,
        actor: str | None = None,
        trace: Mapping[str, str] | None = None,
    ) -> tuple[Accepted, list[Action]]:
        """Accept one prompt: written now when nothing is ahead of it (the prompt and its
        turn.started share one transaction), else queued. The returned Accepted's seq is
        filled in when the Emit is committed. ``actor``: who sent it (a user's name or
        "operator"), recorded as ``by`` in its client events."""
        codec = self.codec
        if codec is None:
            raise Conflict("the agent process ended before the prompt could be sent", code="agent_exited")
        self.check_room()
        refusal = codec.refuse_content(content)
        if refusal is not None:
            raise InvalidRequest(refusal, code="unsupported_content")
        line = codec.encode_prompt(content, trace) if codec.ready else None
        turn = Turn(new_id("turn"), content, self.last_seq + 1, line, actor, trace)
        message = Event("client", "message", _by(prompt_event_data(content, turn.turn_id, client_id), actor), line)
        acc = Accepted(seq=turn.prompt_seq, turn_id=turn.turn_id, queued=self.busy or self.switching)
        if acc.queued or line is None:
            self.queue.append(turn)
            return acc, [Emit([message], client_ids=[client_id]), *self.pump()]
        assert line is not None
        self.active = turn
        started = Event("bridge", "turn.started", {"turn_id": turn.turn_id, "prompt_seq": turn.prompt_seq})
        return acc, [Emit([message, started], {"turn_active": True}, [client_id, None]), Write(line)]

    def prompt_failed(self, turn_id: str | None) -> None:
        """The prompt's Emit failed (the store refused it): it was never accepted."""
        if self.active is not None and self.active.turn_id == turn_id:
            self.active = None
        self.queue = deque(t for t in self.queue if t.turn_id != turn_id)

    def pump(self) -> list[Action]:
        """Write the next queued prompt when no turn is active and the agent is ready."""
        actions: list[Action] = []
        # After a failed start (a Fatal) nothing more is written: the process is stopping, and
        # the prompts still queued end "not started" once it has exited.
        codec = self.codec if self.exit_error is None else None
        if self.switching and codec is not None:
            return self._switch_now()
        while self.active is None and self.queue and codec is not None and codec.ready:
            turn = self.queue.popleft()
            events = [Event("bridge", "turn.started", {"turn_id": turn.turn_id, "prompt_seq": turn.prompt_seq})]
            refusal = codec.refuse_content(turn.content) if turn.line is None else None
            if refusal is not None:
                # Accepted before the agent said what it takes: the turn ends unsent.
                events.append(
                    Event(
                        "bridge",
                        "turn.ended",
                        {
                            "turn_id": turn.turn_id,
                            "status": "error",
                            "error": refusal,
                            "error_code": "unsupported_content",
                        },
                    )
                )
                actions.append(Emit(events))
                continue
            self.active = turn
            line = turn.line
            if line is None:
                line = codec.encode_prompt(turn.content, turn.trace)
                data = _by({"op": "prompt", "turn_id": turn.turn_id}, turn.actor)
                events.append(Event("client", "client.other", data, line))
            actions += [Emit(events, {"turn_active": True}), Write(line)]
        return actions

    # ------------------------------------------------------------------ model switch

    def switch_model(
        self, model: str | None, previous: str | None, actor: str | None, *, restart: bool = True
    ) -> list[Action]:
        """The thread's model is now ``model`` (its launch already says so): recorded with a
        ``notice`` ``model_changed`` in the thread's row. ``restart``: a running agent is
        restarted on it at the turn boundary — stopped now when no turn is active, else once
        the active one ends; prompts sent meanwhile wait and go to the new process (which
        resumes the session: the conversation is kept). Without it the agent switched by
        itself (an ACP config option)."""
        self.model = model
        restart = restart and self.codec is not None and self.exit_reason is None
        text = f"the model is now {model or 'the agent default'}"
        if restart:
            text += "; the agent restarts on it after the running turn" if self.active else "; the agent restarts on it"
        data = _by({"code": MODEL_CHANGED, "text": text, "model": model, "previous": previous}, actor)
        actions: list[Action] = [Emit([Event("bridge", "notice", data)], {"model": model})]
        if restart:
            self.switching = True
            actions += self.pump()
        return actions

    def _keep_model(self, info: dict[str, Any]) -> list[Action]:
        """A new session's agent_info: an agent whose ``model`` option offers the thread's
        model but runs another (an ACP agent restarted after a switch goes back to its
        own default on ``session/load``) is set to it again, once per process, before any
        prompt is written. Its answer goes nowhere but the transcript (route "")."""
        model = self.model
        option = model_option({"agent_info": info}) if model and not self.model_kept else None
        if option is None or model is None or self.codec is None:
            return []
        self.model_kept = True
        offered = any(c.get("value") == model for c in option["choices"])
        if not offered or option["current"] == model or not isinstance(option["config_id"], str):
            return []
        try:
            return config_request(self.codec, option["config_id"], model, "", None)
        except InvalidRequest:  # no session yet to set it on
            self.model_kept = False
            return []

    def _switch_now(self) -> list[Action]:
        """Stop the process for the model switch once no turn is active (only once)."""
        if self.active is not None or self.exit_reason is not None:
            return []
        self.exit_reason = MODEL_CHANGED
        return [Stop(MODEL_CHANGED, resume_queue=True)]

    def queue_not_started(self, why: str) -> list[Action]:
        """The prompts carried over a model switch could not go (the new process did not
        start): each ends ``not started``, once."""
        ended = [
            Event("bridge", "turn.ended", {"turn_id": t.turn_id, "status": "error", "error": f"not started: {why}"})
            for t in self.queue
        ]
        self.queue.clear()
        return [Emit(ended)] if ended else []

    def _end_turn(self) -> list[Action]:
        was = self.interrupting
        self.active = None
        self.interrupting = False
        return [CancelTimer(INTERRUPT_TIMER)] if was else []

    # ------------------------------------------------------------------ client operations

    def interrupt(self, actor: str | None = None) -> tuple[bool, list[Action]]:
        """Cancel the active turn. Idempotent; False when no turn is active."""
        codec = self.codec
        if self.active is None or codec is None:
            return False, []
        if self.interrupting:
            return True, []
        self.interrupting = True
        lines = codec.interrupt()
        actions: list[Action] = []
        if codec.cancel_resolves_permissions:
            ids, dropped = self.permissions.drop_all("interrupt")
            actions += [CancelTimer(timer_key(r)) for r in ids]
            asked_timers, asked = elicit.drop_all(self, "interrupt")
            actions += asked_timers
            dropped += asked
            if dropped:
                actions.append(Emit(dropped))
        if lines is None:
            # The dialect has no interrupt message: stopping the process ends the turn.
            return True, [*actions, Stop("interrupted")]
        actions += self._record_and_write(lines, _by({"op": "interrupt"}, actor))
        # If the agent does not end the turn in time, the process is stopped and the turn
        # ends ``cancelled`` (server.interrupt_timeout_s).
        actions.append(ArmTimer(INTERRUPT_TIMER, self.limits.interrupt_timeout_s))
        return True, actions

    def answer(
        self,
        request_id: str,
        decision: str,
        *,
        channel: str,
        option_id: str | None = None,
        message: str | None = None,
        actor: str | None = None,
    ) -> tuple[dict[str, Any], list[Action]]:
        """One answer per request: the first wins; later ones are refused (409).
        ``channel``: how it came (rest, a client id, raw, timeout), ``permission.resolved``'s
        ``by``; ``actor``: who sent it (a user's name or "operator"; None for the bridge's
        own answer on timeout), ``by`` in the client event of the answer written."""
        pending = self.permissions.take(request_id, decision, channel, option_id)
        data: dict[str, Any] = {"request_id": request_id, "decision": decision, "by": channel}
        if option_id is not None:
            data["option_id"] = option_id
        events = [Event("bridge", "permission.resolved", data)]
        actions: list[Action] = [CancelTimer(timer_key(request_id))]
        line = None
        if self.codec is not None:
            line = self.codec.answer_permission(
                request_id,
                decision,
                option_id=option_id,
                options=pending.options,
                updated_input=pending.input,
                message=message or ("Denied by the user" if decision == "deny" else ""),
            )
            if line is not None:
                events.append(Event("client", "client.other", _by({"op": "permission"}, actor), line))
        actions.append(Emit(events))
        if line is not None:
            actions.append(Write(line))
        return data, actions

    def set_mode(self, mode_id: str, route: str, actor: str | None = None) -> list[Action]:
        """Ask the agent to switch its session mode (ACP ``session/set_mode``); its answer
        is routed to ``route``. Raises Conflict (no process) / InvalidRequest (no modes)."""
        codec = self.codec
        if codec is None:
            raise Conflict("the agent process is not running", code="agent_exited")
        line = codec.set_mode(mode_id, route) if isinstance(codec, ModeSetter) else None
        if line is None:
            raise InvalidRequest("this thread's agent reports no session modes", code="modes_not_supported")
        event = Event("client", "client.other", _by({"op": "set_mode", "mode_id": mode_id}, actor), line)
        return [Emit([event]), Write(line, required=True)]

    def give_up(self, route: str) -> list[Action]:
        """The caller stopped waiting for the answer routed to ``route`` (a mode switch that
        timed out): the dialect withdraws that request where it can (ACP's
        ``$/cancel_request``), recorded like the request was. Nothing when it cannot."""
        codec = self.codec
        line = codec.cancel_routed(route) if isinstance(codec, RoutedCancel) else None
        if line is None:
            return []
        return self._record_and_write([line], {"op": "cancel_request"})

    def raw(self, message: dict[str, Any], route: str, actor: str | None = None) -> list[Action]:
        """A client's raw message: a permission answer takes the permission flow (the first
        answer still wins and is recorded once); anything else is written as the dialect
        says. Raises InvalidRequest / Conflict."""
        codec = self.codec
        if codec is None:
            raise Conflict("the agent process is not running", code="agent_exited")
        ans = codec.raw_permission_answer(message)
        if ans is not None:
            if ans.request_id in self.permissions:
                return self.answer(ans.request_id, ans.decision, channel="raw", message=ans.message, actor=actor)[1]
            if self.permissions.was_resolved(ans.request_id):
                raise Conflict(f"permission request {ans.request_id} was already resolved", code="already_resolved")
        try:
            line = codec.forward_raw(message, route)
        except RawRefused as exc:
            raise InvalidRequest(str(exc), code=exc.code) from exc
        return [Emit([Event("client", "client.other", _by({"op": "raw"}, actor), line)]), Write(line, required=True)]

    def timer_fired(self, key: str) -> list[Action]:
        if key == INTERRUPT_TIMER:
            if not (self.interrupting and self.active is not None):
                return []
            self.exit_reason = "interrupt_timeout"
            text = (
                f"the agent did not end the turn within {self.limits.interrupt_timeout_s:g}s of the interrupt; "
                "stopping it"
            )
            return [
                Emit([Event("bridge", "notice", {"code": "interrupt_timeout", "text": text})]),
                Stop("interrupt_timeout"),
            ]
        if key.startswith(elicit.TIMER_PREFIX):
            return elicit.timer_fired(self, key)
        rid = key.removeprefix("permission:")
        if not self.permissions.expired(rid, self.clock()):
            return []
        return self.answer(rid, "deny", channel="timeout", message="No answer to the permission request in time")[1]

    def served(self, request: AgentRequest, result: Any = None, error: tuple[int, str] | None = None) -> list[Action]:
        """The answer to an agent request the shell served (ACP fs/*)."""
        if self.codec is None:
            return []
        line = self.codec.answer_request(request, result, error)
        return self._record_and_write([line], {"op": "fs", "method": request.method})

    def _record_and_write(self, lines: Sequence[str], data: dict[str, Any]) -> list[Action]:
        if not lines:
            return []
        events = [Event("client", "client.other", dict(data), line) for line in lines]
        return [Emit(events), *(Write(line) for line in lines)]
