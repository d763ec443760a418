"""The ACP gateway's mapping (sessions/acp_session.py), in process: records in, ACP
payloads out, each validated against the official SDK's schema models."""

from __future__ import annotations

import json
from typing import Any

import pytest
from acp import schema

from bridge.errors import InvalidRequest
from bridge.protocols.events import Record
from bridge.sessions import acp_session as m


def rec(kind: str, data: dict[str, Any], source: str = "agent", raw: Any = None, seq: int = 1) -> Record:
    return Record(seq, "2026-12-01T00:00:00.000Z", source, kind, data, None if raw is None else json.dumps(raw), True)


def valid(update: dict[str, Any]) -> dict[str, Any]:
    schema.SessionNotification.model_validate({"sessionId": "thr_x", "update": update})
    return update


def test_streamed_deltas_are_sent_and_the_whole_message_after_them_is_not() -> None:
    mapper = m.UpdateMapper()
    out = mapper.updates(rec("message.delta", {"text": "Hel", "channel": "text"}), own_prompt=False)
    out += mapper.updates(rec("message.delta", {"text": "lo", "channel": "text"}), own_prompt=False)
    out += mapper.updates(rec("message", {"role": "assistant", "text": "Hello"}), own_prompt=False)
    assert [valid(u)["content"]["text"] for u in out] == ["Hel", "lo"]
    # The next message was not streamed: it is sent whole.
    (whole,) = mapper.updates(rec("message", {"role": "assistant", "text": "Bye"}), own_prompt=False)
    assert valid(whole) == {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "Bye"}}


def test_thoughts_user_prompts_and_the_clis_own_user_lines() -> None:
    mapper = m.UpdateMapper()
    (thought,) = mapper.updates(
        rec("message", {"role": "assistant", "text": "hmm", "channel": "thought"}), own_prompt=False
    )
    assert valid(thought)["sessionUpdate"] == "agent_thought_chunk"
    prompt = rec("message", {"role": "user", "text": "hi", "turn_id": "turn_1"}, source="client")
    (user,) = mapper.updates(prompt, own_prompt=False)
    assert valid(user) == {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "hi"}}
    assert mapper.updates(prompt, own_prompt=True) == []
    assert mapper.updates(rec("message", {"role": "user", "text": "x", "origin": "replay"}), own_prompt=False) == []


def test_tool_calls_their_updates_and_results() -> None:
    mapper = m.UpdateMapper()
    (call,) = mapper.updates(
        rec("tool.call", {"tool_call_id": "t1", "name": "Read", "input": {"file_path": "/a"}}), own_prompt=False
    )
    assert valid(call) == {
        "sessionUpdate": "tool_call",
        "toolCallId": "t1",
        "title": "Read",
        "kind": "read",
        "status": "pending",
        "rawInput": {"file_path": "/a"},
    }
    acp_call = {"tool_call_id": "t2", "name": None, "title": "Edit a", "kind": "edit", "status": "in_progress"}
    assert valid(mapper.updates(rec("tool.call", acp_call), own_prompt=False)[0])["title"] == "Edit a"
    (patch,) = mapper.updates(
        rec("tool.call", {"tool_call_id": "t2", "update": True, "status": "bogus"}), own_prompt=False
    )
    assert valid(patch) == {"sessionUpdate": "tool_call_update", "toolCallId": "t2"}
    blocks = [{"type": "text", "text": "line 1"}, {"type": "text", "text": "line 2"}]
    (result,) = mapper.updates(
        rec("tool.result", {"tool_call_id": "t1", "output": blocks, "is_error": True}), own_prompt=False
    )
    assert valid(result)["status"] == "failed" and result["content"][0]["content"]["text"] == "line 1\nline 2"
    assert mapper.updates(rec("tool.call", {"tool_call_id": None}), own_prompt=False) == []


