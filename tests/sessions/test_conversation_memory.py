"""The conversation's logic through its real asyncio shell, with the in-memory agent and
store of tests/support/memory.py instead of a process and SQLite: milliseconds a test.
(What crosses a real process, socket or browser stays in the e2e tests.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_until
from support.memory import MemoryAgent, MemoryStore, Spawner

from bridge.config import AgentProfile, ServerSettings, Settings
from bridge.errors import Busy, Conflict, InvalidRequest, NotFound
from bridge.sessions.conversation import Conversation
from bridge.sessions.history import Compactor
from bridge.sessions.local_port import LocalPort
from bridge.sessions.modes import ModeRefused
from bridge.sessions.registry import Registry

pytestmark = pytest.mark.timeout(10)


def result(status: str = "success", **extra: Any) -> dict[str, Any]:
    sub = "success" if status == "success" else "error_during_execution"
    return {"type": "result", "subtype": sub, "is_error": status != "success", "session_id": "sess-1", **extra}


def assistant(text: str) -> dict[str, Any]:
    return {
        "type": "assistant",
        "message": {"id": "m1", "role": "assistant", "content": [{"type": "text", "text": text}]},
    }


def echo(agent: MemoryAgent, msg: dict[str, Any]) -> None:
    """A stream-json agent: echoes a prompt and ends the turn, except 'slow' (waits for
    an interrupt), 'ask' (asks permission first), 'silent' (says nothing)."""
    if msg.get("type") == "user":
        text = "".join(b.get("text", "") for b in msg["message"]["content"])
        if text == "slow":
            agent.say(
                {
                    "type": "stream_event",
                    "event": {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "…"}},
                }
            )
        elif text == "ask":
            req = {"subtype": "can_use_tool", "tool_name": "Bash", "input": {"command": "ls"}}
            agent.say({"type": "control_request", "request_id": f"p{len(agent.written)}", "request": req})
        elif text != "silent":
            agent.say(
                {"type": "system", "subtype": "init", "session_id": "sess-1"}, assistant(f"echo: {text}"), result()
            )
    elif msg.get("type") == "control_request" and msg["request"]["subtype"] == "interrupt":
        agent.say(result("error", terminal_reason="aborted_streaming"))
    elif msg.get("type") == "control_response":
        agent.say(assistant("done"), result())


class Harness:
    def __init__(self, tmp: Path, *, server: dict[str, Any] | None = None, protocol: str = "stream-json", **prof: Any):
        profile = AgentProfile(name="fake", protocol=protocol, executable="/usr/bin/true", **prof)
        self.settings = Settings(
            data_dir=tmp, server=ServerSettings(**(server or {})), agents={"fake": profile}, default_agent="fake"
        )
        self.store = MemoryStore()
        self.spawner = Spawner(echo)
        self.registry = Registry(self.settings, self.store, spawn=self.spawner)

    async def thread(self, **options: Any) -> Conversation:
        return await self.registry.create(agent="fake", cwd=None, model=None, title=None, options=options)

    def events(self, conv: Conversation, kind: str | None = None) -> list[Any]:
        return [r for r in self.store.events[conv.id] if kind is None or r.kind == kind]

    async def until(self, conv: Conversation, kind: str, count: int = 1, **data: Any) -> list[Any]:
        async with asyncio.timeout(5):
            while True:
                found = [r for r in self.events(conv, kind) if all(r.data.get(k) == v for k, v in data.items())]
                if len(found) >= count:
                    return found
                await conv.wait_beyond(conv.core.last_seq, 1.0)


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    harness = Harness(tmp_path)
    yield harness
    await harness.registry.shutdown()


def prompt(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}]


# ---------------------------------------------------------------------- turns


async def test_a_turn_is_written_once_and_ends_once_with_the_agents_result(h: Harness) -> None:
    conv = await h.thread()
    acc = await LocalPort(conv).submit(prompt("hello"), None)
    [end] = await h.until(conv, "turn.ended")
    assert end.data["turn_id"] == acc.turn_id and end.data["status"] == "success"
    started = h.events(conv, "turn.started")[0]
    assert started.data["prompt_seq"] == acc.seq == h.events(conv, "message")[0].seq
    assert [json.loads(x)["type"] for x in h.spawner.agent.written] == ["user"]
    assert conv.thread["native_session_id"] == "sess-1" and not conv.turn_active


async def test_prompts_during_a_turn_are_queued_in_order_then_refused_when_full(h: Harness) -> None:
    conv = await h.thread()
    first = await LocalPort(conv).submit(prompt("slow"), None)
    queued = [await LocalPort(conv).submit(prompt(f"queued {i}"), None) for i in range(5)]
    assert all(q.queued for q in queued)
    with pytest.raises(Busy):
        await LocalPort(conv).submit(prompt("one too many"), None)
    assert await LocalPort(conv).interrupt() is True
    await h.until(conv, "turn.ended", turn_id=first.turn_id)
    ends = await h.until(conv, "turn.ended", 6)
    assert [e.data["turn_id"] for e in ends[1:]] == [q.turn_id for q in queued]
    assert all(e.data["status"] == "success" for e in ends[1:])
    texts = [r.data["text"] for r in h.events(conv, "message") if r.source == "agent"]
    assert texts == [f"echo: queued {i}" for i in range(5)]


async def test_client_id_makes_a_prompt_idempotent(h: Harness) -> None:
    conv = await h.thread()
    first = await LocalPort(conv).submit(prompt("only once"), "c-1")
    await h.until(conv, "turn.ended")
    again = await LocalPort(conv).submit(prompt("only once"), "c-1")
    assert again.duplicate and again.seq == first.seq
    twins = await asyncio.gather(
        LocalPort(conv).submit(prompt("twin"), "c-2"), LocalPort(conv).submit(prompt("twin"), "c-2")
    )
    assert sorted(t.duplicate for t in twins) == [False, True] and twins[0].seq == twins[1].seq
    written = [x for x in h.spawner.agent.written if "only once" in x or "twin" in x]
    assert len(written) == 2


async def test_terminal_line_with_no_turn_pending_is_recorded_not_assigned(h: Harness) -> None:
    conv = await h.thread()
    await LocalPort(conv).submit(prompt("hello"), None)
    await h.until(conv, "turn.ended")
    h.spawner.agent.say(result())  # after a background task: no turn is pending
    [stray] = await h.until(conv, "agent.other")
    assert stray.data["unsolicited"] == "turn.ended" and json.loads(stray.raw)["type"] == "result"
    acc = await LocalPort(conv).submit(prompt("next one"), None)
    ends = await h.until(conv, "turn.ended", 2)
    assert ends[1].data["turn_id"] == acc.turn_id
    assert [r.data["text"] for r in h.events(conv, "message") if r.source == "agent"][-1] == "echo: next one"


async def test_agent_exit_mid_turn_ends_active_and_queued_turns_once_each(h: Harness) -> None:
    conv = await h.thread()
    first = await LocalPort(conv).submit(prompt("silent"), None)
    second = await LocalPort(conv).submit(prompt("never written"), None)
    assert second.queued
    h.spawner.agent.say({"type": "system", "subtype": "init", "session_id": "sess-1"})
    h.spawner.agent.say_stderr("crashing on purpose")
    h.spawner.agent.exit(3)
    ends = await h.until(conv, "turn.ended", 2)
    assert [e.data["turn_id"] for e in ends] == [first.turn_id, second.turn_id]
    assert all(e.data["status"] == "error" for e in ends) and "crashed" in ends[0].data["error"]
    [exited] = h.events(conv, "process.exited")
    assert exited.data["code"] == 3 and exited.data["reason"] == "crashed"
    assert any("crashing on purpose" in r.data["text"] for r in h.events(conv, "diagnostic"))
    assert not any("never written" in x for x in h.spawner.agents[0].written)
    # The next prompt starts the agent again, resuming its session.
    await LocalPort(conv).submit(prompt("again"), None)
    await h.until(conv, "turn.ended", 3)
    assert len(h.spawner.agents) == 2 and "--resume=sess-1" in h.spawner.agent.spec.argv


async def test_interrupt_that_the_agent_ignores_stops_it_after_the_timeout(tmp_path: Path) -> None:
    h = Harness(tmp_path, server={"interrupt_timeout_s": 0.05})
    h.spawner.script = lambda agent, msg: None  # an agent that never answers
    conv = await h.thread()
    acc = await LocalPort(conv).submit(prompt("anything"), None)
    assert await LocalPort(conv).interrupt() is True and await LocalPort(conv).interrupt() is True  # idempotent
    [end] = await h.until(conv, "turn.ended")
    assert end.data["turn_id"] == acc.turn_id and end.data["status"] == "cancelled"
    assert [r.data["code"] for r in h.events(conv, "notice")] == ["interrupt_timeout"]
    assert h.events(conv, "process.exited")[0].data["reason"] == "interrupt_timeout"
    interrupts = [x for x in h.spawner.agent.written if '"interrupt"' in x]
    assert len(interrupts) == 1
    await h.registry.shutdown()


async def test_interrupt_without_a_turn_is_false_and_writes_nothing(h: Harness) -> None:
    conv = await h.thread()
    await LocalPort(conv).submit(prompt("hello"), None)
    await h.until(conv, "turn.ended")
    assert await LocalPort(conv).interrupt() is False
    assert len(h.spawner.agent.written) == 1


# ---------------------------------------------------------------------- permissions


async def test_two_answers_racing_get_one_acceptance_and_one_write(tmp_path: Path) -> None:
    h = Harness(tmp_path, permission_prompts=True)
    conv = await h.thread()
    await LocalPort(conv).submit(prompt("ask"), None)
    [asked] = await h.until(conv, "permission.requested")
    rid = asked.data["request_id"]
    argv = h.spawner.agent.spec.argv
    assert argv[argv.index("--permission-prompt-tool") + 1] == "stdio"
    assert [p["request_id"] for p in conv.pending_permissions()] == [rid]
    assert conv.pending_permissions()[0]["seq"] == asked.seq
    results = await asyncio.gather(
        LocalPort(conv).answer_permission(rid, "allow", channel="a"),
        LocalPort(conv).answer_permission(rid, "deny", channel="b"),
        return_exceptions=True,
    )
    assert sum(isinstance(r, dict) for r in results) == 1
    [err] = [r for r in results if isinstance(r, BaseException)]
    assert isinstance(err, Conflict) and err.code == "already_resolved"
    answers = [json.loads(x) for x in h.spawner.agent.written if "control_response" in x]
    assert len(answers) == 1 and answers[0]["response"]["response"]["behavior"] == "allow"
    await h.until(conv, "turn.ended")
    assert conv.pending_permissions() == []
    with pytest.raises(NotFound):
        await LocalPort(conv).answer_permission("nope", "allow", channel="a")
    with pytest.raises(InvalidRequest):
        await LocalPort(conv).answer_permission(rid, "maybe", channel="a")


async def test_the_thread_row_counts_pending_permissions_as_they_open_and_close(tmp_path: Path) -> None:
    """The count is a row column (server-wide changes carry it), written in the commit that
    records why it changed: a request, an answer, a timeout, a withdrawal, an exit."""
    h = Harness(tmp_path, server={"permission_timeout_s": 0.2}, permission_prompts=True)
    conv = await h.thread()
    row = h.store.threads[conv.id]
    assert row["pending_permissions"] == 0
    for close in ("answer", "timeout", "withdraw", "exit"):
        n = len(h.events(conv, "permission.requested"))
        await LocalPort(conv).submit(prompt("ask"), None)
        [*_, asked] = await h.until(conv, "permission.requested", count=n + 1)
        assert row["pending_permissions"] == 1 == conv.thread["pending_permissions"], close
        rid = asked.data["request_id"]
        if close == "answer":
            await LocalPort(conv).answer_permission(rid, "allow", channel="a")
        elif close == "withdraw":
            await LocalPort(conv).interrupt()
            h.spawner.agent.say({"type": "control_cancel_request", "request_id": rid})
        elif close == "exit":
            h.spawner.agent.exit(1)
        await h.until(conv, "permission.resolved", request_id=rid)
        assert row["pending_permissions"] == 0 == conv.thread["pending_permissions"], close
        await h.until(conv, "turn.ended", count=n + 1)
    await h.registry.shutdown()


async def test_unanswered_prompt_is_denied_by_the_timeout(tmp_path: Path) -> None:
    h = Harness(tmp_path, server={"permission_timeout_s": 0.05}, permission_prompts=True)
    conv = await h.thread()
    await LocalPort(conv).submit(prompt("ask"), None)
    [resolved] = await h.until(conv, "permission.resolved")
    assert resolved.data["decision"] == "deny" and resolved.data["by"] == "timeout"
    answer = json.loads(next(x for x in h.spawner.agent.written if "control_response" in x))
    assert answer["response"]["response"] == {
        "behavior": "deny",
        "message": "No answer to the permission request in time",
    }
    with pytest.raises(Conflict):
        await LocalPort(conv).answer_permission(resolved.data["request_id"], "allow", channel="late")


async def test_prompts_off_means_denied_by_policy_at_once(h: Harness) -> None:
    conv = await h.thread()
    await LocalPort(conv).submit(prompt("ask"), None)
    [resolved] = await h.until(conv, "permission.resolved")
    assert resolved.data["by"] == "policy" and conv.pending_permissions() == []
    await h.until(conv, "turn.ended")
    assert "--permission-prompt-tool" not in h.spawner.agent.spec.argv


async def test_interrupt_while_a_prompt_is_pending_writes_no_answer(tmp_path: Path) -> None:
    h = Harness(tmp_path, permission_prompts=True)
    conv = await h.thread()
    await LocalPort(conv).submit(prompt("ask"), None)
    [asked] = await h.until(conv, "permission.requested")
    await LocalPort(conv).interrupt()
    # stream-json: the agent withdraws its own request (control_cancel_request)
    h.spawner.agent.say({"type": "control_cancel_request", "request_id": asked.data["request_id"]})
    [resolved] = await h.until(conv, "permission.resolved")
    assert resolved.data == {"request_id": asked.data["request_id"], "decision": "cancelled", "by": "agent"}
    [end] = await h.until(conv, "turn.ended")
    assert end.data["status"] == "cancelled"
    assert not any("control_response" in x for x in h.spawner.agent.written)
    with pytest.raises(Conflict, match="already resolved"):
        await LocalPort(conv).answer_permission(asked.data["request_id"], "allow", channel="late")


async def test_a_raw_control_response_takes_the_permission_flow(tmp_path: Path) -> None:
    h = Harness(tmp_path, permission_prompts=True)
    conv = await h.thread()
    await LocalPort(conv).submit(prompt("ask"), None)
    [asked] = await h.until(conv, "permission.requested")
    rid = asked.data["request_id"]
    raw = {
        "type": "control_response",
        "response": {"subtype": "success", "request_id": rid, "response": {"behavior": "deny", "message": "no"}},
    }
    await LocalPort(conv).write_raw(raw)
    [resolved] = await h.until(conv, "permission.resolved")
    assert resolved.data["by"] == "raw" and resolved.data["decision"] == "deny"
    with pytest.raises(Conflict):
        await LocalPort(conv).write_raw(raw)
    assert sum("control_response" in x for x in h.spawner.agent.written) == 1


# ---------------------------------------------------------------------- tasks, secrets, limits


async def test_task_events_build_the_task_table_and_late_ones_are_ignored(h: Harness) -> None:
    conv = await h.thread()
    await LocalPort(conv).submit(prompt("silent"), None)
    agent = h.spawner.agent
    agent.say({"type": "system", "subtype": "task_started", "task_id": "t1", "description": "sub"})
    agent.say({"type": "system", "subtype": "task_notification", "task_id": "t1", "status": "completed"})
    agent.say({"type": "system", "subtype": "task_notification", "task_id": "t1", "status": "failed"})
    await h.until(conv, "agent.other")
    [task] = conv.tasks.snapshot()
    assert task["task_id"] == "t1" and task["status"] == "completed"
    [ignored] = h.events(conv, "agent.other")
    assert ignored.data["task_event_ignored"] == "duplicate"
    assert json.loads(conv.thread["tasks"])


async def test_profile_secrets_never_reach_the_transcript(tmp_path: Path) -> None:
    h = Harness(tmp_path, env={"MY_API_KEY": "s3cr3t-value"})
    conv = await h.thread()
    await LocalPort(conv).submit(prompt("silent"), None)
    h.spawner.agent.say(assistant("the key is s3cr3t-value"))
    h.spawner.agent.say_stderr("stderr has s3cr3t-value too")
    await h.until(conv, "diagnostic")
    stored = "".join(r.envelope() for r in h.events(conv))
    assert "s3cr3t-value" not in stored and stored.count("[redacted]") >= 2


async def test_capacity_check_refuses_a_start_beyond_max_conversations(tmp_path: Path) -> None:
    h = Harness(tmp_path, server={"max_conversations": 1})
    one, two = await h.thread(), await h.thread()
    await LocalPort(one).submit(prompt("hello"), None)
    with pytest.raises(Exception, match="max_conversations"):
        await LocalPort(two).submit(prompt("hello"), None)
    assert len(h.spawner.agents) == 1
    await h.registry.shutdown()


async def test_a_store_that_refuses_the_prompt_leaves_no_turn_behind(h: Harness) -> None:
    conv = await h.thread()
    await conv.ensure_started()
    h.store.fail_appends = OSError("disk full")
    with pytest.raises(OSError):
        await LocalPort(conv).submit(prompt("hello"), None)
    assert not conv.busy
    h.store.fail_appends = None
    await LocalPort(conv).submit(prompt("hello"), None)
    await h.until(conv, "turn.ended")


async def test_stop_ends_the_process_and_the_thread_resumes(h: Harness) -> None:
    conv = await h.thread()
    await LocalPort(conv).submit(prompt("hello"), None)
    await h.until(conv, "turn.ended")
    await conv.stop()
    assert not conv.running and conv.thread["last_exit"]["reason"] == "stopped"
    await LocalPort(conv).submit(prompt("hello"), None)
    await h.until(conv, "turn.ended", 2)
    assert "--resume=sess-1" in h.spawner.agent.spec.argv


async def test_max_conversations_holds_under_concurrent_starts(tmp_path: Path) -> None:
    """Hardening II #2: the capacity check and the spawn are one step (was 50 of 50 spawned)."""
    h = Harness(tmp_path, server={"max_conversations": 3})
    threads = [await h.thread() for _ in range(12)]
    results = await asyncio.gather(
        *(LocalPort(t).submit(prompt("hello"), None) for t in threads), return_exceptions=True
    )
    refused = [r for r in results if isinstance(r, Exception)]
    assert len(h.spawner.agents) == 3 and len(refused) == 9
    assert all(getattr(r, "code", None) == "capacity" for r in refused)
    await h.registry.shutdown()


