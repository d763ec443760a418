"""A thread seen as an ACP session (the ACP gateway, docs/api.md §11): the transcript's
normalized events as ``session/update`` payloads, a turn's end as a ``stopReason``, a
permission request as ``session/request_permission``, and ACP prompt blocks as the
bridge's content blocks.

Pure: no I/O. The gateway (api/acp_gateway.py) owns the connection; one
:class:`UpdateMapper` per attached session keeps the little state the mapping needs.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from bridge.errors import InvalidRequest
from bridge.protocols.events import Record
from bridge.sessions.acp_usage import LastCall, reported, usage_update

STOP_REASONS = frozenset({"end_turn", "max_tokens", "max_turn_requests", "refusal"})
TOOL_KINDS = frozenset(
    {"read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", "other"}
)
TOOL_STATUSES = frozenset({"pending", "in_progress", "completed", "failed"})
PLAN_PRIORITIES = frozenset({"high", "medium", "low"})
PLAN_STATUSES = frozenset({"pending", "in_progress", "completed"})
OPTION_KINDS = frozenset({"allow_once", "allow_always", "reject_once", "reject_always"})
# stream-json and awp-jsonl requests carry no options: these two stand for allow / deny.
DEFAULT_OPTIONS = (
    {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
    {"optionId": "deny", "name": "Deny", "kind": "reject_once"},
)
# Claude Code's tool names → ACP tool kinds (an icon hint for the client).
_KIND_BY_TOOL = {
    "Read": "read",
    "Edit": "edit",
    "MultiEdit": "edit",
    "Write": "edit",
    "NotebookEdit": "edit",
    "Bash": "execute",
    "Grep": "search",
    "Glob": "search",
    "LS": "search",
    "WebFetch": "fetch",
    "WebSearch": "fetch",
}
MAX_COMMANDS = 256


def _text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _output_text(output: Any) -> str:
    """A tool's output as text: a string as it is, Anthropic content blocks by their text,
    anything else as JSON."""
    if isinstance(output, str):
        return output
    if isinstance(output, list) and all(isinstance(b, dict) for b in output):
        texts = [b["text"] for b in output if isinstance(b.get("text"), str)]
        if texts:
            return "\n".join(texts)
    return json.dumps(output, ensure_ascii=False)


def stop_reason(data: dict[str, Any]) -> str | None:
    """A ``turn.ended``'s ACP ``stopReason``, or None for a turn that failed (the prompt
    is answered with an error then)."""
    status = data.get("status")
    if status == "cancelled":
        return "cancelled"
    if status != "success":
        return None
    reason = data.get("stop_reason")
    if reason in STOP_REASONS:
        return str(reason)
    if data.get("subtype") == "error_max_turns":
        return "max_turn_requests"
    return "end_turn"


class UpdateMapper:
    """One attached session's mapping of records to ``session/update`` payloads.

    A stream-json agent streams a message as deltas and then writes it whole; the whole
    message is skipped when its deltas were sent (per channel), and sent as one chunk when
    they were not (an agent that does not stream).

    **Message ids** (``messageId`` on every chunk): a chunk's is the event's own
    ``message_id`` (an ACP agent's, Claude Code's message id); else, for a streamed chunk,
    the id of the message being streamed: the one a ``message_start`` named, or, when none
    did, ``<session>:<seq>`` with the seq of its first chunk; a whole message and a prompt
    without one: ``<session>:<seq>`` of its record. The
    message being streamed ends at the next ``message_start``, tool call, tool result and
    turn end (:func:`resets`), so the id of any chunk follows from the records since the
    last of those: a session attached in the middle of a message reads them first
    (:meth:`prime`) and gives the rest of it the id its start had.
    """

    def __init__(self, session_id: str = "") -> None:
        self._sid = session_id
        self._streamed: set[str] = set()
        self._message: str | None = None  # the id of the agent message being streamed
        self._last = LastCall()  # for the turn's usage_update (stream-json)
        self._told: dict[str, Any] | None = None  # an ACP agent's last usage_update sent since a reset

    def prime(self, records: list[Record]) -> None:
        """Take in what came before the first record to deliver, sending nothing."""
        for rec in records:
            self.updates(rec, own_prompt=True)

    def _id(self, rec: Record, own: Any) -> str:
        return own if isinstance(own, str) and own else f"{self._sid}:{rec.seq}"

    def updates(self, rec: Record, *, own_prompt: bool) -> list[dict[str, Any]]:
        """The updates for one record. ``own_prompt``: the record is a prompt this very
        ACP client sent (it is not echoed back to it)."""
        kind = rec.kind
        if kind not in _HANDLERS:
            return []
        if kind == "message":
            return self._message_chunk(rec, own_prompt=own_prompt)
        if kind == "message.delta":
            return self._delta(rec)
        if kind == "message.stream":
            self._stream(rec)
            return []
        if kind == "turn.ended":
            update = usage_update(rec.data, rec.raw, self._last)
            told = self._told
            self._reset()
            self._last.clear()
            return [] if update is None or update == told else [update]
        if resets(rec):
            self._reset()
        if kind == "usage":
            update = reported(rec.data)
            self._told = update or self._told
            return [] if update is None else [update]
        if kind in ("tool.call", "tool.result") and not rec.data.get("update"):
            self._last.clear()
        return _HANDLERS[kind](rec)

    def _reset(self) -> None:
        self._message = None
        self._streamed.clear()
        self._told = None

    def _stream(self, rec: Record) -> None:
        event = rec.data.get("event")
        if event == "message_start":
            mid = rec.data.get("message_id")
            self._reset()
            self._message = mid if isinstance(mid, str) and mid else None
            self._last.clear()
            self._last.started(rec.raw)
        elif event == "message_delta":
            self._last.delta(rec.raw)

    def _delta(self, rec: Record) -> list[dict[str, Any]]:
        text = rec.data.get("text")
        if not isinstance(text, str) or not text:
            return []
        channel = "thought" if rec.data.get("channel") == "thought" else "text"
        self._streamed.add(channel)
        own = rec.data.get("message_id")
        if isinstance(own, str) and own:
            self._message = own
        elif self._message is None:
            self._message = self._id(rec, None)
        kind = "agent_thought_chunk" if channel == "thought" else "agent_message_chunk"
        return [{"sessionUpdate": kind, "content": _text_block(text), "messageId": self._message}]

    def _message_chunk(self, rec: Record, *, own_prompt: bool) -> list[dict[str, Any]]:
        data = rec.data
        text = data.get("text")
        if not isinstance(text, str) or not text:
            return []
        if rec.source == "client":
            if own_prompt:
                return []
            return [
                {"sessionUpdate": "user_message_chunk", "content": _text_block(text), "messageId": self._id(rec, None)}
            ]
        if data.get("role") != "assistant":
            return []  # the CLI's own user lines (replay echo, interrupt marker): not the user
        if self._last.input is None:
            self._last.started(rec.raw)  # a dialect without stream events: the whole message's usage
        channel = "thought" if data.get("channel") == "thought" else "text"
        if channel in self._streamed:
            self._streamed.discard(channel)
            return []
        kind = "agent_thought_chunk" if channel == "thought" else "agent_message_chunk"
        mid = self._id(rec, data.get("message_id"))  # a message not streamed is one of its own
        return [{"sessionUpdate": kind, "content": _text_block(text), "messageId": mid}]


def resets(rec: Record) -> bool:
    """Whether nothing before ``rec`` changes what the mapper sends from it on: a
    ``message_start``, a tool call (not a patch of one), a tool result, a turn's end."""
    kind = rec.kind
    if kind == "message.stream":
        return rec.data.get("event") == "message_start"
    if kind == "tool.call":
        return not rec.data.get("update")
    return kind in ("tool.result", "turn.ended")


