""":class:`~bridge.sessions.commands.ThreadPort` on this replica: a client's command run
against this replica's conversation, never forwarded.

Whether another replica runs the thread is the forwarding port's question
(sessions/forwarding.py, which wraps this one); a command another replica forwarded runs
here too (sessions/remote.py). The registry hands out one or the other (``Registry.port``).

Each operation takes what it needs of the conversation's public pieces — its core (the
decisions), ``journal.lock`` (held while the core is asked and its actions performed),
:meth:`~bridge.sessions.conversation.Conversation.perform`, ``ensure_started`` and its
:class:`~bridge.sessions.routes.Routes` — and the conversation knows nothing of commands.

**Adding an operation**: its command type in sessions/commands.py, then one method here
and one line in :data:`_LOCAL` naming it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, cast

from bridge.errors import Conflict, Draining, InvalidRequest, NotFound, StoreError
from bridge.logs import bound_trace, traced_turn
from bridge.protocols.codecs import may_have_modes, stored_content_refusal
from bridge.sessions.actions import Accepted
from bridge.sessions.commands import (
    AnswerElicitation,
    AnswerPermission,
    Command,
    ForkPoint,
    Interrupt,
    Prompt,
    Raw,
    SetMode,
)
from bridge.sessions.config_port import SetConfigOption, set_config_here
from bridge.sessions.conversation import Conversation
from bridge.sessions.elicit_port import answer_here
from bridge.sessions.fanout import Subscriber
from bridge.sessions.fork import fork_point_here
from bridge.sessions.journal import SEQ_RETAKES, Renumber
from bridge.sessions.lease import settled_in_transcript
from bridge.sessions.model_port import SetModel, set_model_here
from bridge.sessions.modes import MODE_TIMEOUT_S, ModeTimeout, check_mode_id, mode_answer
from bridge.sessions.withdraw import ask_agent

A = TypeVar("A")  # a command's answer


class LocalPort:
    def __init__(self, conv: Conversation) -> None:
        self.conv = conv
        self.id = conv.id

    @property
    def running(self) -> bool:
        """Whether this replica runs the thread's agent (the forwarding port asks)."""
        return self.conv.running

    def touch(self) -> None:
        self.conv.touch()

    async def run(self, command: Command[A], *, answer_to: Subscriber | None = None) -> A:
        handler = _LOCAL.get(type(command))
        if handler is None:
            raise InvalidRequest(f"{command.KIND!r} is not an operation this thread runs")
        return cast(A, await handler(self, command, answer_to))

    async def submit(
        self,
        content: list[dict[str, Any]],
        client_id: str | None,
        *,
        actor: str | None = None,
        trace: Mapping[str, str] | None = None,
    ) -> Accepted:
        """A prompt (:class:`~bridge.sessions.commands.Prompt`). ``actor``: who sent it,
        recorded as ``by`` in its client events; ``trace``: its W3C trace context, given to
        the agent with it (if its dialect carries one) and logged."""
        with bound_trace(trace):
            acc = await self._submit(content, client_id, actor, trace)
            if not acc.duplicate:
                traced_turn(self.id, acc.turn_id, trace)
            return acc

    async def _submit(
        self,
        content: list[dict[str, Any]],
        client_id: str | None,
        actor: str | None,
        trace: Mapping[str, str] | None,
    ) -> Accepted:
        conv = self.conv
        if not conv.store.healthy:
            raise StoreError("the transcript store cannot be written right now; retry later", code="store_unavailable")
        if client_id is not None and (dup := await self._duplicate(client_id)) is not None:
            return dup
        conv.core.check_room()
        conv.require_room()  # the transcript's cap (409 transcript_full)
        self._refuse_stored(content)  # what the agent said it takes last time
        await conv.ensure_started()
        async with conv.journal.lock:
            # Under the lock: a resent client_id can never race its twin.
            if client_id is not None and (dup := await self._duplicate(client_id)) is not None:
                return dup
            if conv.retiring:  # SIGTERM landed after the port's check: refused, never recorded then ended
                raise Draining("this replica is shutting down and takes no new input; send it to another replica")
            for retake in range(SEQ_RETAKES + 1):
                acc, actions = conv.core.prompt(content, client_id, actor, trace)
                try:
                    await conv.perform(actions)
                except Renumber:
                    conv.core.prompt_failed(acc.turn_id)
                    if retake == SEQ_RETAKES:
                        raise
                    continue  # its seq was taken and read again: numbered anew
                except BaseException:
                    conv.core.prompt_failed(acc.turn_id)
                    raise
                return acc
            raise AssertionError("unreachable")

    async def _duplicate(self, client_id: str) -> Accepted | None:
        seq = await self.conv.store.find_client_event(self.id, client_id)
        return None if seq is None else Accepted(seq=seq, turn_id=None, duplicate=True)

    def _refuse_stored(self, content: list[dict[str, Any]]) -> None:
        conv = self.conv
        if conv.core.codec is None:
            reason = stored_content_refusal(conv.thread.get("protocol") or "", conv.thread.get("agent_info"), content)
            if reason is not None:
                raise InvalidRequest(reason, code="unsupported_content")

    async def interrupt(self, *, actor: str | None = None) -> bool:
        """Cancel the active turn. Idempotent; False when no turn is active."""
        async with self.conv.journal.lock:
            active, actions = self.conv.core.interrupt(actor)
            await self.conv.perform(actions)
            return active

    async def answer_permission(
        self,
        request_id: str,
        decision: str,
        *,
        channel: str,
        option_id: str | None = None,
        message: str | None = None,
        actor: str | None = None,
    ) -> dict[str, Any]:
        """One answer per request: the first wins; later ones are refused (409).
        ``channel``: how it came, recorded as ``permission.resolved``'s ``by``; ``actor``:
        who sent it, recorded as ``by`` in the client event of the answer written."""
        try:
            async with self.conv.journal.lock:
                data, actions = self.conv.core.answer(
                    request_id, decision, channel=channel, option_id=option_id, message=message, actor=actor
                )
                await self.conv.perform(actions)
                return data
        except NotFound as exc:
            # Unknown here, but the transcript may say it was settled elsewhere (a lost
            # owner's request, cancelled by whoever closed its books): too late, not unknown.
            if exc.code != "permission_not_found":
                raise
            by = await settled_in_transcript(self.conv.store, self.id, request_id)
            if by is None:
                raise
            raise Conflict(
                f"permission request {request_id} was already resolved (by {by})", code="already_resolved"
            ) from None

    async def set_mode(self, mode_id: str, *, actor: str | None = None) -> dict[str, Any]:
        """Switch the agent's session mode (sessions/modes.py), starting the agent first
        when it is not running; answers once the agent accepted it, else raises its refusal."""
        conv = self.conv
        check_mode_id(mode_id)
        if conv.profile is not None and not may_have_modes(conv.profile.protocol):
            raise InvalidRequest("this thread's agent has no session modes", code="modes_not_supported")
        text = await ask_agent(
            conv,
            lambda route: conv.core.set_mode(mode_id, route, actor),
            method="session/set_mode",
            timeout_s=MODE_TIMEOUT_S,
            timeout_error=ModeTimeout,
        )
        return mode_answer(text, mode_id)

    async def write_raw(
        self, message: dict[str, Any], sub: Subscriber | None = None, *, actor: str | None = None
    ) -> int:
        """The ``raw`` op / raw mode: write a client's JSON object to stdin, as the dialect
        says; the codec may route the agent's response back to ``sub`` (a raw-mode client)
        only. Answers the newest seq (the write's record)."""
        conv = self.conv
        await conv.ensure_started()
        route = f"r{id(sub)}" if sub is not None else ""
        async with conv.journal.lock:
            if not conv.running:
                raise Conflict("the agent process is not running", code="agent_exited")
            actions = conv.core.raw(message, route, actor)
            if sub is not None:
                conv.routes.to_client(route, sub)
            await conv.perform(actions)
            return conv.core.last_seq


# What each command runs here (LocalPort.run). A new operation is one line: its command
# type (sessions/commands.py) and the method above that performs it.
_Local = Callable[[LocalPort, Any, "Subscriber | None"], Awaitable[Any]]
_LOCAL: dict[type[Command[Any]], _Local] = {
    Prompt: lambda port, c, _to: port.submit(c.content, c.client_id, actor=c.actor, trace=c.trace),
    Interrupt: lambda port, c, _to: port.interrupt(actor=c.actor),
    AnswerPermission: lambda port, c, _to: port.answer_permission(
        c.request_id, c.decision, channel=c.channel, option_id=c.option_id, message=c.message, actor=c.actor
    ),
    SetMode: lambda port, c, _to: port.set_mode(c.mode_id, actor=c.actor),
    SetConfigOption: lambda port, c, _to: set_config_here(port.conv, c),
    SetModel: lambda port, c, _to: set_model_here(port.conv, c),
    AnswerElicitation: lambda port, c, _to: answer_here(port.conv, c),
    Raw: lambda port, c, to: port.write_raw(c.message, to if c.routed else None, actor=c.actor),
    ForkPoint: lambda port, c, _to: fork_point_here(port.conv, c),
}
