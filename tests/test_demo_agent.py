"""The bundled demo agent (bridge/demo_agent.py), driven as a real subprocess.

It is launched exactly as the daemon launches it: ``<real python> -I <abs path> <flags>``,
with a tiny environment, so nothing from the ``bridge`` package can leak into it.
"""

from __future__ import annotations

import contextlib
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
    assert init["tools"] == ["ListFiles", "ReadFile", "Edit", "Bash", "Task"]
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


def test_a_fork_at_a_chain_entry_keeps_the_turns_up_to_it(spawn: Callable[..., Agent], state_dir: Path) -> None:
    first = spawn()
    turns = [first.turn(f"remember {w}") for w in ("apple", "pear", "plum")]
    first.close_stdin()
    assert first.wait() == 0
    sid = turns[0][0]["session_id"]
    at = [ln["uuid"] for ln in turns[1] if ln["type"] == "assistant"][-1]  # the second turn's last entry

    fork = spawn(f"--resume={sid}", "--fork-session", f"--resume-session-at={at}")
    lines = fork.turn("what did I say?")
    assert lines[0]["session_id"] != sid
    assert "remember pear" in lines[-1]["result"] and "remember plum" not in lines[-1]["result"]
    fork.close_stdin()
    assert fork.wait() == 0
    source = spawn(f"--resume={sid}")  # untouched
    assert "remember plum" in source.turn("history")[-1]["result"]
    source.close_stdin()
    assert source.wait() == 0
    unknown = spawn(f"--resume={sid}", "--resume-session-at=0b7c3a52-9d1e-4f60-8a2b-3c4d5e6f7a8b")
    assert unknown.wait() == 1 and "No message found with message.uuid of: 0b7c3a52" in unknown.stderr


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
    assert lines[0]["tools"] == ["ListFiles", "Edit", "Bash", "Task"]  # ReadFile was disallowed
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


# --------------------------------------------------------------------------- what the page shows

PROMPTS = "--permission-prompt-tool"
HELLO = 'def greet(name: str) -> str:\n    return f"Hello, {name}!"\n\n\nprint(greet("demo"))\n'


def non_stream(lines: list[Json]) -> list[Json]:
    return [ln for ln in lines if ln["type"] != "stream_event"]


def tool_results(lines: list[Json]) -> list[tuple[Json, Json]]:
    """Each tool_result block with the line that carries it."""
    return [
        (b, ln)
        for ln in lines
        if ln["type"] == "user"
        for b in ln["message"]["content"]
        if b.get("type") == "tool_result"
    ]


def answer(agent: Agent, request: Json, response: Json) -> None:
    agent.send(
        {
            "type": "control_response",
            "response": {"subtype": "success", "request_id": request["request_id"], "response": response},
        }
    )


def edit_until_asked(agent: Agent, text: str = "edit hello.py") -> tuple[list[Json], Json]:
    agent.prompt(text)
    lines = agent.until(lambda ln: ln["type"] == "control_request")
    return lines, lines[-1]


def test_edit_asks_over_stdio_then_edits_with_a_diff(spawn: Callable[..., Agent], workdir: Path) -> None:
    (workdir / "hello.py").write_text(HELLO, encoding="utf-8")
    agent = spawn(PROMPTS, "stdio")
    before, asked = edit_until_asked(agent)
    call = next(b for b in assistant_blocks(before) if b["type"] == "tool_use")
    assert call["name"] == "Edit"
    assert call["input"] == {
        "file_path": str(workdir / "hello.py"),
        "old_string": 'def greet(name: str) -> str:\n    return f"Hello, {name}!"\n',
        "new_string": 'def greet(name: str) -> str:\n    return f"Hi there, {name}!"\n',
        "replace_all": False,
    }
    assert assistant_blocks(before)[0]["type"] == "thinking"  # it thinks first
    request = asked["request"]
    assert request["subtype"] == "can_use_tool" and request["tool_name"] == "Edit"
    assert request["input"] == call["input"] and request["tool_use_id"] == call["id"]
    assert request["blocked_path"] == str(workdir / "hello.py")
    assert (workdir / "hello.py").read_text() == HELLO  # nothing before the answer
    answer(agent, asked, {"behavior": "allow", "updatedInput": call["input"]})
    after = agent.until(is_result)

    block, line = tool_results(after)[0]
    assert block["tool_use_id"] == call["id"] and block["is_error"] is False
    assert "has been updated" in block["content"]
    patch = line["tool_use_result"]["structuredPatch"]
    assert patch == [
        {
            "oldStart": 1,
            "oldLines": 5,
            "newStart": 1,
            "newLines": 5,
            "lines": [
                " def greet(name: str) -> str:",
                '-    return f"Hello, {name}!"',
                '+    return f"Hi there, {name}!"',
                " ",
                " ",
                ' print(greet("demo"))',
            ],
        }
    ]
    assert (workdir / "hello.py").read_text() == HELLO.replace("Hello", "Hi there")
    result = after[-1]
    assert result["subtype"] == "success" and result["permission_denials"] == []
    assert "card above shows the diff" in result["result"]


