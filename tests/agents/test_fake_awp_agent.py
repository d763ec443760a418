"""The fake awp-jsonl agent is as strict as the AWP reference adapter (awp-agent-cli.mjs):
exactly its arguments, its start-up failure line and exit status, its input handling.
Each case runs the fake as a real process, as the bridge does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

FAKE = Path(__file__).resolve().parent / "fake_agent.py"
PREFIX = [sys.executable, "-I", str(FAKE), "--dialect", "awp-jsonl"]


def user(text: str) -> str:
    return json.dumps({"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": text}]}})


def run(args: list[str], stdin: str = "", env: dict[str, str] | None = None) -> tuple[int, list[dict[str, Any]]]:
    r = subprocess.run([*PREFIX, *args], input=stdin, capture_output=True, text=True, timeout=20, env=env or {})
    return r.returncode, [json.loads(line) for line in r.stdout.splitlines()]


def startup_error(reason: str) -> dict[str, Any]:
    return {"type": "result", "subtype": "startup_error", "is_error": True, "result": reason}


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--model", "m", "--bogus"], "unsupported_argument:--bogus"),
        (["--model", "m", "--permission-mode", "plan"], "unsupported_argument:--permission-mode"),
        (["--model", "m", "stray"], "unsupported_argument:stray"),
        (["--model", "m", "--exit-at-start"], "unsupported_argument:--exit-at-start"),  # the fake's own: prefix only
        # "=" is not among the characters the reference lets through as a public reason.
        (["--model", "m", "--resume=abc"], "provider_request_failed"),
        (["--model=m"], "provider_request_failed"),  # the one-argument form stream-json CLIs take
        ([], "model_required"),
        (["--model"], "model_required"),
        (["--model", "m", "--resume", "a b"], "invalid_session_id"),
    ],
)
def test_a_start_up_failure_is_one_result_line_and_exit_status_1(args: list[str], reason: str) -> None:
    # Input is waiting, but the failure comes before any of it is read.
    code, lines = run(args, user("hello") + "\n")
    assert (code, lines) == (1, [startup_error(reason)])


def test_the_contract_argv_and_the_stream_json_launcher_flags_are_accepted() -> None:
    contract = ["--model", "m", "--resume", "s.1:x", "--mcp-config", "/nonexistent/mcp.json"]
    compat = ["--output-format", "stream-json", "--input-format", "stream-json", "--print", "--verbose"]
    for args in (contract, [*compat, *contract]):
        code, lines = run(args, user("hello") + "\n")
        assert code == 0
        assert lines[0] == {**lines[0], "type": "system", "subtype": "init", "session_id": "s.1:x", "model": "m"}
        assert lines[-1]["type"] == "result" and lines[-1]["subtype"] == "success"


def test_the_model_may_come_from_the_environment_as_for_the_reference() -> None:
    code, lines = run([], user("hello") + "\n", env={"AWP_REFERENCE_MODEL": "env-model"})
    assert code == 0 and lines[0]["model"] == "env-model"


def test_input_handling_follows_the_reference() -> None:
    stdin = "\n".join([user("one"), "", "not json", '{"type":"control_request"}', user("two"), '{"type":"shutdown"}'])
    code, lines = run(["--model", "m"], stdin + "\n" + user("never read") + "\n")
    assert code == 0
    # system/init once, after the first accepted input; a blank line skipped; lines that are
    # not user messages answered with an error result; nothing after the shutdown line.
    assert [(ln["type"], ln.get("subtype")) for ln in lines if ln["type"] in ("system", "result")] == [
        ("system", "init"),
        ("result", "success"),
        ("result", "error"),
        ("result", "error"),
        ("result", "success"),
    ]
    errors = [ln["result"] for ln in lines if ln.get("subtype") == "error"]
    assert errors == ["invalid_input_json", "invalid_input_message"]
    assert not any("never read" in json.dumps(ln) for ln in lines)


def test_nothing_is_written_before_the_first_input_line() -> None:
    code, lines = run(["--model", "m"])  # stdin closed at once
    assert (code, lines) == (0, [])
