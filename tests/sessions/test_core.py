"""The conversation core alone: synchronous, no loop, the clock injected. Inputs in,
actions out."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bridge.errors import Busy, Conflict
from bridge.protocols.codecs import make_codec
from bridge.protocols.events import Record
from bridge.sessions.actions import ArmTimer, CancelTimer, Emit, Limits, Stop, Write
from bridge.sessions.core import ConversationCore

pytestmark = pytest.mark.timeout(5)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(protocol: str = "stream-json", **options: Any) -> tuple[ConversationCore, Clock]:
    clock = Clock()
    core = ConversationCore(
        last_seq=0,
        native_session_id=None,
        options=options,
        limits=Limits(max_pending_prompts=1, interrupt_timeout_s=2, permission_timeout_s=5),
        clock=clock,
    )
    core.process_started(make_codec(protocol), 1, 1, None)
    return core, clock


def commit(core: ConversationCore, actions: list[Any]) -> list[Any]:
    """Perform Emits as a store would (numbering them), returning every other action."""
    rest: list[Any] = []
    todo = list(actions)
    while todo:
        a = todo.pop(0)
        if isinstance(a, Emit):
            records = [
                Record(core.last_seq + i + 1, "t", e.source, e.kind, e.data, e.raw, e.relay)
                for i, e in enumerate(a.events)
            ]
            core.last_seq += len(records)
            rest.append(("emit", [r.kind for r in records]))
            if a.committed:
                todo[0:0] = a.committed(records)
        else:
            rest.append(a)
    return rest


def decode(core: ConversationCore, *objs: dict[str, Any]) -> list[Any]:
    assert core.codec is not None
    return commit(core, core.agent_output([core.codec.decode(json.dumps(o).encode()) for o in objs]))


def prompt(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}]


def test_a_prompt_with_nothing_ahead_starts_its_turn_in_one_emit_then_is_written() -> None:
    core, _ = make()
    acc, actions = core.prompt(prompt("hi"), None)
    out = commit(core, actions)
    assert out[0] == ("emit", ["message", "turn.started"]) and isinstance(out[1], Write)
    assert acc.seq == 1 and not acc.queued and core.active is not None


def test_a_full_queue_is_busy_and_queued_prompts_start_in_order_when_the_turn_ends() -> None:
    core, _ = make()
    _, a = core.prompt(prompt("one"), None)
    commit(core, a)
    second, a = core.prompt(prompt("two"), None)
    assert second.queued and commit(core, a) == [("emit", ["message"])]
    with pytest.raises(Busy):
        core.prompt(prompt("three"), None)
    out = decode(core, {"type": "result", "subtype": "success"})
    assert out[0] == ("emit", ["turn.ended"]) and out[1] == ("emit", ["turn.started"]) and isinstance(out[2], Write)
    assert core.active is not None and core.active.turn_id == second.turn_id


def test_exit_ends_the_active_and_every_queued_turn_exactly_once() -> None:
    core, _ = make()
    commit(core, core.prompt(prompt("one"), None)[1])
    commit(core, core.prompt(prompt("two"), None)[1])
    core.stopping("stopped")
    out = commit(core, core.process_exited(1, 0, None))
    assert out == [("emit", ["process.exited", "turn.ended", "turn.ended"])]
    assert not core.busy and core.codec is None
    assert commit(core, core.process_exited(1, 0, None)) == [("emit", ["process.exited"])]  # nothing ends twice


def test_a_stored_prompt_that_failed_leaves_no_turn_behind() -> None:
    core, _ = make()
    acc, _ = core.prompt(prompt("one"), None)
    core.prompt_failed(acc.turn_id)
    assert not core.busy


def test_a_permission_deadline_is_armed_on_commit_and_denies_once_expired() -> None:
    core, clock = make(permission_prompts=True)
    commit(core, core.prompt(prompt("ask"), None)[1])
    req = {"subtype": "can_use_tool", "tool_name": "Bash", "input": {}}
    out = decode(core, {"type": "control_request", "request_id": "p1", "request": req})
    assert ArmTimer("permission:p1", 5) in out and len(core.permissions) == 1
    clock.now += 4.9
    assert core.timer_fired("permission:p1") == []  # early (a stale timer): nothing happens
    clock.now += 0.2
    out = commit(core, core.timer_fired("permission:p1"))
    assert ("emit", ["permission.resolved", "client.other"]) in out
    assert json.loads(next(a for a in out if isinstance(a, Write)).line)["response"]["response"]["behavior"] == "deny"
    with pytest.raises(Conflict):
        core.answer("p1", "allow", channel="late")


def test_an_interrupt_is_idempotent_and_its_timeout_stops_the_process() -> None:
    core, _ = make()
    commit(core, core.prompt(prompt("one"), None)[1])
    active, actions = core.interrupt()
    out = commit(core, actions)
    assert active and ArmTimer("interrupt", 2) in out and sum(isinstance(a, Write) for a in out) == 1
    assert core.interrupt() == (True, [])
    out = commit(core, core.timer_fired("interrupt"))
    assert out[0] == ("emit", ["notice"]) and out[1] == Stop("interrupt_timeout")
    assert core.exit_reason == "interrupt_timeout"


def test_an_agent_ending_the_turn_after_an_interrupt_cancels_the_timer_and_reads_as_cancelled() -> None:
    core, _ = make()
    commit(core, core.prompt(prompt("one"), None)[1])
    commit(core, core.interrupt()[1])
    out = decode(core, {"type": "result", "subtype": "error_during_execution", "is_error": True})
    assert CancelTimer("interrupt") in out and core.active is None


def test_awp_jsonl_interrupts_by_stopping_the_process() -> None:
    core, _ = make("awp-jsonl")
    commit(core, core.prompt(prompt("one"), None)[1])
    assert commit(core, core.interrupt()[1]) == [Stop("interrupted")]
    core.stopping("interrupted")
    ended = turn_end(core.process_exited(1, None, 15))
    assert ended["status"] == "cancelled" and ended["reason"] == "interrupted" and "error" not in ended
    assert ended["exit"]["reason"] == "interrupted"


def turn_end(actions: list[Any]) -> dict[str, Any]:
    (end,) = [e for a in actions if isinstance(a, Emit) for e in a.events if e.kind == "turn.ended"]
    return dict(end.data)


def test_an_agent_that_ignores_an_interrupt_is_stopped_and_its_turn_reads_as_interrupted() -> None:
    core, _ = make()
    commit(core, core.prompt(prompt("one"), None)[1])
    commit(core, core.interrupt()[1])
    commit(core, core.timer_fired("interrupt"))
    ended = turn_end(core.process_exited(1, None, 9))
    assert ended["status"] == "cancelled" and ended["reason"] == "interrupted" and "error" not in ended
    assert ended["exit"]["reason"] == "interrupt_timeout"


def test_a_crash_still_ends_the_turn_as_an_error_with_the_reason() -> None:
    core, _ = make()
    commit(core, core.prompt(prompt("one"), None)[1])
    ended = turn_end(core.process_exited(1, 1, None))
    assert ended["status"] == "error" and ended["error"] == "agent process ended: crashed" and "reason" not in ended


def test_acp_prompts_wait_for_the_handshake_and_an_interrupt_resolves_pending_permissions() -> None:
    core, _ = make("acp")
    acc, actions = core.prompt(prompt("one"), None)
    assert acc.queued is False and commit(core, actions) == [("emit", ["message"])]  # held until ready
    codec = core.codec
    assert codec is not None and not codec.ready
    out = decode(core, {"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": 1, "agentCapabilities": {}}})
    out += decode(core, {"jsonrpc": "2.0", "id": 1, "result": {"sessionId": "s1"}})
    assert ("emit", ["turn.started", "client.other"]) in out  # written once the session is open
    decode(
        core,
        {
            "jsonrpc": "2.0",
            "id": 9,
            "method": "session/request_permission",
            "params": {
                "sessionId": "s1",
                "toolCall": {"toolCallId": "t1"},
                "options": [{"optionId": "a", "kind": "allow_once"}],
            },
        },
    )
    assert len(core.permissions) == 1
    out = commit(core, core.interrupt()[1])
    assert ("emit", ["permission.resolved"]) in out and len(core.permissions) == 0


def test_an_exit_after_a_failed_start_ends_the_turn_with_the_agents_reason_whatever_came_first() -> None:
    # The agent's startup_error result can be read before the turn it would end has
    # started (it is written before any input); the exit that follows still says why.
    core, _ = make("awp-jsonl")
    commit(core, core.prompt(prompt("one"), None)[1])
    core.exit_reason, core.exit_error = "startup_error", ("startup_error", "unsupported_argument:--bogus")
    ended = turn_end(core.process_exited(1, 1, None))
    assert ended["status"] == "error" and ended["error"] == "unsupported_argument:--bogus"
    assert ended["error_code"] == "startup_error" and ended["exit"]["error"] == "unsupported_argument:--bogus"


def test_a_model_switch_stops_at_the_turn_boundary_and_carries_the_prompts_sent_meanwhile() -> None:
    core, _ = make()
    core.limits = Limits(max_pending_prompts=3)
    commit(core, core.prompt(prompt("one"), None)[1])
    out = commit(core, core.switch_model("m2", "m1", "ann"))
    assert out == [("emit", ["notice"])]  # the running turn goes on: no stop yet
    acc, actions = core.prompt(prompt("two"), None)
    assert acc.queued and not [a for a in commit(core, actions) if isinstance(a, Write)]  # not for the old process
    out = decode(core, {"type": "result", "subtype": "success", "is_error": False, "result": "done"})
    assert [a for a in out if isinstance(a, Write)] == []
    [stop] = [a for a in out if isinstance(a, Stop)]
    assert stop.reason == "model_changed" and stop.resume_queue
    assert commit(core, core.switch_model("m3", "m2", None))[1:] == []  # one stop, however many switches
    # Its exit ends nothing queued: "two" waits for the next process, encoded by its codec.
    out = commit(core, core.process_exited(1, 0, None))
    assert out == [("emit", ["process.exited"])] and [t.line for t in core.queue] == [None]
    out = commit(core, core.process_started(make_codec("stream-json"), 2, 2, "sess"))
    assert out[0] == ("emit", ["process.started"]) and ("emit", ["turn.started", "client.other"]) in out
    assert isinstance(out[-1], Write) and core.active is not None and not core.switching


def test_an_idle_switch_stops_now_and_a_failed_restart_ends_what_waited() -> None:
    core, _ = make()
    actions = core.switch_model("m2", None, None)
    assert isinstance(actions[0], Emit) and actions[0].fields == {"model": "m2"}
    assert [a.reason for a in actions if isinstance(a, Stop)] == ["model_changed"]
    acc, queued = core.prompt(prompt("late"), None)  # sent while it stops
    commit(core, queued)
    assert acc.queued and len(core.queue) == 1
    commit(core, core.process_exited(1, 0, None))
    assert commit(core, core.queue_not_started("the agent could not start again (x)")) == [("emit", ["turn.ended"])]
    assert not core.queue and not core.busy
    # With no process, the switch is only recorded: the next start uses the new launch.
    assert [type(a) for a in core.switch_model("m3", "m2", None)] == [Emit]
