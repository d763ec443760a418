"""protocols/forking.py: which agents fork how, a chain entry's uuid read from an agent's
line (untrusted), the fork's arguments, and the native fork a fork's row keeps."""

from __future__ import annotations

import json

import pytest

from bridge.protocols.forking import NativeFork, chain_entry, fork_argv, fork_way, pending_fork

UUID = "0b7c3a52-9d1e-4f60-8a2b-3c4d5e6f7a8b"
CLAUDE = "/home/u/.npm/node_modules/@anthropic-ai/claude-code/cli.js"


def test_each_dialect_forks_its_own_way_or_not_at_all() -> None:
    assert fork_way("stream-json", "/usr/bin/claude", [], None) == fork_way("stream-json", "node", [CLAUDE], None)
    assert fork_way("stream-json", "/usr/bin/claude", [], None).earlier
    assert fork_way("stream-json", "/usr/bin/python3", ["agent.py"], None).how == "argv"  # Claude Code's flags
    assert not fork_way("stream-json", "/usr/bin/qwen", [], None).able
    assert not fork_way("stream-json", "/usr/bin/codebuddy", [], None).able
    assert not fork_way("awp-jsonl", "/usr/bin/claude", [], None).able
    offered = {"capabilities": {"sessionCapabilities": {"fork": {}, "resume": {}}}}
    way = fork_way("acp", "/usr/bin/agent", [], offered)
    assert way.how == "handshake" and not way.earlier
    for info in (None, {}, {"capabilities": {"sessionCapabilities": {"fork": True}}}, {"capabilities": []}):
        assert not fork_way("acp", "/usr/bin/agent", [], info).able, info


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ({"type": "assistant", "uuid": UUID, "message": {}}, UUID),
        ({"type": "user", "uuid": UUID}, UUID),
        ({"type": "result", "uuid": UUID}, None),  # not an entry of the session's chain
        ({"type": "system", "subtype": "init", "uuid": UUID}, None),
        ({"type": "assistant", "uuid": "--fork-session"}, None),
        ({"type": "assistant", "uuid": UUID.upper()}, None),
        ({"type": "assistant", "uuid": 7}, None),
        ({"type": "assistant"}, None),
    ],
)
def test_a_chain_entry_is_an_assistant_or_user_line_with_a_well_formed_uuid(line: object, expected: str) -> None:
    assert chain_entry("stream-json", json.dumps(line)) == expected


def test_other_lines_and_dialects_have_no_chain_entries() -> None:
    line = json.dumps({"type": "assistant", "uuid": UUID})
    assert chain_entry("acp", line) is None and chain_entry("awp-jsonl", line) is None
    for raw in (None, "", '{"uuid": ', '["uuid"]', '{"type":"assistant","uuid":"' + UUID + '"'):
        assert chain_entry("stream-json", raw) is None


def test_the_fork_arguments_are_one_argument_each_and_only_a_uuid_is_passed() -> None:
    assert fork_argv("stream-json", None) == ["--fork-session"]
    assert fork_argv("stream-json", UUID) == ["--fork-session", f"--resume-session-at={UUID}"]
    assert fork_argv("acp", UUID) == []
    with pytest.raises(ValueError):
        fork_argv("stream-json", "x --dangerously-skip-permissions")


def test_a_pending_fork_holds_only_while_the_thread_resumes_its_sources_session() -> None:
    row = {"thread": "thr_a", "seq": 9, **NativeFork("src", UUID).stored()}
    assert pending_fork(row, "src") == NativeFork("src", UUID)
    assert pending_fork(row, "its-own") is None  # the agent reported the fork's own session
    assert pending_fork(row, None) is None
    assert pending_fork({"thread": "thr_a", "seq": 9}, "src") is None
    assert pending_fork({**row, "at": None}, "src") == NativeFork("src", None)
    assert pending_fork({**row, "at": "not-a-uuid"}, "src") is None
    assert pending_fork("garbage", "src") is None
    with pytest.raises(ValueError):  # never a fork that would become a plain resume
        NativeFork("src", "--x")