async def test_an_agent_that_closes_stdout_but_keeps_running_is_stopped_and_its_turn_ends(tmp_path: Path) -> None:
    """Hardening II #7: stdout EOF ends the protocol (the turn used to stay active forever)."""
    h = Harness(tmp_path, server={"stop_grace_s": 0.05})
    h.spawner.kw = {"exit_on_eof": False}
    conv = await h.thread()
    acc = await LocalPort(conv).submit(prompt("silent"), None)
    queued = await LocalPort(conv).submit(prompt("after"), None)
    h.spawner.agent.close_stdout()  # and keeps running
    ends = await h.until(conv, "turn.ended", 2)
    assert [e.data["turn_id"] for e in ends] == [acc.turn_id, queued.turn_id]
    assert "stdout_closed" in ends[0].data["error"] and ends[0].data["status"] == "error"
    assert not h.spawner.agent.alive and conv.thread["last_exit"]["reason"] == "stdout_closed"
    await h.registry.shutdown()


async def test_stop_works_while_the_store_cannot_write_and_is_recorded_after(h: Harness) -> None:
    """Hardening II #5: stop and PATCH used to hang for as long as the disk was full."""
    from bridge.errors import StoreError

    conv = await h.thread()
    await LocalPort(conv).submit(prompt("silent"), None)
    h.store.block_appends = asyncio.Event()
    h.store.healthy = False
    h.spawner.agent.say(assistant("this append waits for the disk"))
    async with asyncio.timeout(1):
        await h.store.blocked.wait()  # the reader is inside a blocked append, holding the lock
    assert conv.journal.lock.locked()
    async with asyncio.timeout(3):
        await conv.stop()
    assert not h.spawner.agent.alive
    with pytest.raises(StoreError, match="retry later"):
        await conv.set_fields({"title": "x"})
    h.store.healthy = True
    h.store.block_appends.set()
    [exited] = await h.until(conv, "process.exited")
    assert exited.data["reason"] == "stopped"
    [end] = await h.until(conv, "turn.ended")
    assert end.data["status"] == "cancelled"


