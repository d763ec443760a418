"""What a client can ask of a thread, as data: one frozen type per operation, one table of
bounds, and the commands' wire form between replicas. Pure: no I/O.

Every surface produces these and nothing else — a REST body (api/threads.py), a WebSocket
frame (api/ws.py), an ACP JSON-RPC method (api/acp_gateway.py), a command another replica
forwarded (sessions/remote.py, :func:`from_wire`) — and hands them to one entry point,
:meth:`ThreadPort.run`. The registry gives out the port (``Registry.port(conv)``): the
local port on a single daemon (sessions/local_port.py), a forwarding port in a cluster
(sessions/forwarding.py), which sends the command to the replica that runs the thread and
brings its answer back typed. So a surface never knows where a thread runs::

    port = registry.port(conv)
    accepted = await port.run(Prompt(content=blocks, client_id=cid, actor=user.name))
    await port.run(AnswerPermission(request_id=rid, decision="allow", channel="acp", actor=user.name))

Each command checks its own fields against :data:`BOUNDS` when it is built (a bad one
raises :class:`~bridge.errors.InvalidRequest`, 400 ``invalid_request``), so a command that
exists is well-formed wherever it came from. The transports' schemas (api/schema.py) read
the same table and refuse earlier, in their own words.

Two names for two things: ``actor`` is who acted — a user's name, or ``operator`` for the
daemon's own token (docs/api.md §3.6), recorded as ``by`` in the client events the
command writes; :class:`AnswerPermission`'s ``channel`` is how the answer came (``rest``,
``acp``, a WebSocket frame's ``client_id``, ``websocket``), recorded as
``permission.resolved``'s ``by`` (§6.4). On the bus they keep their old wire names
(``user`` and ``by``), so replicas of two versions still understand each other.

**Adding an operation** (fork, set model, elicitation answer, …): here, a frozen
dataclass subclassing ``Command[Answer]`` with its ``KIND``, its fields and their checks
in ``__post_init__`` (bounds in :class:`Bounds`), its answer's wire form
(``answer_to_wire``/``answer_from_wire``) and one line in :data:`KINDS`; then the local
implementation (a method of sessions/local_port.py's ``LocalPort`` and one line of its
``_LOCAL`` table) and the surface that offers it (a REST route, a row of ws.py's
``_OPS``, an ACP method). The bus, the forwarding port and the holder's side need nothing:
they carry any command in :data:`KINDS`. See the "next operations" comment at the end of
the command types.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeGuard, TypeVar

from bridge.errors import InvalidRequest
from bridge.sessions.actions import Accepted

if TYPE_CHECKING:
    from bridge.sessions.fanout import Subscriber


@dataclass(frozen=True)
class Bounds:
    """Every bound a client's command is held to, in one place: the REST and WebSocket
    schemas, the ACP gateway and the bus read these (docs/api.md §4.6, §4.8, §4.19, §5.3)."""

    content_blocks: int = 64  # a prompt's content blocks (§4.6)
    client_id: int = 128  # a prompt's client_id, 1–128 characters (§4.6, §5.3)
    permission_message: int = 4096  # the reason given to the agent with an answer (§4.8)
    request_id: int = 256  # a permission request's id (§5.3)
    option_id: int = 256  # an ACP permission option (§4.8)
    decision: int = 16  # allow | deny; which one is the core's to check (invalid_decision)
    channel: int = 256  # how a permission answer came: rest, acp, a frame's client_id
    mode_id: int = 256  # an ACP session mode (§4.19)
    config_id: int = 256  # an ACP session config option's id (§4.21)
    config_value: int = 256  # …and the id of the value it is set to
    model: int = 256  # a thread's model (§4.5; the launch rules allow 200, api/threads.py's schema 256)
    actor: int = 256  # a user's name (64 at most, api/users.py) or "operator"
    trace: int = 512  # a prompt's traceparent (55) or tracestate (512 at most: protocols/trace.py)
    seq: int = 2**53  # a seq a client names (a fork's after_seq, §4.26): SQLite integers, JSON-exact
    # One client message, whatever its transport: a WebSocket frame (§5.3), an ACP JSON-RPC
    # message, a REST body (api/limits.py). The bus carries a little more (bus/base.py).
    message_chars: int = 8 * 1024 * 1024


BOUNDS = Bounds()

A = TypeVar("A")  # what a command answers


def _text(value: Any, name: str, bound: int, *, optional: bool = False, min_len: int = 1) -> None:
    if optional and value is None:
        return
    if not isinstance(value, str) or not min_len <= len(value) <= bound:
        least = "a non-empty string" if min_len else "a string"
        raise InvalidRequest(f"{name} must be {least} of at most {bound} characters")


def _unicode(value: str | None, name: str) -> None:
    """Text that can be stored and sent: no lone surrogates (JSON can carry them)."""
    if value is not None:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequest(f"{name} must be valid Unicode text") from None


@dataclass(frozen=True, kw_only=True)
class Command(Generic[A]):
    """A client's operation on one thread. ``actor``: who sent it (the user's name, or
    ``operator``); None when nobody is named (a replica of an older version)."""

    KIND: ClassVar[str]  # its name on the bus
    WIRE_NAMES: ClassVar[Mapping[str, str]] = {"actor": "user"}  # field → wire name, where they differ

    actor: str | None = None

    def __post_init__(self) -> None:
        _text(self.actor, "user", BOUNDS.actor, optional=True)
        self.check()

    def check(self) -> None:
        """The command's own fields (raises InvalidRequest)."""

    @property
    def answered(self) -> bool:
        """Whether its sender waits for an answer (a forwarded command holds the sender's
        events until it is pushed: sessions/remote.py)."""
        return True

    def to_wire(self) -> tuple[str, dict[str, Any]]:
        """``(kind, body)`` for the bus; :func:`from_wire` reads it back."""
        body = {
            self.WIRE_NAMES.get(f.name, f.name): getattr(self, f.name)
            for f in fields(self)
            if f.metadata.get("wire", True)
        }
        return self.KIND, body

    def answer_to_wire(self, answer: A) -> dict[str, Any]:
        """The answer as the holder sends it back (and as REST and WebSocket show it)."""
        raise NotImplementedError

    def answer_from_wire(self, body: Mapping[str, Any]) -> A:
        """The holder's answer, read back strictly (raises :class:`MalformedAnswer`)."""
        raise NotImplementedError


