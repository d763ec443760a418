"""The AWP Agent CLI contract, checked where no process boundary is crossed: the awp-jsonl
codec and the conversation core, synchronously (issue #17 item 6). The e2e half, with the
strict fake agent behind a real daemon, is tests/test_awp_contract_e2e.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bridge.protocols.codec import Fatal
from bridge.protocols.codecs import make_codec
from bridge.protocols.events import Record
from bridge.protocols.framing import MAX_LINE_BYTES, LineFramer, LineTooLong
from bridge.sessions.actions import Emit, Limits, Stop, Write
from bridge.sessions.core import ConversationCore

pytestmark = pytest.mark.timeout(5)


class Run:
    """A core on an awp-jsonl codec, with its Emits numbered as a store would."""

    def __init__(self) -> None:
        self.core = ConversationCore(
            last_seq=0,
            native_session_id=None,
            options={},
            limits=Limits(max_pending_prompts=2, interrupt_timeout_s=2, permission_timeout_s=5),
        )
        self.records: list[Record] = []
        self.writes: list[str] = []
        self.stops: list[Stop] = []
        self.step(self.core.process_started(make_codec("awp-jsonl"), 1, 1, None))

    def step(self, actions: list[Any]) -> list[Record]:
        new: list[Record] = []
        todo = list(actions)
        while todo:
            a = todo.pop(0)
            if isinstance(a, Emit):
                records = [
                    Record(self.core.last_seq + i + 1, "t", e.source, e.kind, dict(e.data), e.raw, e.relay)
                    for i, e in enumerate(a.events)
                ]
                self.core.last_seq += len(records)
                new += records
                if a.committed:
                    todo[0:0] = a.committed(records)
            elif isinstance(a, Write):
                self.writes.append(a.line)
            elif isinstance(a, Stop):
                self.stops.append(a)
        self.records += new
        return new

    def prompt(self, text: str) -> str:
        acc, actions = self.core.prompt([{"type": "text", "text": text}], None)
        self.step(actions)
        return acc.turn_id

    def agent(self, *lines: dict[str, Any] | str) -> list[Record]:
        codec = self.core.codec
        assert codec is not None
        raw = [(ln if isinstance(ln, str) else json.dumps(ln)).encode() for ln in lines]
        return self.step(self.core.agent_output([codec.decode(b) for b in raw]))

    def ends(self, turn_id: str) -> list[Record]:
        return [r for r in self.records if r.kind == "turn.ended" and r.data.get("turn_id") == turn_id]


DELTA = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}}
SUCCESS = {"type": "result", "subtype": "success", "is_error": False, "session_id": "s1"}
STARTUP_ERROR = {"type": "result", "subtype": "startup_error", "is_error": True, "result": "unsupported_argument:--x"}


def test_the_first_line_the_bridge_writes_is_the_prompt_and_it_precedes_any_output() -> None:
    run = Run()
    # No handshake: nothing is written before the prompt, and the prompt goes at once.
    assert run.writes == [] and run.core.codec is not None and run.core.codec.start() == []
    run.prompt("hello")
    assert [json.loads(w) for w in run.writes] == [
        {"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": "hello"}]}}
    ]


def test_output_before_the_first_input_is_recorded_but_never_ends_a_turn() -> None:
    # The contract forbids a response before the first input line; one that comes anyway is
    # kept in the transcript as it is, and a terminal line then belongs to no turn.
    run = Run()
    early = run.agent({"type": "system", "subtype": "init", "session_id": "s1"}, SUCCESS)
    assert [r.kind for r in early] == ["session.started", "agent.other"]
    assert early[1].data["unsolicited"] == "turn.ended"
    turn = run.prompt("hello")
    run.agent(DELTA)
    assert run.ends(turn) == [] and run.core.active is not None
    run.agent(SUCCESS)
    assert [r.data["status"] for r in run.ends(turn)] == ["success"]


def test_exactly_one_terminal_event_per_accepted_turn_and_message_stop_is_one() -> None:
    run = Run()
    first = run.prompt("one")
    second = run.prompt("two")  # queued behind the first
    run.agent(DELTA, {"type": "content_block_stop", "index": 0}, {"type": "message_stop"})
    assert [r.data["stop_reason"] for r in run.ends(first)] == ["message_stop"]
    assert run.core.active is not None and run.core.active.turn_id == second  # the next prompt went
    run.agent(SUCCESS)
    late = run.agent(SUCCESS, {"type": "message_stop"})  # no turn is pending any more
    assert [r.kind for r in late] == ["agent.other", "agent.other"]
    assert len(run.ends(first)) == len(run.ends(second)) == 1
    # An exit after the terminal event ends nothing more.
    run.step(run.core.process_exited(1, 0, None))
    assert len(run.ends(first)) == len(run.ends(second)) == 1


def test_an_exit_before_the_terminal_event_is_a_mid_turn_failure() -> None:
    run = Run()
    turn = run.prompt("one")
    run.agent(DELTA)
    run.step(run.core.process_exited(1, 3, None))
    (end,) = run.ends(turn)
    assert end.source == "bridge" and end.data["status"] == "error" and "crashed" in end.data["error"]


def test_malformed_stdout_lines_are_not_rendered() -> None:
    run = Run()
    turn = run.prompt("one")
    out = run.agent("not json", "[1,2]", '"text"', '{"type": "assistant", "message": ', DELTA)
    assert [r.kind for r in out] == ["diagnostic"] * 4 + ["message.delta"]
    for r in out[:4]:
        # Recorded for diagnosis (the bridge's words, the line cut short), never as agent text.
        assert r.data["stream"] == "protocol" and r.raw is None and not r.relay
    assert run.core.active is not None and run.core.active.turn_id == turn


def test_a_startup_error_ends_the_turn_with_its_reason_and_the_exit_is_a_failed_start() -> None:
    run = Run()
    turn = run.prompt("hello")
    queued = run.prompt("again")
    codec = run.core.codec
    assert codec is not None
    decoded = codec.decode(json.dumps(STARTUP_ERROR).encode())
    assert decoded.control == [Fatal("startup_error", "unsupported_argument:--x")]
    run.agent(STARTUP_ERROR)
    (end,) = run.ends(turn)
    assert end.data["status"] == "error" and end.data["error"] == "unsupported_argument:--x"
    assert end.data["error_code"] == "startup_error"
    notice = next(r for r in run.records if r.kind == "notice")
    assert notice.data == {
        "code": "startup_error",
        "text": "the agent could not start: unsupported_argument:--x",
        "error": "unsupported_argument:--x",
    }
    assert [s.reason for s in run.stops] == ["startup_error"]
    # The agent exits 1 on its own: the exit names the failed start and its cause.
    out = run.step(run.core.process_exited(1, 1, None))
    exited = next(r for r in out if r.kind == "process.exited")
    assert exited.data == {
        "pid": 1,
        "code": 1,
        "signal": None,
        "reason": "startup_error",
        "error": "unsupported_argument:--x",
    }
    (never,) = run.ends(queued)
    assert never.data["error"] == "not started: agent process ended (startup_error)"


def test_a_startup_error_with_no_turn_open_still_names_the_failed_start() -> None:
    run = Run()  # started by POST …/resume: no prompt yet
    run.agent({"type": "result", "subtype": "startup_error", "is_error": True})  # no reason given
    assert [r.kind for r in run.records[-2:]] == ["agent.other", "notice"]
    assert run.records[-1].data["error"] == "startup_error"
    out = run.step(run.core.process_exited(1, 1, None))
    assert next(r for r in out if r.kind == "process.exited").data["reason"] == "startup_error"


def test_a_later_stop_is_not_blamed_on_a_failed_start() -> None:
    run = Run()
    run.agent(STARTUP_ERROR)
    run.core.stopping("stopped")  # the user stopped it first
    out = run.step(run.core.process_exited(1, None, 15))
    assert "error" not in next(r for r in out if r.kind == "process.exited").data


def test_an_unbroken_stdout_buffer_over_4_mib_ends_the_runtime_with_a_clear_reason() -> None:
    framer = LineFramer()
    assert MAX_LINE_BYTES == 4 * 1024 * 1024
    assert framer.feed(b"x" * MAX_LINE_BYTES) == []  # at the cap: still one line to come
    with pytest.raises(LineTooLong) as caught:
        framer.feed(b"x")
    run = Run()
    turn = run.prompt("huge")
    run.step(run.core.line_too_long(str(caught.value)))
    diag = run.records[-1]
    assert diag.kind == "diagnostic" and diag.source == "bridge" and "4194304 bytes" in diag.data["text"]
    assert [s.reason for s in run.stops] == ["line_too_long"]
    run.step(run.core.process_exited(1, None, 15))
    (end,) = run.ends(turn)
    assert end.data["status"] == "error" and end.data["error"] == "agent process ended: line_too_long"
