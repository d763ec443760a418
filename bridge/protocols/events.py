"""The normalized event model shared by every dialect (API.md §4).

An :class:`Event` is what a codec produces from one agent line, what the bridge records
when it writes to the agent, and what the bridge says itself. The conversation gives it a
``seq`` and a timestamp when it enters the transcript; until then it has neither.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

Source = Literal["agent", "client", "bridge"]

# Normalized kinds (API.md §4). Kept as plain strings so that a newer kind never breaks
# an older reader; this set documents what the bridge itself produces.
KINDS = frozenset(
    {
        "session.started",
        "turn.started",
        "message.delta",
        "message",
        "tool.call",
        "tool.result",
        "task.updated",
        "permission.requested",
        "permission.resolved",
        "turn.ended",
        "plan",
        "agent.status",
        "tool.progress",
        "hook",
        "rate_limit",
        "notice",
        "diagnostic",
        "process.started",
        "process.exited",
        "agent.other",
        # client-sourced records of what the bridge wrote to the agent
        "client.other",
    }
)

TURN_STATUSES = ("success", "error", "cancelled")


# Keys whose values are secrets: redacted from logs, control responses and agent output.
# "token" but not token *counts* (totalTokens, input_tokens, tokens_used).
SECRET_KEY_RE = re.compile(
    r"(?i:token)(?![sS](?:$|_))|(?i:secret|password|passwd|api[_-]?key|authorization|"
    r"cookie|credential|private[_-]?key|session[_-]?key)"
)
REDACTED = "[redacted]"


def dumps(obj: Any) -> str:
    """One line of compact JSON (never contains a raw newline) that always encodes as UTF-8.

    A lone surrogate is legal in a parsed JSON string (``"\\ud800"``) but not in UTF-8, so
    such a value falls back to ``\\uXXXX`` escapes, which a reader decodes to the same string
    (protocols.md §0.1; a request_id echoed in a reply must round-trip exactly). Used for
    everything the bridge writes: agent stdin, the store, WebSocket frames.

    orjson writes the common case (issue #8: several times faster than ``json``); what it
    refuses — lone surrogates, integers beyond 64 bits, non-string keys — goes through
    ``json`` exactly as before. The one difference: orjson writes a non-finite float as
    ``null`` where ``json`` wrote the non-JSON ``NaN``/``Infinity``.
    """
    try:
        return orjson.dumps(obj).decode()
    except (TypeError, orjson.JSONEncodeError):
        pass
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(obj, ensure_ascii=True, separators=(",", ":"))
    return text


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# JSON nested deeper than this is refused wherever it comes from (agent lines, client
# frames): Python's json recursion limit would otherwise bite later, when the value is
# serialised again deeper in the stack (store, envelopes, REST pages).
MAX_JSON_DEPTH = 128


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in item)
    return False


_STRICT = json.JSONDecoder(parse_constant=_reject_constant)


def loads_strict(text: str) -> Any:
    """json.loads without the NaN/Infinity extensions, so whatever we accept we can write
    back as standard JSON; nesting deeper than MAX_JSON_DEPTH is a ValueError."""
    value = _STRICT.decode(text)  # one decoder for all (json.loads would build one per call)
    if too_deep(value):
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return value


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


def agent_event(kind: str, data: dict[str, Any], raw: str | None) -> Event:
    return Event("agent", kind, data, raw)


def bridge_event(kind: str, **data: Any) -> Event:
    return Event("bridge", kind, data, None)


def diagnostic(stream: Literal["stderr", "protocol"], text: str) -> Event:
    return Event("agent" if stream == "stderr" else "bridge", "diagnostic", {"stream": stream, "text": text}, None)


_SAFE_TS = re.compile(r"[0-9A-Za-z:.+-]*")
_JSON_STR: dict[str, str] = {}  # source and kind names, already as JSON strings


def _json_str(value: str) -> str:
    out = _JSON_STR.get(value)
    if out is None:
        out = json.dumps(value)
        if len(_JSON_STR) < 1024:  # kinds are a small set; never let agent input grow this
            _JSON_STR[value] = out
    return out


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

    def envelope(self) -> str:
        """The events-mode frame (API.md §4). ``raw`` is the exact line the agent wrote,
        embedded as-is (it is already one JSON object), never re-serialised."""
        if self._envelope is None:
            ts = f'"{self.ts}"' if _SAFE_TS.fullmatch(self.ts) else json.dumps(self.ts)
            self._envelope = (
                f'{{"seq":{self.seq},"ts":{ts},"source":{_json_str(self.source)},'
                f'"kind":{_json_str(self.kind)},"data":{self.data_json},'
                f'"raw":{self.raw if self.raw is not None else "null"}}}'
            )
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


class Frames:
    """A page of the transcript as ready-to-send frame payloads (a replay, issue #8).

    ``count`` rows were read, the last of them ``last`` (the ``after`` of the read when
    none); ``texts`` holds their frames as UTF-8: every envelope in events mode, the
    relayed agent lines in raw mode (so it may be shorter than ``count``). No
    :class:`Record` is built for a replayed row and no text is decoded: the frames are
    joined straight from the stored bytes."""

    __slots__ = ("count", "last", "texts")

    def __init__(self, texts: list[bytes], count: int, last: int) -> None:
        self.texts = texts
        self.count = count
        self.last = last


_SAFE_TS_BYTES = re.compile(rb"[0-9A-Za-z:.+-]*")
_JSON_BYTES: dict[bytes, bytes] = {}  # source and kind names as JSON strings, UTF-8


def _json_bytes(value: bytes) -> bytes:
    out = _JSON_BYTES.get(value)
    if out is None:
        out = _json_str(value.decode()).encode()
        if len(_JSON_BYTES) < 1024:  # kinds are a small set; never let agent input grow this
            _JSON_BYTES[value] = out
    return out


def stored_envelopes(rows: list[tuple[int, bytes, bytes, bytes, bytes, bytes | None]]) -> list[bytes]:
    """The events-mode frames of stored rows ``(seq, ts, source, kind, data_json, raw)``
    read as UTF-8 bytes, byte-identical to :meth:`Record.envelope` of the same records,
    encoded (tests/sessions/test_replay_envelope.py)."""
    safe = _SAFE_TS_BYTES.fullmatch
    js = _JSON_BYTES
    out: list[bytes] = []
    append = out.append
    for seq, ts, source, kind, data, raw in rows:
        src = js.get(source) or _json_bytes(source)
        knd = js.get(kind) or _json_bytes(kind)
        tsj = b'"%b"' % ts if safe(ts) else json.dumps(ts.decode()).encode()
        append(
            b'{"seq":%d,"ts":%b,"source":%b,"kind":%b,"data":%b,"raw":%b}'
            % (seq, tsj, src, knd, data, raw if raw is not None else b"null")
        )
    return out


def ephemeral(kind: str, ts: str, **data: Any) -> str:
    """A bridge frame for one client only (``client.accepted``/``client.rejected``): it is
    not part of the transcript, so its ``seq`` is null."""
    return dumps({"seq": None, "ts": ts, "source": "bridge", "kind": kind, "data": data, "raw": None})
