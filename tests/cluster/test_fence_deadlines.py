"""sessions/fenced.py in-process, on a fake clock: an agent spawned under a lease is
registered with the fence watchdog at the lease's self-fence deadline plus half the margin
(``Ownership.deadline``), every statement that extends the lease (a renew, a re-acquire)
moves that time, a renew that loses the lease does not, and the agent's exit forgets it.
An agent with no process group of its own (an in-memory one) or spawned after its lease
went is not registered."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from bridge.process.agent_io import ExitInfo
from bridge.sessions.fenced import FencedSpawn
from bridge.sessions.ownership import Ownership
from tests.cluster.test_ownership import TTL, Clock, FakeLeases, make

pytestmark = pytest.mark.timeout(30)

KILL_AFTER = TTL - TTL / 5 + TTL / 10  # 9 s after the start of the last extending statement


@dataclass
class Proc:
    pid: int
    pgid: int | None = None
    start_time: int | None = 1234
    exited: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait(self) -> ExitInfo:
        await self.exited.wait()
        return ExitInfo(code=0, signal=None)


class Recorder:
    """The Fence's interface, recorded (an extension of a thread with no agent registered
    is ignored, as by the Fence)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.armed: set[str] = set()

    def arm(self, thread: str, proc: Any, kill_at: float) -> None:
        self.armed.add(thread)
        self.calls.append(("arm", thread, proc.pid, kill_at))

    def extend(self, thread: str, kill_at: float) -> None:
        if thread in self.armed:
            self.calls.append(("extend", thread, kill_at))

    def forget(self, thread: str, proc: Any) -> None:
        self.armed.discard(thread)
        self.calls.append(("forget", thread, proc.pid))


async def spawned(fenced: FencedSpawn, tid: str, proc: Proc) -> Proc:
    async def spawn(_spec: Any) -> Proc:
        return proc

    fenced._spawn = spawn  # type: ignore[assignment]
    got = await fenced.for_thread(tid)(None)  # type: ignore[arg-type]
    assert got is proc
    return proc


def fenced_with_a_lease_of(tid: str) -> tuple[Clock, FakeLeases, Ownership, Recorder, FencedSpawn]:
    """A replica's leases (``tid`` free to take) on a clock of the test's, and its spawn
    registering agents with a recording fence."""
    clock = Clock()
    leases = FakeLeases(clock)
    leases.add(tid)
    own, _lost = make(leases, clock)
    fence = Recorder()
    return clock, leases, own, fence, FencedSpawn(fence, own, None)  # type: ignore[arg-type]


async def test_kill_time_follows_the_lease_and_the_exit_forgets() -> None:
    clock, leases, own, fence, fenced = fenced_with_a_lease_of("thr_a")
    await own.ensure("thr_a")  # acquired at 100: nothing registered yet
    assert fence.calls == []
    proc = await spawned(fenced, "thr_a", Proc(pid=41, pgid=41))
    assert fence.calls == [("arm", "thr_a", 41, 100 + KILL_AFTER)]
    clock.now = 103.0
    assert await own.renew_once()
    assert fence.calls[-1] == ("extend", "thr_a", 103 + KILL_AFTER)
    leases.fail = RuntimeError("store down")
    clock.now = 106.0
    assert not await own.renew_once()  # a failed renew moves nothing
    assert fence.calls[-1] == ("extend", "thr_a", 103 + KILL_AFTER)
    proc.exited.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert fence.calls[-1] == ("forget", "thr_a", 41)


async def test_an_agent_without_a_group_or_without_a_lease_is_not_registered() -> None:
    _clock, _leases, own, fence, fenced = fenced_with_a_lease_of("thr_a")
    await spawned(fenced, "thr_a", Proc(pid=42, pgid=42))  # no lease held
    await own.ensure("thr_a")
    await spawned(fenced, "thr_a", Proc(pid=43))  # an in-memory agent: no process group
    assert fence.calls == []