def test_edit_denied_or_interrupted_changes_nothing(spawn: Callable[..., Agent], workdir: Path) -> None:
    (workdir / "hello.py").write_text(HELLO, encoding="utf-8")
    agent = spawn(PROMPTS, "stdio")
    _, asked = edit_until_asked(agent)
    answer(agent, asked, {"behavior": "deny", "message": "Not today"})
    after = agent.until(is_result)
    block, line = tool_results(after)[0]
    assert block == {
        "tool_use_id": asked["request"]["tool_use_id"],
        "type": "tool_result",
        "content": "Not today",
        "is_error": True,
    }
    assert line["tool_use_result"] == "Error: Not today"
    assert after[-1]["permission_denials"] == [
        {"tool_name": "Edit", "tool_use_id": asked["request"]["tool_use_id"], "tool_input": asked["request"]["input"]}
    ]
    assert "unchanged" in after[-1]["result"]

    _, asked = edit_until_asked(agent)
    agent.interrupt("req_int")
    after = agent.until(is_result)
    kinds = [(ln["type"], ln.get("request_id") or ln.get("response", {}).get("request_id")) for ln in after]
    assert ("control_cancel_request", asked["request_id"]) in kinds
    block, _ = tool_results(after)[0]
    assert block["is_error"] is True and "rejected" in block["content"]
    assert non_stream(after)[-2]["message"]["content"] == [
        {"type": "text", "text": "[Request interrupted by user for tool use]"}
    ]
    assert after[-1]["subtype"] == "error_during_execution" and after[-1]["terminal_reason"] == "aborted_tools"
    # A late answer to the withdrawn request is ignored.
    answer(agent, asked, {"behavior": "allow"})
    assert (workdir / "hello.py").read_text() == HELLO
    assert agent.turn("hello")[-1]["subtype"] == "success"


def test_edit_without_a_way_to_ask_is_refused_unless_the_mode_accepts_edits(
    spawn: Callable[..., Agent], workdir: Path, tmp_path: Path
) -> None:
    (workdir / "hello.py").write_text(HELLO, encoding="utf-8")
    lines = spawn().turn("edit hello.py")
    assert not [ln for ln in lines if ln["type"] == "control_request"]
    block, _ = tool_results(lines)[0]
    assert block["is_error"] is True and "--permission-prompt-tool stdio" in block["content"]
    assert (workdir / "hello.py").read_text() == HELLO

    for mode in ("plan", "dontAsk"):  # modes that never ask, even with a way to
        lines = spawn("--permission-mode", mode, PROMPTS, "stdio").turn("edit hello.py")
        assert not [ln for ln in lines if ln["type"] == "control_request"], mode
        assert tool_results(lines)[0][0]["is_error"] is True and mode in lines[-1]["result"]
    assert (workdir / "hello.py").read_text() == HELLO

    agent = spawn("--permission-mode", "acceptEdits")
    lines = agent.turn("edit alpha.txt")  # no "Hello": a comment goes on top
    block, _ = tool_results(lines)[0]
    assert block["is_error"] is False
    assert (workdir / "alpha.txt").read_text().startswith("# Edited by the agent-bridge demo agent.\nfirst line")
    for target in ("../outside.txt", "nosuch.txt", "subdir"):
        (tmp_path / "outside.txt").write_text("Hello", encoding="utf-8")
        lines = agent.turn(f"edit {target}")
        assert not tool_results(lines), target  # not even attempted
        assert "I can't edit" in lines[-1]["result"]
    assert (tmp_path / "outside.txt").read_text() == "Hello"


