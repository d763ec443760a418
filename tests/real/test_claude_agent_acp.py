"""The real claude-agent-acp (ACP) through a real daemon, fully offline (issue #9).

``@agentclientprotocol/claude-agent-acp`` (the version in npm-pins.txt) runs under node and
spawns the Claude Code CLI bundled with its ``@anthropic-ai/claude-agent-sdk``; both talk
to the loopback fake Messages API of fake_anthropic.py.
"""

from __future__ import annotations

import json

import pytest
from conftest import new_thread, wait_until
from fake_anthropic import MODEL, QUESTION, asked_with, block_texts, last_user, tool_results
from realagents import (
    AGENT_TIMEOUT,
    PINS,
    Real,
    acp_command,
    agent_text,
    assert_only_peer_is,
    doc_preset,
    fake_api,
    profile,
    real,
    root_sandbox,
    strace_wrapped,
    write_allowed,
)

__all__ = ["fake_api", "real"]  # fixtures used by the tests below

pytestmark = pytest.mark.timeout(120)


def acp_profile(r: Real, name: str = "claude-acp", command: tuple[str, list[str]] | None = None) -> str:
    # root_sandbox(): claude-agent-acp always passes the bypass flag.
    node, args = command or acp_command()
    # Newer releases (0.101.0) start a session with no configured mode in "auto", where Claude Code's
    # classifier, not the user, allows a tool call: these tests are about the prompts a
    # person answers, so the user's settings choose "default" (ask before changes).
    settings = r.home / ".claude" / "settings.json"
    settings.parent.mkdir(exist_ok=True)
    settings.write_text(json.dumps({"permissions": {"defaultMode": "default"}}))
    return profile(name, protocol="acp", executable=node, args=args, env=r.env(ANTHROPIC_MODEL=MODEL, **root_sandbox()))


async def test_acp_chat_turn_streams_text_from_the_real_agent(real: Real) -> None:
    d = await real.daemon(real.config(acp_profile(real)))
    thread = await new_thread(d, "claude-acp", cwd=str(real.work))
    c = await d.ws(thread["id"])
    end = await c.turn("CHAT hello there")
    assert end["data"]["status"] == "success" and end["data"]["stop_reason"] == "end_turn", end
    assert agent_text(c) == "Hello from the fake model."
    assert len(c.seen("message.delta", channel="text")) >= 2  # streamed, not one lump
    async with d.http() as http:
        t = (await http.get(f"/v1/threads/{thread['id']}")).json()
    assert t["agent_info"]["info"]["version"] == PINS["@agentclientprotocol/claude-agent-acp"]
    assert t["native_session_id"] == c.seen("session.started")[0]["data"]["native_session_id"]
    reqs = real.fake.model_requests()
    assert reqs and all(r.body["stream"] is True for r in reqs)
    assert "CHAT hello there" in block_texts(last_user(reqs[-1].body)["content"])
    assert all("sk-ant-fake" not in t for t in c.texts)


async def test_acp_permission_requests_are_relayed_then_allowed_and_denied(real: Real) -> None:
    d = await real.daemon(real.config(acp_profile(real)))
    thread = await new_thread(d, "claude-acp", cwd=str(real.work))
    c = await d.ws(thread["id"])
    allowed, denied = real.work / "allowed.txt", real.work / "denied.txt"

    acc = await c.prompt(f"WRITE {allowed}")
    req = await c.kind("permission.requested", timeout=AGENT_TIMEOUT)
    kinds = {o["kind"] for o in req["data"]["options"]}
    assert {"allow_once", "reject_once"} <= kinds, req
    # The tool's name, as on stream-json (not the human title the ACP request carries).
    assert req["data"]["tool"] == "Bash" and req["data"]["title"] == f"touch {allowed}"
    assert req["data"]["input"]["command"] == f"touch {allowed}"
    await c.send(op="permission", request_id=req["data"]["request_id"], decision="allow")
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"], timeout=AGENT_TIMEOUT)
    assert end["data"]["status"] == "success", end
    assert allowed.exists()

    acc = await c.prompt(f"WRITE {denied}")
    req = await c.kind("permission.requested", timeout=AGENT_TIMEOUT)
    await c.send(op="permission", request_id=req["data"]["request_id"], decision="deny")
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"], timeout=AGENT_TIMEOUT)
    assert end["data"]["status"] == "success", end
    assert not denied.exists()
    assert [f["data"]["decision"] for f in c.seen("permission.resolved")] == ["allow", "deny"]
    # The last request that carries a tool result (a newer agent asks for a title after).
    [denial] = [r for r in (tool_results(last_user(m.body)) for m in real.fake.model_requests()) if r][-1]
    assert denial["is_error"] is True