class MalformedAnswer(ValueError):
    """A holder's answer that is not what the command answers: never taken for a success."""


@dataclass(frozen=True, kw_only=True)
class Prompt(Command[Accepted]):
    """One user prompt (docs/api.md §4.6); idempotent by ``client_id``."""

    KIND = "prompt"
    content: list[dict[str, Any]]
    client_id: str | None = None
    # W3C trace context (traceparent[, tracestate]) the surface read and checked
    # (protocols/trace.py); only its shape is held here, the dialect checks it again.
    trace: Mapping[str, str] | None = None

    def check(self) -> None:
        content = self.content
        if not isinstance(content, list) or not content or len(content) > BOUNDS.content_blocks:
            raise InvalidRequest(f"content must be a non-empty list of at most {BOUNDS.content_blocks} content blocks")
        if not all(isinstance(b, dict) and isinstance(b.get("type"), str) for b in content):
            raise InvalidRequest("every content block must be an object with a type")
        _text(self.client_id, "client_id", BOUNDS.client_id, optional=True)
        _unicode(self.client_id, "client_id")
        trace = self.trace
        if trace is not None and (
            not isinstance(trace, Mapping)
            or not 0 < len(trace) <= 2
            or set(trace) - {"traceparent", "tracestate"}
            or not all(isinstance(v, str) and len(v) <= BOUNDS.trace for v in trace.values())
        ):
            raise InvalidRequest("trace must hold traceparent and tracestate strings only")

    def to_wire(self) -> tuple[str, dict[str, Any]]:
        kind, body = super().to_wire()
        if body.get("trace") is None:
            body.pop("trace", None)  # a replica of an older version knows no such field
        else:
            body["trace"] = dict(body["trace"])
        return kind, body

    def answer_to_wire(self, answer: Accepted) -> dict[str, Any]:
        return {"seq": answer.seq, "turn_id": answer.turn_id, "duplicate": answer.duplicate, "queued": answer.queued}

    def answer_from_wire(self, body: Mapping[str, Any]) -> Accepted:
        seq, turn_id = body.get("seq"), body.get("turn_id")
        if not _seq(seq):
            raise MalformedAnswer("the holder's answer to a prompt has no seq")
        return Accepted(
            seq=seq,
            turn_id=turn_id if isinstance(turn_id, str) else None,
            duplicate=body.get("duplicate") is True,
            queued=body.get("queued") is True,
        )


@dataclass(frozen=True, kw_only=True)
class Interrupt(Command[bool]):
    """Cancel the active turn (§4.7); answers whether one was active."""

    KIND = "interrupt"

    def answer_to_wire(self, answer: bool) -> dict[str, Any]:
        return {"active": answer}

    def answer_from_wire(self, body: Mapping[str, Any]) -> bool:
        return body.get("active") is True


