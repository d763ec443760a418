"""The ACP gateway end to end (issue #19): the official Python ACP SDK as the client of a
real daemon's ``/v1/acp``, driving the demo agent and the stream-json fake agent. Every
message the gateway sends is validated against the SDK's schema models (support/acp_client)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import websockets
from acp import text_block
from conftest import STEP_TIMEOUT, base_config, new_thread, profile_toml
from support.acp_client import connect
from test_events_e2e import ws_changes

BRIDGE = {"agent-bridge": {"agent": "asker"}}


def config(tmp_path: Path, env: dict[str, str]) -> str:
    return base_config(tmp_path, env) + profile_toml("asker", "stream-json", env, permission_prompts=True)


async def started(d: Any) -> Any:
    s = await connect(d.ws_url, d.token)
    init = await s.initialize()
    assert init.protocol_version == 1
    return s


async def test_chat_with_the_demo_agent_over_acp(daemon_factory: Any, tmp_path: Path, agent_env: Any) -> None:
    d = await daemon_factory(base_config(tmp_path, agent_env))
    s = await connect(d.ws_url, d.token, "/v1/acp/demo")
    assert s.connection_id and len(s.connection_id) == 32
    init = await s.initialize()
    caps = init.agent_capabilities
    assert caps.load_session is True and caps.session_capabilities.list is not None
    assert caps.session_capabilities.resume is not None
    assert caps.prompt_capabilities.image is True and caps.prompt_capabilities.audio is False
    assert init.agent_info.name == "agent-bridge"
    new = await s.conn.new_session(cwd=str(tmp_path))
    sid = new.session_id
    resp = await asyncio.wait_for(s.conn.prompt(session_id=sid, prompt=[text_block("hello")]), STEP_TIMEOUT)
    assert resp.stop_reason == "end_turn"
    assert "hello" in s.rec.text(sid).lower()
    assert not s.rec.of(sid, "user_message_chunk")  # its own prompt is not echoed to it
    async with d.http() as http:
        thread = (await http.get(f"/v1/threads/{sid}")).json()
        events = (await http.get(f"/v1/threads/{sid}/events?after=0")).json()["events"]
    assert thread["agent"] == "demo" and thread["cwd"] == str(tmp_path) and thread["last_seq"] > 0
    said = [e["data"]["text"] for e in events if e["kind"] == "message" and e["data"].get("role") == "assistant"]
    assert s.rec.text(sid) == "".join(said)  # streamed or whole, each text once
    await s.close()


async def test_tool_call_and_permission_answered_over_acp(daemon_factory: Any, tmp_path: Path, agent_env: Any) -> None:
    d = await daemon_factory(config(tmp_path, agent_env))
    s = await started(d)
    sid = (await s.conn.new_session(cwd=str(tmp_path), **BRIDGE)).session_id
    resp = await asyncio.wait_for(s.conn.prompt(session_id=sid, prompt=[text_block("tool")]), STEP_TIMEOUT)
    assert resp.stop_reason == "end_turn"
    (call,) = s.rec.of(sid, "tool_call")
    assert call["title"] == "Bash" and call["kind"] == "execute" and call["rawInput"] == {"command": "echo hi"}
    (done,) = s.rec.of(sid, "tool_call_update")
    assert done["toolCallId"] == call["toolCallId"] and done["status"] == "completed"
    assert done["content"][0]["content"]["text"] == "hi"
    assert s.rec.text(sid).endswith("tool done")

    s.rec.answer = lambda ask: {"outcome": "selected", "optionId": "allow"}
    resp = await asyncio.wait_for(s.conn.prompt(session_id=sid, prompt=[text_block("ask")]), STEP_TIMEOUT)
    assert resp.stop_reason == "end_turn"
    (ask,) = s.rec.asks
    assert ask["toolCall"]["rawInput"] == {"command": "touch x"} and ask["toolCall"]["toolCallId"] == "toolu_ask"
    assert [o["kind"] for o in ask["options"]] == ["allow_once", "reject_once"]
    assert s.rec.text(sid).endswith("permission: allow")
    async with d.http() as http:
        events = (await http.get(f"/v1/threads/{sid}/events?after=0")).json()["events"]
    (resolved,) = [e for e in events if e["kind"] == "permission.resolved"]
    assert resolved["data"]["decision"] == "allow" and resolved["data"]["by"] == "acp"
    await s.close()


async def test_a_permission_raced_against_a_websocket_client_is_cancelled_for_acp(
    daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    d = await daemon_factory(config(tmp_path, agent_env))
    s = await started(d)
    never: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    s.rec.answer = lambda ask: never  # the ACP user never clicks
    sid = (await s.conn.new_session(cwd=str(tmp_path), **BRIDGE)).session_id
    prompt = asyncio.ensure_future(s.conn.prompt(session_id=sid, prompt=[text_block("ask")]))
    await s.rec.wait_for(lambda: bool(s.rec.asks), "the permission request")
    c = await d.ws(sid)
    req = await c.kind("permission.requested")
    await c.send(op="permission", request_id=req["data"]["request_id"], decision="deny")
    resp = await asyncio.wait_for(prompt, STEP_TIMEOUT)
    assert resp.stop_reason == "end_turn"
    assert s.rec.text(sid).endswith("permission: deny")
    cancels = [m for m in s.validator.received if m.get("method") == "$/cancel_request"]
    asked = [m for m in s.validator.received if m.get("method") == "session/request_permission"]
    assert [m["params"]["requestId"] for m in cancels] == [asked[0]["id"]]
    never.set_result({"outcome": "cancelled"})  # the client's late answer is ignored
    resolved = await c.kind("permission.resolved")
    assert resolved["data"]["by"] == "websocket" and resolved["data"]["decision"] == "deny"
    await s.close()


async def test_cancel_mid_turn_ends_the_prompt_cancelled(daemon_factory: Any, tmp_path: Path, agent_env: Any) -> None:
    d = await daemon_factory(config(tmp_path, agent_env))
    s = await started(d)
    sid = (await s.conn.new_session(cwd=str(tmp_path), **{"agent-bridge": {"agent": "stream-json"}})).session_id
    prompt = asyncio.ensure_future(s.conn.prompt(session_id=sid, prompt=[text_block("slow")]))
    await s.rec.wait_for(lambda: bool(s.rec.text(sid)), "the first tick")
    await s.conn.cancel(session_id=sid)
    resp = await asyncio.wait_for(prompt, STEP_TIMEOUT)
    assert resp.stop_reason == "cancelled"
    await s.close()


async def test_load_after_a_daemon_restart_replays_everything_and_the_next_prompt_continues(
    daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    d = await daemon_factory(config(tmp_path, agent_env))
    s = await started(d)
    sid = (await s.conn.new_session(cwd=str(tmp_path), **{"agent-bridge": {"agent": "stream-json"}})).session_id
    for text in ("first words", "second words"):
        resp = await asyncio.wait_for(s.conn.prompt(session_id=sid, prompt=[text_block(text)]), STEP_TIMEOUT)
        assert resp.stop_reason == "end_turn"
    before = s.rec.text(sid)
    await s.close()
    await d.stop()
    await d.start()

    s2 = await started(d)
    await asyncio.wait_for(s2.conn.load_session(cwd=str(tmp_path), session_id=sid), STEP_TIMEOUT)
    assert [u["content"]["text"] for u in s2.rec.of(sid, "user_message_chunk")] == ["first words", "second words"]
    assert s2.rec.text(sid) == before == "echo: first wordsecho: second words"
    # The thread keeps the title its first prompt gave it (issue #38 item 6), told after
    # the replay as a change of the thread, without a seq (§11.8).
    await s2.rec.wait_for(
        lambda: [u.get("title") for u in s2.rec.of(sid, "session_info_update")] == ["first words"], "the title"
    )
    replayed = [m for m in s2.validator.received if m.get("method")]
    seqs = [
        m["params"]["_meta"]["agent-bridge"]["seq"]
        for m in replayed
        if m["params"]["update"]["sessionUpdate"] != "session_info_update"
    ]
    assert seqs == sorted(seqs)
    resp = await asyncio.wait_for(s2.conn.prompt(session_id=sid, prompt=[text_block("recall")]), STEP_TIMEOUT)
    assert resp.stop_reason == "end_turn"
    assert "first words" in s2.rec.text(sid) and "second words" in s2.rec.text(sid).split("echo: second words")[-1]
    await s2.close()


async def test_session_list_shows_rest_threads_and_rest_shows_acp_sessions(
    daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    d = await daemon_factory(config(tmp_path, agent_env))
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir(), there.mkdir()
    rest = await new_thread(d, "stream-json", cwd=str(here), title="made over REST")
    await new_thread(d, "stream-json", cwd=str(there))
    s = await started(d)
    sid = (await s.conn.new_session(cwd=str(here))).session_id
    listed = await s.conn.list_sessions(cwd=str(here))
    assert {x.session_id for x in listed.sessions} == {rest["id"], sid}
    assert {x.title for x in listed.sessions if x.session_id == rest["id"]} == {"made over REST"}
    everything = await s.conn.list_sessions()
    assert len(everything.sessions) == 3 and everything.next_cursor is None
    async with d.http() as http:
        threads = (await http.get("/v1/threads")).json()["threads"]
    assert sid in {t["id"] for t in threads}
    async with ws_changes(d, since=0) as changes:  # what the page's thread list reads
        created = await changes.thread(sid)
        assert created["kind"] == "thread.created" and created["thread"]["cwd"] == str(here)
    await s.close()


async def rpc(conn: Any, msg: Any) -> dict[str, Any]:
    await conn.send(msg if isinstance(msg, str) else json.dumps(msg))
    return dict(json.loads(await asyncio.wait_for(conn.recv(), STEP_TIMEOUT)))


async def answer_to(conn: Any, msg: dict[str, Any]) -> dict[str, Any]:
    """Send a request and read past the notifications the session sends meanwhile (its
    running turn's updates) to the answer with the request's id."""
    await conn.send(json.dumps(msg))
    while True:
        got = dict(json.loads(await asyncio.wait_for(conn.recv(), STEP_TIMEOUT)))
        if "method" not in got and got.get("id") == msg["id"]:
            return got


async def test_json_rpc_errors_and_the_connection_stays_usable(daemon: Any) -> None:
    async with websockets.connect(f"{daemon.ws_url}/v1/acp", additional_headers=daemon.headers) as conn:
        assert conn.response.headers["Acp-Connection-Id"]
        early = await rpc(conn, {"jsonrpc": "2.0", "id": 1, "method": "session/list", "params": {}})
        assert early["id"] == 1 and early["error"]["code"] == -32600
        bad = await rpc(conn, "{not json")
        assert bad == {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}
        await conn.send(json.dumps({"jsonrpc": "2.0", "method": "no/such_notification", "params": {}}))
        init = await rpc(conn, {"jsonrpc": "2.0", "id": "a", "method": "initialize", "params": {"protocolVersion": 9}})
        assert init["id"] == "a" and init["result"]["protocolVersion"] == 1  # the notification got no answer
        unknown = await rpc(conn, {"jsonrpc": "2.0", "id": 7, "method": "session/fork", "params": {}})
        assert unknown["id"] == 7 and unknown["error"]["code"] == -32601
        missing = await rpc(conn, {"jsonrpc": "2.0", "id": 8, "method": "session/load", "params": {"sessionId": "x"}})
        assert missing["error"]["code"] == -32002
        huge = await rpc(conn, json.dumps({"jsonrpc": "2.0", "id": 9, "method": "x", "params": {"p": "x" * (8 << 20)}}))
        assert huge["id"] is None and huge["error"]["code"] == -32600
        not_rpc = await rpc(conn, {"id": 10, "method": "initialize"})
        assert not_rpc["id"] == 10 and not_rpc["error"]["code"] == -32600
        again = await rpc(conn, {"jsonrpc": "2.0", "id": 11, "method": "session/list", "params": {}})
        assert again["result"] == {"sessions": []}


async def test_the_upgrade_needs_credentials_and_a_good_origin(daemon: Any) -> None:
    url = f"{daemon.ws_url}/v1/acp"
    for headers, status in (
        ({}, 401),
        ({"Authorization": "Bearer wrong"}, 401),
        ({**daemon.headers, "Origin": "http://evil.example"}, 403),
    ):
        try:
            async with websockets.connect(url, additional_headers=headers):
                raise AssertionError("upgraded")
        except websockets.InvalidStatus as exc:
            assert exc.response.status_code == status
    token = daemon.token
    async with websockets.connect(url, subprotocols=["agent-bridge.v1", f"bearer.{token}"]) as conn:  # type: ignore[list-item]
        assert conn.subprotocol == "agent-bridge.v1"
    try:
        async with websockets.connect(f"{url}/nope", additional_headers=daemon.headers):
            raise AssertionError("upgraded")
    except websockets.InvalidStatus as exc:
        assert exc.response.status_code == 404


async def test_two_acp_clients_are_both_asked_and_a_client_that_loads_later_is_asked_too(
    daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    d = await daemon_factory(config(tmp_path, agent_env))
    a, b = await started(d), await started(d)
    never: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    a.rec.answer = lambda ask: never
    sid = (await a.conn.new_session(cwd=str(tmp_path), **BRIDGE)).session_id
    prompt = asyncio.ensure_future(a.conn.prompt(session_id=sid, prompt=[text_block("ask")]))
    await a.rec.wait_for(lambda: bool(a.rec.asks), "the permission request")
    # b attaches after the request was made: it is asked as well (resume: no replay).
    b.rec.answer = lambda ask: {"outcome": "selected", "optionId": "allow"}
    await b.conn.resume_session(cwd=str(tmp_path), session_id=sid)
    resp = await asyncio.wait_for(prompt, STEP_TIMEOUT)
    assert resp.stop_reason == "end_turn" and a.rec.text(sid).endswith("permission: allow")
    # b reads its own connection: the turn's last chunk may reach it after a's answer.
    await b.rec.wait_for(lambda: b.rec.text(sid).endswith("permission: allow"), "b sees the turn's end")
    assert len(b.rec.asks) == 1
    assert [u["content"]["text"] for u in b.rec.of(sid, "user_message_chunk")] == []  # resumed after the prompt
    await a.rec.wait_for(
        lambda: any(m.get("method") == "$/cancel_request" for m in a.validator.received), "a's request cancelled"
    )
    never.set_result({"outcome": "cancelled"})
    await a.close()
    await b.close()


async def test_pending_requests_per_connection_are_bounded(daemon_factory: Any, tmp_path: Path, agent_env: Any) -> None:
    cfg = config(tmp_path, agent_env).replace("[server]\n", "[server]\nmax_pending_prompts = 100\n", 1)
    d = await daemon_factory(cfg)
    async with websockets.connect(f"{d.ws_url}/v1/acp/stream-json", additional_headers=d.headers) as conn:
        await rpc(conn, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}})
        new = await rpc(
            conn,
            {"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"cwd": str(tmp_path), "mcpServers": []}},
        )
        sid = new["result"]["sessionId"]
        prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "hang"}]}
        for i in range(32):
            await conn.send(json.dumps({"jsonrpc": "2.0", "id": 100 + i, "method": "session/prompt", "params": prompt}))
        c = await d.ws(sid)
        for _ in range(32):  # every prompt accepted (one turn running, the rest queued)
            await c.next(lambda f: f.get("kind") == "message" and f.get("source") == "client")
        over = await answer_to(conn, {"jsonrpc": "2.0", "id": 999, "method": "session/prompt", "params": prompt})
        assert over["id"] == 999 and over["error"]["code"] == -32000


async def test_an_acp_agent_behind_the_gateway_keeps_its_own_options_tools_and_plan(
    daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    from test_acp_e2e import acp_profile

    d = await daemon_factory(base_config(tmp_path, agent_env) + acp_profile("acp", agent_env))
    s = await connect(d.ws_url, d.token, "/v1/acp/acp")
    init = await s.initialize()
    assert init.agent_capabilities.prompt_capabilities.image is False  # not known before the agent runs
    sid = (await s.conn.new_session(cwd=str(tmp_path))).session_id
    s.rec.answer = lambda ask: {"outcome": "selected", "optionId": ask["options"][1]["optionId"]}
    for text in ("tool", "plan", "ask"):
        resp = await asyncio.wait_for(s.conn.prompt(session_id=sid, prompt=[text_block(text)]), STEP_TIMEOUT)
        assert resp.stop_reason == "end_turn", text
    statuses = [u.get("status") for u in s.rec.of(sid, "tool_call_update")]
    assert "completed" in statuses
    (plan,) = s.rec.of(sid, "plan")
    assert len(plan["entries"]) == 2
    (ask,) = s.rec.asks
    assert [o["kind"] for o in ask["options"]] == ["allow_once", "allow_always", "reject_once"]
    assert s.rec.text(sid).endswith(f"permission: {ask['options'][1]['optionId']}")
    await s.close()


async def test_bad_params_are_answered_and_refusals_carry_the_bridges_code(daemon: Any, tmp_path: Path) -> None:
    async with websockets.connect(f"{daemon.ws_url}/v1/acp/demo", additional_headers=daemon.headers) as conn:
        n = iter(range(1, 100))

        async def call(method: str, params: Any) -> dict[str, Any]:
            i = next(n)
            got = await rpc(conn, {"jsonrpc": "2.0", "id": i, "method": method, "params": params})
            assert got["id"] == i, got
            return got

        assert (await call("initialize", {"protocolVersion": "1"}))["error"]["code"] == -32602
        assert "result" in await call("initialize", {"protocolVersion": 1})
        assert (await call("session/new", [1]))["error"]["code"] == -32602
        assert (await call("session/new", {"cwd": 5}))["error"]["code"] == -32602
        assert (await call("session/new", {"cwd": str(tmp_path), "mcpServers": "x"}))["error"]["code"] == -32602
        nowhere = await call("session/new", {"cwd": str(tmp_path / "nope"), "mcpServers": []})
        assert nowhere["error"]["code"] == -32602 and nowhere["error"]["data"] == {"code": "bad_cwd"}
        other = await call("session/new", {"cwd": str(tmp_path), "_meta": {"agent-bridge": {"agent": "nope"}}})
        assert other["error"]["code"] == -32002 and other["error"]["data"] == {"code": "agent_not_found"}
        sid = (await call("session/new", {"cwd": str(tmp_path), "mcpServers": []}))["result"]["sessionId"]
        assert (await call("session/resume", {"sessionId": sid}))["error"]["code"] == -32602  # already attached
        assert (await call("session/prompt", {"prompt": []}))["error"]["code"] == -32602
        unattached = await call("session/prompt", {"sessionId": "thr_0000000000000000", "prompt": []})
        assert unattached["error"]["code"] == -32002
        audio = [{"type": "audio", "data": "aGk=", "mimeType": "audio/wav"}]
        refused = await call("session/prompt", {"sessionId": sid, "prompt": audio})
        assert refused["error"]["data"] == {"code": "unsupported_content"}
        tiff = [{"type": "image", "data": "aGk=", "mimeType": "image/tiff"}]
        assert (await call("session/prompt", {"sessionId": sid, "prompt": tiff}))["error"]["data"] == {
            "code": "invalid_content"
        }
        bad_cursor = await call("session/list", {"cursor": "zzz"})
        assert bad_cursor["error"]["code"] == -32602 and bad_cursor["error"]["data"] == {"code": "invalid_cursor"}
        assert (await call("session/list", {"cwd": 3}))["error"]["code"] == -32602
        after = await call("session/load", {"sessionId": sid, "_meta": {"agent-bridge": {"after": -1}}})
        assert after["error"]["code"] == -32602
        hello = {"sessionId": sid, "prompt": [{"type": "text", "text": "hello"}]}
        first = await rpc(conn, {"jsonrpc": "2.0", "id": "p", "method": "session/prompt", "params": hello})
        seen = [first]
        while "id" not in seen[-1]:
            seen.append(json.loads(await asyncio.wait_for(conn.recv(), STEP_TIMEOUT)))
        assert seen[-1] == {"jsonrpc": "2.0", "id": "p", "result": {"stopReason": "end_turn"}}
        assert {m["method"] for m in seen[:-1]} == {"session/update"} and len(seen) > 1  # the updates came first


async def test_a_stopping_daemon_closes_acp_connections_with_1001(daemon: Any) -> None:
    async with websockets.connect(f"{daemon.ws_url}/v1/acp", additional_headers=daemon.headers) as conn:
        await rpc(conn, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}})
        stopping = asyncio.ensure_future(daemon.stop())
        try:
            await asyncio.wait_for(conn.recv(), STEP_TIMEOUT)
            raise AssertionError("a frame after shutdown")
        except websockets.ConnectionClosed as exc:
            assert exc.rcvd is not None and exc.rcvd.code == 1001
        assert await asyncio.wait_for(stopping, STEP_TIMEOUT) == 0


async def test_close_stops_the_agent_keeps_the_thread_and_delete_deletes_it(
    daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    d = await daemon_factory(config(tmp_path, agent_env))
    s = await started(d)
    caps = (await s.initialize()).agent_capabilities.session_capabilities
    assert caps.close is not None and caps.delete is not None
    sid = (await s.conn.new_session(cwd=str(tmp_path), **{"agent-bridge": {"agent": "stream-json"}})).session_id
    prompt = asyncio.ensure_future(s.conn.prompt(session_id=sid, prompt=[text_block("slow")]))
    await s.rec.wait_for(lambda: bool(s.rec.text(sid)), "the first tick")
    await asyncio.wait_for(s.conn.close_session(session_id=sid), STEP_TIMEOUT)
    assert (await asyncio.wait_for(prompt, STEP_TIMEOUT)).stop_reason == "cancelled"
    async with d.http() as http:
        thread = (await http.get(f"/v1/threads/{sid}")).json()
    assert thread["state"] == "exited" and thread["last_exit"]["reason"] == "stopped"  # the thread stays
    await asyncio.wait_for(s.conn.close_session(session_id=sid), STEP_TIMEOUT)  # closed twice: closed
    # Resumed, the session goes on: its agent starts again at the next prompt.
    await s.conn.resume_session(cwd=str(tmp_path), session_id=sid)
    resp = await asyncio.wait_for(s.conn.prompt(session_id=sid, prompt=[text_block("again")]), STEP_TIMEOUT)
    assert resp.stop_reason == "end_turn"

    other = await started(d)
    await other.conn.resume_session(cwd=str(tmp_path), session_id=sid)
    await asyncio.wait_for(s.conn._conn.send_request("session/delete", {"sessionId": sid}), STEP_TIMEOUT)
    for client in (s, other):  # every attached client is told
        await client.rec.wait_for(
            lambda c=client: any(u.get("field_meta") or u.get("_meta") for u in c.rec.of(sid, "session_info_update")),
            "the deletion",
        )
    async with d.http() as http:
        assert (await http.get(f"/v1/threads/{sid}")).status_code == 404
    assert sid not in {x.session_id for x in (await s.conn.list_sessions()).sessions}
    assert await asyncio.wait_for(s.conn._conn.send_request("session/delete", {"sessionId": sid}), STEP_TIMEOUT) == {}
    await s.close()
    await other.close()


async def test_titles_models_and_message_ids_reach_every_attached_client(
    daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    modeled = profile_toml("modeled", "stream-json", agent_env, model="fake-model", models=["other-model"])
    d = await daemon_factory(config(tmp_path, agent_env) + modeled)
    a, b = await started(d), await started(d)
    new = await a.conn.new_session(cwd=str(tmp_path), **{"agent-bridge": {"agent": "modeled"}})
    sid = new.session_id
    (model,) = new.config_options or []
    assert model.id == "model" and model.category == "model"
    await b.conn.resume_session(cwd=str(tmp_path), session_id=sid)
    for text in ("one", "two"):
        resp = await asyncio.wait_for(a.conn.prompt(session_id=sid, prompt=[text_block(text)]), STEP_TIMEOUT)
        assert resp.stop_reason == "end_turn"
    # The first prompt titled the thread (issue #38 item 6), then a title given over REST:
    # both clients hear both.
    async with d.http() as http:
        assert (await http.get(f"/v1/threads/{sid}")).json()["title"] == "one"
        assert (await http.patch(f"/v1/threads/{sid}", json={"title": "renamed"})).status_code == 200
    for client in (a, b):
        await client.rec.wait_for(
            lambda c=client: [u.get("title") for u in c.rec.of(sid, "session_info_update")] == ["one", "renamed"],
            "the titles",
        )
    # The model, set by a: answered whole to a, told to b, recorded on the thread.
    got = await asyncio.wait_for(
        a.conn.set_config_option(session_id=sid, config_id="model", value="other-model"), STEP_TIMEOUT
    )
    assert [o.current_value for o in got.config_options] == ["other-model"]
    await b.rec.wait_for(lambda: bool(b.rec.of(sid, "config_option_update")), "the model change")
    assert not a.rec.of(sid, "config_option_update")
    async with d.http() as http:
        assert (await http.get(f"/v1/threads/{sid}")).json()["model"] == "other-model"
    # The idle agent was stopped: the next prompt starts it with the new model, resuming its session.
    resp = await asyncio.wait_for(a.conn.prompt(session_id=sid, prompt=[text_block("three")]), STEP_TIMEOUT)
    assert resp.stop_reason == "end_turn"
    starts = [
        e["argv"]
        for e in map(json.loads, Path(agent_env["FAKE_AGENT_LOG"]).read_text().splitlines())
        if e.get("event") == "start"
    ]
    first, last = " ".join(starts[0]), " ".join(starts[-1])
    assert "--model=fake-model" in first and "--model=other-model" in last and "--resume" in last, (first, last)
    # Message ids: the same live and on a load, from the start or from the middle.
    live = [(u["messageId"], u["content"]["text"]) for u in a.rec.of(sid, "agent_message_chunk")]
    assert len({m for m, _ in live}) == 3 and all(m for m, _ in live)
    c = await started(d)
    await asyncio.wait_for(c.conn.load_session(cwd=str(tmp_path), session_id=sid), STEP_TIMEOUT)
    assert [(u["messageId"], u["content"]["text"]) for u in c.rec.of(sid, "agent_message_chunk")] == live
    seqs = [
        m["params"]["_meta"]["agent-bridge"]["seq"]
        for m in c.validator.received
        if m.get("method") == "session/update" and m["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
    ]
    users = [u["messageId"] for u in c.rec.of(sid, "user_message_chunk")]
    assert len(set(users)) == 3 and not set(users) & {m for m, _ in live}
    e = await started(d)
    meta = {"agent-bridge": {"after": seqs[1]}}  # from the middle of the first message
    await asyncio.wait_for(e.conn.load_session(cwd=str(tmp_path), session_id=sid, **meta), STEP_TIMEOUT)
    assert [(u["messageId"], u["content"]["text"]) for u in e.rec.of(sid, "agent_message_chunk")] == live[2:]
    for client in (a, b, c, e):
        await client.close()


async def test_an_acp_agents_config_options_usage_titles_and_message_ids_reach_the_client(
    daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    from test_acp_e2e import acp_profile

    d = await daemon_factory(base_config(tmp_path, agent_env) + acp_profile("acp", agent_env, "--config-options"))
    s = await connect(d.ws_url, d.token, "/v1/acp/acp")
    await s.initialize()
    new = await s.conn.new_session(cwd=str(tmp_path))
    sid = new.session_id
    options = {o.id: o for o in new.config_options or []}
    assert set(options) == {"mode", "model"} and options["model"].category == "model"  # the agent's own, no boolean
    got = await asyncio.wait_for(
        s.conn.set_config_option(session_id=sid, config_id="model", value="deep"), STEP_TIMEOUT
    )
    assert {o.id: o.current_value for o in got.config_options}["model"] == "deep"
    for text in ("whatconfig", "usage", "title Named by the agent", "config mode plan"):
        resp = await asyncio.wait_for(s.conn.prompt(session_id=sid, prompt=[text_block(text)]), STEP_TIMEOUT)
        assert resp.stop_reason == "end_turn", text
    assert "config: model=deep" in s.rec.text(sid)
    (usage, *_) = s.rec.of(sid, "usage_update")
    assert usage["used"] == 1200 and usage["size"] == 200000 and usage["cost"]["currency"] == "USD"
    ids = {u["messageId"] for u in s.rec.of(sid, "agent_message_chunk")}
    assert all(ids) and not any(i.startswith(sid) for i in ids)  # the agent's own ids
    # The first prompt titled the thread; the agent's own title replaced that one (issue #38 item 6).
    await s.rec.wait_for(
        lambda: [u.get("title") for u in s.rec.of(sid, "session_info_update")] == ["whatconfig", "Named by the agent"],
        "the titles",
    )
    await s.rec.wait_for(
        lambda: any(
            {o["id"]: o["currentValue"] for o in u["configOptions"]}.get("mode") == "plan"
            for u in s.rec.of(sid, "config_option_update")
        ),
        "the agent's own change of mode",
    )
    bad = s.conn.set_config_option(session_id=sid, config_id="model", value="nope")
    try:
        await asyncio.wait_for(bad, STEP_TIMEOUT)
        raise AssertionError("an unknown value was taken")
    except Exception as exc:  # the SDK raises the JSON-RPC error
        assert getattr(exc, "code", None) == -32602, exc
    await s.close()