async def test_acp_interrupt_during_a_slow_streamed_reply(real: Real) -> None:
    d = await real.daemon(real.config(acp_profile(real)))
    thread = await new_thread(d, "claude-acp", cwd=str(real.work))
    c = await d.ws(thread["id"])
    acc = await c.prompt("SLOW please")
    # Mid-stream: a few of the slow reply's deltas have arrived (a real one, not the empty
    # chunk claude-agent-acp sends when a text block starts).
    await c.next(lambda f: f.get("kind") == "message.delta" and f["data"]["text"] == "tick 2 ", timeout=AGENT_TIMEOUT)
    await c.send(op="interrupt")
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"], timeout=AGENT_TIMEOUT)
    assert end["data"]["status"] == "cancelled" and end["data"]["stop_reason"] == "cancelled", end
    slow = next(r for r in real.fake.model_requests() if "SLOW please" in block_texts(last_user(r.body)["content"]))
    await wait_until(lambda: slow.stream == "aborted", what="the slow stream to be dropped")
    assert not c.seen("process.exited")
    mark = c.seqs()[-1]
    end = await c.turn("CHAT again")
    assert end["data"]["status"] == "success", end
    assert agent_text(c, since=mark) == "Hello from the fake model."


async def test_acp_stop_start_loads_the_session_and_the_model_sees_the_first_turn(real: Real) -> None:
    cfg = real.config(acp_profile(real))
    d1 = await real.daemon(cfg)
    thread = await new_thread(d1, "claude-acp", cwd=str(real.work))
    c1 = await d1.ws(thread["id"])
    end = await c1.turn("CHAT remember the word PINEAPPLE")
    assert end["data"]["status"] == "success", end
    native = c1.seen("session.started")[0]["data"]["native_session_id"]
    assert await d1.stop() == 0

    d2 = await real.daemon(cfg)
    async with d2.http() as http:
        last = (await http.get(f"/v1/threads/{thread['id']}")).json()["last_seq"]
    c2 = await d2.ws(thread["id"], after=0)
    end = await c2.turn("CHAT which word?")
    assert end["data"]["status"] == "success", end
    resumed = [f["data"] for f in c2.seen("session.started") if f["seq"] > last]
    assert resumed and resumed[0]["resumed"] == "load" and resumed[0]["native_session_id"] == native
    # The replayed history did not enter the transcript again: one user message each.
    assert [f["data"]["text"] for f in c2.seen("message", role="user")] == [
        "CHAT remember the word PINEAPPLE",
        "CHAT which word?",
    ]
    second = asked_with(real.fake, "which word?")
    texts = [t for m in second.messages for t in block_texts(m["content"])]
    assert any("remember the word PINEAPPLE" in t for t in texts)
    assert "Hello from the fake model." in texts
    assert any("which word?" in t for t in block_texts(last_user(second.body)["content"]))


async def test_acp_sub_agent_call_is_a_tool_call_with_its_result(real: Real) -> None:
    d = await real.daemon(real.config(acp_profile(real)))
    thread = await new_thread(d, "claude-acp", cwd=str(real.work))
    c = await d.ws(thread["id"])
    end = await c.turn("DELEGATE the counting")
    assert end["data"]["status"] == "success", end
    firsts = [block_texts(r.messages[0]["content"]) for r in real.fake.model_requests()]
    assert sum("SUBTASK: count the files here" in texts for texts in firsts) == 1
    # claude-agent-acp reports the sub-agent as an Agent tool call (kind "think") and its
    # result; ACP has no task messages, so the thread's task table stays empty.
    calls = [f for f in c.seen("tool.call") if f["data"]["name"] == "Agent"]
    tool_id = calls[0]["data"]["tool_call_id"]
    assert calls[0]["data"]["kind"] == "think"
    assert any(f["data"].get("input", {}).get("prompt") == "SUBTASK: count the files here" for f in calls)
    [result] = c.seen("tool.result", tool_call_id=tool_id)
    assert result["data"]["is_error"] is False
    assert "Sub-agent found 3 files." in "\n".join(block_texts(result["data"]["output"]))  # wrapped by newer CLIs
    # The report went back to the main agent's model, which answered the user from it (the
    # fake quotes a tool result's first 200 characters; newer CLIs put a preamble first).
    returned = [
        block_texts(t.get("content")) for m in real.fake.model_requests() for t in tool_results(last_user(m.body))
    ]
    assert any("Sub-agent found 3 files." in "\n".join(r) for r in returned)
    assert agent_text(c).startswith("Delegating.Tool said: ")
    assert not c.seen("task.updated")
    async with d.http() as http:
        assert (await http.get(f"/v1/threads/{thread['id']}/tasks")).json()["tasks"] == []


