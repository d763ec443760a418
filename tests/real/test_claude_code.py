"""The real Claude Code CLI (stream-json) through a real daemon, fully offline (issue #9).

Each test drives ``@anthropic-ai/claude-code`` (the version in npm-pins.txt) against the
loopback fake Messages API of fake_anthropic.py; the prompt's marker word picks the
model's reply (fake_anthropic.MARKERS).
"""

from __future__ import annotations

import json
import os

import pytest
from conftest import new_thread, wait_until
from fake_anthropic import MODEL, block_texts, last_user, tool_results
from realagents import (
    AGENT_TIMEOUT,
    PINS,
    Real,
    agent_text,
    assert_only_peer_is,
    claude_executable,
    doc_preset,
    fake_api,
    profile,
    real,
    strace_wrapped,
    write_allowed,
)

__all__ = ["fake_api", "real"]  # fixtures used by the tests below

pytestmark = pytest.mark.timeout(120)


def claude_profile(r: Real, name: str = "claude") -> str:
    return profile(
        name,
        protocol="stream-json",
        executable=claude_executable(),
        args=["--include-partial-messages", "--setting-sources", "", "--strict-mcp-config"],
        env=r.env(),
        model=MODEL,
        permission_prompts=True,
    )


async def test_chat_turn_streams_text_from_the_real_cli(real: Real) -> None:
    d = await real.daemon(real.config(claude_profile(real)))
    thread = await new_thread(d, "claude", cwd=str(real.work))
    c = await d.ws(thread["id"])
    end = await c.turn("CHAT hello there")
    assert end["data"]["status"] == "success", end
    # Streamed: one delta per SSE text_delta, then the complete message.
    assert [f["data"]["text"] for f in c.seen("message.delta", channel="text")] == [
        "Hello ",
        "from ",
        "the ",
        "fake ",
        "model.",
    ]
    assert [f["data"]["text"] for f in c.seen("message", role="assistant")] == ["Hello from the fake model."]
    started = c.seen("session.started")[0]["data"]
    assert started["native_session_id"] and started["model"] == MODEL
    init = c.seen("session.started")[0]["raw"]
    assert init["claude_code_version"] == PINS["@anthropic-ai/claude-code"]
    assert init["apiKeySource"] == "ANTHROPIC_API_KEY" and init["analytics_disabled"] is True
    # The model saw our prompt, streamed, with our model name; the key never reached a client.
    [req] = real.fake.model_requests()
    assert req.body["stream"] is True and req.body["model"] == MODEL
    assert "CHAT hello there" in block_texts(last_user(req.body)["content"])
    assert req.headers["x-claude-code-session-id"] == started["native_session_id"]
    assert all("sk-ant-fake" not in t for t in c.texts)


async def test_permission_prompts_are_relayed_then_allowed_and_denied(real: Real) -> None:
    d = await real.daemon(real.config(claude_profile(real)))
    thread = await new_thread(d, "claude", cwd=str(real.work))
    c = await d.ws(thread["id"])
    allowed, denied = real.work / "allowed.txt", real.work / "denied.txt"

    acc = await c.prompt(f"WRITE {allowed}")
    req = await c.kind("permission.requested", timeout=AGENT_TIMEOUT)
    assert req["data"]["tool"] == "Bash" and req["data"]["input"]["command"] == f"touch {allowed}"
    await c.send(op="permission", request_id=req["data"]["request_id"], decision="allow")
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"], timeout=AGENT_TIMEOUT)
    assert end["data"]["status"] == "success", end
    assert allowed.exists()
    call = c.seen("tool.call", name="Bash")[-1]
    result = c.seen("tool.result", tool_call_id=call["data"]["tool_call_id"])[0]
    assert result["data"]["is_error"] is False

    acc = await c.prompt(f"WRITE {denied}")
    req = await c.kind("permission.requested", timeout=AGENT_TIMEOUT)
    async with d.http() as http:  # this one over REST, with a reason
        r = await http.post(
            f"/v1/threads/{thread['id']}/permissions/{req['data']['request_id']}",
            json={"decision": "deny", "message": "not in this test"},
        )
        assert r.status_code == 200, r.text
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"], timeout=AGENT_TIMEOUT)
    assert end["data"]["status"] == "success", end
    assert not denied.exists()
    resolved = [f["data"] for f in c.seen("permission.resolved")]
    assert [(x["decision"], x["by"]) for x in resolved] == [("allow", "websocket"), ("deny", "rest")]
    # The model got the denial back as an error tool_result carrying our message.
    last = real.fake.model_requests()[-1]
    [denial] = tool_results(last_user(last.body))
    assert denial["is_error"] is True and "not in this test" in " ".join(block_texts(denial["content"]))


