"""What the daemon needs from a bus between replicas, and the single-daemon bus.

A bus carries three things, none of which is ever the only copy of anything:

* **wake-ups** — after a commit, the replica holding a thread's lease announces ``(thread_id, last_seq)``,
  and after a change to a thread row the store's change cursor. Other replicas read the
  committed records from the store themselves; an announcement may be dropped or arrive
  twice, so a listener treats it as "look at the store now". When the bus was down or has
  just reconnected, :meth:`Listener.resync` says "anything may have been missed".
* **commands to a thread's lease holder** — a client's command (sessions/commands.py: a prompt,
  interrupt, permission answer, mode switch, raw frame) sent to another replica, as its
  wire form ``(kind, body)``: :meth:`Bus.request` delivers it to the holder's inbox and
  returns the holder's answer (the ``client.accepted`` / ``client.rejected`` the client gets).
  A command whose answer does not arrive in time raises :class:`NoReply`; the client's
  ``client_id`` makes a retry safe.
* **heartbeats** — which replicas are alive, for ``/v1/cluster`` and for routing.

Everything read from a bus comes from another process: it is untrusted input, parsed
strictly and bounded (:func:`parse_message`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from bridge.protocols import jsonline

# The largest message a replica sends or accepts: a prompt of up to 8 MiB of text, JSON
# escaped, plus its envelope.
MAX_MESSAGE_BYTES = 20 * 1024 * 1024
# Identifiers on the bus: replica ids, thread ids, command ids.
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
# A command's kind is only shaped here: which kinds exist, and what each carries, is the
# receiver's to check (sessions/commands.py ``from_wire``, and ``stop`` in
# sessions/cluster.py), so an unknown kind is answered with a refusal, not dropped.
_KIND = re.compile(r"[a-z][a-z_]{0,31}")


class BusUnavailable(Exception):
    """The bus cannot carry a command now (down, or there is no bus: one daemon)."""


class NoReply(Exception):
    """A command reached no holder, or its answer did not come back in time."""


class NotOnBus(NoReply):
    """The holder is not reading the bus: it has no heartbeat there, or it did not take the
    command from its inbox in time (the command was then taken back: it never ran). Whether
    it is alive is for its lease in the store to say."""


def valid_id(value: object) -> bool:
    return isinstance(value, str) and _ID.fullmatch(value) is not None


@dataclass(frozen=True)
class Command:
    """A client's input for a thread whose lease another replica holds."""

    id: str
    sender: str  # the replica the answer goes back to
    kind: str  # what the body is: a client command's KIND (sessions/commands.py), or "stop"
    thread_id: str
    body: Mapping[str, Any] = field(default_factory=dict)
    deadline: float = math.inf  # the sender's wall clock: after this nobody waits for the answer

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "command",
            "id": self.id,
            "sender": self.sender,
            "kind": self.kind,
            "thread": self.thread_id,
            "body": dict(self.body),
            "deadline": self.deadline,
        }


@dataclass(frozen=True)
class Reply:
    id: str
    ok: bool
    body: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"type": "reply", "id": self.id, "ok": self.ok, "body": dict(self.body)}


@dataclass(frozen=True)
class Commit:
    sender: str
    thread_id: str
    last_seq: int
    at: float  # the sender's wall clock when it announced (bus lag, same host only)


@dataclass(frozen=True)
class Changes:
    sender: str
    at: float


Message = Command | Reply | Commit | Changes


def _non_negative_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _parse_command(obj: dict[str, Any]) -> Command | None:
    body, deadline = obj.get("body"), obj.get("deadline")
    if not isinstance(deadline, int | float):
        return None
    if not (valid_id(obj.get("id")) and valid_id(obj.get("sender")) and valid_id(obj.get("thread"))):
        return None
    kind = obj.get("kind")
    if not (isinstance(kind, str) and _KIND.fullmatch(kind)) or not isinstance(body, dict) or not _finite(deadline):
        return None
    return Command(obj["id"], obj["sender"], obj["kind"], obj["thread"], body, float(deadline))