async def test_the_documented_preset_runs(real: Real) -> None:
    # docs/agents.md's [agents.claude-acp], with only the paths and the key/base URL of the
    # fake swapped in.
    preset = doc_preset("claude-acp")
    assert set(preset) == {"protocol", "executable", "args", "env"}
    node, args = acp_command()
    assert preset["args"][0].endswith(args[0].split("node_modules", 1)[1])
    preset.update(executable=node, args=args)
    preset["env"] = {**preset["env"], **real.env(**root_sandbox())}
    d = await real.daemon(real.config(profile("claude-acp", **preset)))
    c = await d.ws((await new_thread(d, "claude-acp", cwd=str(real.work)))["id"])
    end = await c.turn("CHAT hi")
    assert end["data"]["status"] == "success", end
    assert agent_text(c) == "Hello from the fake model."
    # ANTHROPIC_MODEL from the preset chose the model.
    assert {r.body["model"] for r in real.fake.model_requests()} == {preset["env"]["ANTHROPIC_MODEL"]}


async def test_no_traffic_leaves_the_machine(real: Real) -> None:
    # strace -f follows node into the Claude Code CLI it spawns and the tools that runs.
    log = real.tmp / "strace.log"
    node, args = acp_command()
    d = await real.daemon(real.config(acp_profile(real, "traced", strace_wrapped(node, args, log))))
    c = await d.ws((await new_thread(d, "traced", cwd=str(real.work)))["id"])
    assert (await c.turn("CHAT hello"))["data"]["status"] == "success"
    await write_allowed(c, real.work / "traced.txt")
    assert_only_peer_is(real.fake, log)


async def test_usage_title_message_ids_and_the_model_option_of_acp_2026(real: Real) -> None:
    """What claude-agent-acp sends of ACP's 2026 additions, as the thread keeps it: its
    ``usage_update`` in the turn's usage, its ``session_info_update`` as the thread's title,
    the ``messageId`` of its chunks, and its ``configOptions``, whose ``model`` option
    switches the model the next turn asks the API for."""
    d = await real.daemon(real.config(acp_profile(real)))
    thread = await new_thread(d, "claude-acp", cwd=str(real.work))
    c = await d.ws(thread["id"])
    end = await c.turn("CHAT hello there")
    usage = end["data"]["usage"]
    assert usage["context"]["used"] > 0 and usage["context"]["size"] >= usage["context"]["used"]
    assert usage["session_cost"]["currency"] == "USD" and usage["output_tokens"] > 0
    ids = {f["data"]["message_id"] for f in c.seen("message.delta")}
    assert len(ids) == 1 and None not in ids  # one model message, one id on all its chunks
    if not c.seen("session.info"):  # the title may come after the turn's end
        await c.kind("session.info", timeout=AGENT_TIMEOUT)
    async with d.http() as http:
        t = (await http.get(f"/v1/threads/{thread['id']}")).json()
        assert t["title"] == t["agent_info"]["session_info"]["title"] == "CHAT hello there"
        [model] = [o for o in t["agent_info"]["config_options"] if o.get("category") == "model"]
        assert model["currentValue"] == MODEL and "sonnet" in {o["value"] for o in model["options"]}
        r = await http.post(f"/v1/threads/{thread['id']}/config", json={"config_id": model["id"], "value": "sonnet"})
        assert r.status_code == 200, r.text
        [now] = [o for o in r.json()["config_options"] if o["id"] == model["id"]]
        assert now["currentValue"] == "sonnet"
    assert (await c.turn("CHAT again"))["data"]["status"] == "success"
    asked = asked_with(real.fake, "CHAT again").body["model"]
    assert asked != MODEL and "sonnet" in asked, asked


async def test_a_question_of_the_agent_is_an_elicitation_any_client_answers(real: Real) -> None:
    """Claude Code's AskUserQuestion tool, which claude-agent-acp turns into an ACP form
    elicitation for a client that shows forms (the bridge says it does): the thread's
    ``elicitation.requested``, answered on the WebSocket; the choice reaches the model as
    the tool's result."""
    d = await real.daemon(real.config(acp_profile(real)))
    thread = await new_thread(d, "claude-acp", cwd=str(real.work))
    c = await d.ws(thread["id"])
    acc = await c.prompt("QUESTION about the colour")
    asked = await c.kind("elicitation.requested", timeout=AGENT_TIMEOUT)
    data = asked["data"]
    assert data["mode"] == "form" and data["message"] == QUESTION["question"]
    field = data["requested_schema"]["properties"]["question_0"]
    assert [o["const"] for o in field["oneOf"]] == ["red", "green"]
    await c.send(op="elicitation", request_id=data["request_id"], action="accept", content={"question_0": "green"})
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"], timeout=AGENT_TIMEOUT)
    assert end["data"]["status"] == "success", end
    (resolved,) = c.seen("elicitation.resolved", request_id=data["request_id"])
    assert resolved["data"]["action"] == "accept"
    answered = [
        " ".join(block_texts(t.get("content")))
        for m in real.fake.model_requests()
        for t in tool_results(last_user(m.body))
    ]
    assert any("green" in text for text in answered), answered
