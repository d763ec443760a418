"""The normalized event model shared by every dialect (docs/api.md §6).

An :class:`Event` is what a codec produces from one agent line, what the bridge records
when it writes to the agent, and what the bridge says itself. The conversation gives it a
``seq`` and a timestamp when it enters the transcript; until then it has neither.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from bridge.protocols.envelope import record_envelope
from bridge.protocols.jsonline import dumps

Source = Literal["agent", "client", "bridge"]

# Normalized kinds (docs/api.md §6.3). Kept as plain strings so that a newer kind never breaks
# an older reader; this set documents what the bridge itself produces.
KINDS = frozenset(
    {
        "session.started",
        "turn.started",
        "message.delta",
        "message.stream",
        "message",
        "tool.call",
        "tool.result",
        "task.updated",
        "permission.requested",
        "permission.resolved",
        "elicitation.requested",
        "elicitation.resolved",
        "turn.ended",
        "plan",
        "usage",  # an ACP agent's context and cost report (usage_update)
        "session.info",  # an ACP agent's session title / updatedAt (session_info_update)
        "agent.status",
        "tool.progress",
        "hook",
        "rate_limit",
        "notice",
        "diagnostic",
        "agent.reply",
        "process.started",
        "process.exited",
        "agent.other",
        # client-sourced records of what the bridge wrote to the agent
        "client.other",
    }
)

# Keys whose values are secrets: redacted from logs, control responses and agent output.
# "token" but not token *counts* (totalTokens, input_tokens, tokens_used).
SECRET_KEY_RE = re.compile(
    r"(?i:token)(?![sS](?:$|_))|(?i:secret|password|passwd|api[_-]?key|authorization|"
    r"cookie|credential|private[_-]?key|session[_-]?key)"
)
REDACTED = "[redacted]"

# What an interrupted turn's end says it was (docs/api.md §6.5).
INTERRUPTED = "interrupted"


def mark_interrupted(data: dict[str, Any]) -> Any:
    """Make a ``turn.ended`` read as what happened: status ``cancelled``, reason
    ``interrupted``, and no ``error``. Returns the ``error`` it took off (what the agent
    said about the aborted turn, such as Claude Code's internal ``[ede_diagnostic] …``),
    or None: the caller records it as a diagnostic, and the agent's line keeps it in
    ``raw``."""
    data["status"] = "cancelled"
    data["reason"] = INTERRUPTED
    return data.pop("error", None)


@dataclass(slots=True)
class Event:
    source: Source
    kind: str
    data: dict[str, Any] = field(default_factory=dict)
    # The exact JSON line (no trailing newline) the agent wrote or the bridge wrote to the
    # agent. ``None`` for bridge events and for agent lines that are not a JSON object.
    raw: str | None = None
    # True on exactly one event per agent stdout line that raw mode relays (the first
    # event decoded from a JSON-object line); False on the extra events of that line.
    relay: bool = False


class Record:
    """An event as it stands in the transcript: numbered, timestamped, immutable.

    ``data`` is serialised once (``data_json``) for the store and every envelope, and a
    record read back from the store keeps the stored text, so a replay never parses and
    re-serialises what it only relays (issue #8). Either form is derived on first use.
    """

    __slots__ = ("_data", "_data_json", "_envelope", "kind", "raw", "relay", "seq", "source", "ts")

    def __init__(
        self,
        seq: int,
        ts: str,
        source: str,
        kind: str,
        data: dict[str, Any] | None,
        raw: str | None,
        relay: bool,
        data_json: str | None = None,
        envelope: str | None = None,
    ) -> None:
        # Positional and unchecked: a replay builds one per stored event. ``data`` or
        # ``data_json`` must be given; ``envelope``, when given, must be what envelope()
        # would build.
        self.seq = seq
        self.ts = ts
        self.source = source
        self.kind = kind
        self._data = data
        self._data_json = data_json
        self.raw = raw
        self.relay = relay
        self._envelope = envelope

    @property
    def data(self) -> dict[str, Any]:
        if self._data is None:
            assert self._data_json is not None
            self._data = json.loads(self._data_json)
        return self._data

    @property
    def data_json(self) -> str:
        if self._data_json is None:
            self._data_json = dumps(self._data)
        return self._data_json

    def __repr__(self) -> str:
        return f"Record(seq={self.seq}, kind={self.kind!r}, source={self.source!r})"

    def envelope(self, *, with_raw: bool = True) -> str:
        """The events-mode frame (docs/api.md §6.1), built once; without ``raw`` (null),
        built each time it is asked for."""
        if not with_raw:
            return record_envelope(self.seq, self.ts, self.source, self.kind, self.data_json, None)
        if self._envelope is None:
            self._envelope = record_envelope(self.seq, self.ts, self.source, self.kind, self.data_json, self.raw)
        return self._envelope

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "ts": self.ts,
            "source": self.source,
            "kind": self.kind,
            "data": self.data,
            "raw": json.loads(self.raw) if self.raw is not None else None,
        }