async def test_interrupt_during_a_slow_streamed_reply(real: Real) -> None:
    d = await real.daemon(real.config(claude_profile(real)))
    thread = await new_thread(d, "claude", cwd=str(real.work))
    c = await d.ws(thread["id"])
    acc = await c.prompt("SLOW please")
    # Mid-stream: a few of the slow reply's deltas have arrived (a real one, not the empty
    # chunk claude-agent-acp sends when a text block starts).
    await c.next(lambda f: f.get("kind") == "message.delta" and f["data"]["text"] == "tick 2 ", timeout=AGENT_TIMEOUT)
    await c.send(op="interrupt")
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"], timeout=AGENT_TIMEOUT)
    assert end["data"]["status"] == "cancelled", end
    # It reads as what happened (issue #17 item 5): Claude Code's internal account of the
    # aborted turn is not the reason users see; it stays in the raw line and a diagnostic.
    assert (end["data"]["reason"], end["data"]["terminal_reason"]) == ("interrupted", "aborted_streaming"), end
    assert "error" not in end["data"] and "ede_diagnostic" not in json.dumps(end["data"]), end
    [said] = end["raw"]["errors"]
    assert said.startswith("[ede_diagnostic] "), end["raw"]
    diag = c.frames[c.frames.index(end) - 1]
    assert (diag["kind"], diag["source"], diag["data"]["text"], diag["raw"]) == (
        "diagnostic",
        "agent",
        said,
        end["raw"],
    )
    # The CLI's marker and its answer to the interrupt have their kinds; nothing is agent.other.
    [marker] = c.seen("message", origin="interrupt")
    assert marker["data"]["text"] == "[Request interrupted by user]" and marker["data"]["role"] == "user"
    [ack] = c.seen("agent.reply", op="interrupt")
    assert ack["data"]["subtype"] == "success"
    assert not c.seen("agent.other"), c.seen("agent.other")
    assert {f["data"]["event"] for f in c.seen("message.stream")} >= {"message_start", "content_block_start"}
    # The CLI dropped the model's stream long before its ~30 s end.
    slow = real.fake.model_requests()[0]
    await wait_until(lambda: slow.stream == "aborted", what="the slow stream to be dropped")
    assert not c.seen("process.exited")  # interrupted, not killed
    # The same process takes the next turn.
    mark = c.seqs()[-1]
    end = await c.turn("CHAT again")
    assert end["data"]["status"] == "success"
    assert agent_text(c, since=mark) == "Hello from the fake model."
    assert len(c.seen("process.started")) == 1


async def test_stop_start_resume_carries_the_first_turn_to_the_model(real: Real) -> None:
    cfg = real.config(claude_profile(real))
    d1 = await real.daemon(cfg)
    thread = await new_thread(d1, "claude", cwd=str(real.work))
    c1 = await d1.ws(thread["id"])
    end = await c1.turn("CHAT remember the word PINEAPPLE")
    assert end["data"]["status"] == "success"
    native = c1.seen("session.started")[0]["data"]["native_session_id"]
    assert await d1.stop() == 0

    d2 = await real.daemon(cfg)
    c2 = await d2.ws(thread["id"], after=0)
    end = await c2.turn("CHAT which word?")
    assert end["data"]["status"] == "success", end
    started = [f["data"] for f in c2.seen("process.started")]
    assert [s["resume"] for s in started] == [None, native]
    assert c2.seen("session.started")[-1]["data"]["native_session_id"] == native
    # Proof the history came back: the second model request carries the first turn.
    first, second = real.fake.model_requests()
    texts = [t for m in second.messages for t in block_texts(m["content"])]
    assert any("remember the word PINEAPPLE" in t for t in texts)
    assert "Hello from the fake model." in texts
    assert any("which word?" in t for t in block_texts(last_user(second.body)["content"]))
    assert first.headers["x-claude-code-session-id"] == second.headers["x-claude-code-session-id"] == native


