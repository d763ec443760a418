"""What the conversation core asks its shell to do (actions), and the small records the
two share. Pure data: no asyncio, no I/O."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bridge.protocols.codec import AgentRequest
from bridge.protocols.events import Event, Record

# ---------------------------------------------------------------------- actions


@dataclass(slots=True)
class Emit:
    """Number, store, publish. ``committed`` is called with the records once stored; the
    actions it returns are performed next."""

    events: list[Event]
    fields: dict[str, Any] = field(default_factory=dict)
    client_ids: list[str | None] | None = None
    committed: Callable[[list[Record]], list[Action]] | None = None


@dataclass(slots=True)
class Write:
    """One line to the agent's stdin (recorded by an Emit before it). ``required``: a
    closed stdin is the client's error, not only a log line."""

    line: str
    required: bool = False


@dataclass(slots=True)
class ArmTimer:
    key: str
    delay_s: float


@dataclass(slots=True)
class CancelTimer:
    key: str


@dataclass(slots=True)
class Serve:
    request: AgentRequest


@dataclass(slots=True)
class Route:
    route: str
    text: str


@dataclass(slots=True)
class Stop:
    reason: str
    grace_s: float | None = None  # None: the configured grace
    # A model switch's stop: the prompts still queued once it exited start the next process.
    resume_queue: bool = False


Action = Emit | Write | ArmTimer | CancelTimer | Serve | Route | Stop

INTERRUPT_TIMER = "interrupt"
USER_ENDED = frozenset({"stopped", "interrupted", "interrupt_timeout", "deleted"})


@dataclass(frozen=True, slots=True)
class Limits:
    max_pending_prompts: int = 5
    interrupt_timeout_s: float = 10.0
    permission_timeout_s: float = 300.0
    stop_grace_s: float = 5.0


@dataclass(slots=True)
class Turn:
    turn_id: str
    content: list[dict[str, Any]]
    prompt_seq: int
    # The exact line, when the codec could encode it at acceptance; ACP prompts need the
    # session id, so before the handshake completes they are encoded when written.
    line: str | None
    actor: str | None = None  # who sent it (a user's name or "operator"), recorded as ``by`` in its client events
    trace: Mapping[str, str] | None = None  # its W3C trace context, given to the agent with it


@dataclass(slots=True)
class Accepted:
    seq: int
    turn_id: str | None
    duplicate: bool = False
    queued: bool = False
