"""Leases and epoch fencing (issue #18), both stores: two store instances on one database
are two replicas. Expiry is the database's; a fenced append is refused by the database in
its own transaction (LeaseLost, nothing written), never by a check in Python."""

from __future__ import annotations

import asyncio

import pytest
from support.stores import StoreFactory, records, thread

from bridge.errors import InvalidRequest, LeaseLost, StoreError
from bridge.protocols.events import Record
from bridge.store.base import Store

pytestmark = pytest.mark.timeout(60)


async def seqs(store: Store, tid: str) -> list[int]:
    """Every stored seq of the thread, page by page."""
    out: list[int] = []
    while page := await store.read_events(tid, out[-1] if out else 0, 1000):
        out += [r.seq for r in page]
    return out


async def expire(store: Store, tid: str, holder: str) -> None:
    """Wait (on the database's clock) until ``holder``'s lease on ``tid`` has expired."""
    async with asyncio.timeout(10):
        while True:
            lease = await store.lease_of(tid)
            if lease is None or lease.holder != holder or not lease.live:
                return
            await asyncio.sleep(0.02)


async def test_acquire_renew_release(opened: StoreFactory) -> None:
    async with asyncio.timeout(30), opened(replica_id="a") as a:
        await a.create_thread(thread("thr_1"))  # type: ignore[arg-type]
        lease = await a.lease_of("thr_1")
        assert lease is not None and (lease.holder, lease.epoch, lease.live) == (None, 0, False)
        assert await a.lease_of("thr_missing") is None
        assert await a.acquire_lease("thr_missing", "a", 5) is None

        assert await a.acquire_lease("thr_1", "a", 5) == 1
        assert await a.acquire_lease("thr_1", "a", 5) == 1  # mine: renewed, same epoch
        lease = await a.lease_of("thr_1")
        assert lease is not None and lease.holder == "a" and lease.live
        assert lease.expires_in_s is not None and 0 < lease.expires_in_s <= 5
        assert await a.acquire_lease("thr_1", "b", 5) is None  # another live holder

        assert await a.renew_leases("a", 30) == {"thr_1": 1}
        lease = await a.lease_of("thr_1")
        assert lease is not None and lease.expires_in_s is not None and lease.expires_in_s > 5
        assert await a.renew_leases("b", 30) == {}

        assert not await a.release_lease("thr_1", "a", 2)  # not that epoch
        assert not await a.release_lease("thr_1", "b", 1)  # not that holder
        assert await a.release_lease("thr_1", "a", 1)
        lease = await a.lease_of("thr_1")
        assert lease is not None and (lease.holder, lease.epoch, lease.live) == (None, 1, False)
        # Released: the next holder, whoever it is, gets a new epoch at once.
        assert await a.acquire_lease("thr_1", "b", 5) == 2


async def test_takeover_after_expiry_fences_the_stale_holder(opened: StoreFactory) -> None:
    async with asyncio.timeout(30), opened(replica_id="a") as a, opened(replica_id="b") as b:
        await a.create_thread(thread("thr_1"))  # type: ignore[arg-type]
        epoch_a = await a.acquire_lease("thr_1", "a", 0.3)
        assert epoch_a == 1
        await a.append("thr_1", records(1, 2), [None, None], {}, epoch=epoch_a)
        assert await b.acquire_lease("thr_1", "b", 5) is None  # still a's
        await expire(b, "thr_1", "a")
        # a's lease has expired: it can neither append nor renew.
        with pytest.raises(LeaseLost) as refused:
            await a.append("thr_1", records(3, 1), [None], {}, epoch=epoch_a)
        assert refused.value.code == "lease_lost"
        assert await a.renew_leases("a", 5) == {}
        epoch_b = await b.acquire_lease("thr_1", "b", 5)
        assert epoch_b == 2
        await b.append("thr_1", records(3, 2), [None, None], {"state": "running"}, epoch=epoch_b)
        # The stale holder's append is refused by the database, and leaves nothing behind:
        # not its events, not its thread fields.
        with pytest.raises(LeaseLost):
            await a.append("thr_1", records(5, 1), [None], {"title": "stale"}, epoch=epoch_a)
        assert not await a.release_lease("thr_1", "a", epoch_a)
        assert await seqs(a, "thr_1") == [1, 2, 3, 4]
        row = await b.get_thread("thr_1")
        assert row is not None and row["title"] == "" and row["last_seq"] == 4
        lease = await a.lease_of("thr_1")
        assert lease is not None and (lease.holder, lease.epoch, lease.live) == ("b", 2, True)


async def test_a_fence_refuses_one_append_and_the_rest_of_the_batch_commits(opened: StoreFactory) -> None:
    async with asyncio.timeout(30), opened(replica_id="a") as a:
        for tid in ("thr_1", "thr_2", "thr_3"):
            await a.create_thread(thread(tid))  # type: ignore[arg-type]
        e1 = await a.acquire_lease("thr_1", "a", 5)
        assert e1 is not None
        results = await asyncio.gather(
            a.append("thr_1", records(1, 1), [None], {}, epoch=e1),
            a.append("thr_2", records(1, 1), [None], {}, epoch=7),  # never leased
            a.append("thr_3", records(1, 1), [None], {}),  # not fenced
            a.append("thr_1", records(2, 1), [None], {}, epoch=e1 + 1),  # a wrong epoch
            return_exceptions=True,
        )
        assert results[0] is None and results[2] is None
        assert isinstance(results[1], LeaseLost) and isinstance(results[3], LeaseLost)
        assert await seqs(a, "thr_1") == [1] and await seqs(a, "thr_2") == [] and await seqs(a, "thr_3") == [1]