def _s(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) and value else None


def _tool_fields(data: dict[str, Any]) -> dict[str, Any]:
    """A tool call's title, kind and status, the ones that are well-formed."""
    name = _s(data, "name")
    kind = data.get("kind") if data.get("kind") in TOOL_KINDS else _KIND_BY_TOOL.get(name or "")
    fields = {
        "title": _s(data, "title"),
        "kind": kind,
        "status": data.get("status") if data.get("status") in TOOL_STATUSES else None,
    }
    out = {k: v for k, v in fields.items() if v is not None}
    if data.get("input") is not None:
        out["rawInput"] = data["input"]
    return out


def _tool_call(rec: Record) -> list[dict[str, Any]]:
    data = rec.data
    call_id = _s(data, "tool_call_id")
    if call_id is None:
        return []
    fields = _tool_fields(data)
    if data.get("update"):
        return [{"sessionUpdate": "tool_call_update", "toolCallId": call_id, **fields}]
    fields.setdefault("title", _s(data, "name") or "tool")
    fields.setdefault("status", "pending")
    return [{"sessionUpdate": "tool_call", "toolCallId": call_id, **fields}]


def _tool_result(rec: Record) -> list[dict[str, Any]]:
    data = rec.data
    call_id = data.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        return []
    output = data.get("output")
    update: dict[str, Any] = {
        "sessionUpdate": "tool_call_update",
        "toolCallId": call_id,
        "status": "failed" if data.get("is_error") else "completed",
        "content": [{"type": "content", "content": _text_block(_output_text(output))}],
    }
    if output is not None:
        update["rawOutput"] = output
    return [update]


