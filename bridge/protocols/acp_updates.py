"""ACP's data as the client codec reads and writes it, apart from the JSON-RPC state machine
(protocols/acp.py): an agent's ``session/update`` as normalized events, the bridge's
content blocks as ACP ``ContentBlock``s, an agent's session modes, and what the bridge
says of itself in ``initialize`` (docs/api.md §7.3).

Pure functions, plus :class:`ToolNames`, the one piece of memory the mapping needs: a
permission request names its tool call by id only, and the stable tool name came earlier,
in the call's own update.
"""

from __future__ import annotations

import base64
from typing import Any

from bridge.protocols.events import Event

PROTOCOL_VERSION = 1
# What the bridge implements, and so all it declares (issue #4: never claim more).
CLIENT_CAPABILITIES: dict[str, Any] = {
    "fs": {"readTextFile": True, "writeTextFile": True},
    "terminal": False,
    # Both modes: every client of a thread can answer a form; a URL is shown, never opened
    # by the bridge (protocols/acp_elicit.py).
    "elicitation": {"form": {}, "url": {}},
    # Boolean session config options are kept and set like select ones (acp_state.py).
    "session": {"configOptions": {"boolean": {}}},
}

MAX_TOOL_NAMES = 1024  # tool call ids whose names are remembered for permission requests
MAX_MODES = 64  # session modes kept from an agent's answer
MAX_MODE_TEXT = 1024  # characters of a mode's id, name or description


