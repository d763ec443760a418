"""The fakes fork as the real agents do: the stream-json fake takes Claude Code's
``--fork-session`` and ``--resume-session-at`` (the second only with a resume, with Claude
Code 2.1.332's error text otherwise) and refuses an option Claude Code does not have; the
ACP fake serves ``session/fork`` strictly by the schema, only when it advertises it. Each
case runs the fake as a real process, as the bridge does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

FAKE = Path(__file__).resolve().parent / "fake_agent.py"
FAKE_ACP = Path(__file__).resolve().parent / "fake_acp_agent.py"
SJ = [sys.executable, "-I", str(FAKE), "--dialect", "stream-json", "--output-format", "stream-json", "--verbose"]


def user(text: str) -> str:
    return json.dumps({"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": text}]}})


def run(args: list[str], prompts: list[str], state: Path) -> tuple[int, list[dict[str, Any]], str]:
    stdin = "".join(user(p) + "\n" for p in prompts)
    env = {"FAKE_AGENT_STATE": str(state)}
    r = subprocess.run([*SJ, *args], input=stdin, capture_output=True, text=True, timeout=20, env=env)
    return r.returncode, [json.loads(line) for line in r.stdout.splitlines()], r.stderr


def replies(lines: list[dict[str, Any]]) -> list[str]:
    return [ln["result"] for ln in lines if ln.get("type") == "result"]


def test_resume_session_at_needs_a_resume_and_unknown_options_are_refused(tmp_path: Path) -> None:
    assert run(["--resume-session-at", "x"], ["hi"], tmp_path)[::2] == (
        1,
        "Error: --resume-session-at requires --resume\n",
    )
    assert run(["--bogus=1"], ["hi"], tmp_path)[::2] == (1, "error: unknown option '--bogus'\n")
    code, lines, _ = run(["--fork-session"], ["hi"], tmp_path)  # without a resume: no effect, as Claude Code
    assert code == 0 and replies(lines) == ["echo: hi"]


def test_a_fork_copies_the_session_up_to_a_chain_entry_under_a_new_id(tmp_path: Path) -> None:
    code, lines, _ = run([], ["one", "two", "three"], tmp_path)
    assert code == 0
    sid = lines[0]["session_id"]
    entries = [ln["uuid"] for ln in lines if ln.get("type") == "assistant"]
    code, lines, _ = run(
        [f"--resume={sid}", "--fork-session", f"--resume-session-at={entries[1]}"], ["recall"], tmp_path
    )
    assert code == 0 and replies(lines) == ["history: one | two"]
    assert lines[0]["session_id"] not in (sid, None)
    code, lines, _ = run(["--resume", sid, "--fork-session"], ["recall"], tmp_path)  # the whole session
    assert replies(lines) == ["history: one | two | three"]
    code, lines, _ = run([f"--resume={sid}"], ["recall"], tmp_path)  # the source untouched
    assert lines[0]["session_id"] == sid and replies(lines) == ["history: one | two | three"]
    code, _, err = run([f"--resume={sid}", "--resume-session-at", "0b7c3a52-9d1e-4f60-8a2b-3c4d5e6f7a8b"], [], tmp_path)
    assert code == 1 and err == "No message found with message.uuid of: 0b7c3a52-9d1e-4f60-8a2b-3c4d5e6f7a8b\n"


def acp(flags: list[str], messages: list[dict[str, Any]], state: Path) -> list[dict[str, Any]]:
    stdin = "".join(json.dumps({"jsonrpc": "2.0", **m}) + "\n" for m in messages)
    r = subprocess.run(
        [sys.executable, "-I", str(FAKE_ACP), *flags],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=20,
        env={"FAKE_AGENT_STATE": str(state)},
    )
    return [json.loads(line) for line in r.stdout.splitlines()]


def test_the_acp_fake_serves_session_fork_by_the_schema_only_when_advertised(tmp_path: Path) -> None:
    cwd = str(tmp_path)
    init = {"id": 0, "method": "initialize", "params": {"protocolVersion": 1, "clientCapabilities": {}}}
    new = {"id": 1, "method": "session/new", "params": {"cwd": cwd, "mcpServers": []}}
    out = acp(["--fork-cap"], [init, new], tmp_path)
    assert out[0]["result"]["agentCapabilities"]["sessionCapabilities"]["fork"] == {}
    sid = out[1]["result"]["sessionId"]
    forks = [
        {"id": 2, "method": "session/fork", "params": {"sessionId": sid, "cwd": cwd}},
        {"id": 3, "method": "session/fork", "params": {"sessionId": sid, "cwd": cwd, "mcpServers": [], "x": 1}},
        {"id": 4, "method": "session/fork", "params": {"sessionId": sid}},
        {"id": 5, "method": "session/fork", "params": {"sessionId": "acp-none", "cwd": cwd}},
    ]
    by_id = {m["id"]: m for m in acp(["--fork-cap"], [init, *forks], tmp_path)}
    assert by_id[2]["result"]["sessionId"].startswith("acp-") and by_id[2]["result"]["sessionId"] != sid
    assert by_id[3]["error"]["code"] == -32602 and by_id[4]["error"]["code"] == -32602
    assert by_id[5]["error"]["code"] == -32002
    plain = {m["id"]: m for m in acp([], [init, forks[0]], tmp_path)}
    assert "fork" not in plain[0]["result"]["agentCapabilities"]["sessionCapabilities"]
    assert plain[2]["error"]["code"] == -32601