def _plan(rec: Record) -> list[dict[str, Any]]:
    entries = rec.data.get("entries")
    if not isinstance(entries, list):
        return []
    good = [
        {"content": e["content"], "priority": e["priority"], "status": e["status"]}
        for e in entries
        if isinstance(e, dict)
        and isinstance(e.get("content"), str)
        and e.get("priority") in PLAN_PRIORITIES
        and e.get("status") in PLAN_STATUSES
    ]
    return [{"sessionUpdate": "plan", "entries": good}]


def _status(rec: Record) -> list[dict[str, Any]]:
    mode = rec.data.get("mode")
    if rec.data.get("status") == "mode_changed" and isinstance(mode, str) and mode:
        return [{"sessionUpdate": "current_mode_update", "currentModeId": mode}]
    return []


def _session_started(rec: Record) -> list[dict[str, Any]]:
    """stream-json's init line lists the CLI's slash commands: ACP's available commands."""
    if rec.source != "agent" or rec.raw is None:
        return []
    try:
        line = json.loads(rec.raw)
    except ValueError:
        return []
    commands = line.get("slash_commands") if isinstance(line, dict) else None
    if not isinstance(commands, list):
        return []
    names = [c for c in commands[:MAX_COMMANDS] if isinstance(c, str) and c]
    listed = [{"name": n.removeprefix("/"), "description": ""} for n in names]
    return [{"sessionUpdate": "available_commands_update", "availableCommands": listed}]


def _nothing(rec: Record) -> list[dict[str, Any]]:
    return []


_HANDLERS = {
    "message": _nothing,  # UpdateMapper._message_chunk
    "turn.ended": _nothing,  # UpdateMapper.updates: usage_update
    "message.delta": _nothing,  # UpdateMapper._delta
    "message.stream": _nothing,  # UpdateMapper._stream: message ids and usage
    "usage": _nothing,  # UpdateMapper.updates: an ACP agent's usage_update
    "tool.call": _tool_call,
    "tool.result": _tool_result,
    "plan": _plan,
    "agent.status": _status,
    "session.started": _session_started,
}


