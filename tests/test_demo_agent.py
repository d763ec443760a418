"""The bundled demo agent (bridge/demo_agent.py), driven as a real subprocess.

It is launched exactly as the daemon launches it: ``<real python> -I <abs path> <flags>``,
with a tiny environment, so nothing from the ``bridge`` package can leak into it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = (Path(__file__).resolve().parent.parent / "bridge" / "demo_agent.py").resolve()
PYTHON = os.path.realpath(sys.executable)
BASE_ARGS = ["--output-format", "stream-json", "--input-format", "stream-json", "--verbose", "--model", "demo"]
READ_TIMEOUT = 10.0

Json = dict[str, Any]


class Agent:
    """One demo-agent subprocess with a reader thread on stdout (never a blocking read)."""

    def __init__(self, cwd: Path, state_dir: Path, home: Path, extra_args: list[str]) -> None:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "DEMO_AGENT_STATE_DIR": str(state_dir),
        }
        self.argv = [PYTHON, "-I", str(SCRIPT), *BASE_ARGS, *extra_args]
        self.proc = subprocess.Popen(
            self.argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.lines: queue.Queue[Json | None] = queue.Queue()
        self.seen: list[Json] = []
        self.bad_lines: list[bytes] = []
        self.stderr_chunks: list[bytes] = []
        self._out = threading.Thread(target=self._read_stdout, daemon=True)
        self._err = threading.Thread(target=self._read_stderr, daemon=True)
        self._out.start()
        self._err.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                obj = json.loads(raw)
            except ValueError:
                self.bad_lines.append(raw)
                continue
            if not isinstance(obj, dict) or not raw.endswith(b"\n"):
                self.bad_lines.append(raw)
                continue
            self.lines.put(obj)
        self.lines.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.stderr_chunks.append(raw)

    @property
    def stderr(self) -> str:
        return b"".join(self.stderr_chunks).decode("utf-8", "replace")

    # ---- input

    def send(self, obj: Json) -> None:
        self.send_raw(json.dumps(obj))

    def send_raw(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode("utf-8") + b"\n")
        self.proc.stdin.flush()

    def prompt(self, text: str) -> None:
        # The daemon's encoding (content blocks, empty session_id, a fresh uuid).
        self.send(
            {
                "type": "user",
                "message": {"role": "user", "content": [{"type": "text", "text": text}]},
                "parent_tool_use_id": None,
                "session_id": "",
                "uuid": str(uuid.uuid4()),
            }
        )

    def interrupt(self, request_id: str) -> None:
        self.send({"type": "control_request", "request_id": request_id, "request": {"subtype": "interrupt"}})

    def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    # ---- output

    def next(self, timeout: float = READ_TIMEOUT) -> Json:
        try:
            obj = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no stdout line within {timeout}s; stderr: {self.stderr}") from None
        if obj is None:
            self.lines.put(None)  # keep reporting EOF
            raise AssertionError(f"stdout closed; rc={self.proc.poll()} stderr: {self.stderr}")
        self.seen.append(obj)
        return obj

    def until(self, pred: Callable[[Json], bool], timeout: float = READ_TIMEOUT) -> list[Json]:
        """Lines up to and including the first one matching pred."""
        deadline = time.monotonic() + timeout
        out: list[Json] = []
        while True:
            obj = self.next(max(0.01, deadline - time.monotonic()))
            out.append(obj)
            if pred(obj):
                return out

    def turn(self, text: str, timeout: float = READ_TIMEOUT) -> list[Json]:
        self.prompt(text)
        return self.until(is_result, timeout)

    def assert_silent(self, seconds: float) -> None:
        try:
            obj = self.lines.get(timeout=seconds)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected stdout line: {obj}")

    def wait(self, timeout: float = READ_TIMEOUT) -> int:
        rc = self.proc.wait(timeout=timeout)
        self._out.join(timeout)
        return rc

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=READ_TIMEOUT)
        self._out.join(READ_TIMEOUT)
        self._err.join(READ_TIMEOUT)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except BrokenPipeError:
                    pass


def is_result(obj: Json) -> bool:
    return obj.get("type") == "result"


def events(lines: list[Json], etype: str | None = None) -> list[Json]:
    evs = [ln["event"] for ln in lines if ln.get("type") == "stream_event"]
    return [e for e in evs if etype is None or e.get("type") == etype]


def text_deltas(lines: list[Json]) -> list[str]:
    return [e["delta"]["text"] for e in events(lines, "content_block_delta") if e["delta"].get("type") == "text_delta"]


def assistant_blocks(lines: list[Json]) -> list[Json]:
    out = []
    for ln in lines:
        if ln.get("type") == "assistant":
            content = ln["message"]["content"]
            assert len(content) == 1, "one block per assistant line"
            out.append(content[0])
    return out


def index_of(lines: list[Json], pred: Callable[[Json], bool]) -> int:
    for i, ln in enumerate(lines):
        if pred(ln):
            return i
    raise AssertionError(f"no matching line in {[ln.get('type') for ln in lines]}")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    cwd = tmp_path / "project"
    cwd.mkdir()
    (cwd / "alpha.txt").write_text("first line of alpha\nsecond line\n", encoding="utf-8")
    (cwd / "beta.py").write_text("print('beta')\n", encoding="utf-8")
    (cwd / "subdir").mkdir()
    return cwd


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def spawn(tmp_path: Path, workdir: Path, state_dir: Path) -> Iterator[Callable[..., Agent]]:
    started: list[Agent] = []
    home = tmp_path / "home"
    home.mkdir()

    def _spawn(*extra_args: str) -> Agent:
        agent = Agent(workdir, state_dir, home, list(extra_args))
        started.append(agent)
        return agent

    try:
        yield _spawn
    finally:
        for agent in started:
            agent.stop()
    for agent in started:
        assert agent.bad_lines == [], f"stdout lines that are not JSON objects: {agent.bad_lines}"
    # The default state dir under $HOME must not be touched when DEMO_AGENT_STATE_DIR is set.
    assert list(home.iterdir()) == []


# --------------------------------------------------------------------------- tests


def test_chat_turn_has_claude_code_shapes(spawn: Callable[..., Agent]) -> None:
    agent = spawn()
    agent.assert_silent(0.3)  # prints nothing before the first stdin line
    lines = agent.turn("hello there, héllo ✓")

    init = lines[0]
    assert init["type"] == "system" and init["subtype"] == "init"
    sid = init["session_id"]
    assert uuid.UUID(sid).version == 4
    assert init["tools"] == ["ListFiles", "ReadFile"]
    assert init["model"] == "demo"
    assert init["permissionMode"] == "default"
    assert isinstance(init["demo_agent_version"], str)
    assert init["cwd"] == os.path.realpath(init["cwd"]) and isinstance(init["uuid"], str)

    for ln in lines:
        if ln["type"] != "result":
            assert ln["session_id"] == sid
        assert isinstance(ln["uuid"], str)

    kinds = [e["type"] for e in events(lines)]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    deltas = text_deltas(lines)
    assert len(deltas) >= 5
    assert all(1 <= len(d.split()) <= 2 for d in deltas), deltas

    # The complete assistant line comes after the last delta and before content_block_stop.
    i_assistant = index_of(lines, lambda ln: ln["type"] == "assistant")
    i_last_delta = max(
        i for i, ln in enumerate(lines) if ln["type"] == "stream_event" and ln["event"]["type"] == "content_block_delta"
    )
    i_stop = index_of(lines, lambda ln: ln["type"] == "stream_event" and ln["event"]["type"] == "content_block_stop")
    assert i_last_delta < i_assistant < i_stop
    assistant = lines[i_assistant]
    msg_id = assistant["message"]["id"]
    assert events(lines, "message_start")[0]["message"]["id"] == msg_id
    assert assistant["message"]["role"] == "assistant"
    assert assistant["message"]["stop_reason"] is None
    text = assistant_blocks(lines)[0]["text"]
    assert text == "".join(deltas)
    assert "agent-bridge demo agent" in text
    assert "héllo ✓" in text  # echoes what was said, UTF-8 intact
    assert "list files" in text and "what did I say?" in text
    assert events(lines, "message_delta")[0]["delta"]["stop_reason"] == "end_turn"

    result = lines[-1]
    assert result["subtype"] == "success" and result["is_error"] is False
    assert result["result"] == text
    assert result["session_id"] == sid
    assert result["num_turns"] == 1
    assert result["stop_reason"] == "end_turn"
    assert isinstance(result["duration_ms"], int) and isinstance(result["usage"], dict)

    # A second turn: a new system/init with the same session id.
    lines2 = agent.turn("thanks")
    assert lines2[0]["subtype"] == "init" and lines2[0]["session_id"] == sid
    assert lines2[-1]["subtype"] == "success"

    agent.close_stdin()
    assert agent.wait() == 0


def test_list_files_uses_a_tool(spawn: Callable[..., Agent], workdir: Path) -> None:
    agent = spawn()
    lines = agent.turn("Could you list files please?")

    tool_uses = [b for b in assistant_blocks(lines) if b["type"] == "tool_use"]
    assert len(tool_uses) == 1
    call = tool_uses[0]
    assert call["name"] == "ListFiles" and call["input"] == {"path": "."}
    assert call["id"].startswith("toolu_demo_")
    starts = events(lines, "content_block_start")
    assert any(s["content_block"]["type"] == "tool_use" and s["content_block"]["id"] == call["id"] for s in starts)

    i_use = index_of(lines, lambda ln: ln["type"] == "assistant" and ln["message"]["content"][0]["type"] == "tool_use")
    i_res = index_of(lines, lambda ln: ln["type"] == "user")
    assert i_use < i_res
    tool_line = lines[i_res]
    block = tool_line["message"]["content"][0]
    assert block["type"] == "tool_result" and block["tool_use_id"] == call["id"]
    assert block["is_error"] is False
    assert block["content"].split("\n") == ["alpha.txt", "beta.py", "subdir/"]
    assert "tool_use_result" in tool_line
    assert [e["delta"]["stop_reason"] for e in events(lines, "message_delta")] == ["tool_use", "end_turn"]

    summary = assistant_blocks(lines)[-1]
    assert summary["type"] == "text" and summary["text"].startswith("I found 3 entries")
    result = lines[-1]
    assert result["subtype"] == "success" and result["num_turns"] == 2
    assert result["result"] == summary["text"]


def test_list_files_caps_at_50_entries(spawn: Callable[..., Agent], workdir: Path) -> None:
    for n in range(60):
        (workdir / f"f{n:03d}.txt").write_text("x", encoding="utf-8")
    lines = spawn().turn("ls")
    block = next(ln for ln in lines if ln["type"] == "user")["message"]["content"][0]
    entries = block["content"].split("\n")
    assert len(entries) == 50 and entries == sorted(entries)
    assert assistant_blocks(lines)[-1]["text"].startswith("I found 63 entries")


def test_read_file_inside_cwd_only(spawn: Callable[..., Agent], workdir: Path, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("TOP SECRET", encoding="utf-8")
    (workdir / "link.txt").symlink_to(tmp_path / "secret.txt")
    agent = spawn()

    lines = agent.turn("read alpha.txt")
    call = next(b for b in assistant_blocks(lines) if b["type"] == "tool_use")
    assert call["name"] == "ReadFile" and call["input"] == {"path": "alpha.txt"}
    block = next(ln for ln in lines if ln["type"] == "user")["message"]["content"][0]
    assert block["tool_use_id"] == call["id"] and block["is_error"] is False
    assert block["content"] == "first line of alpha\nsecond line\n"
    assert "first line of alpha" in lines[-1]["result"]
    assert lines[-1]["num_turns"] == 2

    for target in ("../secret.txt", str(tmp_path / "secret.txt"), "link.txt"):
        lines = agent.turn(f"read {target}")
        block = next(ln for ln in lines if ln["type"] == "user")["message"]["content"][0]
        assert block["is_error"] is True, target
        assert "outside the working directory" in block["content"]
        assert "TOP SECRET" not in json.dumps(lines)
        assert lines[-1]["subtype"] == "success"

    lines = agent.turn("read nosuchfile.txt")
    block = next(ln for ln in lines if ln["type"] == "user")["message"]["content"][0]
    assert block["is_error"] is True and "does not exist" in block["content"]


def test_interrupt_during_slow_reply(spawn: Callable[..., Agent]) -> None:
    agent = spawn()
    agent.prompt("slow please")
    before = agent.until(lambda ln: ln["type"] == "stream_event" and ln["event"]["type"] == "content_block_delta")
    before += [agent.next() for _ in range(2)]  # a couple more deltas
    agent.interrupt("req_1_abcd1234")
    after = agent.until(is_result)
    lines = before + after

    i_resp = index_of(lines, lambda ln: ln["type"] == "control_response")
    assert lines[i_resp] == {
        "type": "control_response",
        "response": {"subtype": "success", "request_id": "req_1_abcd1234"},
    }
    # After the response: the partial text, the interrupt marker, the error result.
    tail = [ln for ln in lines[i_resp + 1 :] if ln["type"] != "stream_event"]
    assert [ln["type"] for ln in tail] == ["assistant", "user", "result"]
    partial = tail[0]["message"]["content"][0]["text"]
    deltas = text_deltas(lines)
    assert partial == "".join(deltas)
    assert len(deltas) < 50  # it really stopped early
    assert tail[1]["message"]["content"] == [{"type": "text", "text": "[Request interrupted by user]"}]
    result = tail[2]
    assert result["subtype"] == "error_during_execution" and result["is_error"] is True
    assert result["terminal_reason"] == "aborted_streaming"
    assert result["session_id"] == lines[0]["session_id"]
    assert events(lines, "message_stop") == []  # like the real CLI: the stream just ends

    # Still alive: the next prompt is answered normally.
    lines = agent.turn("hello again")
    assert lines[0]["subtype"] == "init"
    assert lines[-1]["subtype"] == "success" and lines[-1]["is_error"] is False
    agent.close_stdin()
    assert agent.wait() == 0


def test_control_requests_when_idle(spawn: Callable[..., Agent]) -> None:
    agent = spawn()
    agent.interrupt("r-idle")
    assert agent.next() == {"type": "control_response", "response": {"subtype": "success", "request_id": "r-idle"}}
    agent.send({"type": "control_request", "request_id": "r-bogus", "request": {"subtype": "bogus_subtype"}})
    assert agent.next() == {
        "type": "control_response",
        "response": {
            "subtype": "error",
            "request_id": "r-bogus",
            "error": "Unsupported control request subtype: bogus_subtype",
        },
    }
    agent.send({"type": "keep_alive"})
    agent.send({"type": "control_response", "response": {"subtype": "success", "request_id": "stale"}})
    agent.assert_silent(0.2)
    # The idle interrupt left no trace: the next prompt is a normal turn.
    lines = agent.turn("hi")
    assert lines[0]["subtype"] == "init" and lines[-1]["subtype"] == "success"

    # The few harmless host requests a UI may send are accepted.
    agent.send({"type": "control_request", "request_id": "r-init", "request": {"subtype": "initialize", "hooks": None}})
    resp = agent.next()["response"]
    assert resp["subtype"] == "success" and resp["request_id"] == "r-init"
    assert resp["response"]["models"][0]["value"] == "demo"
    agent.send(
        {"type": "control_request", "request_id": "r-model", "request": {"subtype": "set_model", "model": "demo-2"}}
    )
    assert agent.next() == {"type": "control_response", "response": {"subtype": "success", "request_id": "r-model"}}
    agent.send(
        {
            "type": "control_request",
            "request_id": "r-mode",
            "request": {"subtype": "set_permission_mode", "mode": "acceptEdits"},
        }
    )
    assert agent.next()["response"]["response"] == {"mode": "acceptEdits"}
    lines = agent.turn("hi again")
    assert lines[0]["model"] == "demo-2" and lines[0]["permissionMode"] == "acceptEdits"


def test_user_message_mid_turn_is_queued(spawn: Callable[..., Agent]) -> None:
    agent = spawn()
    agent.prompt("first message")
    first = agent.until(lambda ln: ln["type"] == "stream_event" and ln["event"]["type"] == "content_block_delta")
    agent.prompt("what did I say?")
    first += agent.until(is_result)
    assert first[-1]["subtype"] == "success"
    assert sum(1 for ln in first if ln.get("subtype") == "init") == 1  # not mixed in
    second = agent.until(is_result)
    assert second[0]["subtype"] == "init"
    assert "“first message”" in second[-1]["result"]


def test_resume_keeps_session_and_history(spawn: Callable[..., Agent], state_dir: Path) -> None:
    first = spawn()
    lines = first.turn("my favourite colour is teal")
    sid = lines[0]["session_id"]
    assert lines[-1]["session_id"] == sid
    first.close_stdin()
    assert first.wait() == 0
    saved = json.loads((state_dir / f"{sid}.json").read_text(encoding="utf-8"))
    assert saved["history"][0]["prompt"] == "my favourite colour is teal"
    assert [p.name for p in state_dir.iterdir()] == [f"{sid}.json"]  # no temp files left

    second = spawn(f"--resume={sid}")
    lines = second.turn("what did I say?")
    assert lines[0]["session_id"] == sid and lines[-1]["session_id"] == sid
    assert "my favourite colour is teal" in lines[-1]["result"]
    second.close_stdin()
    assert second.wait() == 0

    third = spawn("--resume", sid)  # the two-token form
    lines = third.turn("history")
    assert lines[0]["session_id"] == sid
    assert "my favourite colour is teal" in lines[-1]["result"]
    assert "what did I say?" in lines[-1]["result"]


def test_invalid_resume_id_is_refused(spawn: Callable[..., Agent], tmp_path: Path, state_dir: Path) -> None:
    sentinel = tmp_path / "x.json"
    sentinel.write_text('{"history": [{"prompt": "NOT MINE"}]}', encoding="utf-8")
    outside_before = sorted(str(p) for p in tmp_path.rglob("*") if state_dir not in p.parents)

    agent = spawn("--resume=../x")
    lines = agent.turn("what did I say?")
    sid = lines[0]["session_id"]
    assert sid != "../x" and uuid.UUID(sid).version == 4
    assert "NOT MINE" not in lines[-1]["result"]
    agent.close_stdin()
    assert agent.wait() == 0
    assert "refusing --resume" in agent.stderr

    assert sentinel.read_text(encoding="utf-8") == '{"history": [{"prompt": "NOT MINE"}]}'
    outside_after = sorted(str(p) for p in tmp_path.rglob("*") if p != state_dir and state_dir not in p.parents)
    assert outside_after == outside_before
    assert [p.name for p in state_dir.iterdir()] == [f"{sid}.json"]


def test_flags_and_malformed_input_are_tolerated(spawn: Callable[..., Agent]) -> None:
    agent = spawn(
        "--mcp-config",
        "/nonexistent/mcp.json",
        "--permission-mode",
        "plan",
        "--system-prompt",
        "be nice",
        "--allowedTools",
        "Read,Bash(git *)",
        "--disallowedTools",
        "ReadFile",
        "--permission-prompt-tool",
        "stdio",
        "--include-partial-messages",
        "--some-unknown-flag",
        "--other=1",
        "stray",
    )
    agent.send_raw("this is not json")
    agent.send_raw("[1, 2, 3]")
    agent.send_raw("")
    agent.send({"type": "mystery"})
    lines = agent.turn("hi")
    assert lines[0]["permissionMode"] == "plan"
    assert lines[0]["tools"] == ["ListFiles"]  # ReadFile was disallowed
    assert lines[-1]["subtype"] == "success"
    lines = agent.turn("read alpha.txt")  # a disallowed tool is not used
    assert not any(b["type"] == "tool_use" for b in assistant_blocks(lines))
    assert "disallowed" in lines[-1]["result"]
    agent.close_stdin()
    assert agent.wait() == 0
    assert "malformed stdin line 1" in agent.stderr


def test_eof_mid_turn_finishes_quickly_and_exits_zero(spawn: Callable[..., Agent], state_dir: Path) -> None:
    agent = spawn()
    agent.prompt("slow")
    agent.until(lambda ln: ln["type"] == "stream_event" and ln["event"]["type"] == "content_block_delta")
    started = time.monotonic()
    agent.close_stdin()
    lines = agent.until(is_result)
    assert agent.wait() == 0
    assert time.monotonic() - started < 3.0  # the slow reply alone would take > 5 s
    assert lines[-1]["subtype"] == "success"
    sid = lines[-1]["session_id"]
    saved = json.loads((state_dir / f"{sid}.json").read_text(encoding="utf-8"))
    assert saved["history"][-1]["prompt"] == "slow"


def test_sigterm_exits_promptly(spawn: Callable[..., Agent]) -> None:
    agent = spawn()
    agent.prompt("slow")
    agent.until(lambda ln: ln["type"] == "stream_event" and ln["event"]["type"] == "content_block_delta")
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=5) == -signal.SIGTERM


# --------------------------------------------------------------------------- pure helpers


@pytest.fixture(scope="module")
def demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("demo_agent_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses need the module registered
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_parse_args(demo: ModuleType) -> None:
    opts = demo.parse_args(
        [*BASE_ARGS, "--resume", "abc", "--mcp-config", "m.json", "--permission-mode", "acceptEdits", "--verbose"]
    )
    assert (opts.model, opts.resume, opts.permission_mode) == ("demo", "abc", "acceptEdits")
    assert demo.parse_args(["--resume=-odd"]).resume == "-odd"
    assert demo.parse_args(["--resume", "--verbose"]).resume is None  # value-less --resume
    assert demo.parse_args(["--model"]).model == "demo"  # a missing value is tolerated


def test_session_id_validation(demo: ModuleType) -> None:
    assert demo.valid_session_id(str(uuid.uuid4()))
    assert demo.valid_session_id("a.b:c-d_e")
    for bad in ("", "../x", "a/b", "a b", "x" * 257, "a\nb"):
        assert not demo.valid_session_id(bad), bad