def _parse_reply(obj: dict[str, Any]) -> Reply | None:
    if not valid_id(obj.get("id")) or not isinstance(obj.get("ok"), bool) or not isinstance(obj.get("body"), dict):
        return None
    return Reply(obj["id"], obj["ok"], obj["body"])


def _parse_commit(obj: dict[str, Any]) -> Commit | None:
    if not (valid_id(obj.get("sender")) and valid_id(obj.get("thread"))):
        return None
    if not _non_negative_int(obj.get("seq")) or not _finite(obj.get("at")):
        return None
    return Commit(obj["sender"], obj["thread"], obj["seq"], float(obj["at"]))


def _parse_changes(obj: dict[str, Any]) -> Changes | None:
    if not valid_id(obj.get("sender")) or not _finite(obj.get("at")):
        return None
    return Changes(obj["sender"], float(obj["at"]))


_PARSERS: dict[str, Callable[[dict[str, Any]], Message | None]] = {
    "command": _parse_command,
    "reply": _parse_reply,
    "commit": _parse_commit,
    "changes": _parse_changes,
}


def parse_message(data: bytes) -> Message | None:
    """A message from another replica, or None when it is not one (wrong shape, too big,
    not JSON). Never raises."""
    if len(data) > MAX_MESSAGE_BYTES:
        return None
    obj, _, _ = jsonline.parse_object(data)
    if obj is None:
        return None
    parser = _PARSERS.get(obj.get("type"))  # type: ignore[arg-type]
    return parser(obj) if parser is not None else None


class Listener(Protocol):
    """What the daemon does when the bus wakes it; called on the event loop, must not block."""

    def committed(self, thread_id: str, last_seq: int) -> None: ...
    def changed(self) -> None:
        """A thread row changed on another replica: read the store's change log."""
        ...

    def resync(self) -> None:
        """The bus was down or has just (re)connected: announcements may have been missed."""
        ...


Handler = Callable[[Command], Awaitable[Mapping[str, Any]]]
"""Runs a command on this replica (the lease holder); its result is the reply's body. Raising
:class:`CommandRefused` answers ``ok: false`` with the exception's body."""


class CommandRefused(Exception):
    def __init__(self, body: Mapping[str, Any]):
        super().__init__(str(body.get("code", "refused")))
        self.body = body


class Bus(Protocol):
    replica_id: str
    healthy: bool

    async def start(self, listener: Listener, handler: Handler) -> None: ...
    async def close(self) -> None: ...
    def announce_commit(self, thread_id: str, last_seq: int) -> None:
        """Never blocks, never raises; may drop (a reader catches up from the store)."""
        ...

    def announce_changes(self) -> None: ...
    async def request(
        self, replica_id: str, kind: str, thread_id: str, body: Mapping[str, Any], timeout: float
    ) -> Reply: ...
    async def live_replicas(self) -> dict[str, dict[str, Any]]: ...
    def stats(self) -> dict[str, float]: ...


class LocalBus:
    """One daemon: nothing to wake, nobody to send a command to."""

    healthy = True

    def __init__(self, replica_id: str):
        self.replica_id = replica_id

    async def start(self, listener: Listener, handler: Handler) -> None:
        return None

    async def close(self) -> None:
        return None

    def announce_commit(self, thread_id: str, last_seq: int) -> None:
        return None

    def announce_changes(self) -> None:
        return None

    async def request(
        self, replica_id: str, kind: str, thread_id: str, body: Mapping[str, Any], timeout: float
    ) -> Reply:
        raise BusUnavailable("no bus is configured: this daemon is the only replica")

    async def live_replicas(self) -> dict[str, dict[str, Any]]:
        return {self.replica_id: {}}

    def stats(self) -> dict[str, float]:
        return {}
