"""The one interface every dialect implements, and the one shape its output takes.

A codec is a sans-I/O object for one agent process: bytes of one stdout line in,
:class:`Decoded` out; client intents in, lines to write out. Everything a dialect knows —
the launch flags it adds, whether permission prompts always go to clients, what an
interrupt does to pending permission requests, how a raw client's own answer to a
permission prompt is recognised — is behind :class:`Codec`, so the session layer never
names a dialect (docs/DESIGN.md, "Where a new dialect goes").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from bridge.protocols.events import Event

# ---------------------------------------------------------------------- control items


@dataclass(slots=True)
class Ready:
    """The handshake is done: prompts may be written now."""


@dataclass(slots=True)
class Fatal:
    """The agent cannot be used (a failed handshake): stop it with ``reason``."""

    reason: str
    message: str


@dataclass(slots=True)
class AgentInfo:
    """What the agent said about itself (name, version, capabilities), for the thread."""

    info: dict[str, Any]


@dataclass(slots=True)
class AgentRequest:
    """An agent → client request the caller must serve, because it needs I/O (ACP
    ``fs/*``); answered with :meth:`Codec.answer_request`."""

    id: int | str
    method: str
    params: dict[str, Any]


@dataclass(slots=True)
class RoutedReply:
    """A response to a request one raw-mode client forwarded: for that client only,
    with the client's own id restored."""

    route: str
    text: str


Control = Ready | Fatal | AgentInfo | AgentRequest | RoutedReply


@dataclass(slots=True)
class Decoded:
    """What one agent line produced: events for the transcript, lines the codec must write
    back right away (answers that keep the agent from hanging), and control items for the
    conversation."""

    events: list[Event] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    control: list[Control] = field(default_factory=list)

    # Views of ``control`` (tests and callers that want one kind).
    @property
    def ready(self) -> bool:
        return any(isinstance(c, Ready) for c in self.control)

    @property
    def fatal(self) -> Fatal | None:
        return next((c for c in self.control if isinstance(c, Fatal)), None)

    @property
    def requests(self) -> list[AgentRequest]:
        return [c for c in self.control if isinstance(c, AgentRequest)]

    @property
    def routed(self) -> list[tuple[str, str]]:
        return [(c.route, c.text) for c in self.control if isinstance(c, RoutedReply)]

    @property
    def agent(self) -> dict[str, Any] | None:
        return next((c.info for c in self.control if isinstance(c, AgentInfo)), None)


@dataclass(frozen=True, slots=True)
class RawAnswer:
    """A raw client's own answer to a permission prompt, recognised by the codec."""

    request_id: str
    decision: str  # allow | deny
    message: str | None


class RawRefused(ValueError):
    """A raw message this dialect does not forward (the reason is for the client)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


@runtime_checkable
class ModeSetter(Protocol):
    """A dialect whose agent has session modes (ACP ``session/set_mode``): an optional
    capability of a :class:`Codec`, looked up with ``isinstance``."""

    def set_mode(self, mode_id: str, route: str) -> str | None:
        """The line asking the agent to switch to ``mode_id``, its answer routed to
        ``route`` (:class:`RoutedReply`); None when the agent reported no modes."""
        ...


@runtime_checkable
class RoutedCancel(Protocol):
    """A dialect that can withdraw a request of its own whose answer was routed to a caller
    (a mode or config switch) once that caller stopped waiting (ACP ``$/cancel_request``,
    protocols/acp_cancel.py): an optional capability, looked up with ``isinstance``."""

    def cancel_routed(self, route: str) -> str | None:
        """The line withdrawing the request answered to ``route``; None when none waits.
        The request stays known: the agent's answer is still read as it would have been."""
        ...


class Codec(Protocol):
    """One agent process's dialect. Implemented by stream_json.StreamJsonCodec,
    awp_jsonl.AwpJsonlCodec and acp.AcpCodec; made by codecs.make_codec."""

    protocol: str
    # No handshake (True at once) or the handshake is done: prompts may be written.
    ready: bool
    # Resume goes on the command line (:meth:`resume_args`), not through a handshake request.
    resume_on_argv: bool
    # The dialect's command line must carry ``--model M`` (awp-jsonl's contract).
    requires_model: bool
    # An interrupt answers every pending permission request (ACP session/cancel, docs/api.md §6.5);
    # otherwise the agent withdraws its own requests.
    cancel_resolves_permissions: bool

    def launch_flags(self, options: Mapping[str, Any]) -> list[str]:
        """The flags this dialect adds to argv, given the thread's spawn options."""
        ...

    def model_args(self, model: str) -> list[str]:
        """The arguments that choose ``model`` on the command line, in this dialect's form
        (stream-json ``--model=M``, awp-jsonl ``--model M``); empty when the model is not
        on the command line (ACP). ``model`` is validated by the caller (launch.model_argv)."""
        ...

    def resume_args(self, session_id: str) -> list[str]:
        """The arguments that resume ``session_id`` on the command line, in this dialect's
        form (stream-json ``--resume=ID``, awp-jsonl ``--resume ID``); empty when resume
        is not on the command line. ``session_id`` was validated by the caller."""
        ...

    def prompts_to_clients(self, options: Mapping[str, Any]) -> bool:
        """Whether the agent's permission requests wait for a client's answer (else the
        bridge denies them by policy so the agent never hangs)."""
        ...

    def start(self) -> list[str]: ...
    def decode(self, line: bytes) -> Decoded: ...
    def decode_many(self, lines: Sequence[bytes]) -> list[Decoded]:
        """One read's lines: what ``decode`` makes of each, in order, where lines back to
        back that carry events only may be merged into one Decoded."""
        ...

    def refuse_content(self, content: list[dict[str, Any]]) -> str | None: ...
    def encode_prompt(self, content: list[dict[str, Any]], trace: Mapping[str, str] | None = None) -> str:
        """The prompt's line; ``trace`` (W3C trace context, protocols/trace.py) goes with it
        where the dialect has a place for it (ACP's ``_meta``), else nowhere."""
        ...

    def interrupt(self) -> list[str] | None:
        """Lines that interrupt the turn; None when the dialect cannot (stop the process)."""
        ...

    def encode_shutdown(self) -> str | None: ...

    def answer_permission(
        self,
        request_id: str,
        decision: str,
        *,
        option_id: str | None = None,
        options: Sequence[dict[str, Any]] = (),
        updated_input: dict[str, Any] | None = None,
        message: str = "",
    ) -> str | None: ...

    def raw_permission_answer(self, message: dict[str, Any]) -> RawAnswer | None:
        """A raw client message that answers a permission prompt, or None."""
        ...

    def forward_raw(self, message: dict[str, Any], route: str) -> str:
        """The line to write for a raw client message; ``route`` names the client a
        response should go back to. Raises :class:`RawRefused`."""
        ...

    def answer_request(self, request: AgentRequest, result: Any = None, error: tuple[int, str] | None = None) -> str:
        """The line answering one :class:`AgentRequest` with a result or (code, message)."""
        ...
