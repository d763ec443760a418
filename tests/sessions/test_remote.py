"""Input forwarded between replicas (sessions/remote.py), in-process: a command from
another replica is checked before it is used, an owner's refusal comes back as the error a
local client would have got, and a malformed answer is never taken for an acceptance."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from bridge.bus.base import CommandRefused, LocalBus, Reply
from bridge.errors import BridgeError, NotFound
from bridge.sessions.actions import Accepted
from bridge.sessions.fanout import Fanout, Subscriber
from bridge.sessions.modes import ModeRefused
from bridge.sessions.remote import ForwardFailed, Owners, accepted_body, accepted_from, refusal, run_command

pytestmark = pytest.mark.timeout(10)


class FakeConv:
    """Records what the owner was asked to do."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.users: list[str | None] = []  # the ``by`` (users mode) each call carried

    async def submit(
        self, content: list[dict[str, Any]], client_id: str | None, *, forward: bool, by: str | None = None
    ) -> Accepted:
        self.calls.append(("submit", (content, client_id, forward)))
        self.users.append(by)
        return Accepted(seq=7, turn_id="turn_1")

    async def interrupt(self, *, forward: bool, by: str | None = None) -> bool:
        self.calls.append(("interrupt", forward))
        self.users.append(by)
        return True

    async def answer_permission(self, request_id: str, decision: str, **kw: Any) -> dict[str, Any]:
        self.users.append(kw.pop("user", None))
        self.calls.append(("permission", (request_id, decision, kw)))
        if request_id == "gone":
            raise NotFound("no pending permission request gone", code="permission_not_found")
        return {"request_id": request_id, "decision": decision}

    async def set_mode(self, mode_id: str, *, forward: bool, by: str | None = None) -> dict[str, Any]:
        self.calls.append(("mode", (mode_id, forward)))
        self.users.append(by)
        if mode_id == "yolo":
            raise ModeRefused("the agent refused mode 'yolo': Internal error (-32603)", {"code": -32603})
        return {"mode_id": mode_id}

    async def write_raw(self, message: dict[str, Any], *, forward: bool, by: str | None = None) -> int:
        self.calls.append(("raw", (message, forward)))
        self.users.append(by)
        return 9


async def run(kind: str, body: Mapping[str, Any]) -> tuple[FakeConv, Mapping[str, Any]]:
    conv = FakeConv()
    return conv, await run_command(conv, kind, body)  # type: ignore[arg-type]


async def test_each_command_runs_on_the_owner_and_is_never_forwarded_again() -> None:
    conv, out = await run("prompt", {"content": [{"type": "text", "text": "hi"}], "client_id": "c1"})
    assert out == {"seq": 7, "turn_id": "turn_1", "duplicate": False, "queued": False}
    assert conv.calls == [("submit", ([{"type": "text", "text": "hi"}], "c1", False))]
    conv, out = await run("interrupt", {})
    assert out == {"active": True} and conv.calls == [("interrupt", False)]
    conv, out = await run("raw", {"message": {"jsonrpc": "2.0"}})
    assert out == {"seq": 9} and conv.calls == [("raw", ({"jsonrpc": "2.0"}, False))]
    conv, out = await run("permission", {"request_id": "r1", "decision": "allow", "by": "web-1"})
    assert out == {"request_id": "r1", "decision": "allow"}
    assert conv.calls[0][1][2] == {"by": "web-1", "option_id": None, "message": None, "forward": False}


async def test_the_user_who_sent_a_command_crosses_with_it() -> None:
    """Users mode: the owner records the sender's user as ``by``, as the sender's replica would."""
    for kind, body in (
        ("prompt", {"content": [{"type": "text", "text": "hi"}]}),
        ("interrupt", {}),
        ("raw", {"message": {"jsonrpc": "2.0"}}),
        ("permission", {"request_id": "r1", "decision": "allow", "by": "web-1"}),
    ):
        conv, _ = await run(kind, {**body, "user": "alice"})
        assert conv.users == ["alice"], kind
        conv, _ = await run(kind, body)
        assert conv.users == [None], kind  # token mode: nobody named
        with pytest.raises(CommandRefused):
            await run(kind, {**body, "user": 5})  # not a name: refused, nothing done


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("prompt", {}),
        ("prompt", {"content": []}),
        ("prompt", {"content": "text"}),
        ("prompt", {"content": [{"text": "no type"}]}),
        ("prompt", {"content": [{"type": "text"}] * 1001}),
        ("prompt", {"content": [{"type": "text", "text": "x"}], "client_id": 5}),
        ("prompt", {"content": [{"type": "text", "text": "x"}], "client_id": "c" * 257}),
        ("permission", {"decision": "allow"}),
        ("permission", {"request_id": "r", "decision": ["allow"]}),
        ("raw", {"message": [1]}),
        ("shell", {}),
    ],
)
async def test_a_malformed_command_from_another_replica_is_refused_without_acting(
    kind: str, body: dict[str, Any]
) -> None:
    conv = FakeConv()
    with pytest.raises(CommandRefused) as caught:
        await run_command(conv, kind, body)  # type: ignore[arg-type]
    assert caught.value.body["code"] == "invalid_request" and caught.value.body["status"] == 400
    assert conv.calls == []


