"""The stdio relay's bookkeeping (bridge/acp_adapter.py), in process: what it remembers
from the messages it passes on, and what it sends after a reconnection."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from bridge.acp_adapter import Relay, gateway_url


def line(**msg: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **msg}).encode() + b"\n"


def test_gateway_urls() -> None:
    assert gateway_url("http://127.0.0.1:8765", None) == "ws://127.0.0.1:8765/v1/acp"
    assert gateway_url("https://h.example/", "claude") == "wss://h.example/v1/acp/claude"
    assert gateway_url("ws://h:1/custom/acp", "x") == "ws://h:1/custom/acp"
    assert gateway_url("http://h", "a b") == "ws://h/v1/acp/a%20b"
    for bad in ("ftp://h", "h:8765", "http://"):
        with pytest.raises(ValueError):
            gateway_url(bad, None)


def test_prompts_get_a_client_id_and_sessions_their_seq() -> None:
    relay = Relay("ws://x/v1/acp", None, out=io.BytesIO())
    assert relay.from_editor(b"  \n") is None
    text, req = relay.from_editor(line(id=0, method="initialize", params={"protocolVersion": 1}))  # type: ignore[misc]
    assert relay.init == {"protocolVersion": 1} and req is not None
    relay.waiting[1] = {"id": 1, "method": "session/new", "params": {"cwd": "/w", "mcpServers": []}}
    assert relay.from_daemon(
        json.dumps(
            {"jsonrpc": "2.0", "id": 1, "result": {"sessionId": "thr_a", "_meta": {"agent-bridge": {"last_seq": 3}}}}
        )
    )
    assert relay.sessions["thr_a"].last_seq == 3 and relay.sessions["thr_a"].cwd == "/w"
    update = {"sessionId": "thr_a", "update": {}, "_meta": {"agent-bridge": {"seq": 9}}}
    assert relay.from_daemon(json.dumps({"jsonrpc": "2.0", "method": "session/update", "params": update}))
    assert relay.sessions["thr_a"].last_seq == 9
    text, req = relay.from_editor(line(id=2, method="session/prompt", params={"sessionId": "thr_a", "prompt": []}))  # type: ignore[misc]
    cid = json.loads(text)["params"]["_meta"]["agent-bridge"]["client_id"]
    assert cid.startswith("relay-") and req is not None and req["params"]["_meta"]["agent-bridge"]["client_id"] == cid
    kept, _ = relay.from_editor(  # type: ignore[misc]
        line(
            id=3,
            method="session/prompt",
            params={"sessionId": "thr_a", "prompt": [], "_meta": {"agent-bridge": {"client_id": "mine"}}},
        )
    )
    assert json.loads(kept)["params"]["_meta"]["agent-bridge"]["client_id"] == "mine"
    assert relay.from_editor(b"not json\n") == ("not json", None)
    assert relay.from_editor(line(method="session/cancel", params={"sessionId": "thr_a"}))[1] is None  # type: ignore[index]


def test_answers_to_the_relays_own_requests_are_not_passed_on() -> None:
    import asyncio

    async def go() -> None:
        relay = Relay("ws://x/v1/acp", None, out=io.BytesIO())
        rid, fut = relay.reserve()
        assert rid == "agent-bridge-relay-1"
        assert not relay.from_daemon(json.dumps({"jsonrpc": "2.0", "id": "agent-bridge-relay-1", "result": {}}))
        assert fut.result() == {"jsonrpc": "2.0", "id": "agent-bridge-relay-1", "result": {}}
        assert relay.from_daemon(json.dumps({"jsonrpc": "2.0", "id": "agent-bridge-relay-2", "result": {}}))

    asyncio.run(go())


class FakeDaemon:
    """What _restore talks to: keeps what is sent, answers the relay's own requests
    (a load of ``thr_gone`` is refused)."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.sent: list[dict[str, Any]] = []

    async def send(self, text: str) -> None:
        msg = json.loads(text)
        self.sent.append(msg)
        if str(msg.get("id", "")).startswith("agent-bridge-relay-"):
            gone = msg["params"].get("sessionId") == "thr_gone"
            answer = {"error": {"code": -32002, "message": "no"}} if gone else {"result": {}}
            assert not self.relay.from_daemon(json.dumps({"jsonrpc": "2.0", "id": msg["id"], **answer}))


def test_a_reconnection_initializes_loads_from_the_last_seq_and_resends_what_is_safe() -> None:
    import asyncio

    from bridge.acp_adapter import _Session

    out = io.BytesIO()
    relay = Relay("ws://x/v1/acp", None, out=out)
    relay.init = {"protocolVersion": 1}
    relay.sessions = {"thr_a": _Session("/w", 9), "thr_gone": _Session(None, 0)}
    prompt = {"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": {"sessionId": "thr_a"}}
    relay.waiting = {
        2: prompt,
        3: {"jsonrpc": "2.0", "id": 3, "method": "session/list", "params": {}},
        4: {"jsonrpc": "2.0", "id": 4, "method": "session/new", "params": {"cwd": "/w"}},
    }
    daemon = FakeDaemon(relay)
    asyncio.run(relay._restore(daemon))  # type: ignore[arg-type]
    assert [(m.get("method"), m["params"].get("sessionId")) for m in daemon.sent] == [
        ("initialize", None),
        ("session/load", "thr_a"),
        ("session/load", "thr_gone"),
        ("session/prompt", "thr_a"),
        ("session/list", None),
    ]
    assert daemon.sent[1]["params"] == {
        "sessionId": "thr_a",
        "mcpServers": [],
        "cwd": "/w",
        "_meta": {"agent-bridge": {"after": 9}},
    }
    assert daemon.sent[3] == prompt and set(relay.sessions) == {"thr_a"} and set(relay.waiting) == {2, 3}
    assert json.loads(out.getvalue()) == {
        "jsonrpc": "2.0",
        "id": 4,
        "error": {"code": -32603, "message": "connection lost"},
    }

    # An initialize the editor is still waiting for is its own again, not the relay's.
    relay = Relay("ws://x/v1/acp", None, out=io.BytesIO())
    relay.init = {"protocolVersion": 1}
    relay.waiting = {0: {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": relay.init}}
    daemon = FakeDaemon(relay)
    asyncio.run(relay._restore(daemon))  # type: ignore[arg-type]
    assert daemon.sent == [relay.waiting[0]]