@dataclass(frozen=True, kw_only=True)
class AnswerPermission(Command[dict[str, Any]]):
    """Answer a pending permission request (§4.8, §6.4): the first answer wins."""

    KIND = "permission"
    WIRE_NAMES: ClassVar[Mapping[str, str]] = {"actor": "user", "channel": "by"}
    request_id: str
    decision: str
    # How it came: "rest", "acp", a frame's client_id, or "websocket" for a frame without
    # one (§6.4's ``by``; also what a holder takes when a sender left it out).
    channel: str = "websocket"
    option_id: str | None = None
    message: str | None = None

    def check(self) -> None:
        _text(self.request_id, "request_id", BOUNDS.request_id)
        _text(self.decision, "decision", BOUNDS.decision)
        _text(self.channel, "by", BOUNDS.channel)
        _text(self.option_id, "option_id", BOUNDS.option_id, optional=True)
        _text(self.message, "message", BOUNDS.permission_message, optional=True, min_len=0)

    def answer_to_wire(self, answer: dict[str, Any]) -> dict[str, Any]:
        return answer

    def answer_from_wire(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return dict(body)


@dataclass(frozen=True, kw_only=True)
class SetMode(Command[dict[str, Any]]):
    """Switch the agent's session mode (ACP ``session/set_mode``, §4.19)."""

    KIND = "mode"  # ("set_mode" over the WebSocket; "mode" on the bus since replicas spoke it)
    mode_id: str

    def check(self) -> None:
        _text(self.mode_id, "mode_id", BOUNDS.mode_id)

    def answer_to_wire(self, answer: dict[str, Any]) -> dict[str, Any]:
        return answer

    def answer_from_wire(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return dict(body)


@dataclass(frozen=True, kw_only=True)
class SetConfigOption(Command[dict[str, Any]]):
    """Set one of the agent's session config options (ACP ``session/set_config_option``,
    §4.21): a select option's value id, or a boolean. Answers ``{config_id, value,
    config_options}`` (the agent's full list after the switch)."""

    KIND = "config"
    config_id: str
    value: str | bool

    def check(self) -> None:
        _text(self.config_id, "config_id", BOUNDS.config_id)
        if not isinstance(self.value, bool):
            _text(self.value, "value", BOUNDS.config_value)

    def answer_to_wire(self, answer: dict[str, Any]) -> dict[str, Any]:
        return answer

    def answer_from_wire(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return dict(body)


@dataclass(frozen=True, kw_only=True)
class Raw(Command[int]):
    """A client's JSON object written to the agent's stdin as the dialect says (§5.3);
    answers the seq that records it. ``routed``: a raw-mode client's frame, whose agent
    response goes back to the sender's subscription only (never across replicas: it is
    not on the wire, and such a frame has no answer to wait for)."""

    KIND = "raw"
    message: dict[str, Any]
    routed: bool = field(default=False, metadata={"wire": False})

    def check(self) -> None:
        if not isinstance(self.message, dict):
            raise InvalidRequest("message must be a JSON object")

    @property
    def answered(self) -> bool:
        return not self.routed

    def answer_to_wire(self, answer: int) -> dict[str, Any]:
        return {"seq": answer}

    def answer_from_wire(self, body: Mapping[str, Any]) -> int:
        seq = body.get("seq")
        if not _seq(seq):
            raise MalformedAnswer("the holder's answer to a raw write has no seq")
        return seq


@dataclass(frozen=True, kw_only=True)
class SetModel(Command[dict[str, Any]]):
    """Switch the thread's model, the conversation kept (docs/api.md §4.5 ``PATCH``):
    stream-json and awp-jsonl restart the agent with it at a turn boundary, resuming its
    session; ACP sets the agent's ``model`` config option (sessions/model_port.py).
    Answers ``{model, previous, applies}``; ``applies`` is ``now`` (nothing was running
    or the agent took it at once), ``after_turn`` (the running turn ends first) or
    ``unchanged``."""

    KIND = "model"
    model: str

    def check(self) -> None:
        _text(self.model, "model", BOUNDS.model)
        _unicode(self.model, "model")

    def answer_to_wire(self, answer: dict[str, Any]) -> dict[str, Any]:
        return answer

    def answer_from_wire(self, body: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(body.get("model"), str):
            raise MalformedAnswer("the holder's answer to a model switch has no model")
        return dict(body)


# The next operations (fork, …) go above this line, each as the ones above: a frozen
# ``Command[Answer]`` subclass with its KIND, fields, ``check`` and answer codecs, then a
# line in KINDS below.


@dataclass(frozen=True, kw_only=True)
class ForkPoint(Command[dict[str, Any]]):
    """Where a fork of the thread would begin (§4.26), asked where the thread runs (its
    turn and its session are known there): the turn boundary at or before ``after_seq``
    (None: the end). Answers ``{"seq", "session", "at"}``: the last seq the fork takes, the
    agent session it copies and the chain entry it stops at (sessions/fork.py); the fork
    itself is made by the caller."""

    KIND = "fork_point"
    after_seq: int | None = None

    def check(self) -> None:
        seq = self.after_seq
        if seq is not None and (not _seq(seq) or seq > BOUNDS.seq):
            raise InvalidRequest(f"after_seq must be an integer from 0 to {BOUNDS.seq}")

    def answer_to_wire(self, answer: dict[str, Any]) -> dict[str, Any]:
        return answer

    def answer_from_wire(self, body: Mapping[str, Any]) -> dict[str, Any]:
        seq, session, at = body.get("seq"), body.get("session"), body.get("at")
        texts = all(v is None or isinstance(v, str) for v in (session, at))
        if not _seq(seq) or not texts:
            raise MalformedAnswer("the holder's fork point is malformed")
        return {"seq": seq, "session": session, "at": at}


@dataclass(frozen=True, kw_only=True)
class AnswerElicitation(Command[dict[str, Any]]):
    """Answer a pending elicitation (sessions/elicitations.py): the first answer wins;
    ``content`` (an accepted form's values) is checked against the form by the core."""

    KIND = "elicitation"
    WIRE_NAMES: ClassVar[Mapping[str, str]] = {"actor": "user", "channel": "by"}
    request_id: str
    action: str
    content: dict[str, Any] | None = None
    channel: str = "websocket"  # as AnswerPermission's: ``elicitation.resolved``'s ``by``

    def check(self) -> None:
        _text(self.request_id, "request_id", BOUNDS.request_id)
        _text(self.action, "action", BOUNDS.decision)
        _text(self.channel, "by", BOUNDS.channel)
        if self.content is not None and not isinstance(self.content, dict):
            raise InvalidRequest("content must be a JSON object")

    def answer_to_wire(self, answer: dict[str, Any]) -> dict[str, Any]:
        return answer

    def answer_from_wire(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return dict(body)


KINDS: dict[str, type[Command[Any]]] = {
    c.KIND: c
    for c in (
        Prompt,
        Interrupt,
        AnswerPermission,
        SetMode,
        SetConfigOption,
        SetModel,
        Raw,
        AnswerElicitation,
        ForkPoint,
    )
}


def _seq(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _wire_fields(cls: type[Command[Any]]) -> dict[str, Any]:
    """A command type's fields by their wire names (``routed`` and the like left out)."""
    return {cls.WIRE_NAMES.get(f.name, f.name): f for f in fields(cls) if f.metadata.get("wire", True)}


def from_wire(kind: str, body: Mapping[str, Any]) -> Command[Any]:
    """A command another replica sent: untrusted. An unknown kind, an unknown field, a
    missing one or a bad value raises InvalidRequest, and nothing is done. A field sent as
    null is taken as absent (the sender's None)."""
    cls = KINDS.get(kind)
    if cls is None:
        raise InvalidRequest(f"unknown command {kind!r}")
    wire = _wire_fields(cls)
    if unknown := sorted(set(body) - set(wire)):
        raise InvalidRequest(f"unknown field {unknown[0]!r} in a {kind} command")
    given = {wire[k].name: v for k, v in body.items() if v is not None}
    missing = [w for w, f in wire.items() if f.default is MISSING and f.name not in given]
    if missing:
        raise InvalidRequest(f"a {kind} command needs {' and '.join(missing)}")
    return cls(**given)


class ThreadPort(Protocol):
    """The one way to run a client's command on a thread, wherever it runs. Implemented
    by the local port (sessions/local_port.py: the command runs here) and by the
    forwarding port (sessions/forwarding.py: another replica may run it)."""

    async def run(self, command: Command[A], *, answer_to: Subscriber | None = None) -> A:
        """Run ``command``; its answer, or the refusal (a BridgeError) a client is given.
        ``answer_to``: the sender's subscription, when there is one — held while a
        forwarded command's answer is awaited (the answer goes out before the events it
        caused), and where a raw-mode frame's agent response is routed."""
        ...


__all__ = [
    "BOUNDS",
    "KINDS",
    "AnswerElicitation",
    "AnswerPermission",
    "Bounds",
    "Command",
    "ForkPoint",
    "Interrupt",
    "MalformedAnswer",
    "Prompt",
    "Raw",
    "SetConfigOption",
    "SetMode",
    "SetModel",
    "ThreadPort",
    "from_wire",
]