def test_an_allowed_edit_is_checked_again_as_the_host_changed_it(spawn: Callable[..., Agent], workdir: Path) -> None:
    (workdir / "hello.py").write_text(HELLO, encoding="utf-8")
    agent = spawn(PROMPTS, "stdio")
    _, asked = edit_until_asked(agent)
    changed = {**asked["request"]["input"], "new_string": "# the host's text\n"}
    answer(agent, asked, {"behavior": "allow", "updatedInput": changed})
    agent.until(is_result)
    assert (workdir / "hello.py").read_text() == '# the host\'s text\n\n\nprint(greet("demo"))\n'
    _, asked = edit_until_asked(agent, "edit alpha.txt")
    outside = {**asked["request"]["input"], "file_path": "/etc/hostname"}
    answer(agent, asked, {"behavior": "allow", "updatedInput": outside})
    after = agent.until(is_result)
    block, _ = tool_results(after)[0]
    assert block["is_error"] is True and "outside the working directory" in block["content"]


def test_run_shows_output_and_exit_status_of_a_fixed_command_set(spawn: Callable[..., Agent], workdir: Path) -> None:
    agent = spawn()
    lines = agent.turn("run wc -l alpha.txt")
    call = next(b for b in assistant_blocks(lines) if b["type"] == "tool_use")
    assert call["name"] == "Bash" and call["input"]["command"] == "wc -l alpha.txt"
    block, line = tool_results(lines)[0]
    assert block["is_error"] is False and block["content"].split() == ["2", "alpha.txt"]
    assert line["tool_use_result"] == {
        "stdout": block["content"],
        "stderr": "",
        "interrupted": False,
        "isImage": False,
        "noOutputExpected": False,
    }
    assert "exited with status 0" in lines[-1]["result"]

    lines = agent.turn("run git status")  # not a repository (or no git at all): it fails
    block, line = tool_results(lines)[0]
    assert block["is_error"] is True
    code = int(block["content"].split("\n")[0].removeprefix("Exit code "))
    assert code in (127, 128) and f"exited with status {code}" in lines[-1]["result"]

    for text in ("run rm -rf .", "run ls; touch pwned", "run wc -l ../x", "run python3 hello.py", "$ sh -c id"):
        lines = agent.turn(text)
        assert not tool_results(lines), text
    assert not (workdir / "pwned").exists()


def test_think_and_code_stream_a_thinking_block_and_a_fenced_block(spawn: Callable[..., Agent]) -> None:
    agent = spawn()
    lines = agent.turn("think")
    starts = [e["content_block"]["type"] for e in events(lines, "content_block_start")]
    assert starts == ["thinking", "text"]
    deltas = [e["delta"]["type"] for e in events(lines, "content_block_delta")]
    assert "thinking_delta" in deltas and deltas.index("signature_delta") < deltas.index("text_delta")
    first, second = assistant_blocks(lines)
    assert first["type"] == "thinking" and first["thinking"] and first["signature"]
    assert second["type"] == "text" and lines[-1]["result"] == second["text"]
    thought = "".join(e["delta"].get("thinking", "") for e in events(lines, "content_block_delta"))
    assert thought == first["thinking"]

    lines = agent.turn("code")
    assert "```python\ndef fizzbuzz" in lines[-1]["result"]