def permission_request(session_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """``session/request_permission`` params for a ``permission.requested`` event."""
    tool = _s(data, "tool")
    call: dict[str, Any] = {
        "toolCallId": _s(data, "tool_call_id") or str(data.get("request_id")),
        "title": _s(data, "title") or tool or "permission",
        "status": "pending",
    }
    if (kind := _KIND_BY_TOOL.get(tool or "")) is not None:
        call["kind"] = kind
    if data.get("input") is not None:
        call["rawInput"] = data["input"]
    options = agent_options(data) or [dict(o) for o in DEFAULT_OPTIONS]
    return {"sessionId": session_id, "toolCall": call, "options": options}


def agent_options(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's own options (an ACP agent's), the well-formed ones."""
    raw = data.get("options")
    if not isinstance(raw, list):
        return []
    return [
        {"optionId": o["optionId"], "name": o["name"], "kind": o["kind"]}
        for o in raw
        if isinstance(o, dict)
        and isinstance(o.get("optionId"), str)
        and isinstance(o.get("name"), str)
        and o.get("kind") in OPTION_KINDS
    ]


def _chosen(result: Any) -> str | None:
    """The outcome of a ``session/request_permission`` answer: the chosen option id,
    ``""`` for ``cancelled``, None when it is neither."""
    outcome = result.get("outcome") if isinstance(result, dict) else None
    kind = outcome.get("outcome") if isinstance(outcome, dict) else None
    if kind == "cancelled":
        return ""
    chosen = outcome.get("optionId") if isinstance(outcome, dict) and kind == "selected" else None
    return chosen if isinstance(chosen, str) and chosen else None


def permission_answer(data: dict[str, Any], result: Any) -> tuple[str, str | None] | None:
    """An ACP client's answer to a request made from ``data``, as (decision, option_id),
    or None when the answer names no option of the request. A ``cancelled`` outcome is a
    denial: the client will not ask its user."""
    chosen = _chosen(result)
    if not chosen:
        return None if chosen is None else ("deny", None)
    own = agent_options(data)
    option = next((o for o in own or DEFAULT_OPTIONS if o["optionId"] == chosen), None)
    if option is None:
        return None
    decision = "allow" if str(option["kind"]).startswith("allow") else "deny"
    return decision, chosen if own else None


def prompt_blocks(prompt: Any) -> list[dict[str, Any]]:
    """ACP ``ContentBlock``s as the bridge's blocks (docs/api.md §4.6): text; an image;
    an embedded resource as a document (text as ``text/plain``, a PDF blob); a resource
    link as a text line naming it. Anything else is refused (``unsupported_content``)."""
    if not isinstance(prompt, list) or not prompt:
        raise InvalidRequest("prompt must be a non-empty list of content blocks", code="invalid_content")
    return [_block(i, b) for i, b in enumerate(prompt)]


def _block(i: int, block: Any) -> dict[str, Any]:
    btype = block.get("type") if isinstance(block, dict) else None
    convert = _BLOCKS.get(btype) if isinstance(btype, str) else None
    converted = convert(block) if convert is not None else None
    if converted is None:
        raise InvalidRequest(f"prompt[{i}]: unsupported content block {btype!r}", code="unsupported_content")
    return converted


def _text_in(block: dict[str, Any]) -> dict[str, Any] | None:
    return _text_block(block["text"]) if isinstance(block.get("text"), str) else None


def _image_in(block: dict[str, Any]) -> dict[str, Any] | None:
    if not isinstance(block.get("data"), str):
        return None
    return {"type": "image", "source": {"type": "base64", "media_type": block.get("mimeType"), "data": block["data"]}}


def _link_in(block: dict[str, Any]) -> dict[str, Any] | None:
    uri = _s(block, "uri")
    return None if uri is None else _text_block(f"[{_s(block, 'name') or uri}]({uri})")


def _resource_in(block: dict[str, Any]) -> dict[str, Any] | None:
    res = block.get("resource")
    if not isinstance(res, dict):
        return None
    if isinstance(res.get("text"), str):
        data = base64.b64encode(res["text"].encode()).decode()
        return {"type": "document", "source": {"type": "base64", "media_type": "text/plain", "data": data}}
    if isinstance(res.get("blob"), str):
        return {
            "type": "document",
            "source": {"type": "base64", "media_type": res.get("mimeType"), "data": res["blob"]},
        }
    return None


_BLOCKS = {"text": _text_in, "image": _image_in, "resource_link": _link_in, "resource": _resource_in}
