"""A forwarded command whose lease holder is not on the bus (sessions/remote.py), in-process
with a fake bus and lease: a holder that keeps renewing its lease is reported at once as
unreachable (503 ``bus_unavailable``, Retry-After), one that died is waited for until its
lease runs out (then the input is routed again), and a bus down here fails at once."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from bridge.bus.base import BusUnavailable, LocalBus, NotOnBus, Reply
from bridge.sessions.remote import ForwardFailed, HolderGone, LeaseHolders
from bridge.store.base import Lease, Replica

pytestmark = pytest.mark.timeout(20)
TTL = 3.0


class Leases:
    """One thread's lease held by "b", on a monotonic clock; renewed every ttl/3 while
    ``renewing`` (as a live holder's ownership loop does), else left to run out."""

    def __init__(self, *, renewing: bool) -> None:
        self.loop = asyncio.get_running_loop()
        self.expires = self.loop.time() + TTL
        self.renewing = renewing
        self.task = asyncio.create_task(self._renew())
        self.replicas = [Replica("b", "i", None, "", 0.1, 1), Replica("a", "j", None, "", 0.1, 0)]

    async def _renew(self) -> None:
        while self.renewing:
            await asyncio.sleep(TTL / 3)
            self.expires = self.loop.time() + TTL

    async def lease_of(self, thread_id: str) -> Lease:
        left = self.expires - self.loop.time()
        return Lease("b", 1, left, left > 0)

    async def list_replicas(self) -> list[Replica]:
        return self.replicas


class OffBus(LocalBus):
    """A bus on which "b" never takes a command (no heartbeat, or a stalled inbox)."""

    def __init__(self, error: Exception) -> None:
        super().__init__("a")
        self.error = error
        self.on_bus: dict[str, dict[str, Any]] = {"a": {}}

    async def request(
        self, replica_id: str, kind: str, thread_id: str, body: Mapping[str, Any], timeout: float
    ) -> Reply:
        raise self.error

    async def live_replicas(self) -> dict[str, dict[str, Any]]:
        return self.on_bus


async def forward(bus: OffBus, leases: Leases) -> tuple[BaseException, float]:
    holders = LeaseHolders(leases, bus, "a", lease_ttl_s=TTL)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        with pytest.raises((ForwardFailed, HolderGone)) as caught:
            await holders.forward("b", "prompt", "thr_1", {"client_id": "c1"})
    finally:
        leases.renewing = False
        leases.task.cancel()
    return caught.value, loop.time() - start


async def test_a_live_holder_off_the_bus_is_a_quick_retryable_503() -> None:
    err, took = await forward(
        OffBus(NotOnBus("replica b is not alive on the bus (no heartbeat)")), Leases(renewing=True)
    )
    assert isinstance(err, ForwardFailed), err
    assert err.code == "bus_unavailable" and err.status == 503 and err.retry_after_s == 2
    assert "not on the bus" in err.message
    assert took < TTL  # one renewal seen (every ttl/3), never the 30 s timeout


async def test_a_dead_holder_off_the_bus_is_waited_for_until_its_lease_ends() -> None:
    err, took = await forward(OffBus(NotOnBus("replica b did not take the command within 2 s")), Leases(renewing=False))
    assert isinstance(err, HolderGone)  # routed again: the input runs on a survivor
    assert TTL - 0.5 <= took < TTL + 2


async def test_the_bus_down_here_is_a_503_at_once() -> None:
    err, took = await forward(OffBus(BusUnavailable("the bus is down")), Leases(renewing=True))
    assert isinstance(err, ForwardFailed) and err.code == "bus_unavailable" and err.retry_after_s == 2
    assert took < 0.5


async def test_followers_poll_when_a_replica_that_runs_threads_is_off_the_bus() -> None:
    bus, leases = OffBus(BusUnavailable("x")), Leases(renewing=False)
    leases.task.cancel()
    holders = LeaseHolders(leases, bus, "a", lease_ttl_s=TTL)  # type: ignore[arg-type]
    assert await holders.peers_off_bus()  # b holds a lease and has no heartbeat
    bus.on_bus["b"] = {}
    assert not await holders.peers_off_bus()
    leases.replicas = [Replica("b", "i", None, "", 0.1, 0), Replica("c", "k", None, "", 0.1, 0)]
    del bus.on_bus["b"]
    assert not await holders.peers_off_bus()  # replicas off the bus that run nothing: no matter