async def test_the_owners_refusal_keeps_its_code_and_status() -> None:
    with pytest.raises(CommandRefused) as caught:
        await run("permission", {"request_id": "gone", "decision": "allow"})
    err = refusal(caught.value.body)
    assert (err.code, err.status, err.message) == ("permission_not_found", 404, "no pending permission request gone")


@pytest.mark.parametrize(
    "body",
    [{}, {"code": "bad code!", "status": 200}, {"code": 3, "status": True, "message": 4}, {"status": 99999}],
)
def test_a_refusal_that_is_not_well_formed_reads_as_a_refusal_never_a_success(body: dict[str, Any]) -> None:
    err = refusal(body)
    assert isinstance(err, BridgeError) and 400 <= err.status <= 599
    assert err.code in ("refused", str(body.get("code")))


@pytest.mark.parametrize("body", [{}, {"seq": "7"}, {"seq": -1}, {"seq": True}])
def test_an_answer_without_a_seq_is_not_an_acceptance(body: dict[str, Any]) -> None:
    with pytest.raises(ForwardFailed):
        accepted_from(body)


def test_an_acceptance_crosses_as_it_was() -> None:
    acc = Accepted(seq=3, turn_id=None, duplicate=True, queued=True)
    assert accepted_from(accepted_body(acc)) == acc


async def test_without_a_bus_input_for_another_replica_is_refused_clearly() -> None:
    owners = Owners(None, LocalBus("a"), "a", lease_ttl_s=15)  # type: ignore[arg-type]
    with pytest.raises(ForwardFailed) as caught:
        await owners.forward("b", "prompt", "thr_1", {})
    assert caught.value.code == "bus_unavailable" and caught.value.status == 503
    assert "retry" in caught.value.message


async def test_set_mode_runs_on_the_owner_and_its_refusal_comes_back() -> None:
    conv, out = await run("mode", {"mode_id": "plan", "user": "ann"})
    assert out == {"mode_id": "plan"} and conv.calls == [("mode", ("plan", False))] and conv.users == ["ann"]
    with pytest.raises(CommandRefused) as info:
        await run("mode", {"mode_id": "yolo"})
    assert refusal(info.value.body).code == "mode_refused" and refusal(info.value.body).status == 400
    with pytest.raises(CommandRefused):
        await run("mode", {"mode_id": 7})


class AnsweringBus(LocalBus):
    """A bus whose owner answers at once, noting whether the sender's subscription was
    held when the command left (the owner may commit events before its answer arrives)."""

    def __init__(self, sub: Subscriber, reply: Reply) -> None:
        super().__init__("a")
        self.sub, self.reply = sub, reply
        self.held_at_send: list[bool] = []

    async def request(
        self, replica_id: str, kind: str, thread_id: str, body: Mapping[str, Any], timeout: float
    ) -> Reply:
        self.held_at_send.append(self.sub.held_until > 0)
        return self.reply


async def test_the_senders_subscription_is_held_from_before_the_command_leaves() -> None:
    # docs/api.md §5.4: the answer first, on a replica that forwards. The hold outlives
    # forward() — answered or refused — until the transport has pushed the answer.
    for ok in (True, False):
        sub = Fanout().subscribe()
        bus = AnsweringBus(sub, Reply("x", ok, {"seq": 4} if ok else {"code": "busy", "message": "busy"}))
        owners = Owners(None, bus, "a", lease_ttl_s=15)  # type: ignore[arg-type]
        if ok:
            assert await owners.forward("b", "prompt", "thr_1", {}, answer_to=sub) == {"seq": 4}
        else:
            with pytest.raises(BridgeError) as refused:
                await owners.forward("b", "prompt", "thr_1", {}, answer_to=sub)
            assert refused.value.code == "busy"
        assert bus.held_at_send == [True] and sub.held_until > 0
        sub.release()
        assert sub.held_until == 0.0 and sub.wake.is_set()
    unheld = Fanout().subscribe()  # a frame not forwarded: nothing is held
    bus = AnsweringBus(unheld, Reply("x", True, {}))
    await Owners(None, bus, "a", lease_ttl_s=15).forward("b", "raw", "thr_1", {})  # type: ignore[arg-type]
    assert bus.held_at_send == [False]
