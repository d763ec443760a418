"""The WebSocket's frames on a replica that does not run the thread (docs/api.md §5.4):
every op that is forwarded holds the sender's subscription from before the command leaves
until its answer is pushed — accepted or refused — so the answer goes out first. In-process:
the frame handler without a socket, the holder replaced by a stand-in for the bus."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from bridge.api.app import create_app
from bridge.api.users import OPERATOR
from bridge.api.ws import _Session
from bridge.config import load_settings
from bridge.errors import BridgeError
from bridge.sessions.conversation import Conversation
from bridge.sessions.fanout import Subscriber
from bridge.sessions.forwarding import Forwarding
from bridge.sessions.local_port import LocalPort

pytestmark = pytest.mark.timeout(30)
TOKEN = "t" * 32

ANSWERS: dict[str, dict[str, Any]] = {
    "prompt": {"seq": 5, "turn_id": "turn_1", "duplicate": False, "queued": False},
    "interrupt": {"active": True},
    "raw": {"seq": 6},
    "permission": {"request_id": "p1", "decision": "allow", "by": "w"},
    "mode": {"mode_id": "plan"},
}
FRAMES = [
    {"op": "prompt", "text": "hi", "client_id": "c1"},
    {"op": "interrupt"},
    {"op": "raw", "message": {"type": "keep_alive"}},
    {"op": "permission", "request_id": "p1", "decision": "allow"},
    {"op": "set_mode", "mode_id": "plan"},
]
KINDS = {"set_mode": "mode"}  # the bus command each op is forwarded as, where it differs


class Holder:
    """Another replica runs the thread: each command's answer (or refusal), noting whether
    the sender's subscription was held when it was sent."""

    def __init__(self, refuse: bool) -> None:
        self.refuse = refuse
        self.held: list[tuple[str, bool]] = []

    async def elsewhere(self, thread_id: str) -> str | None:
        return "b"

    async def forward(
        self, holder: str, kind: str, thread_id: str, body: Mapping[str, Any], *, answer_to: Subscriber | None = None
    ) -> Mapping[str, Any]:
        assert answer_to is not None
        answer_to.hold(30)  # as LeaseHolders.forward does
        self.held.append((kind, answer_to.held_until > 0))
        if self.refuse:
            raise BridgeError("busy on the holder", code="busy")
        return ANSWERS[kind]


@pytest.fixture
async def conv(tmp_path: Path) -> AsyncIterator[Conversation]:
    app = create_app(load_settings(data_dir=str(tmp_path), token=TOKEN, port=8765))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765", headers=headers) as c:
            thread = (await c.post("/v1/threads", json={"agent": "demo"})).json()
        yield await app.context.registry.get(thread["id"])


@pytest.mark.parametrize("refuse", [False, True])
async def test_each_forwarded_op_holds_its_senders_events_until_its_answer_is_pushed(
    conv: Conversation, refuse: bool
) -> None:
    holder = Holder(refuse)
    port = Forwarding(LocalPort(conv), holder)  # type: ignore[arg-type]  # what Registry.port hands out among replicas
    assert conv.profile is not None  # an agent with session modes, so set_mode is forwarded too
    conv.profile = conv.profile.model_copy(update={"protocol": "acp"})
    sub = conv.subscribe()

    class Probe(_Session):
        def __init__(self) -> None:
            self.conv, self.port, self._sub, self.actor, self.user = conv, port, sub, OPERATOR.name, OPERATOR
            # What a refusal's message is masked with (the daemon's settings, as a WebSocket's app has them).
            self.ws = SimpleNamespace(app=create_app(conv.settings))  # type: ignore[assignment]

    for frame in FRAMES:
        await Probe()._op_frame(json.dumps(frame))
        assert sub.held_until == 0.0 and sub.wake.is_set(), frame  # released with the answer
        answer = json.loads(sub.replies.pop())
        assert answer["kind"] == ("client.rejected" if refuse else "client.accepted"), answer
        assert answer["data"]["op"] == frame["op"]
    assert holder.held == [(KINDS.get(f["op"], f["op"]), True) for f in FRAMES]
    assert not conv.running  # nothing ran here
