"""The transcript replay agent, run as a subprocess with this test acting as the host.

Each scenario test speaks like the bridge does (fresh uuids, its own request ids, compact
JSON) and asserts that the agent's stdout is the recorded Claude Code 2.1.197 output,
byte for byte, except for the request_id of an ack to the host's own control_request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import TIMEOUT, LineProcess

HERE = Path(__file__).resolve().parent
AGENT = HERE / "replay_agent.py"
TRANSCRIPTS = HERE.parent / "fixtures" / "transcripts" / "claude-code-2.1.197"


# ---------------------------------------------------------------------- the oracle


def entries(name: str) -> list[dict[str, Any]]:
    """The transcript's ">"/"<"/"stderr" entries, each with its parsed JSON as ``obj``."""
    out = []
    for raw in (TRANSCRIPTS / f"{name}.transcript.jsonl").read_text(encoding="utf-8").splitlines():
        rec = json.loads(raw)
        if rec.get("dir") in (">", "<", "stderr"):
            rec["obj"] = json.loads(rec["line"]) if rec["dir"] != "stderr" else None
            out.append(rec)
    return out


def without_initialize(es: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the bridge sees: no initialize exchange, so no hook callbacks it registered."""
    init = {
        e["obj"]["request_id"]
        for e in es
        if e["dir"] == ">" and e["obj"]["type"] == "control_request" and e["obj"]["request"]["subtype"] == "initialize"
    }
    hooks = {
        e["obj"]["request_id"]
        for e in es
        if e["dir"] == "<"
        and e["obj"]["type"] == "control_request"
        and e["obj"]["request"]["subtype"] == "hook_callback"
    }
    kept = []
    for e in es:
        o = e["obj"] or {}
        if o.get("type") == "control_request" and o["request_id"] in init | hooks:
            continue
        if o.get("type") == "control_response" and o["response"]["request_id"] in init | hooks:
            continue
        kept.append(e)
    return kept


def segments(es: list[dict[str, Any]]) -> tuple[list[list[str]], list[dict[str, Any]]]:
    """The agent's stdout lines between host lines (segment k follows host line k), and the host lines."""
    outs: list[list[str]] = [[]]
    hosts: list[dict[str, Any]] = []
    for e in es:
        if e["dir"] == ">":
            hosts.append(e["obj"])
            outs.append([])
        elif e["dir"] == "<":
            outs[-1].append(e["line"])
    return outs, hosts


def stderr_lines(es: list[dict[str, Any]]) -> list[str]:
    return [e["line"] for e in es if e["dir"] == "stderr"]


# ---------------------------------------------------------------------- a host


def user(text: str) -> dict[str, Any]:
    return {
        "type": "user",
        "message": {"role": "user", "content": [{"type": "text", "text": text}]},
        "parent_tool_use_id": None,
        "session_id": "",
        "uuid": str(uuid.uuid4()),
    }


def permission(request_id: str, behavior: str, tool_input: dict[str, Any] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {"behavior": behavior}
    if behavior == "allow":
        answer["updatedInput"] = tool_input or {}
    else:
        answer["message"] = "denied by the test"
    return {
        "type": "control_response",
        "response": {"subtype": "success", "request_id": request_id, "response": answer},
    }


def interrupt(request_id: str) -> dict[str, Any]:
    return {"type": "control_request", "request_id": request_id, "request": {"subtype": "interrupt"}}


class Host(LineProcess):
    def expect(self, lines: list[str]) -> list[str]:
        got = [self.next_line() for _ in lines]
        assert got == lines
        return got

    def finish(self) -> int:
        """Close stdin; the agent must exit with nothing more on stdout."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        rc = self.proc.wait(timeout=TIMEOUT)
        self._reader.join(timeout=TIMEOUT)
        assert self.lines.get(timeout=TIMEOUT) is None, "output after the expected lines"
        return rc


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    hosts: list[Host] = []

    def make(name: str, *flags: str, bridge_args: bool = True) -> Host:
        argv = [sys.executable, "-I", str(AGENT), "--transcript", str(TRANSCRIPTS / f"{name}.transcript.jsonl"), *flags]
        if bridge_args:  # what the bridge passes to a real claude: accepted and ignored
            argv += [
                "-p",
                "--input-format",
                "stream-json",
                "--output-format",
                "stream-json",
                "--verbose",
                "--model",
                "claude-x",
                "--resume=abc",
                "--permission-prompt-tool",
                "stdio",
            ]
        env = {**os.environ, "FAKE_AGENT_LOG": str(tmp_path / "agent.log")}
        host = Host(argv, env, tmp_path / f"stderr-{len(hosts)}.txt")
        hosts.append(host)
        return host

    try:
        yield make
    finally:
        for host in hosts:
            host.close()


def agent_log(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "agent.log"
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


# ---------------------------------------------------------------------- the five scenarios


def test_minA_one_turn(spawn: Any, tmp_path: Path) -> None:
    outs, hosts = segments(without_initialize(entries("minA")))
    assert [h["type"] for h in hosts] == ["user"] and outs[0] == []
    host = spawn("minA")
    host.quiet(0.3)  # nothing before the host speaks
    msg = user("hello")
    host.send(msg)
    got = host.expect(outs[1])
    assert [json.loads(x)["type"] for x in got] == ["system", "assistant", "result"]
    assert host.finish() == 0
    log = agent_log(tmp_path)
    assert log[0]["event"] == "start" and log[0]["pid"] == host.proc.pid and "--model" in log[0]["argv"]
    assert log[0]["cwd"] == str(tmp_path) and log[0]["env"]["FAKE_AGENT_LOG"] == str(tmp_path / "agent.log")
    assert [e for e in log if e["event"] == "stdin"] == [
        {"event": "stdin", "line": json.dumps(msg, separators=(",", ":"))}
    ]
    assert not [e for e in log if e["event"] == "skipped"]


@pytest.mark.parametrize("name", ["allow", "deny"])
def test_permission_answered(spawn: Any, name: str) -> None:
    es = without_initialize(entries(name))
    outs, hosts = segments(es)
    assert [h["type"] for h in hosts] == ["user", "control_response"]
    behavior = hosts[1]["response"]["response"]["behavior"]
    assert behavior == name
    host = spawn(name)
    host.send(user("make a file"))
    got = host.expect(outs[1])
    ask = json.loads(got[-1])
    assert ask["request"]["subtype"] == "can_use_tool"
    assert not any(
        json.loads(x)["type"] == "control_request" and json.loads(x)["request"]["subtype"] == "hook_callback"
        for x in got
    ), "hook callbacks exist only for an initialize the bridge never sends"
    host.send(permission(ask["request_id"], behavior, ask["request"]["input"]))
    host.expect(outs[2])
    assert json.loads(outs[2][-1])["type"] == "result"
    assert host.finish() == 0
    assert host.stderr_text().splitlines() == stderr_lines(es)


@pytest.mark.parametrize("late_answer", [False, True])
def test_cancelperm_interrupt_while_asking(spawn: Any, tmp_path: Path, late_answer: bool) -> None:
    es = without_initialize(entries("cancelperm"))
    outs, hosts = segments(es)
    assert [(h["type"], h.get("request", {}).get("subtype")) for h in hosts] == [
        ("user", None),
        ("control_request", "interrupt"),
        ("control_response", None),
        ("user", None),
    ]
    recorded_id = hosts[1]["request_id"]
    host = spawn("cancelperm")
    host.send(user("make a file"))
    got = host.expect(outs[1])
    ask = json.loads(got[-1])
    assert ask["request"]["subtype"] == "can_use_tool"

    my_id = "req_1_" + uuid.uuid4().hex[:8]
    host.send(interrupt(my_id))
    expected = [
        x.replace(f'"request_id":"{recorded_id}"', f'"request_id":"{my_id}"')
        if json.loads(x)["type"] == "control_response"
        else x
        for x in outs[2]
    ]
    got = host.expect(expected)
    assert json.loads(got[0]) == {"type": "control_cancel_request", "request_id": ask["request_id"]}
    assert json.loads(got[1])["response"] == {"subtype": "success", "request_id": my_id}
    assert json.loads(got[-2])["subtype"] == "error_during_execution"

    # The prompt was withdrawn: the bridge does not answer it. A late answer is tolerated.
    assert outs[3] == []
    if late_answer:
        host.send(permission(ask["request_id"], "allow", ask["request"]["input"]))
        host.quiet(0.3)
    host.send(user("again"))
    got = host.expect(outs[4])
    assert json.loads(got[-2])["subtype"] == "success"
    assert host.finish() == 0
    assert not [e for e in agent_log(tmp_path) if e["event"] == "skipped"]


def test_hooks_events_in_one_turn(spawn: Any) -> None:
    outs, hosts = segments(without_initialize(entries("hooks")))
    assert [h["type"] for h in hosts] == ["user"]
    host = spawn("hooks")
    host.send(user("hi"))
    got = host.expect(outs[1])
    assert [json.loads(x).get("subtype") for x in got] == [
        "session_state_changed",
        "hook_started",
        "hook_response",
        "init",
        None,
        "success",
        "session_state_changed",
    ]
    assert host.finish() == 0


# ---------------------------------------------------------------------- matching and flags


def test_unmatched_lines_are_logged_and_skipped(spawn: Any, tmp_path: Path) -> None:
    outs, _ = segments(without_initialize(entries("allow")))
    host = spawn("allow")
    host.send(user("make a file"))
    ask = json.loads(host.expect(outs[1])[-1])
    host.send(permission("not-the-request", "allow"))  # wrong id
    host.send(permission(ask["request_id"], "deny"))  # wrong behavior for this transcript
    host.raw("not json\n")
    host.quiet(0.3)
    host.send(permission(ask["request_id"], "allow", ask["request"]["input"]))
    host.expect(outs[2])
    host.send(user("after the end"))
    assert host.finish() == 0
    log = agent_log(tmp_path)
    skipped = [e["line"] for e in log if e["event"] == "skipped"]
    assert len(skipped) == 4 and skipped[2] == "not json" and json.loads(skipped[3])["type"] == "user"
    assert len([e for e in log if e["event"] == "stdin"]) == 6


def test_strict_exits_2_on_a_mismatch(spawn: Any) -> None:
    host = spawn("minA", "--strict")
    host.send(interrupt("req_9"))
    rc = host.proc.wait(timeout=TIMEOUT)
    assert rc == 2
    assert host.lines.get(timeout=TIMEOUT) is None  # nothing on stdout
    err = host.stderr_text()
    assert "does not match" in err and "req_9" in err


def test_eof_before_first_line_and_mid_transcript(spawn: Any) -> None:
    host = spawn("minA")
    host.quiet(0.3)
    assert host.finish() == 0

    outs, _ = segments(without_initialize(entries("allow")))
    host = spawn("allow")
    host.send(user("make a file"))
    host.expect(outs[1])
    assert host.finish() == 0  # EOF while the permission prompt is pending


def test_missing_transcript_is_an_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-I", str(AGENT), "--verbose"],
        input="",
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=str(tmp_path),
    )
    assert proc.returncode == 2 and "--transcript" in proc.stderr


# ---------------------------------------------------------------------- every transcript, verbatim


@pytest.mark.parametrize("name", sorted(p.name.split(".")[0] for p in TRANSCRIPTS.glob("*.transcript.jsonl")))
@pytest.mark.parametrize("skip_init", [True, False])
def test_verbatim_host_reproduces_the_recording(spawn: Any, tmp_path: Path, name: str, skip_init: bool) -> None:
    """A host that writes exactly the recorded lines gets exactly the recorded output, strictly."""
    es = entries(name)
    if skip_init:
        es = without_initialize(es)
    flags = ["--strict"] + ([] if skip_init else ["--no-skip-host-initialize"])
    host = spawn(name, *flags, bridge_args=False)
    deadline = time.monotonic() + 30
    for e in es:
        assert time.monotonic() < deadline
        if e["dir"] == ">":
            host.raw(e["line"] + "\n")
        elif e["dir"] == "<":
            assert host.next_line() == e["line"]
    assert host.finish() == 0
    assert host.stderr_text().splitlines() == stderr_lines(es)
    assert not [e for e in agent_log(tmp_path) if e["event"] == "skipped"]
