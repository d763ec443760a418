"""Commands forwarded between replicas (sessions/remote.py), in-process: a command from
another replica is checked before it is used, a holder's refusal comes back as the error a
local client would have got, and a malformed answer is never taken for an acceptance."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from bridge.bus.base import CommandRefused, LocalBus, Reply
from bridge.errors import BridgeError, NotFound
from bridge.sessions.actions import Accepted
from bridge.sessions.commands import AnswerPermission, Command, Interrupt, MalformedAnswer, Prompt, Raw, SetMode
from bridge.sessions.fanout import Fanout, Subscriber
from bridge.sessions.modes import ModeRefused
from bridge.sessions.remote import ForwardFailed, LeaseHolders, refusal, serve

pytestmark = pytest.mark.timeout(10)


class FakePort:
    """The holder's own conversation: records each command it was given to run here."""

    def __init__(self) -> None:
        self.commands: list[Command[Any]] = []

    @property
    def users(self) -> list[str | None]:
        return [c.actor for c in self.commands]  # who sent each (users mode)

    async def run(self, command: Command[Any], *, answer_to: Subscriber | None = None) -> Any:
        self.commands.append(command)
        if isinstance(command, Prompt):
            return Accepted(seq=7, turn_id="turn_1")
        if isinstance(command, Interrupt):
            return True
        if isinstance(command, AnswerPermission):
            if command.request_id == "gone":
                raise NotFound("no pending permission request gone", code="permission_not_found")
            return {"request_id": command.request_id, "decision": command.decision}
        if isinstance(command, SetMode):
            if command.mode_id == "yolo":
                raise ModeRefused("the agent refused mode 'yolo': Internal error (-32603)", {"code": -32603})
            return {"mode_id": command.mode_id}
        assert isinstance(command, Raw)
        return 9


async def run(kind: str, body: Mapping[str, Any]) -> tuple[FakePort, Mapping[str, Any]]:
    port = FakePort()
    return port, await serve(port, kind, body)


async def test_each_command_runs_on_the_holder_and_is_never_forwarded_again() -> None:
    # serve() is given the holder's conversation itself, never a forwarding port.
    conv, out = await run("prompt", {"content": [{"type": "text", "text": "hi"}], "client_id": "c1"})
    assert out == {"seq": 7, "turn_id": "turn_1", "duplicate": False, "queued": False}
    assert conv.commands == [Prompt(content=[{"type": "text", "text": "hi"}], client_id="c1")]
    conv, out = await run("interrupt", {})
    assert out == {"active": True} and conv.commands == [Interrupt()]
    conv, out = await run("raw", {"message": {"jsonrpc": "2.0"}})
    assert out == {"seq": 9} and conv.commands == [Raw(message={"jsonrpc": "2.0"})]
    conv, out = await run("permission", {"request_id": "r1", "decision": "allow", "by": "web-1"})
    assert out == {"request_id": "r1", "decision": "allow"}
    assert conv.commands == [AnswerPermission(request_id="r1", decision="allow", channel="web-1")]


async def test_what_a_replica_sends_is_what_the_holder_runs() -> None:
    for command in (
        Prompt(content=[{"type": "text", "text": "hi"}], client_id="c1", actor="alice"),
        Interrupt(actor="alice"),
        AnswerPermission(request_id="r1", decision="deny", channel="acp", option_id="o", message="no", actor="a"),
        SetMode(mode_id="plan", actor="ann"),
        Raw(message={"jsonrpc": "2.0"}, actor="bob"),
    ):
        conv, _ = await run(*command.to_wire())
        assert conv.commands == [command]


async def test_the_user_who_sent_a_command_crosses_with_it() -> None:
    """Users mode: the holder records the sender's user as ``by``, as the sender's replica would."""
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
        ("raw", {"message": {}, "routed": True}),  # a field no replica sends
        ("shell", {}),
    ],
)
async def test_a_malformed_command_from_another_replica_is_refused_without_acting(
    kind: str, body: dict[str, Any]
) -> None:
    conv = FakePort()
    with pytest.raises(CommandRefused) as caught:
        await serve(conv, kind, body)
    assert caught.value.body["code"] == "invalid_request" and caught.value.body["status"] == 400
    assert conv.commands == []


async def test_the_holders_refusal_keeps_its_code_and_status() -> None:
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
    prompt = Prompt(content=[{"type": "text", "text": "x"}])
    with pytest.raises(MalformedAnswer):
        prompt.answer_from_wire(body)
    with pytest.raises(MalformedAnswer):
        Raw(message={}).answer_from_wire(body)


def test_an_acceptance_crosses_as_it_was() -> None:
    acc = Accepted(seq=3, turn_id=None, duplicate=True, queued=True)
    prompt = Prompt(content=[{"type": "text", "text": "x"}])
    assert prompt.answer_from_wire(prompt.answer_to_wire(acc)) == acc


async def test_without_a_bus_input_for_another_replica_is_refused_clearly() -> None:
    holders = LeaseHolders(None, LocalBus("a"), "a", lease_ttl_s=15)  # type: ignore[arg-type]
    with pytest.raises(ForwardFailed) as caught:
        await holders.forward("b", "prompt", "thr_1", {})
    assert caught.value.code == "bus_unavailable" and caught.value.status == 503
    assert "retry" in caught.value.message


async def test_set_mode_runs_on_the_holder_and_its_refusal_comes_back() -> None:
    conv, out = await run("mode", {"mode_id": "plan", "user": "ann"})
    assert out == {"mode_id": "plan"} and conv.commands == [SetMode(mode_id="plan", actor="ann")]
    with pytest.raises(CommandRefused) as info:
        await run("mode", {"mode_id": "yolo"})
    assert refusal(info.value.body).code == "mode_refused" and refusal(info.value.body).status == 400
    with pytest.raises(CommandRefused):
        await run("mode", {"mode_id": 7})


class AnsweringBus(LocalBus):
    """A bus whose holder answers at once, noting whether the sender's subscription was
    held when the command left (the holder may commit events before its answer arrives)."""

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
        holders = LeaseHolders(None, bus, "a", lease_ttl_s=15)  # type: ignore[arg-type]
        if ok:
            assert await holders.forward("b", "prompt", "thr_1", {}, answer_to=sub) == {"seq": 4}
        else:
            with pytest.raises(BridgeError) as refused:
                await holders.forward("b", "prompt", "thr_1", {}, answer_to=sub)
            assert refused.value.code == "busy"
        assert bus.held_at_send == [True] and sub.held_until > 0
        sub.release()
        assert sub.held_until == 0.0 and sub.wake.is_set()
    unheld = Fanout().subscribe()  # a frame not forwarded: nothing is held
    bus = AnsweringBus(unheld, Reply("x", True, {}))
    await LeaseHolders(None, bus, "a", lease_ttl_s=15).forward("b", "raw", "thr_1", {})  # type: ignore[arg-type]
    assert bus.held_at_send == [False]
