"""What the stream-json lines that carry no conversation content become (docs/api.md §7.1).

Claude Code, CodeBuddy and Qwen Code write many lines besides messages, tool calls and the
turn's end: state changes, retries, compaction, banners, liveness pings, the structure of
a streamed message. Each known one maps here onto a normalized kind, so that
``agent.other`` is left for what is truly unknown. The lists come from the CLIs
themselves: the stream-json contract, the output schemas bundled in Claude Code 2.1.197 and
its agent SDK's types, Qwen Code 0.24.4's output adapter, and what the real CLIs printed
against the loopback fake model APIs of tests/real (tests/fixtures/stream-json).

Pure functions of one parsed line; agent output is untrusted, so every field is checked
for its type and a missing one is never assumed present.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# ``system`` subtypes that say something about the agent's state and carry nothing a user
# reads: ``agent.status`` with ``event`` (the subtype) and nothing else.
QUIET_SYSTEM = frozenset(
    {
        # Claude Code 2.1.197 / its agent SDK
        "agents_killed",
        "background_tasks_changed",
        "bridge_state",
        "bridge_status",
        "commands_changed",
        "control_request_progress",
        "elicitation_complete",
        "file_snapshot",
        "files_persisted",
        "memory_recall",
        "plugin_install",
        "post_turn_summary",
        "scheduled_task_fire",
        "stop_hook_summary",
        "task_summary",
        "thinking",
        "thinking_tokens",
        "turn_duration",
        # Qwen Code 0.24.4
        "session_end",
        "worktree_restored",
        "worktree_started",
    }
)

# ``system`` subtypes that carry text for the user (banners, notifications, fallbacks,
# auto-denials, local command output, data loss): ``notice`` with ``code`` (the subtype)
# and ``text``.
NOTICE_SYSTEM = frozenset(
    {
        "api_error",
        "away_summary",
        "continue_turn_failed",
        "informational",
        "local_command_output",
        "memory_saved",
        "mirror_error",
        "model_consent_fallback",
        "model_fallback",
        "model_refusal_fallback",
        "model_refusal_no_fallback",
        "notification",
        "permission_denied",
        "permission_retry",
        "session_writes_lost",
        "vision_bridge",
        "vision_bridge_failed",
        "vision_routing",
    }
)

# Top-level types other than the conversation's: liveness, authentication, goals and the
# CLI's internal bookkeeping (``agent.status`` with ``event``), or text for the user
# (``notice``).
QUIET_TOPLEVEL = frozenset(
    {
        "active_goal",
        "api_metrics",
        "attachment",
        "auth_status",
        "command_lifecycle",
        "conversation_reset",
        "keep_alive",
        "tombstone",
        "transcript_mirror",
    }
)
NOTICE_TOPLEVEL = frozenset({"prompt_suggestion", "tool_use_summary"})

# The events of the Messages API stream that are not text: ``message.stream``.
STREAM_STRUCTURE = frozenset(
    {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
        "error",
    }
)
_TOOL_BLOCKS = ("tool_use", "server_tool_use", "mcp_tool_use")

# What an error ``result`` is, when the agent gave no text of its own to say so.
RESULT_ERRORS = {
    "error_during_execution": "the turn failed during execution",
    "error_max_turns": "the maximum number of turns was reached",
    "error_max_budget_usd": "the maximum budget was reached",
    "error_max_structured_output_retries": "the structured output kept failing validation",
}
# Claude Code's own diagnostics in a result's ``errors``: not for users (docs/api.md §6.5).
INTERNAL_ERROR_PREFIX = "[ede_diagnostic]"
# The marker text Claude Code writes as a user message when a turn is interrupted.
INTERRUPT_MARKER = "[Request interrupted by user"


def _s(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _d(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _num(value: Any) -> int | float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def stream_structure(ev: dict[str, Any]) -> dict[str, Any] | None:
    """``message.stream`` data for a Messages API stream event that is not a text or
    thinking delta, or None for a type that is not one. Strings only: the decode fast path
    builds the same from orjson's values (docs/api.md §6.3)."""
    etype = ev.get("type")
    if not isinstance(etype, str) or etype not in STREAM_STRUCTURE:
        return None
    data: dict[str, Any] = {"event": etype}
    if etype == "message_start":
        data["message_id"] = _s(_d(ev.get("message")).get("id"))
    elif etype == "content_block_start":
        block = _d(ev.get("content_block"))
        btype = _s(block.get("type"))
        data["block_type"] = btype
        if btype in _TOOL_BLOCKS:
            data["tool_call_id"] = _s(block.get("id"))
            data["name"] = _s(block.get("name"))
    elif etype == "content_block_delta":
        data["delta_type"] = _s(_d(ev.get("delta")).get("type"))
    elif etype == "message_delta":
        data["stop_reason"] = _s(_d(ev.get("delta")).get("stop_reason"))
    elif etype == "error":
        data["error"] = _s(_d(ev.get("error")).get("message"))
    return data


