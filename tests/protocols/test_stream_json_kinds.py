"""Every stream-json line a real CLI prints maps to a normalized kind (issue #17 item 5).

Real lines come from tests/fixtures/stream-json/real-lines.jsonl (Claude Code 2.1.197 and
Qwen Code 0.24.4 through tests/real) and the Claude Code transcripts in
tests/fixtures/transcripts; the table below holds the shapes the CLIs can print but the
fake model APIs never made them print (from the stream-json contract, Claude Code's
bundled output schemas and agent SDK types, and Qwen Code's output adapter). Only what
is truly unknown is ``agent.other`` (docs/api.md §7.1). In-process, no boundary crossed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bridge.protocols.codec import Decoded
from bridge.protocols.codecs import make_codec
from bridge.protocols.events import KINDS, Record
from bridge.protocols.stream_json import StreamJsonCodec
from bridge.sessions.actions import Emit, Limits
from bridge.sessions.core import ConversationCore

pytestmark = pytest.mark.timeout(30)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
REAL = [json.loads(line) for line in (FIXTURES / "stream-json" / "real-lines.jsonl").read_text().splitlines()]
TRANSCRIPT_LINES = [
    {"cli": f"claude-code 2.1.197 ({path.name})", "line": rec["line"]}
    for path in sorted((FIXTURES / "transcripts" / "claude-code-2.1.197").glob("*.transcript.jsonl"))
    for rec in map(json.loads, path.read_text().splitlines())
    if rec.get("dir") == "<"
]


def shape(line: str) -> str:
    obj = json.loads(line)
    parts = [str(obj.get("type"))]
    if obj.get("type") in ("system", "result"):
        parts.append(str(obj.get("subtype")))
    if obj.get("type") == "stream_event":
        parts.append(str((obj.get("event") or {}).get("type")))
    return "/".join(parts)


def decode(line: str) -> Decoded:
    return StreamJsonCodec().decode(line.encode())


def test_the_fixture_holds_both_clis_and_the_lines_of_a_turn() -> None:
    clis = {r["cli"] for r in REAL}
    assert clis == {"claude-code 2.1.197", "qwen-code 0.24.4"}
    for cli in clis:
        shapes = {shape(r["line"]) for r in REAL if r["cli"] == cli}
        for needed in ("system/init", "stream_event/message_start", "stream_event/message_stop", "result/success"):
            assert needed in shapes, (cli, needed)
        assert "result/error_during_execution" in shapes, cli  # the interrupt


@pytest.mark.parametrize(
    "rec",
    REAL + TRANSCRIPT_LINES,
    ids=[f"{r['cli']}:{i}:{shape(r['line'])}" for i, r in enumerate(REAL + TRANSCRIPT_LINES)],
)
def test_every_real_line_maps_to_a_normalized_kind(rec: dict[str, str]) -> None:
    decoded = decode(rec["line"])
    kinds = [e.kind for e in decoded.events]
    assert kinds and "agent.other" not in kinds, (kinds, rec["line"][:300])
    assert set(kinds) <= KINDS
    # the fast path and the generic one agree (stream_event lines take the fast one)
    slow = StreamJsonCodec()._decode_slow(rec["line"].encode())
    assert [(e.kind, e.data, e.relay) for e in decoded.events] == [(e.kind, e.data, e.relay) for e in slow.events]


def line(**obj: Any) -> str:
    return json.dumps(obj)


def system(subtype: str, **fields: Any) -> str:
    return line(type="system", subtype=subtype, **{"uuid": "u1", "session_id": "s1", **fields})


def stream(**event: Any) -> str:
    return line(type="stream_event", event=event, session_id="s1", parent_tool_use_id=None, uuid="u1")


# The shapes the real CLIs can print that the fakes never made them print: line → (kind, data).
TABLE: list[tuple[str, str, dict[str, Any]]] = [
    (
        system("compact_boundary", compact_metadata={"trigger": "auto", "pre_tokens": 180000, "post_tokens": 12000}),
        "agent.status",
        {"event": "compact_boundary", "trigger": "auto", "pre_tokens": 180000, "post_tokens": 12000},
    ),
    (
        system("status", status="compacting", permissionMode="plan"),
        "agent.status",
        {"event": "status", "status": "compacting", "permission_mode": "plan"},
    ),
    (
        system("status", status=None, permissionMode="default"),
        "agent.status",
        {"event": "status", "status": None, "permission_mode": "default"},
    ),
    (system("hook_progress", hook_id="h", hook_name="n", hook_event="PreToolUse", stdout="x"), "hook", None),
    (system("worker_shutting_down"), "agent.status", {"event": "worker_shutting_down", "status": "shutting_down"}),
    (system("thinking_tokens", estimated_tokens=10, estimated_tokens_delta=2), "agent.status", None),
    (system("commands_changed", commands=[]), "agent.status", {"event": "commands_changed"}),
    (system("background_tasks_changed", tasks=[]), "agent.status", {"event": "background_tasks_changed"}),
    (system("files_persisted", files=[], failed=[]), "agent.status", {"event": "files_persisted"}),
    (system("plugin_install", status="installed", name="p"), "agent.status", {"event": "plugin_install"}),
    (system("elicitation_complete", elicitation_id="e"), "agent.status", None),
    (system("memory_recall", mode="select", memories=[]), "agent.status", None),
    (system("turn_duration", duration_ms=5), "agent.status", None),
    (
        system("informational", content="Context low", level="warning"),
        "notice",
        {"code": "informational", "text": "Context low", "level": "warning"},
    ),
    (
        system("notification", key="k", text="Update available", priority="low"),
        "notice",
        {"code": "notification", "text": "Update available", "level": "low"},
    ),
    (
        system("local_command_output", content="<local-command-stdout>ok</local-command-stdout>"),
        "notice",
        {"code": "local_command_output", "text": "<local-command-stdout>ok</local-command-stdout>"},
    ),
    (
        system(
            "permission_denied", tool_name="Bash", tool_use_id="toolu_1", message="Bash is not allowed in dontAsk mode"
        ),
        "notice",
        {
            "code": "permission_denied",
            "text": "Bash is not allowed in dontAsk mode",
            "tool": "Bash",
            "tool_call_id": "toolu_1",
        },
    ),
    (
        system("model_refusal_fallback", trigger="refusal", content="Retrying with another model"),
        "notice",
        {"code": "model_refusal_fallback", "text": "Retrying with another model"},
    ),
    (
        system("api_error", error={"message": "boom", "formatted": "API Error: boom"}),
        "notice",
        {"code": "api_error", "text": "API Error: boom"},
    ),
    (
        system("session_writes_lost", error_code="ENOSPC", lost=[]),
        "notice",
        {"code": "session_writes_lost", "text": None},
    ),
    (system("mirror_error", error="store down"), "notice", {"code": "mirror_error", "text": "store down"}),
    # Qwen Code 0.24.4's own system subtypes (BaseJsonOutputAdapter.emitSystemMessage)
    (
        system("retry", data={"reason": "retry", "attempt": 2, "maxRetries": 5, "delayMs": 1000}),
        "agent.status",
        {
            "event": "retry",
            "status": "retrying",
            "attempt": 2,
            "max_retries": 5,
            "retry_delay_ms": 1000,
            "error_status": None,
            "error": None,
        },
    ),
    (
        system("model_fallback", data={"fromModel": "a", "toModel": "b", "statusCode": 429}),
        "notice",
        {"code": "model_fallback", "text": "falling back from a to b"},
    ),
    (
        system("vision_bridge_failed", data={"notice": "Vision bridge failed; proceeding without the image(s)."}),
        "notice",
        {"code": "vision_bridge_failed", "text": "Vision bridge failed; proceeding without the image(s)."},
    ),
    (system("session_end", data={"session_id": "s1"}), "agent.status", {"event": "session_end"}),
    (system("session_start", session_id="q1", model="qwen3"), "session.started", None),
    # top-level types besides the conversation
    (line(type="keep_alive"), "agent.status", {"event": "keep_alive"}),
    (
        line(type="auth_status", isAuthenticating=True, output=[], uuid="u", session_id="s"),
        "agent.status",
        {"event": "auth_status", "authenticating": True},
    ),
    (
        line(type="tool_use_summary", summary="Read 3 files", preceding_tool_use_ids=["t1"]),
        "notice",
        {"code": "tool_use_summary", "text": "Read 3 files"},
    ),
    (
        line(type="prompt_suggestion", suggestion="Run the tests"),
        "notice",
        {"code": "prompt_suggestion", "text": "Run the tests"},
    ),
    (line(type="conversation_reset", new_conversation_id="c2"), "agent.status", {"event": "conversation_reset"}),
    (line(type="tombstone", message={}), "agent.status", {"event": "tombstone"}),
    (line(type="command_lifecycle", command_uuid="c", state="started"), "agent.status", None),
    (line(type="active_goal", value=None), "agent.status", None),
    (
        line(type="tool_progress", tool_use_id="toolu_1", tool_name="Bash", elapsed_time_seconds=2.5),
        "tool.progress",
        {"tool_call_id": "toolu_1", "name": "Bash", "elapsed_s": 2.5},
    ),
    # the Messages API stream
    (
        stream(type="content_block_start", index=1, content_block={"type": "tool_use", "id": "t1", "name": "Bash"}),
        "message.stream",
        {"event": "content_block_start", "block_type": "tool_use", "tool_call_id": "t1", "name": "Bash"},
    ),
    (
        stream(type="content_block_delta", index=0, delta={"type": "signature_delta", "signature": "x"}),
        "message.stream",
        {"event": "content_block_delta", "delta_type": "signature_delta"},
    ),
    (
        stream(type="content_block_delta", index=0, delta={"type": "citations_delta", "citation": {}}),
        "message.stream",
        {"event": "content_block_delta", "delta_type": "citations_delta"},
    ),
    (stream(type="ping"), "message.stream", {"event": "ping"}),
    (
        stream(type="error", error={"type": "overloaded_error", "message": "Overloaded"}),
        "message.stream",
        {"event": "error", "error": "Overloaded"},
    ),
    # Qwen Code's own stream events
    (
        stream(type="tool_progress", tool_use_id="call_1", content={"progress": 1}),
        "tool.progress",
        {"tool_call_id": "call_1", "name": None, "elapsed_s": None},
    ),
    (
        stream(type="goal_state", goal_state={"v": 2, "goal": None, "activity": "idle"}),
        "agent.status",
        {"event": "goal_state", "activity": "idle"},
    ),
    # results: every subtype ends the turn
    (
        line(type="result", subtype="error_max_budget_usd", is_error=True, errors=[]),
        "turn.ended",
        {
            "status": "error",
            "stop_reason": None,
            "error": "the maximum budget was reached",
            "subtype": "error_max_budget_usd",
        },
    ),
    (
        line(type="result", subtype="error_max_structured_output_retries", is_error=True),
        "turn.ended",
        None,
    ),
    (
        line(type="result", subtype="error_max_turns", is_error=True, error={"message": "Max turns reached"}),
        "turn.ended",
        {"status": "error", "stop_reason": None, "error": "Max turns reached", "subtype": "error_max_turns"},
    ),
    # user lines that are not tool results
    (
        line(type="user", message={"role": "user", "content": "hi"}, isReplay=True),
        "message",
        {"role": "user", "text": "hi", "origin": "replay"},
    ),
    (
        line(
            type="user",
            message={"role": "user", "content": [{"type": "text", "text": "SUBTASK: go"}]},
            parent_tool_use_id="toolu_9",
        ),
        "message",
        {"role": "user", "text": "SUBTASK: go", "origin": "agent", "parent_tool_use_id": "toolu_9"},
    ),
]


@pytest.mark.parametrize(("text", "kind", "data"), TABLE, ids=[f"{i}:{shape(t[0])}" for i, t in enumerate(TABLE)])
def test_each_known_shape_maps_to_its_kind(text: str, kind: str, data: dict[str, Any] | None) -> None:
    decoded = decode(text)
    [ev] = decoded.events
    assert ev.kind == kind and ev.relay and ev.raw == text and decoded.replies == []
    if data is not None:
        assert ev.data == data


@pytest.mark.parametrize(
    "text",
    [
        system("something_new", x=1),
        line(type="brand_new_type"),
        stream(type="new_stream_event"),
        line(type="user", message={"role": "user", "content": [{"type": "image", "source": {}}]}),
    ],
)
def test_what_is_truly_unknown_stays_agent_other(text: str) -> None:
    [ev] = decode(text).events
    assert (ev.kind, ev.data, ev.relay, ev.raw) == ("agent.other", {}, True, text)


def test_a_hostile_stream_event_type_is_agent_other_and_never_raises() -> None:
    for text in (stream(type=["x"]), stream(type={"a": 1}), stream(type=None), line(type="stream_event", event=[1])):
        [ev] = decode(text).events
        assert ev.kind == "agent.other"


# ---------------------------------------------------------------- the interrupted turn


def real_line(cli: str, pred: Any) -> str:
    for rec in REAL:
        if rec["cli"].startswith(cli) and pred(json.loads(rec["line"])):
            return str(rec["line"])
    raise AssertionError(f"no {cli} line matches")


def interrupted_result(cli: str) -> str:
    return real_line(cli, lambda o: o.get("type") == "result" and o.get("subtype") == "error_during_execution")


def test_claude_codes_interrupted_result_reads_as_interrupted() -> None:
    text = interrupted_result("claude-code")
    assert "[ede_diagnostic]" in text  # what 2.1.197 really says
    diag, end = decode(text).events
    assert end.kind == "turn.ended"
    assert (end.data["status"], end.data["reason"]) == ("cancelled", "interrupted")
    assert "error" not in end.data and "ede_diagnostic" not in json.dumps(end.data)
    assert end.data["terminal_reason"] == "aborted_streaming"
    # the raw detail is kept: in the diagnostic, and in both events' raw line
    assert diag.kind == "diagnostic" and diag.data["stream"] == "protocol"
    assert diag.data["text"] == json.loads(text)["errors"][0]
    assert diag.raw == end.raw == text and diag.relay and not end.relay


def collect(core: ConversationCore, actions: list[Any]) -> list[Record]:
    out: list[Record] = []
    todo = list(actions)
    while todo:
        a = todo.pop(0)
        if isinstance(a, Emit):
            records = [
                Record(core.last_seq + i + 1, "t", e.source, e.kind, e.data, e.raw, e.relay)
                for i, e in enumerate(a.events)
            ]
            core.last_seq += len(records)
            out += records
            if a.committed:
                todo[0:0] = a.committed(records)
    return out


@pytest.mark.parametrize("cli", ["claude-code", "qwen-code"])
def test_an_interrupted_turn_ends_as_interrupted_in_the_transcript(cli: str) -> None:
    # Qwen Code's result says "Operation cancelled." with no terminal_reason: the
    # conversation, which knows it interrupted, makes it read the same way.
    core = ConversationCore(
        last_seq=0,
        native_session_id=None,
        options={},
        limits=Limits(max_pending_prompts=1, interrupt_timeout_s=2, permission_timeout_s=5),
        clock=lambda: 100.0,
    )
    core.process_started(make_codec("stream-json"), 1, 1, None)
    collect(core, core.prompt([{"type": "text", "text": "slow"}], None)[1])
    collect(core, core.interrupt()[1])
    text = interrupted_result(cli)
    codec = core.codec
    assert codec is not None
    records = collect(core, core.agent_output([codec.decode(text.encode())]))
    diag, end = records
    assert end.kind == "turn.ended" and end.data["turn_id"]
    assert (end.data["status"], end.data["reason"], "error" in end.data) == ("cancelled", "interrupted", False)
    said = json.loads(text).get("errors") or [json.loads(text)["error"]["message"]]
    assert diag.kind == "diagnostic" and diag.data["text"] == said[0] and diag.raw == text
    assert core.active is None
