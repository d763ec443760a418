"""The bridge withdrawing one of its own requests from an ACP agent (protocols/acp_cancel.py,
sessions/core.py ``give_up``): a mode switch nobody waits for any more gets
``$/cancel_request``, and the agent's answer to it is still read as before."""

from __future__ import annotations

import json
from typing import Any

from bridge.protocols.acp import AcpCodec
from bridge.protocols.acp_cancel import target
from bridge.protocols.codec import RoutedCancel
from bridge.protocols.stream_json import StreamJsonCodec
from bridge.sessions.actions import Emit, Limits, Write
from bridge.sessions.core import ConversationCore

MODES = {"currentModeId": "default", "availableModes": [{"id": "default", "name": "D"}, {"id": "plan", "name": "P"}]}


def answer(codec: AcpCodec, line: str, result: Any) -> Any:
    rid = json.loads(line)["id"]
    return codec.decode(json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}).encode())


def ready() -> AcpCodec:
    codec = AcpCodec(cwd="/w")
    (init,) = codec.start()
    (new,) = answer(codec, init, {"protocolVersion": 1, "agentCapabilities": {}}).replies
    assert answer(codec, new, {"sessionId": "s1", "modes": MODES}).events
    return codec


def test_a_switch_given_up_on_is_withdrawn_by_its_id_and_its_late_answer_still_read() -> None:
    codec = ready()
    assert isinstance(codec, RoutedCancel) and not isinstance(StreamJsonCodec(), RoutedCancel)
    asked = codec.set_mode("plan", "route-1")
    assert asked is not None
    assert codec.cancel_routed("other-route") is None
    line = codec.cancel_routed("route-1")
    assert line is not None
    notice = json.loads(line)
    assert notice == {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": json.loads(asked)["id"]}}
    assert target(notice["params"]) == json.loads(asked)["id"]
    # The agent may still do it: its answer is read as ever (the mode changes).
    late = answer(codec, asked, {})
    assert [e.data.get("mode") for e in late.events if e.kind == "agent.status"] == ["plan"]
    assert codec.cancel_routed("route-1") is None  # answered: nothing left to withdraw
    # … or answer -32800, which is the agent's refusal as any other.
    again = codec.set_mode("default", "route-2")
    assert again is not None and codec.cancel_routed("route-2") is not None
    err = {"jsonrpc": "2.0", "id": json.loads(again)["id"], "error": {"code": -32800, "message": "Request cancelled"}}
    out = codec.decode(json.dumps(err).encode())
    assert [e.kind for e in out.events] == ["agent.other"] and not out.replies


def test_the_core_records_and_writes_the_withdrawal_and_does_nothing_without_one() -> None:
    core = ConversationCore(last_seq=0, native_session_id=None, options={}, limits=Limits())
    codec = ready()
    core.codec = codec
    asked = codec.set_mode("plan", "r")
    assert asked is not None
    emit, write = core.give_up("r")
    assert isinstance(emit, Emit) and isinstance(write, Write)
    assert emit.events[0].kind == "client.other" and emit.events[0].data == {"op": "cancel_request"}
    assert write.line == emit.events[0].raw and json.loads(write.line)["method"] == "$/cancel_request"
    assert core.give_up("unknown") == []
    core.codec = StreamJsonCodec()
    assert core.give_up("r") == []
