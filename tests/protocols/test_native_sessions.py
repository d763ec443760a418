"""Agents' own session stores, read without I/O (bridge/protocols/native_sessions.py and
session_list.py). The fixture files are session files the real CLIs wrote (Claude Code
2.1.197, Qwen Code 0.24.4, run offline against the tests/real fakes; the cwd replaced by
/home/user/project)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge.protocols.jsonline import dumps
from bridge.protocols.native_sessions import (
    MAX_TITLE,
    BadCursor,
    claude_project_dir,
    claude_title,
    iso_from_ns,
    page,
    parse_acp_cursor,
    qwen_project_dir,
    qwen_title,
    store_of,
)
from bridge.protocols.session_list import AcpLister

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "native_sessions"
CLAUDE_FILE = (FIXTURES / "claude-code-2.1.197.jsonl").read_bytes()
QWEN_FILE = (FIXTURES / "qwen-code-0.24.4.jsonl").read_bytes()


def lines(*objs: object) -> bytes:
    return b"".join(json.dumps(o).encode() + b"\n" for o in objs)


# ------------------------------------------------------------------ where


@pytest.mark.parametrize(
    ("cwd", "name"),
    [
        # What Claude Code 2.1.197 itself created for these directories.
        ("/tmp/adopt-probe/my work.dir_x", "-tmp-adopt-probe-my-work-dir-x"),
        (
            "/tmp/adopt-probe/é😀x" + "/".join(["d" * 60] * 4),
            "-tmp-adopt-probe----x" + "-".join(["d" * 60] * 3)[: 200 - len("-tmp-adopt-probe----x")] + "-w9rahs",
        ),
    ],
)
def test_claude_project_dir_is_the_name_the_real_cli_gives(cwd: str, name: str) -> None:
    assert claude_project_dir(cwd) == name


def test_qwen_project_dir_is_the_name_the_real_cli_gives_and_is_never_hashed() -> None:
    assert qwen_project_dir("/tmp/adopt-probe/q work.dir_x") == "-tmp-adopt-probe-q-work-dir-x"
    long = "/" + "x" * 300
    assert qwen_project_dir(long) == "-" + "x" * 300


@pytest.mark.parametrize(
    ("protocol", "executable", "args", "store"),
    [
        ("stream-json", "/opt/npm/node_modules/@anthropic-ai/claude-code-linux-x64/claude", [], "claude-code"),
        ("stream-json", "/usr/local/bin/claude", [], "claude-code"),
        ("stream-json", "/usr/bin/node", ["/opt/npm/node_modules/@qwen-code/qwen-code/cli-entry.js"], "qwen-code"),
        ("stream-json", "/usr/bin/codebuddy", [], None),
        ("stream-json", "/usr/bin/python3", ["-I", "fake_agent.py"], None),
        ("awp-jsonl", "/usr/local/bin/claude", [], None),
        ("acp", "/usr/bin/node", ["/x/claude-agent-acp/dist/index.js"], "acp"),
    ],
)
def test_store_of_names_the_store_each_agent_keeps(
    protocol: str, executable: str, args: list[str], store: str | None
) -> None:
    assert store_of(protocol, executable, args) == store


# ------------------------------------------------------------------ what


def test_a_real_claude_session_file_is_titled_by_its_first_prompt() -> None:
    assert claude_title(CLAUDE_FILE, b"", tail_is_whole=True) == "CHAT remember the word PINEAPPLE"


def test_a_claude_custom_title_beats_an_ai_title_beats_the_first_prompt() -> None:
    ai = {"type": "ai-title", "aiTitle": "Fruit talk", "sessionId": "s"}
    custom = {"type": "custom-title", "customTitle": "My  fruit\nsession", "sessionId": "s"}
    assert claude_title(CLAUDE_FILE, b"\n" + lines(ai)) == "Fruit talk"
    assert claude_title(CLAUDE_FILE, b"}\n" + lines(custom, ai)) == "My fruit session"  # one line, spaces folded
    # The newest title line wins (the CLI appends a new one on rename).
    renamed = {"type": "custom-title", "customTitle": "Renamed", "sessionId": "s"}
    assert claude_title(lines(custom), b"\n" + lines(renamed)) == "Renamed"


def test_claude_lines_that_are_not_typed_prompts_are_passed_over() -> None:
    head = lines(
        {"type": "queue-operation", "content": "not a prompt line"},
        {"type": "user", "isMeta": True, "message": {"content": "meta"}},
        {"type": "user", "message": {"content": "<command-name>/clear</command-name>"}},
        {"type": "user", "message": {"content": [{"type": "tool_result", "content": "x"}]}},
        {"type": "user", "isCompactSummary": True, "message": {"content": "summary"}},
        {"type": "user", "message": {"content": [{"type": "image"}, {"type": "text", "text": "fix the bug"}]}},
    )
    assert claude_title(b"not json\n" + head, b"") == "fix the bug"


def test_a_cut_line_at_either_window_edge_is_not_read() -> None:
    whole = lines({"type": "user", "message": {"content": "first"}})
    cut = lines({"type": "user", "message": {"content": "cut off"}})[:-10]
    assert claude_title(cut, b"") is None
    assert claude_title(cut + b"\n" + whole, b"") == "first"
    tail = b'{"type":"custom-title","customTitle":"half"}\n' + lines({"type": "ai-title", "aiTitle": "whole"})
    assert claude_title(whole, tail) == "whole"  # the window's first line may be cut: never read
    assert claude_title(whole, tail, tail_is_whole=True) == "half"


def test_titles_are_bounded() -> None:
    title = claude_title(lines({"type": "user", "message": {"content": "y" * 5000}}), b"")
    assert title == "y" * MAX_TITLE + "…"


def test_a_real_qwen_session_file_is_titled_by_its_first_prompt_or_its_custom_title() -> None:
    assert qwen_title(QWEN_FILE, b"", tail_is_whole=True) == "CHAT remember the word MANGO"
    titled = {"type": "system", "subtype": "custom_title", "systemPayload": {"customTitle": "Mango"}}
    assert qwen_title(QWEN_FILE, b"\n" + lines(titled)) == "Mango"
    shown = {"type": "user", "systemPayload": {"displayText": "/plan it"}, "message": {"parts": [{"text": "x"}]}}
    assert qwen_title(lines(shown), b"") == "/plan it"
    assert qwen_title(lines({"type": "user", "subtype": "notice", "message": {"parts": [{"text": "no"}]}}), b"") is None


def test_last_activity_is_an_iso_utc_time_with_milliseconds() -> None:
    assert iso_from_ns(1_796_132_495_357_123_456) == "2026-12-01T13:41:35.357Z"


# ------------------------------------------------------------------ order and cursor


def test_pages_run_newest_first_with_ties_by_id_and_cover_everything_once() -> None:
    files = [(5, "b"), (9, "z"), (5, "a"), (1, "old"), (9, "y")]
    seen, cursor, pages = [], None, 0
    while True:
        chosen, cursor = page(files, 2, cursor)
        seen += chosen
        pages += 1
        if cursor is None:
            break
    assert seen == [(9, "y"), (9, "z"), (5, "a"), (5, "b"), (1, "old")] and pages == 3
    assert page(files, 5, None)[1] is None  # exactly one full page: no next cursor
    assert page([], 5, None) == ([], None)


@pytest.mark.parametrize("cursor", ["", "x", "t", "t12", "tabc/x", "a1/x", "t" + "9" * 30 + "/x"])
def test_a_cursor_this_listing_never_gave_is_refused(cursor: str) -> None:
    with pytest.raises(BadCursor):
        page([(1, "a")], 5, cursor)


def test_an_acp_cursor_carries_the_agents_own_cursor_and_an_offset() -> None:
    assert parse_acp_cursor("a3/opaque/with/slashes") == ("opaque/with/slashes", 3)
    assert parse_acp_cursor("a0/") == (None, 0)
    with pytest.raises(BadCursor):
        parse_acp_cursor("t1/x")


# ------------------------------------------------------------------ ACP session/list


def answer(rid: int, result: object) -> bytes:
    return dumps({"jsonrpc": "2.0", "id": rid, "result": result}).encode()


def test_acp_listing_initializes_then_lists_for_the_cwd() -> None:
    lister = AcpLister(cwd="/w", cursor="c1", auth_method=None)
    [init] = [json.loads(x) for x in lister.start()]
    assert init["method"] == "initialize" and init["params"]["protocolVersion"] == 1
    caps = {"agentCapabilities": {"sessionCapabilities": {"list": {}}}}
    replies, outcome = lister.feed(answer(init["id"], caps))
    [req] = [json.loads(x) for x in replies]
    assert outcome is None and req["method"] == "session/list" and req["params"] == {"cwd": "/w", "cursor": "c1"}
    sessions = [{"sessionId": "s1", "cwd": "/w"}, "junk"]
    replies, outcome = lister.feed(answer(req["id"], {"sessions": sessions, "nextCursor": "c2"}))
    assert replies == [] and outcome is not None
    assert outcome.sessions == [{"sessionId": "s1", "cwd": "/w"}] and outcome.next_cursor == "c2"


def test_acp_listing_authenticates_first_when_the_profile_says_so() -> None:
    lister = AcpLister(cwd="/w", cursor=None, auth_method="openai")
    lister.start()
    replies, _ = lister.feed(answer(0, {"agentCapabilities": {"sessionCapabilities": {"list": {}}}}))
    assert json.loads(replies[0])["method"] == "authenticate"
    replies, _ = lister.feed(answer(1, {}))
    assert json.loads(replies[0])["params"] == {"cwd": "/w"}


def test_an_agent_that_does_not_advertise_session_list_is_never_asked() -> None:
    lister = AcpLister(cwd="/w", cursor=None, auth_method=None)
    lister.start()
    replies, outcome = lister.feed(answer(0, {"agentCapabilities": {"loadSession": True}}))
    assert replies == [] and outcome is not None and outcome.reason == "not_advertised"


def test_acp_errors_noise_and_requests_from_the_agent() -> None:
    lister = AcpLister(cwd="/w", cursor=None, auth_method=None)
    lister.start()
    assert lister.feed(b"booting...") == ([], None)
    assert lister.feed(answer(77, {})) == ([], None)  # not ours
    replies, outcome = lister.feed(b'{"jsonrpc":"2.0","id":"q","method":"fs/read_text_file","params":{}}')
    assert outcome is None and json.loads(replies[0])["error"]["code"] == -32601
    _, outcome = lister.feed(b'{"jsonrpc":"2.0","id":0,"error":{"code":-32000,"message":"' + b"x" * 900 + b'"}}')
    assert outcome is not None and outcome.reason == "agent_error"
    assert outcome.detail is not None and outcome.detail.startswith("initialize: x") and len(outcome.detail) <= 300