def test_task_runs_a_sub_agent_whose_lines_carry_the_task_call_id(spawn: Callable[..., Agent]) -> None:
    agent = spawn()
    lines = agent.turn("task", timeout=30)
    task = next(b for b in assistant_blocks(lines) if b["type"] == "tool_use")
    assert task["name"] == "Task" and task["input"]["subagent_type"] == "general-purpose"
    parent = task["id"]
    system = [ln for ln in lines if ln["type"] == "system" and ln["subtype"].startswith("task_")]
    assert system[0]["subtype"] == "task_started"
    assert {ln["tool_use_id"] for ln in system if "tool_use_id" in ln} == {parent}
    progress = [ln for ln in system if ln["subtype"] == "task_progress"]
    assert [p["summary"] for p in progress] == ["Listing the files", "Reading alpha.txt", "Reading beta.py"]
    assert [p["usage"]["tool_uses"] for p in progress] == [1, 2, 3]
    assert all(p["description"] == task["input"]["description"] for p in progress)
    done = system[-1]
    assert done["subtype"] == "task_notification" and done["status"] == "completed"

    inner = [ln for ln in lines if ln.get("parent_tool_use_id") == parent]
    assert inner[0]["type"] == "user" and inner[0]["message"]["content"][0]["text"] == task["input"]["prompt"]
    assert not [ln for ln in inner if ln["type"] == "stream_event"]  # a sub-agent's messages come whole
    calls = [ln["message"]["content"][0] for ln in inner if ln["type"] == "assistant"]
    assert [c["name"] for c in calls if c["type"] == "tool_use"] == ["ListFiles", "ReadFile", "ReadFile"]
    report = calls[-1]["text"]
    assert "alpha.txt has 2 lines" in report
    block, line = next((b, ln) for b, ln in tool_results(lines) if b["tool_use_id"] == parent)
    assert line["parent_tool_use_id"] is None and block["content"] == [{"type": "text", "text": report}]
    assert line["tool_use_result"]["status"] == "completed"
    assert lines[-1]["result"] == f"The sub-agent reports: {report}"


def test_an_interrupted_sub_agent_is_stopped(spawn: Callable[..., Agent]) -> None:
    agent = spawn()
    agent.prompt("task")
    agent.until(lambda ln: ln.get("subtype") == "task_progress")
    agent.interrupt("req_stop")
    lines = agent.until(is_result)
    stopped = next(ln for ln in lines if ln.get("subtype") == "task_notification")
    assert stopped["status"] == "stopped"
    assert lines[-1]["terminal_reason"] == "aborted_tools"
    assert agent.turn("hello")[-1]["subtype"] == "success"


def test_tour_does_everything_in_one_turn(spawn: Callable[..., Agent], workdir: Path) -> None:
    (workdir / "hello.py").write_text(HELLO, encoding="utf-8")
    agent = spawn("--permission-mode", "acceptEdits")
    lines = agent.turn("tour", timeout=60)
    blocks = assistant_blocks([ln for ln in lines if ln.get("parent_tool_use_id") is None])
    assert blocks[0]["type"] == "thinking"
    assert [b["name"] for b in blocks if b["type"] == "tool_use"] == ["Edit", "Bash", "Task"]
    assert all(not b["is_error"] for b, ln in tool_results(lines) if ln.get("parent_tool_use_id") is None)
    assert "Hi there" in (workdir / "hello.py").read_text()
    assert "```python\ndef greet(name: str) -> str:" in lines[-1]["result"] and lines[-1]["num_turns"] == 4
    assert sum(ln.get("subtype") == "task_progress" for ln in lines) == 2  # the files, then one of them


def test_shell_commands_are_a_fixed_list_never_a_shell(demo: ModuleType, workdir: Path) -> None:
    cwd = str(workdir)
    assert demo.shell_command(cwd, "") == ("ls -l", ["ls", "-l"])
    assert demo.shell_command(cwd, "ls -la") == ("ls -la", ["ls", "-la"])
    assert demo.shell_command(cwd, "wc -l")[1] == ["wc", "-l", "alpha.txt", "beta.py"]
    assert demo.shell_command(cwd, "git log")[0] == "git log --oneline -5"
    for text in ("ls -R /", "ls $(id)", "wc -l -", "cat alpha.txt", "git push", "python3 -c 1", "date; id"):
        with contextlib.suppress(demo.ToolError):
            assert demo.shell_command(cwd, text) is None, text
    assert demo.shell_result(0, "", "") == (
        "(Bash completed with no output)",
        False,
        {"stdout": "", "stderr": "", "interrupted": False, "isImage": False, "noOutputExpected": False},
    )
    assert demo.shell_result(2, "out", "err")[:2] == ("Exit code 2\nout\nerr", True)
    assert demo.run_shell(cwd, ["no-such-command-x"])[0] == 127