async def test_racing_holders_never_both_append(opened: StoreFactory) -> None:
    """Two replicas believe they own a thread (one stale, one after takeover) and append
    the same seqs at once, many times: every time exactly one wins, and the transcript is
    the winner's, gapless."""
    async with asyncio.timeout(45), opened(replica_id="a") as a, opened(replica_id="b") as b:
        await a.create_thread(thread("thr_1"))  # type: ignore[arg-type]
        stale = await a.acquire_lease("thr_1", "a", 0.2)
        assert stale is not None
        await expire(b, "thr_1", "a")
        fresh = await b.acquire_lease("thr_1", "b", 30)
        assert fresh == stale + 1
        for seq in range(1, 21):
            won = await asyncio.gather(
                a.append("thr_1", records(seq, 1), [None], {}, epoch=stale),
                b.append("thr_1", records(seq, 1), [None], {}, epoch=fresh),
                return_exceptions=True,
            )
            assert isinstance(won[0], LeaseLost) and won[1] is None, won
        assert await seqs(a, "thr_1") == list(range(1, 21))


async def test_takeover_racing_appends_serialises(opened: StoreFactory) -> None:
    """While the holder appends as fast as it can, another replica takes the lease the moment
    it expires: every append either committed before the takeover (under the old epoch) or
    was refused; after the first refusal none of the old holder's appends succeeds."""
    async with asyncio.timeout(45), opened(replica_id="a") as a, opened(replica_id="b") as b:
        await a.create_thread(thread("thr_1"))  # type: ignore[arg-type]
        epoch = await a.acquire_lease("thr_1", "a", 0.5)
        assert epoch is not None
        outcomes: list[bool] = []

        async def holder() -> None:
            seq = 1
            while True:  # until refused (the test's timeout bounds it)
                try:
                    await a.append("thr_1", records(seq, 1), [None], {}, epoch=epoch)
                    outcomes.append(True)
                    seq += 1
                except LeaseLost:
                    outcomes.append(False)
                    if outcomes.count(False) >= 5:
                        return
                await asyncio.sleep(0)

        async def taker() -> int:
            while True:
                got = await b.acquire_lease("thr_1", "b", 30)
                if got is not None:
                    return got
                await asyncio.sleep(0.01)

        _, new_epoch = await asyncio.gather(holder(), taker())
        assert new_epoch == epoch + 1
        first_refusal = outcomes.index(False)
        assert all(outcomes[:first_refusal]) and not any(outcomes[first_refusal:])
        # What the old holder committed is all there, gapless, and b continues after it.
        committed = await seqs(b, "thr_1")
        assert committed == list(range(1, first_refusal + 1))
        await b.append("thr_1", records(first_refusal + 1, 1), [None], {}, epoch=new_epoch)


async def test_client_ids_are_unique_per_thread_and_a_bad_append_is_refused_alone(opened: StoreFactory) -> None:
    async with asyncio.timeout(30), opened() as s:
        await s.create_thread(thread("thr_1"))  # type: ignore[arg-type]
        await s.create_thread(thread("thr_2"))  # type: ignore[arg-type]
        await s.append("thr_1", records(1, 1), ["c1"], {})
        assert await s.find_client_event("thr_1", "c1") == 1
        assert await s.find_client_event("thr_1", "c2") is None
        results = await asyncio.gather(
            s.append("thr_1", records(2, 1), ["c1"], {}),  # a duplicate client_id
            s.append("thr_2", records(1, 1), ["c1"], {}),  # the same id on another thread: fine
            s.append("thr_1", records(1, 1), [None], {}),  # a duplicate seq
            s.append("thr_1", records(2, 2), [None, "c2"], {"title": "ok"}),
            return_exceptions=True,
        )
        assert isinstance(results[0], StoreError) and not isinstance(results[0], LeaseLost)
        assert isinstance(results[2], StoreError)
        assert results[1] is None and results[3] is None
        assert await seqs(s, "thr_1") == [1, 2, 3] and await seqs(s, "thr_2") == [1]
        row = await s.get_thread("thr_1")
        assert row is not None and row["title"] == "ok" and row["last_seq"] == 3
        assert await s.find_client_event("thr_1", "c2") == 3


async def test_a_nul_in_a_thread_title_is_refused_never_a_store_failure(opened: StoreFactory) -> None:
    """PostgreSQL text cannot hold a NUL, so neither store keeps one in a thread column
    (bridge/store/rows.py refuse_nul): refused as a bad request (400), and the store stays
    healthy. Event text is JSON, escaped, on both."""
    async with asyncio.timeout(30), opened() as s:
        await s.create_thread(thread("thr_1"))  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest) as refused:
            await s.update_thread("thr_1", {"title": "a\x00b"})
        assert refused.value.code == "invalid_request"
        nul = Record(1, "2026-11-30T00:00:01.000Z", "agent", "message", {"text": "a\x00b"}, None, False)
        await s.append("thr_1", [nul], [None], {})
        (got,) = await s.read_events("thr_1", 0, 10)
        assert got.data == {"text": "a\x00b"} and s.healthy
