"""The forwarding port (sessions/forwarding.py), in-process: a command runs where the
thread runs — here while this replica's agent runs it or nobody does, on the holder
otherwise — and comes back typed; holders that die are routed around a bounded number of
times, and a lease taken by another replica meanwhile sends the command there."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from bridge.errors import HeldElsewhere
from bridge.sessions.actions import Accepted
from bridge.sessions.commands import Command, Interrupt, Prompt, Raw, SetMode
from bridge.sessions.fanout import Fanout, Subscriber
from bridge.sessions.forwarding import ROUTE_ATTEMPTS, Forwarding
from bridge.sessions.remote import ForwardFailed, HolderGone

pytestmark = pytest.mark.timeout(10)

PROMPT = Prompt(content=[{"type": "text", "text": "hi"}], client_id="c1", actor="ann")


class Local:
    """This replica's conversation: runs what it is given, or refuses not_owner."""

    def __init__(self, *, running: bool = False, not_owner: bool = False) -> None:
        self.id = "thr_1"
        self.running = running
        self.not_owner = not_owner
        self.ran: list[Command[Any]] = []
        self.touched = 0

    def touch(self) -> None:
        self.touched += 1

    async def run(self, command: Command[Any], *, answer_to: Subscriber | None = None) -> Any:
        if self.not_owner:
            raise HeldElsewhere("b", self.id)
        self.ran.append(command)
        return Accepted(seq=1, turn_id="turn_here") if isinstance(command, Prompt) else True


class LeaseHolders:
    """Who holds the lease, as the store would say, one look-up after another; and the
    answers the holders give (an exception is raised instead)."""

    def __init__(self, holders: list[str | None], answers: list[Any]) -> None:
        self.holders = holders
        self.answers = answers
        self.sent: list[tuple[str, str, dict[str, Any], bool]] = []

    async def elsewhere(self, thread_id: str) -> str | None:
        return self.holders.pop(0) if len(self.holders) > 1 else self.holders[0]

    async def forward(
        self, holder: str, kind: str, thread_id: str, body: Mapping[str, Any], *, answer_to: Subscriber | None = None
    ) -> Mapping[str, Any]:
        self.sent.append((holder, kind, dict(body), answer_to is not None))
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def port(local: Local, holders: LeaseHolders) -> Forwarding:
    return Forwarding(local, holders)  # type: ignore[arg-type]


async def test_a_thread_whose_agent_runs_here_runs_the_command_here_without_asking_the_store() -> None:
    local, holders = Local(running=True), LeaseHolders(["b"], [])
    assert await port(local, holders).run(PROMPT) == Accepted(seq=1, turn_id="turn_here")
    assert local.ran == [PROMPT] and holders.sent == []


async def test_a_thread_nobody_runs_runs_here() -> None:
    local, holders = Local(), LeaseHolders([None], [])
    assert await port(local, holders).run(Interrupt(actor="ann")) is True
    assert local.ran == [Interrupt(actor="ann")] and holders.sent == []


async def test_a_thread_another_replica_runs_gets_the_command_in_its_wire_form_and_answers_typed() -> None:
    local = Local()
    holders = LeaseHolders(["b"], [{"seq": 4, "turn_id": "turn_b", "duplicate": False, "queued": True}])
    sub = Fanout().subscribe()
    acc = await port(local, holders).run(PROMPT, answer_to=sub)
    assert acc == Accepted(seq=4, turn_id="turn_b", queued=True)
    assert holders.sent == [("b", "prompt", PROMPT.to_wire()[1], True)]  # the sender's events held
    assert local.ran == [] and local.touched == 1


async def test_holders_that_die_before_answering_are_routed_around_a_bounded_number_of_times() -> None:
    local = Local()
    holders = LeaseHolders(["b", "c"], [HolderGone("b"), {"mode_id": "plan"}])
    assert await port(local, holders).run(SetMode(mode_id="plan")) == {"mode_id": "plan"}
    assert [o for o, *_ in holders.sent] == ["b", "c"]
    holders = LeaseHolders(["b"], [HolderGone("b")] * ROUTE_ATTEMPTS)
    with pytest.raises(ForwardFailed) as caught:
        await port(Local(), holders).run(SetMode(mode_id="plan"))
    assert caught.value.code == "owner_unreachable" and len(holders.sent) == ROUTE_ATTEMPTS


async def test_the_holder_dying_leaves_the_thread_to_run_here() -> None:
    local, holders = Local(), LeaseHolders(["b", None], [HolderGone("b")])
    assert await port(local, holders).run(Interrupt()) is True
    assert local.ran == [Interrupt()]


async def test_a_lease_taken_elsewhere_before_the_local_start_sends_any_command_there() -> None:
    local = Local(not_owner=True)
    holders = LeaseHolders([None, "b"], [{"active": True}])
    assert await port(local, holders).run(Interrupt(actor="ann")) is True
    assert holders.sent == [("b", "interrupt", {"user": "ann"}, False)]
    with pytest.raises(HeldElsewhere):  # nobody holds it by the time we look again: the refusal stands
        await port(Local(not_owner=True), LeaseHolders([None], [])).run(Interrupt())


async def test_a_holders_answer_that_is_not_well_formed_is_never_taken_for_a_success() -> None:
    holders = LeaseHolders(["b"], [{"seq": "7"}])
    with pytest.raises(ForwardFailed) as caught:
        await port(Local(), holders).run(PROMPT)
    assert caught.value.code == "owner_unreachable" and caught.value.status == 503


async def test_a_raw_mode_frame_has_no_answer_to_hold_the_senders_events_for() -> None:
    sub = Fanout().subscribe()
    holders = LeaseHolders(["b"], [{"seq": 3}, {"seq": 4}])
    assert await port(Local(), holders).run(Raw(message={"a": 1}, routed=True), answer_to=sub) == 3
    assert await port(Local(), holders).run(Raw(message={"a": 1}), answer_to=sub) == 4
    assert [held for *_, held in holders.sent] == [False, True]
    assert [body for _, _, body, _ in holders.sent] == [{"user": None, "message": {"a": 1}}] * 2  # routed stays here
