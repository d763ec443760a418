"""What an ACP agent says of its session besides the conversation, through a real daemon
(issue #37, the dialect): usage into ``turn.ended``, its title into the thread's, its
session config options onto the thread and switched through it (REST, the WebSocket op),
an older agent's ``models`` likewise, and message ids in the events. The fake ACP agent
(tests/agents/fake_acp_agent.py) plays the agent."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from conftest import STEP_TIMEOUT, new_thread, profile_toml
from test_acp_e2e import acp_profile, sent


def config(tmp_path: Path, env: dict[str, str]) -> str:
    return (
        "[server]\nstop_grace_s = 1\n\n"
        + acp_profile("acp", env)
        + acp_profile("cfg", env, "--config-options", "--modes")
        + acp_profile("old", env, "--models")
        + profile_toml("sj", "stream-json", env)
    )


async def thread_of(d: Any, tid: str) -> dict[str, Any]:
    async with d.http() as http:
        r = await http.get(f"/v1/threads/{tid}")
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out


async def test_usage_reaches_turn_ended_and_chunks_keep_their_message_ids(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(tmp_path, agent_env))
    tid = (await new_thread(d, "acp"))["id"]
    c = await d.ws(tid)
    first = await c.turn("usage")
    second = await c.turn("usage")
    # Tokens under stream-json's names, the context, and each turn's share of the agent's
    # cumulative cost: the shares add up to what the agent reports in all.
    assert first["data"]["usage"]["input_tokens"] == 10 and first["data"]["usage"]["output_tokens"] == 5
    assert first["data"]["usage"]["cache_read_input_tokens"] == 2 and first["data"]["usage"]["total_tokens"] == 17
    assert first["data"]["usage"]["context"] == {"used": 1200, "size": 200000}
    assert first["data"]["usage"]["cost"] == {"amount": 0.25, "currency": "USD"}
    assert second["data"]["usage"]["cost"] == {"amount": 0.25, "currency": "USD"}
    assert second["data"]["usage"]["session_cost"] == {"amount": 0.5, "currency": "USD"}
    assert second["data"]["usage"]["acp"]["usage"]["totalTokens"] == 17  # what the agent sent
    # every report is an event of its own too
    assert [f["data"]["cost"]["amount"] for f in c.seen("usage")] == [0.25, 0.5]
    # the echo's three chunks are one message: one id, on every chunk
    await c.turn("hello there")
    ids = {f["data"]["message_id"] for f in c.seen("message.delta")[-3:]}
    assert len(ids) == 1 and next(iter(ids)).startswith("msg_")
    await c.close()


async def test_the_agents_title_names_the_thread_until_the_user_does(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(tmp_path, agent_env))
    tid = (await new_thread(d, "acp"))["id"]
    c = await d.ws(tid)
    await c.turn("title Fix the login bug")
    [info] = c.seen("session.info")
    assert info["data"]["title"] == "Fix the login bug" and info["data"]["updated_at"]
    t = await thread_of(d, tid)
    assert t["title"] == "Fix the login bug"
    assert t["agent_info"]["session_info"]["title"] == "Fix the login bug"
    # A new agent process says nothing of the title until it sends one: the stored one is
    # kept, and still known as the agent's, so its next title replaces it.
    async with d.http() as http:
        assert (await http.post(f"/v1/threads/{tid}/stop")).status_code == 202
    await c.turn("title Fix the login bug, take two")
    assert (await thread_of(d, tid))["title"] == "Fix the login bug, take two"
    # The user names the thread: the agent's titles no longer replace it.
    async with d.http() as http:
        assert (await http.patch(f"/v1/threads/{tid}", json={"title": "Mine"})).status_code == 200
    await c.turn("title Something else")
    t = await thread_of(d, tid)
    assert t["title"] == "Mine" and t["agent_info"]["session_info"]["title"] == "Something else"
    # An empty title hands the naming back to the agent.
    async with d.http() as http:
        assert (await http.patch(f"/v1/threads/{tid}", json={"title": ""})).status_code == 200
    await c.turn("title Back to the agent")
    assert (await thread_of(d, tid))["title"] == "Back to the agent"
    await c.turn("title")  # the agent clears its title: so is the thread's
    assert (await thread_of(d, tid))["title"] == ""
    # A thread created with a title is the user's from the start.
    named = (await new_thread(d, "acp", title="Given"))["id"]
    c2 = await d.ws(named)
    await c2.turn("title Agent's idea")
    assert (await thread_of(d, named))["title"] == "Given"
    await c.close()
    await c2.close()


async def test_config_options_are_on_the_thread_and_switch_the_model_through_rest(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(tmp_path, agent_env))
    tid = (await new_thread(d, "cfg"))["id"]
    sj = (await new_thread(d, "sj"))["id"]
    async with d.http() as http:
        # The agent is started for the switch, as a prompt would start it.
        r = await http.post(f"/v1/threads/{tid}/config", json={"config_id": "model", "value": "deep"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["config_id"] == "model" and body["value"] == "deep"
        assert [(o["id"], o["currentValue"]) for o in body["config_options"]] == [
            ("mode", "default"),
            ("model", "deep"),
            ("brave", False),  # the bridge advertises boolean options, so the agent sends one
        ]
        t = (await http.get(f"/v1/threads/{tid}")).json()
        assert t["agent_info"]["config_options"] == body["config_options"]
        # a boolean option
        r = await http.post(f"/v1/threads/{tid}/config", json={"config_id": "brave", "value": True})
        assert r.status_code == 200, r.text
        assert r.json()["config_options"][2]["currentValue"] is True
        # the agent's refusals, as it gave them; nothing changes
        for bad in ({"config_id": "nope", "value": "x"}, {"config_id": "model", "value": "huge"}):
            r = await http.post(f"/v1/threads/{tid}/config", json=bad)
            assert r.status_code == 400 and r.json()["error"]["code"] == "config_refused", r.text
            assert "Invalid params" in r.json()["error"]["message"]
        r = await http.post(f"/v1/threads/{tid}/config", json={"config_id": "model", "value": 3})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
        r = await http.post(f"/v1/threads/{sj}/config", json={"config_id": "model", "value": "deep"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "config_not_supported"
        assert (await http.get(f"/v1/threads/{sj}")).json()["state"] == "idle"  # not started for nothing
        r = await http.post("/v1/threads/nope/config", json={"config_id": "model", "value": "deep"})
        assert r.status_code == 404
    sets = [m["params"] for m in sent(tmp_path, "session/set_config_option")]
    assert sets[0] == {"sessionId": sets[0]["sessionId"], "configId": "model", "value": "deep"}
    assert sets[1]["type"] == "boolean" and sets[1]["value"] is True
    c = await d.ws(tid, after=0)
    end = await c.turn("whatconfig")
    assert end["data"]["status"] == "success"
    assert "config: model=deep mode=default" in "".join(f["data"]["text"] for f in c.seen("message.delta"))
    switched = c.seen("agent.status", status="config_changed")
    assert len(switched) == 2 and switched[0]["data"]["config_options"][1]["currentValue"] == "deep"
    asked = c.seen("client.other", op="set_config_option")
    assert [(a["data"]["config_id"], a["data"]["value"]) for a in asked][:2] == [("model", "deep"), ("brave", True)]
    # The agent changing an option by itself: the thread follows.
    await c.turn("config model fast")
    t = await thread_of(d, tid)
    assert t["agent_info"]["config_options"][1]["currentValue"] == "fast"
    await c.close()


async def test_the_websocket_op_switches_an_option_and_answers_first(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(tmp_path, agent_env))
    tid = (await new_thread(d, "cfg"))["id"]
    c = await d.ws(tid)

    def answer(f: dict[str, Any]) -> bool:
        return f.get("kind") in ("client.accepted", "client.rejected") and f["data"].get("op") == "set_config_option"

    await c.send(op="set_config_option", config_id="mode", value="plan", client_id="k1")
    ok = await c.next(answer)
    assert ok["kind"] == "client.accepted", ok
    assert ok["data"]["config_id"] == "mode" and ok["data"]["config_options"][0]["currentValue"] == "plan"
    await c.kind("agent.status", status="config_changed")
    await c.send(op="set_config_option", config_id="nope", value="x")
    refused = await c.next(answer)
    assert refused["kind"] == "client.rejected" and refused["data"]["code"] == "config_refused"
    await c.send(op="set_config_option", config_id="", value="x")
    bad = await c.next(answer)
    assert bad["kind"] == "client.rejected" and bad["data"]["code"] == "invalid_frame"
    await c.close()


async def test_an_older_agents_models_switch_through_session_set_model(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(tmp_path, agent_env))
    tid = (await new_thread(d, "old"))["id"]
    plain = (await new_thread(d, "acp"))["id"]
    async with d.http() as http:
        r = await http.post(f"/v1/threads/{tid}/config", json={"config_id": "model", "value": "deep"})
        assert r.status_code == 200, r.text
        [option] = r.json()["config_options"]
        assert option["category"] == "model" and option["currentValue"] == "deep"
        assert [v["value"] for v in option["options"]] == ["fast", "deep"]
        r = await http.post(f"/v1/threads/{tid}/config", json={"config_id": "model", "value": "huge"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "config_refused"
        # an agent that reports neither: nothing to set
        r = await http.post(f"/v1/threads/{plain}/config", json={"config_id": "model", "value": "deep"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "config_not_supported"
    assert [m["params"]["modelId"] for m in sent(tmp_path, "session/set_model")] == ["deep", "huge"]
    assert sent(tmp_path, "session/set_config_option") == []
    c = await d.ws(tid)
    await asyncio.wait_for(c.turn("whatconfig"), STEP_TIMEOUT)
    assert "model=deep" in "".join(f["data"]["text"] for f in c.seen("message.delta"))
    await c.close()
