"""The AWP Agent CLI ``awp-jsonl`` dialect (docs/api.md §7.2).

A subset of stream-json: the same ``system/init``, ``assistant`` and ``result`` lines,
plus top-level ``content_block_*`` and ``message_stop`` events, ``result.subtype ==
"error"``, no control protocol and no permission prompts. Input is one ``user`` line per
turn; ``{"type":"shutdown"}`` asks for a graceful exit. Resume is ``--resume ID``, two
arguments, exactly as the contract's argv states (stream-json's ``--resume=ID`` is one).

A ``result`` with subtype ``startup_error`` is not a turn's answer: the AWP reference
adapter writes it, before reading any input, when it cannot start (an argument it does not
know, a bad configuration) and then exits 1. It ends the turn (if one is open) with that
machine-readable reason and stops the process as a failed start (:class:`Fatal`,
reason ``startup_error``), so users see why the agent never answered.

The variant is expressed in class attributes of :class:`AwpJsonlCodec` only: its handler
table (no ``control_*`` handlers, so such lines are recorded as ``agent.other`` and never
answered; the top-level streaming events added), the decode shortcuts and which
top-level types are streaming deltas.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from bridge.protocols import stream_json_fast as fast
from bridge.protocols.codec import Decoded, Fatal
from bridge.protocols.events import Event
from bridge.protocols.jsonline import dumps
from bridge.protocols.stream_json import Handler, StreamJsonCodec, _d, _s
from bridge.protocols.stream_json_map import result_error

PROTOCOL = "awp-jsonl"
STARTUP_ERROR = "startup_error"
# What a start-up failure's reason may show, at most (the reference adapter's are short codes).
_MAX_REASON = 512


def _block(codec: StreamJsonCodec, obj: dict[str, Any], raw: str, out: Decoded) -> list[Event]:
    """A top-level event of a raw stream: a ``tool_use`` block start is a ``tool.call``,
    the rest what it is inside a ``stream_event``."""
    if obj.get("type") == "content_block_start":
        block = _d(obj.get("content_block"))
        if block.get("type") == "tool_use":
            data = {"tool_call_id": _s(block.get("id")), "name": _s(block.get("name")), "input": block.get("input")}
            return [Event("agent", "tool.call", data, raw)]
    return codec._raw_stream(obj, raw)


def _message_stop(codec: StreamJsonCodec, obj: dict[str, Any], raw: str, out: Decoded) -> list[Event]:
    # A raw stream may end its turn with a top-level message_stop (Part 2).
    return [Event("agent", "turn.ended", {"status": "success", "stop_reason": "message_stop"}, raw)]


def _result(codec: StreamJsonCodec, obj: dict[str, Any], raw: str, out: Decoded) -> list[Event]:
    if obj.get("subtype") != STARTUP_ERROR:
        return StreamJsonCodec._result(codec, obj, raw, out)
    reason = result_error(obj, STARTUP_ERROR)[0][:_MAX_REASON]
    text = f"the agent could not start: {reason}"
    out.control.append(Fatal(STARTUP_ERROR, reason))
    ended = {"status": "error", "stop_reason": None, "error": reason, "subtype": STARTUP_ERROR}
    return [
        Event("agent", "turn.ended", {**ended, "error_code": STARTUP_ERROR}, raw),
        Event("bridge", "notice", {"code": STARTUP_ERROR, "text": text, "error": reason}),
    ]


_NO_CONTROL = ("control_request", "control_cancel_request")


class AwpJsonlCodec(StreamJsonCodec):
    protocol = PROTOCOL
    requires_model = True  # the contract's argv: --model <model> [--resume <id>] [--mcp-config <path>]
    _fast_handlers: ClassVar[dict[str, fast.FastHandler]] = {
        "content_block_delta": fast.stream,
        "assistant": fast.assistant,
    }
    _fast_prefixes: ClassVar[tuple[bytes, ...]] = fast.prefixes(_fast_handlers)
    _toplevel_deltas: ClassVar[frozenset[str]] = frozenset({"content_block_delta"})
    _handlers: ClassVar[dict[str, Handler]] = {
        **{k: v for k, v in StreamJsonCodec._handlers.items() if k not in _NO_CONTROL},
        "content_block_start": _block,
        "content_block_delta": _block,
        # the rest of a raw stream's structure: message.stream, as inside a stream_event
        "content_block_stop": _block,
        "message_start": _block,
        "message_delta": _block,
        "message_stop": _message_stop,
        "result": _result,
    }

    def __init__(self, *, protocol_flags: Sequence[str] | None = None) -> None:
        # The AWP host passes only --model/--resume/--mcp-config, unless a profile states more.
        super().__init__(protocol_flags=protocol_flags or ())

    def launch_flags(self, options: Mapping[str, Any]) -> list[str]:
        return list(self._flags)  # no spawn options: the contract's argv is fixed

    def model_args(self, model: str) -> list[str]:
        # The contract: "--model <model>", two arguments; the reference adapter refuses
        # "--model=M" as an unsupported argument. The launch rules refuse a model id that
        # begins with "-" (process/launch.py), so it is never read as a flag.
        return ["--model", model]

    def resume_args(self, session_id: str) -> list[str]:
        # The contract: "[--resume <native-session-id>]", two arguments; the reference adapter
        # refuses "--resume=ID" as an unsupported argument. The launch rules refuse an id that
        # begins with "-" in this form (process/launch.py).
        return ["--resume", session_id]

    def prompts_to_clients(self, options: Mapping[str, Any]) -> bool:
        return False  # the contract has no permission prompts

    def encode_prompt(self, content: list[dict[str, Any]], trace: Mapping[str, str] | None = None) -> str:
        # The AWP contract's user line has no place for a trace context.
        return dumps({"type": "user", "message": {"role": "user", "content": content}})

    def encode_interrupt(self) -> str | None:
        return None  # no interrupt message: the bridge interrupts by stopping the process

    def encode_shutdown(self) -> str | None:
        return dumps({"type": "shutdown"})

    def raw_permission_answer(self, message: dict[str, Any]) -> None:
        return None  # no control protocol, so no permission prompts to answer