def other_stream_event(ev: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """Qwen Code's own ``stream_event`` payloads: MCP or shell tool progress, and its
    ``/goal`` state."""
    etype = ev.get("type")
    if etype == "tool_progress":
        return "tool.progress", {"tool_call_id": _s(ev.get("tool_use_id")), "name": None, "elapsed_s": None}
    if etype == "goal_state":
        goal = _d(ev.get("goal_state"))
        return "agent.status", {"event": "goal_state", "activity": _s(goal.get("activity"))}
    return None


def notice_text(obj: dict[str, Any]) -> str | None:
    """The human text of an informational line, wherever this line type keeps it."""
    for key in ("content", "text", "message", "summary", "suggestion", "error"):
        text = _s(obj.get(key))
        if text:
            return text
    err = _d(obj.get("error"))
    data = _d(obj.get("data"))
    text = _s(err.get("formatted")) or _s(err.get("message")) or _s(data.get("notice"))
    if text:
        return text
    if obj.get("subtype") == "model_fallback" and data:  # qwen: {fromModel, toModel, …}
        return f"falling back from {_s(data.get('fromModel'))} to {_s(data.get('toModel'))}"
    return None


def notice(code: str, obj: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = {"code": code, "text": notice_text(obj)}
    level = _s(obj.get("level")) or _s(obj.get("priority"))
    if level is not None:
        data["level"] = level
    if code == "permission_denied":
        data["tool"] = _s(obj.get("tool_name"))
        data["tool_call_id"] = _s(obj.get("tool_use_id"))
    return data


def _status(obj: dict[str, Any]) -> dict[str, Any]:
    st = obj.get("status")
    data: dict[str, Any] = {"status": st if isinstance(st, str) else None}
    mode = _s(obj.get("permissionMode")) or _s(obj.get("permission_mode"))
    if mode is not None:
        data["permission_mode"] = mode
    return data


def _compacted(obj: dict[str, Any]) -> dict[str, Any]:
    meta = _d(obj.get("compact_metadata"))
    return {
        "trigger": _s(meta.get("trigger")),
        "pre_tokens": _num(meta.get("pre_tokens")),
        "post_tokens": _num(meta.get("post_tokens")),
    }


def _retrying(obj: dict[str, Any]) -> dict[str, Any]:
    # Claude Code's api_retry, and Qwen Code's retry (its fields in ``data``, camelCase)
    src = _d(obj.get("data")) if obj.get("subtype") == "retry" else obj
    return {
        "status": "retrying",
        "attempt": _num(src.get("attempt")),
        "max_retries": _num(src.get("max_retries", src.get("maxRetries"))),
        "retry_delay_ms": _num(src.get("retry_delay_ms", src.get("delayMs"))),
        "error_status": _num(src.get("error_status")),
        "error": _s(src.get("error")),
    }


_STATUS_FIELDS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "status": _status,
    "session_state_changed": lambda obj: {"state": _s(obj.get("state"))},
    "compact_boundary": _compacted,
    "api_retry": _retrying,
    "retry": _retrying,
    "worker_shutting_down": lambda obj: {"status": "shutting_down"},
}


def system_status(sub: str, obj: dict[str, Any]) -> dict[str, Any] | None:
    """``agent.status`` data for a ``system`` line, or None when the subtype is not one."""
    fields = _STATUS_FIELDS.get(sub)
    if fields is not None:
        return {"event": sub, **fields(obj)}
    return {"event": sub} if sub in QUIET_SYSTEM else None


def toplevel(typ: str, obj: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The kind and data of a known top-level type outside the conversation."""
    if typ in NOTICE_TOPLEVEL:
        return "notice", notice(typ, obj)
    if typ not in QUIET_TOPLEVEL:
        return None
    data: dict[str, Any] = {"event": typ}
    if typ == "auth_status":
        data["authenticating"] = obj.get("isAuthenticating") is True
        if _s(obj.get("error")):
            data["error"] = obj["error"]
    return "agent.status", data


def result_error(obj: dict[str, Any], sub: str) -> tuple[str, list[str]]:
    """What an error ``result`` says went wrong, for users — Qwen Code's
    ``error.message``, else the ``errors``, else the result text, else what the subtype
    means — and the CLI's internal diagnostics it also carried (``[ede_diagnostic] …``),
    which are not for them."""
    public, internal = _errors(obj)
    err = _s(_d(obj.get("error")).get("message")) or public or _s(obj.get("result"))
    return err or RESULT_ERRORS.get(sub) or sub or "error", internal


def _errors(obj: dict[str, Any]) -> tuple[str, list[str]]:
    raw_errors = obj.get("errors")
    errors = [e for e in raw_errors if isinstance(e, str)] if isinstance(raw_errors, list) else []
    internal = [e for e in errors if e.startswith(INTERNAL_ERROR_PREFIX)]
    return "; ".join(e for e in errors if not e.startswith(INTERNAL_ERROR_PREFIX)), internal


def user_message(obj: dict[str, Any], content: Any) -> dict[str, Any] | None:
    """``message`` data (``role: "user"``, source agent) for a ``user`` line that is not a
    tool result: the CLI's replay of a prompt, its interrupt marker, or a prompt it made
    itself (a sub-agent's, a task notification); ``origin`` says which."""
    if isinstance(content, str):
        texts = [content]
    else:
        texts = [b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)]
    if not texts:
        return None
    text = "".join(texts)
    if obj.get("isReplay"):
        origin = "replay"
    elif text.startswith(INTERRUPT_MARKER):
        origin = "interrupt"
    else:
        origin = "agent"
    data: dict[str, Any] = {"role": "user", "text": text, "origin": origin}
    if _s(obj.get("parent_tool_use_id")):
        data["parent_tool_use_id"] = obj["parent_tool_use_id"]
    return data


def result_usage(obj: dict[str, Any], spent: float) -> tuple[dict[str, Any] | None, float]:
    """A result line's ``usage`` for its ``turn.ended`` (docs/api.md §6.3), and the running
    total to remember: the CLI's own ``usage`` as it gave it, with ``cost`` and
    ``session_cost`` when the line gives ``total_cost_usd``, in the shape ACP's turns have.
    Claude Code gives what the process has spent so far, so the turn's own cost is what that
    grew by since ``spent`` (the total when the process's previous turn ended; a resumed
    process counts from zero again). Without a usable total, ``spent`` stays."""
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    total = obj.get("total_cost_usd")
    if isinstance(total, bool) or not isinstance(total, (int, float)) or not 0 <= total < float("inf"):
        return usage, spent
    share = total - spent if total >= spent else total
    cost = {"amount": round(share, 10), "currency": "USD"}
    return {**(usage or {}), "cost": cost, "session_cost": {"amount": float(total), "currency": "USD"}}, float(total)