async def test_the_history_is_kept_at_commit_so_a_first_read_reads_no_transcript(h: Harness) -> None:
    conv = await h.thread()
    for text in ("one", "two"):
        await LocalPort(conv).submit(prompt(text), None)
        await h.until(conv, "turn.ended", count=1 if text == "one" else 2)
    reads: list[int] = []
    read = h.store.read_events

    async def counting(thread_id: str, after: int, limit: int, **kw: Any) -> Any:
        page = await read(thread_id, after, limit, **kw)
        reads.append(len(page))
        return page

    h.store.read_events = counting  # type: ignore[method-assign]
    page = await conv.journal.history_page(None, 1000)
    items, last = page.items, page.last_seq
    assert reads == [] and last == conv.core.last_seq and not page.more  # kept at commit: nothing read
    rebuilt = Compactor()
    rebuilt.feed(h.store.events[conv.id])
    assert items == rebuilt.snapshot()
    assert [i["text"] for i in items if i["type"] == "message"] == ["one", "echo: one", "two", "echo: two"]


# ---------------------------------------------------------------------- session modes (ACP)

MODES = {"currentModeId": "default", "availableModes": [{"id": "default", "name": "D"}, {"id": "plan", "name": "P"}]}


def acp_agent(agent: MemoryAgent, msg: dict[str, Any]) -> None:
    """An ACP agent with modes: plan is accepted, 'die' makes it exit without answering,
    anything else is refused as claude-agent-acp refuses it."""
    method, rid = msg.get("method"), msg.get("id")
    if method == "initialize":
        agent.say({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": 1, "agentCapabilities": {}}})
    elif method == "session/new":
        agent.say({"jsonrpc": "2.0", "id": rid, "result": {"sessionId": "s1", "modes": MODES}})
    elif method == "session/set_mode":
        mode = msg["params"]["modeId"]
        if mode == "die":
            agent.exit(3)
        elif mode == "plan":
            agent.say({"jsonrpc": "2.0", "id": rid, "result": {}})
        else:
            err = {"code": -32603, "message": "Internal error", "data": {"details": "Invalid Mode"}}
            agent.say({"jsonrpc": "2.0", "id": rid, "error": err})


async def test_set_mode_starts_the_agent_waits_for_its_session_and_records_the_switch(tmp_path: Path) -> None:
    h = Harness(tmp_path, protocol="acp")
    h.spawner.script = acp_agent
    try:
        conv = await h.thread()
        assert await LocalPort(conv).set_mode("plan") == {"mode_id": "plan"}
        assert conv.thread["agent_info"]["modes"]["currentModeId"] == "plan"
        [switch] = [r for r in h.events(conv, "client.other") if r.data.get("op") == "set_mode"]
        [changed] = h.events(conv, "agent.status")
        assert switch.data["mode_id"] == "plan" and changed.seq > switch.seq  # recorded before it was written
        with pytest.raises(ModeRefused) as info:
            await LocalPort(conv).set_mode("yolo")
        assert info.value.rpc == {"code": -32603, "message": "Internal error", "data": {"details": "Invalid Mode"}}
        assert conv.thread["agent_info"]["modes"]["currentModeId"] == "plan"
        with pytest.raises(Conflict) as exited:
            await asyncio.wait_for(LocalPort(conv).set_mode("die"), 5)  # the process ends: no 30 s wait
        assert exited.value.code == "agent_exited" and len(conv.routes) == 0
    finally:
        await h.registry.shutdown()


async def test_set_mode_for_an_agent_without_modes_is_refused_without_starting_it(h: Harness) -> None:
    conv = await h.thread()
    with pytest.raises(InvalidRequest) as info:
        await LocalPort(conv).set_mode("plan")
    assert info.value.code == "modes_not_supported" and h.spawner.agents == []


# ---------------------------------------------------------------------- pipelined bursts (issue #22)


def delta(text: str) -> dict[str, Any]:
    return {
        "type": "stream_event",
        "event": {"type": "content_block_delta", "delta": {"type": "text_delta", "text": text}},
    }


def _published_after_commit(h: Harness, conv: Conversation) -> list[int]:
    """Every record the conversation publishes, checked to be in the store already."""
    seen: list[int] = []
    announcer = conv.journal.announcer

    class Checking:
        def committed(self, records: Any) -> None:
            stored = {r.seq for r in h.store.events[conv.id]}
            assert all(r.seq in stored for r in records), "published before it was committed"
            seen.extend(r.seq for r in records)
            announcer.committed(records)

    conv.journal.announcer = Checking()
    return seen


async def test_a_burst_is_decoded_while_the_one_before_commits_and_both_are_published_in_order(
    h: Harness,
) -> None:
    conv = await h.thread()
    await LocalPort(conv).submit(prompt("silent"), None)
    first = conv.core.last_seq
    seen = _published_after_commit(h, conv)
    h.store.block_appends = asyncio.Event()  # the store takes its time over each commit
    h.spawner.agent.say(*[delta(f"a{i}") for i in range(20)])
    h.spawner.agent.say(*[delta(f"b{i}") for i in range(20)])
    # Both bursts are decoded, numbered and handed to the store while neither is committed.
    await wait_until(lambda: conv.journal.in_flight == 2, 3, "two bursts in flight")
    assert seen == [] and conv.core.last_seq == first and conv.journal.numbered == first + 40
    h.store.block_appends.set()
    await h.until(conv, "message.delta", 40)
    await wait_until(lambda: len(seen) == 40, 3, "both bursts published")
    assert seen == list(range(first + 1, first + 41)) and conv.core.last_seq == first + 40
    texts = [r.data["text"] for r in h.events(conv, "message.delta")]
    assert texts == [f"a{i}" for i in range(20)] + [f"b{i}" for i in range(20)]


async def test_a_prompt_during_bursts_in_flight_is_numbered_and_published_after_them(h: Harness) -> None:
    conv = await h.thread()
    await LocalPort(conv).submit(prompt("silent"), None)
    seen = _published_after_commit(h, conv)
    h.store.block_appends = asyncio.Event()
    h.spawner.agent.say(*[delta(f"a{i}") for i in range(20)])
    await wait_until(lambda: conv.journal.in_flight == 1, 3, "a burst in flight")
    burst_last = conv.journal.numbered
    sent = asyncio.create_task(LocalPort(conv).submit(prompt("next"), None))
    await asyncio.sleep(0)
    h.store.block_appends.set()
    async with asyncio.timeout(3):
        acc = await sent
    assert acc.seq == burst_last + 1 and acc.queued  # after the burst, behind the open turn
    assert seen == sorted(seen) and seen[-1] == acc.seq


async def test_after_a_burst_fails_to_commit_nothing_later_is_published_live(h: Harness) -> None:
    from bridge.errors import StoreError

    conv = await h.thread()
    await LocalPort(conv).submit(prompt("silent"), None)
    seen = _published_after_commit(h, conv)
    before = conv.core.last_seq
    append, calls = h.store.append, []
    gate = asyncio.Event()

    async def first_fails(thread_id: str, records: Any, *args: Any, **kw: Any) -> None:
        calls.append(len(records))
        first = len(calls) == 1
        await gate.wait()
        if first:
            raise StoreError("append refused: test")
        await append(thread_id, records, *args, **kw)

    h.store.append = first_fails  # type: ignore[method-assign]
    h.spawner.agent.say(*[delta(f"a{i}") for i in range(20)])
    h.spawner.agent.say(*[delta(f"b{i}") for i in range(20)])
    await wait_until(lambda: len(calls) == 2, 3, "two bursts handed to the store")
    gate.set()
    await wait_until(lambda: not conv.journal.in_flight, 3, "both settled")
    # The first burst is not in the store and was never shown; the second committed, but
    # publishing it live would show a gap: the seq moves past it and subscribers re-read.
    assert [r.seq for r in h.store.events[conv.id] if r.seq > before] == list(range(before + 21, before + 41))
    assert seen == [] and conv.core.last_seq == before + 40


async def test_a_publish_that_raises_does_not_stall_the_bursts_after_it(h: Harness) -> None:
    conv = await h.thread()
    await LocalPort(conv).submit(prompt("silent"), None)
    before = conv.core.last_seq
    announcer, calls = conv.journal.announcer, []

    class Flaky:
        def committed(self, records: Any) -> None:
            calls.append(len(records))
            if len(calls) == 1:
                raise RuntimeError("a subscriber's bug")
            announcer.committed(records)

    conv.journal.announcer = Flaky()
    h.store.block_appends = asyncio.Event()
    h.spawner.agent.say(*[delta(f"a{i}") for i in range(20)])
    h.spawner.agent.say(*[delta(f"b{i}") for i in range(20)])
    await wait_until(lambda: conv.journal.in_flight == 2, 3, "two bursts in flight")
    h.store.block_appends.set()
    # (Committed together, the two bursts are published as one batch: one call, or two.)
    await wait_until(lambda: sum(calls) == 40 and not conv.journal.in_flight, 3, "both settled")
    assert conv.core.last_seq == before + 40
    # The pipe goes on: the next burst is published too.
    h.spawner.agent.say(*[delta(f"c{i}") for i in range(20)])
    await wait_until(lambda: sum(calls) == 60, 3, "the next burst published")
    assert conv.core.last_seq == before + 60


# ---------------------------------------------------------------------- a seq taken by someone else (issue #32 B8)


def _foreign(seq: int) -> Any:
    """A row this daemon did not write, at ``seq``."""
    from bridge.protocols.events import Record

    return Record(
        seq, "2026-12-01T00:00:00.000Z", "agent", "message", {"role": "assistant", "text": "forged"}, None, False
    )


def _assert_dense(h: Harness, conv: Conversation) -> None:
    seqs = [r.seq for r in h.store.events[conv.id]]
    assert seqs == list(range(1, len(seqs) + 1)), "a gap or a duplicate seq"


async def test_a_prompt_whose_seq_was_taken_reads_the_seq_again_and_is_accepted_after_a_notice(h: Harness) -> None:
    conv = await h.thread()
    await LocalPort(conv).submit(prompt("hello"), None)
    await h.until(conv, "turn.ended")
    taken = conv.core.last_seq + 1
    h.store.events[conv.id].append(_foreign(taken))
    acc = await LocalPort(conv).submit(prompt("again"), "c-again")
    [notice] = h.events(conv, "notice")
    assert notice.seq == taken + 1 and notice.source == "bridge" and notice.data["code"] == "seq_conflict"
    assert "did not write" in notice.data["text"]
    assert acc.seq == taken + 2 and not acc.queued and not acc.duplicate
    [end] = (await h.until(conv, "turn.ended", 2))[1:]
    assert end.data["turn_id"] == acc.turn_id and end.data["status"] == "success"
    started = h.events(conv, "turn.started")[-1]
    assert started.data["prompt_seq"] == acc.seq == h.events(conv, "message")[-2].seq
    _assert_dense(h, conv)
    assert conv.thread["last_seq"] == conv.core.last_seq == h.store.events[conv.id][-1].seq
    # Written to the agent once; the client_id names the prompt that was stored.
    assert sum("again" in line for line in h.spawner.agent.written) == 1
    assert (await LocalPort(conv).submit(prompt("again"), "c-again")).seq == acc.seq


async def test_agent_output_whose_seq_was_taken_is_committed_after_the_rows_found(h: Harness) -> None:
    conv = await h.thread()
    await LocalPort(conv).submit(prompt("silent"), None)
    sub = conv.subscribe()
    taken = conv.core.last_seq + 1
    h.store.events[conv.id] += [_foreign(taken), _foreign(taken + 1)]
    h.spawner.agent.say(assistant("late"))  # one line: an emit under the lock
    [msg] = await h.until(conv, "message", text="late")
    assert msg.seq == taken + 3 and h.events(conv, "notice")[0].seq == taken + 2
    assert "rows up to seq" in h.events(conv, "notice")[0].data["text"]
    _assert_dense(h, conv)
    assert sub.lagging  # what it was not sent live (the rows found) it re-reads from the store


async def test_a_burst_whose_seq_was_taken_is_committed_again_after_the_rows_found(h: Harness) -> None:
    conv = await h.thread()
    await LocalPort(conv).submit(prompt("silent"), None)
    taken = conv.core.last_seq + 1
    h.store.events[conv.id].append(_foreign(taken))
    h.spawner.agent.say(*[delta(f"a{i}") for i in range(20)])  # pipelined: refused in flight
    await h.until(conv, "message.delta", 20)
    await wait_until(lambda: conv.core.last_seq == taken + 21, 3, "the burst published")
    assert [r.kind for r in h.store.events[conv.id][taken - 1 : taken + 1]] == ["message", "notice"]
    texts = [r.data["text"] for r in h.events(conv, "message.delta")]
    assert texts == [f"a{i}" for i in range(20)]
    _assert_dense(h, conv)
    assert conv.journal.failure is None
    h.spawner.agent.say(result())  # the reader goes on
    await h.until(conv, "turn.ended")
    _assert_dense(h, conv)
