"""Elicitation through the ACP gateway: an official-SDK client over the WebSocket that
advertised elicitation is sent the fake ACP agent's question as ``elicitation/create`` (every
message validated against the SDK's schema), answers it, and the agent gets that answer;
answered elsewhere first, the client's open question is withdrawn with
``$/cancel_request``; a client that advertised nothing is never asked."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import acp
from acp import schema, text_block
from acp.ws import create_websocket_stream
from conftest import STEP_TIMEOUT
from pydantic import TypeAdapter, ValidationError
from support.acp_client import Recorder, Session, Validator
from test_acp_e2e import config

# Unions in the SDK's schema: checked through a TypeAdapter.
ELICIT: dict[str, Any] = {
    "elicitation/create": TypeAdapter(schema.CreateElicitationRequest),
    "elicitation/complete": TypeAdapter(schema.CompleteElicitationNotification),
}
INCOMING = tuple(ELICIT)


class StrictValidator(Validator):
    def check(self, msg: dict[str, Any]) -> None:
        adapter = ELICIT.get(msg.get("method", ""))
        if adapter is None:
            super().check(msg)
            return
        try:
            adapter.validate_python(msg.get("params"))
        except ValidationError as exc:
            self.problems.append(f"{msg}: {exc}")


class Asker(Recorder):
    """The SDK client side, answering elicitations with ``reply`` (a dict, or an awaitable)."""

    def __init__(self) -> None:
        super().__init__()
        self.elicits: list[dict[str, Any]] = []
        self.reply: Any = lambda ask: {"action": "decline"}

    async def create_elicitation(self, message: str, mode: Any, **kw: Any) -> Any:
        self.elicits.append({"message": message, **mode.model_dump(by_alias=True, exclude_none=True, mode="json")})
        self._poke()
        answer = self.reply(self.elicits[-1])
        if asyncio.iscoroutine(answer) or isinstance(answer, asyncio.Future):
            answer = await answer
        return answer


async def connect(d: Any, *, elicitation: bool) -> tuple[Session, Asker]:
    transport = await asyncio.wait_for(
        create_websocket_stream(d.ws_url + "/v1/acp/acp", headers={"Authorization": f"Bearer {d.token}"}), STEP_TIMEOUT
    )
    rec, validator = Asker(), StrictValidator()
    # SDK 0.12.1 routes elicitation/create only with its unstable methods turned on.
    conn = acp.connect_to_agent(rec, transport, observers=[validator], use_unstable_protocol=True)  # type: ignore[arg-type]
    caps = schema.ClientCapabilities(
        elicitation=schema.ElicitationCapabilities(
            form=schema.ElicitationFormCapabilities(), url=schema.ElicitationUrlCapabilities()
        )
        if elicitation
        else None
    )
    await asyncio.wait_for(conn.initialize(protocol_version=1, client_capabilities=caps), STEP_TIMEOUT)
    return Session(conn, rec, validator, transport), rec


async def test_an_acp_client_answers_the_agents_form(daemon_factory: Any, tmp_path: Path, agent_env: Any) -> None:
    d = await daemon_factory(config(agent_env))
    s, rec = await connect(d, elicitation=True)
    rec.reply = lambda ask: schema.AcceptElicitationResponse(action="accept", content={"name": "Ada", "count": 4})
    sid = (await s.conn.new_session(cwd=str(tmp_path))).session_id
    resp = await asyncio.wait_for(s.conn.prompt(session_id=sid, prompt=[text_block("elicit form")]), STEP_TIMEOUT)
    assert resp.stop_reason == "end_turn"
    (ask,) = rec.elicits
    assert ask["sessionId"] == sid and ask["message"] == "Tell me about it"
    assert ask["requestedSchema"]["required"] == ["name"]
    assert s.rec.text(sid).endswith('elicit: accept {"count": 4, "name": "Ada"}')
    async with d.http() as http:
        events = (await http.get(f"/v1/threads/{sid}/events?after=0")).json()["events"]
    (resolved,) = [e for e in events if e["kind"] == "elicitation.resolved"]
    assert resolved["data"]["by"] == "acp" and resolved["data"]["content"] == {"name": "Ada", "count": 4}
    await s.close()


async def test_answered_elsewhere_the_acp_client_is_sent_cancel_request(
    daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    d = await daemon_factory(config(agent_env))
    s, rec = await connect(d, elicitation=True)
    quiet, quiet_rec = await connect(d, elicitation=False)
    never: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    rec.reply = lambda ask: never  # the ACP user never clicks
    sid = (await s.conn.new_session(cwd=str(tmp_path))).session_id
    await asyncio.wait_for(quiet.conn.load_session(session_id=sid, cwd=str(tmp_path)), STEP_TIMEOUT)
    prompt = asyncio.ensure_future(s.conn.prompt(session_id=sid, prompt=[text_block("elicit url")]))
    await rec.wait_for(lambda: bool(rec.elicits), "the elicitation")
    assert (
        rec.elicits[0]["url"] == "https://example.com/connect?e=fake-1" and rec.elicits[0]["elicitationId"] == "fake-1"
    )
    c = await d.ws(sid)
    req = await c.kind("elicitation.requested")
    await c.send(op="elicitation", request_id=req["data"]["request_id"], action="accept")
    resp = await asyncio.wait_for(prompt, STEP_TIMEOUT)
    assert resp.stop_reason == "end_turn"
    assert s.rec.text(sid).endswith("elicit: accept null")
    asked = [m for m in s.validator.received if m.get("method") == "elicitation/create"]
    cancels = [m for m in s.validator.received if m.get("method") == "$/cancel_request"]
    assert [m["params"]["requestId"] for m in cancels] == [asked[0]["id"]]
    never.set_result(schema.DeclineElicitationResponse(action="decline"))  # too late: ignored
    resolved = await c.kind("elicitation.resolved")
    assert resolved["data"]["by"] == "websocket" and resolved["data"]["action"] == "accept"
    assert not quiet_rec.elicits  # it advertised no elicitation: never asked
    assert not [m for m in quiet.validator.received if m.get("method") in INCOMING]
    await c.close()
    await quiet.close()
    await s.close()