def test_plans_modes_and_slash_commands() -> None:
    mapper = m.UpdateMapper()
    entries = [{"content": "a", "priority": "high", "status": "pending"}, {"content": 3, "priority": "x"}]
    (plan,) = mapper.updates(rec("plan", {"entries": entries}), own_prompt=False)
    assert valid(plan)["entries"] == entries[:1]
    (mode,) = mapper.updates(rec("agent.status", {"status": "mode_changed", "mode": "plan"}), own_prompt=False)
    assert valid(mode) == {"sessionUpdate": "current_mode_update", "currentModeId": "plan"}
    init = {"type": "system", "subtype": "init", "slash_commands": ["compact", "/review", 7]}
    (cmds,) = mapper.updates(rec("session.started", {"native_session_id": "s"}, raw=init), own_prompt=False)
    assert [c["name"] for c in valid(cmds)["availableCommands"]] == ["compact", "review"]
    assert mapper.updates(rec("session.started", {}, raw={"type": "x"}), own_prompt=False) == []
    assert mapper.updates(rec("diagnostic", {"text": "x"}), own_prompt=False) == []


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ({"status": "success", "stop_reason": "end_turn"}, "end_turn"),
        ({"status": "success", "stop_reason": "refusal"}, "refusal"),
        ({"status": "success", "stop_reason": "tool_use"}, "end_turn"),
        ({"status": "success", "stop_reason": None, "subtype": "error_max_turns"}, "max_turn_requests"),
        ({"status": "cancelled", "reason": "interrupted"}, "cancelled"),
        ({"status": "error", "error": "boom"}, None),
    ],
)
def test_stop_reasons(data: dict[str, Any], reason: str | None) -> None:
    assert m.stop_reason(data) == reason
    if reason is not None:
        schema.PromptResponse.model_validate({"stopReason": reason})


def test_permission_requests_and_answers_without_options() -> None:
    data = {"request_id": "r1", "tool": "Bash", "input": {"command": "ls"}, "options": [], "tool_call_id": "toolu_1"}
    params = m.permission_request("thr_x", data)
    schema.RequestPermissionRequest.model_validate(params)
    assert params["toolCall"] == {
        "toolCallId": "toolu_1",
        "title": "Bash",
        "status": "pending",
        "kind": "execute",
        "rawInput": {"command": "ls"},
    }
    assert m.permission_answer(data, {"outcome": {"outcome": "selected", "optionId": "allow"}}) == ("allow", None)
    assert m.permission_answer(data, {"outcome": {"outcome": "selected", "optionId": "deny"}}) == ("deny", None)
    assert m.permission_answer(data, {"outcome": {"outcome": "cancelled"}}) == ("deny", None)
    assert m.permission_answer(data, {"outcome": {"outcome": "selected", "optionId": "other"}}) is None
    assert m.permission_answer(data, "garbage") is None


def test_an_acp_agents_own_options_are_offered_and_answered_by_id() -> None:
    opts = [
        {"optionId": "yes", "name": "Yes", "kind": "allow_always"},
        {"optionId": "no", "name": "No", "kind": "reject_once"},
        {"optionId": "bad", "name": "Bad", "kind": "maybe"},
    ]
    data = {"request_id": "r1", "tool": "edit", "title": "Edit x", "input": None, "options": opts}
    params = m.permission_request("thr_x", data)
    schema.RequestPermissionRequest.model_validate(params)
    assert [o["optionId"] for o in params["options"]] == ["yes", "no"]
    assert params["toolCall"]["title"] == "Edit x" and params["toolCall"]["toolCallId"] == "r1"
    assert m.permission_answer(data, {"outcome": {"outcome": "selected", "optionId": "yes"}}) == ("allow", "yes")
    assert m.permission_answer(data, {"outcome": {"outcome": "selected", "optionId": "no"}}) == ("deny", "no")


def test_prompt_blocks() -> None:
    blocks = m.prompt_blocks(
        [
            {"type": "text", "text": "look"},
            {"type": "image", "data": "aGk=", "mimeType": "image/png"},
            {"type": "resource_link", "uri": "file:///a.py", "name": "a.py"},
            {"type": "resource", "resource": {"uri": "file:///b.txt", "text": "hi"}},
        ]
    )
    assert blocks == [
        {"type": "text", "text": "look"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}},
        {"type": "text", "text": "[a.py](file:///a.py)"},
        {"type": "document", "source": {"type": "base64", "media_type": "text/plain", "data": "aGk="}},
    ]
    for bad in ([], None, [{"type": "audio", "data": "aGk=", "mimeType": "audio/wav"}], ["x"]):
        with pytest.raises(InvalidRequest):
            m.prompt_blocks(bad)