async def test_sub_agent_task_reports_task_updates_and_a_final_state(real: Real) -> None:
    d = await real.daemon(real.config(claude_profile(real)))
    thread = await new_thread(d, "claude", cwd=str(real.work))
    c = await d.ws(thread["id"])
    end = await c.turn("DELEGATE the counting")
    assert end["data"]["status"] == "success", end
    call = next(f for f in c.seen("tool.call") if f["data"]["name"] in ("Agent", "Task"))
    updates = [f["data"] for f in c.seen("task.updated")]
    events = [u["event"] for u in updates]
    assert events[0] == "task_started" and updates[0]["status"] == "running", events
    assert events[-1] == "task_notification" and updates[-1]["status"] == "completed", events
    assert {u["task_id"] for u in updates} == {updates[0]["task_id"]}
    async with d.http() as http:
        tasks = (await http.get(f"/v1/threads/{thread['id']}/tasks")).json()["tasks"]
    [task] = tasks
    assert task["status"] == "completed" and task["tool_use_id"] == call["data"]["tool_call_id"]
    assert task["description"] == "Count files"
    # The sub-agent made its own model request with the delegated prompt.
    firsts = [block_texts(r.messages[0]["content"]) for r in real.fake.model_requests()]
    assert sum("SUBTASK: count the files here" in texts for texts in firsts) == 1
    # Its report went back to the main model, which answered from it (the fake quotes a tool
    # result's first 200 characters; newer CLIs put a hand-back preamble before the report).
    returned = [
        block_texts(t.get("content")) for m in real.fake.model_requests() for t in tool_results(last_user(m.body))
    ]
    assert any("Sub-agent found 3 files." in "\n".join(r) for r in returned)
    assert agent_text(c).startswith("Delegating.Tool said: ")


async def test_bypass_permissions_as_root_needs_is_sandbox_1(real: Real) -> None:
    # The preset for running as root (docs/agents.md): Claude Code refuses the bypass mode
    # for uid 0 unless IS_SANDBOX=1; the daemon's own IS_SANDBOX never reaches the agent.
    root = os.geteuid() == 0
    cfg = real.config(
        profile(
            "yolo",
            protocol="stream-json",
            executable=claude_executable(),
            model=MODEL,
            env=real.env(IS_SANDBOX="1") if root else real.env(),
            permission_mode="bypassPermissions",
        ),
        profile(
            "yolo-unsandboxed",
            protocol="stream-json",
            executable=claude_executable(),
            model=MODEL,
            env=real.env(),
            permission_mode="bypassPermissions",
        ),
    )
    d = await real.daemon(cfg)
    target = real.work / "bypassed.txt"
    c = await d.ws((await new_thread(d, "yolo", cwd=str(real.work)))["id"])
    end = await c.turn(f"WRITE {target}")
    assert end["data"]["status"] == "success", end
    assert target.exists() and not c.seen("permission.requested")
    if root:
        c2 = await d.ws((await new_thread(d, "yolo-unsandboxed", cwd=str(real.work)))["id"])
        end = await c2.turn("CHAT hello")
        assert end["data"]["status"] == "error", end
        assert any("cannot be used with root" in f["data"]["text"] for f in c2.seen("diagnostic"))


async def test_the_documented_preset_runs(real: Real) -> None:
    # docs/agents.md's [agents.claude], with only the binary's path and the key/base URL
    # of the fake swapped in: the preset the docs ship is the one CI runs.
    preset = doc_preset("claude")
    assert set(preset) == {"protocol", "executable", "args", "model", "permission_prompts", "env"}
    preset["executable"] = claude_executable()
    preset["env"] = {**preset["env"], **real.env()}
    d = await real.daemon(real.config(profile("claude", **preset)))
    c = await d.ws((await new_thread(d, "claude", cwd=str(real.work)))["id"])
    await write_allowed(c, real.work / "preset.txt")
    assert (real.work / "preset.txt").exists()
    assert agent_text(c).startswith("Tool said")  # streamed (--include-partial-messages)
    assert {r.body["model"] for r in real.fake.model_requests()} == {preset["model"]}


async def test_no_traffic_leaves_the_machine(real: Real) -> None:
    # Every connect()/send*() of the CLI and of what it runs, seen by strace: only the
    # fake on loopback; no DNS lookup, no telemetry (CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC).
    log = real.tmp / "strace.log"
    exe, args = strace_wrapped(claude_executable(), ["--include-partial-messages"], log)
    d = await real.daemon(
        real.config(
            profile(
                "traced",
                protocol="stream-json",
                executable=exe,
                args=args,
                env=real.env(),
                model=MODEL,
                permission_prompts=True,
            )
        )
    )
    c = await d.ws((await new_thread(d, "traced", cwd=str(real.work)))["id"])
    assert (await c.turn("CHAT hello"))["data"]["status"] == "success"
    await write_allowed(c, real.work / "traced.txt")
    assert (real.work / "traced.txt").exists()
    assert_only_peer_is(real.fake, log)