def s(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def d(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def items(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def initialize_params(client_info: dict[str, Any]) -> dict[str, Any]:
    """What the bridge says about itself in ``initialize``, as a client of an ACP agent."""
    return {"protocolVersion": PROTOCOL_VERSION, "clientCapabilities": CLIENT_CAPABILITIES, "clientInfo": client_info}


# ---------------------------------------------------------------------- content blocks


def _plain_text(source: dict[str, Any]) -> str | None:
    try:
        return base64.b64decode(str(source.get("data")), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None


def to_acp_blocks(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Bridge (Anthropic-shaped) content blocks → ACP ContentBlocks (docs/api.md §7.3)."""
    out: list[dict[str, Any]] = []
    for b in content:
        if b.get("type") == "text":
            out.append({"type": "text", "text": b.get("text", "")})
        elif b.get("type") == "image":
            src = d(b.get("source"))
            out.append({"type": "image", "mimeType": src.get("media_type"), "data": src.get("data")})
        elif b.get("type") == "document":
            src = d(b.get("source"))
            resource: dict[str, Any] = {"uri": "attachment:document", "mimeType": src.get("media_type")}
            text = _plain_text(src) if src.get("media_type") == "text/plain" else None
            if text is not None:
                resource["text"] = text  # an embedded text resource, as agents expect for text
            else:
                resource["blob"] = src.get("data")
            out.append({"type": "resource", "resource": resource})
    return out


def content_refusal(content: list[dict[str, Any]], capabilities: Any) -> str | None:
    """Why an agent with these ``agentCapabilities`` cannot take ``content``, or None.
    Text is baseline; images need ``promptCapabilities.image`` and documents (sent as
    embedded resources) ``promptCapabilities.embeddedContext`` (docs/api.md §7.3). Refused, never
    silently dropped or turned into something else."""
    caps = d(d(capabilities).get("promptCapabilities"))
    for b in content:
        if b.get("type") == "image" and caps.get("image") is not True:
            return "this agent does not accept images (its promptCapabilities.image is not true)"
        if b.get("type") == "document" and caps.get("embeddedContext") is not True:
            return "this agent does not accept documents (its promptCapabilities.embeddedContext is not true)"
    return None


def _content_text(block: Any) -> str:
    block = d(block)
    if block.get("type") == "text" and isinstance(block.get("text"), str):
        return str(block["text"])
    if block.get("type") == "resource_link":
        return f"[{block.get('name') or block.get('uri')}]({block.get('uri')})"
    return ""


# ---------------------------------------------------------------------- modes


def _mode_text(v: Any) -> str | None:
    return v if isinstance(v, str) and 0 < len(v) <= MAX_MODE_TEXT else None


def session_modes(value: Any) -> dict[str, Any] | None:
    """An agent's ``modes`` (ACP ``SessionModeState``: ``currentModeId`` and
    ``availableModes`` of ``{id, name, description?}``), the well-formed part, or None."""
    value = d(value)
    current = _mode_text(value.get("currentModeId"))
    available = []
    for m in items(value.get("availableModes"))[:MAX_MODES]:
        mid, name = _mode_text(d(m).get("id")), _mode_text(d(m).get("name"))
        if mid is None or name is None:
            continue
        mode: dict[str, Any] = {"id": mid, "name": name}
        if (text := _mode_text(m.get("description"))) is not None:
            mode["description"] = text
        available.append(mode)
    if current is None or not available:
        return None
    return {"currentModeId": current, "availableModes": available}


def mode_in(update: dict[str, Any]) -> str | None:
    """The mode a ``current_mode_update`` names (``currentModeId``; early agents: ``modeId``)."""
    return s(update.get("currentModeId")) or s(update.get("modeId"))


# ---------------------------------------------------------------------- session/update


def meta_tool_name(obj: dict[str, Any]) -> str | None:
    """The agent's stable tool name, if it gives one: claude-agent-acp's
    ``_meta.claudeCode.toolName``, Qwen Code's ``_meta.toolName``."""
    meta = d(obj.get("_meta"))
    return s(d(meta.get("claudeCode")).get("toolName")) or s(meta.get("toolName"))


class ToolNames:
    """toolCallId → the stable tool name the agent gave for it (bounded, oldest dropped),
    so a permission request, whose toolCall has only a title, names the tool too."""

    def __init__(self, limit: int = MAX_TOOL_NAMES) -> None:
        self.limit = limit
        self.names: dict[str, str] = {}

    def saw(self, update: dict[str, Any]) -> None:
        tcid, name = s(update.get("toolCallId")), meta_tool_name(update)
        if tcid and name:
            self.names.pop(tcid, None)
            self.names[tcid] = name
            while len(self.names) > self.limit:
                del self.names[next(iter(self.names))]

    def of(self, call: dict[str, Any]) -> str | None:
        """The tool's name as tool.call reported it (claude-agent-acp: "Bash"), as on
        stream-json; None when the agent never named it (the caller falls back to the title)."""
        tcid = s(call.get("toolCallId"))
        return meta_tool_name(call) or (self.names.get(tcid) if tcid else None)

    def __len__(self) -> int:
        return len(self.names)


def update_events(kind: str, u: dict[str, Any], raw: str, names: ToolNames) -> list[Event]:
    """One ``session/update`` (its ``sessionUpdate`` is ``kind``) as normalized events."""
    if kind in ("agent_message_chunk", "agent_thought_chunk"):
        text = _content_text(u.get("content"))
        channel = "text" if kind == "agent_message_chunk" else "thought"
        data = {"text": text, "channel": channel, "message_id": s(u.get("messageId"))}
        return [Event("agent", "message.delta", data, raw)]
    if kind == "user_message_chunk":
        data = {"session_update": kind, "text": _content_text(u.get("content"))}
        if (mid := s(u.get("messageId"))) is not None:
            data["message_id"] = mid  # ACP message ids: chunks of one message share one
        return [Event("agent", "agent.other", data, raw)]
    if kind in ("tool_call", "tool_call_update"):
        names.saw(u)
        return [_tool_event(kind, u, raw)]
    if kind == "plan":
        entries = [e for e in items(u.get("entries")) if isinstance(e, dict)]
        return [Event("agent", "plan", {"entries": entries}, raw)]
    if kind == "current_mode_update":
        return [Event("agent", "agent.status", {"status": "mode_changed", "mode": mode_in(u)}, raw)]
    return [Event("agent", "agent.other", {"session_update": kind}, raw)]


def _tool_event(kind: str, u: dict[str, Any], raw: str) -> Event:
    tcid = s(u.get("toolCallId"))
    status = s(u.get("status"))
    if kind == "tool_call_update" and status in ("completed", "failed"):
        output: Any = u.get("rawOutput")
        if output is None:
            output = "".join(_content_text(d(c).get("content")) for c in items(u.get("content")))
        return Event(
            "agent", "tool.result", {"tool_call_id": tcid, "output": output, "is_error": status == "failed"}, raw
        )
    # A stable tool name when the agent gives one (claude-agent-acp: _meta.claudeCode.toolName);
    # the title is a human label that changes during the call.
    meta_name = meta_tool_name(u)
    data: dict[str, Any] = {"tool_call_id": tcid}
    if kind == "tool_call":
        data.update(
            name=meta_name or s(u.get("title")) or s(u.get("kind")),
            input=u.get("rawInput"),
            title=s(u.get("title")),
            kind=s(u.get("kind")),
            status=status or "pending",
        )
        return Event("agent", "tool.call", data, raw)
    # tool_call_update patches the call: only the fields present (an absent field is
    # unchanged, not cleared).
    data["update"] = True
    if meta_name:
        data["name"] = meta_name
    for src, dst in (("rawInput", "input"), ("title", "title"), ("kind", "kind"), ("status", "status")):
        if src in u:
            data[dst] = u[src]
    return Event("agent", "tool.call", data, raw)
