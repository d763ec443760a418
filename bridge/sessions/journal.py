"""A thread's transcript as this replica writes it: the seq, the appends (fenced by the
lease's epoch), the one ordered pipeline of commits in flight, and publishing once a
commit is durable.

The journal knows the store, the fan-out and the thread row; it knows nothing of agent
processes, codecs or the core. Its caller (the conversation) decides what to write and
holds :attr:`Journal.lock` while it does; the journal decides the seqs, commits, and makes
what was committed visible: the subscribers (through the announcer), the compacted
history, the other replicas (``on_committed``) and the long-polls (:meth:`wait_beyond`).

Durable before visible, always. Two ways in:

* :meth:`Journal.emit` numbers after the newest committed seq, commits, then publishes;
* :meth:`Journal.submit` (the stdout reader's bursts, issue #22) numbers after whatever is
  still in flight and returns without waiting for the commit, so the next burst is decoded
  on the event loop while the store commits this one. At most ``PIPELINE_DEPTH`` are in
  flight; each is published once committed, in order (:meth:`_settle`, a done-callback).
  Whoever takes :attr:`lock` first waits until nothing is in flight (:class:`Ordered`),
  so ``last_seq`` is then the newest committed seq and what the holder emits comes after.

This is the only commit pipeline of the daemon: it works the same on every store (the
PostgreSQL store has none of its own), and the SQLite writer commits one batch at a time.

A seq the store refuses because the transcript already holds it (a row this daemon did not
write, issue #32 B8) is read again: a ``notice`` ``seq_conflict`` goes after the rows found
and what was being written after it (:meth:`_retake_seq`). An emit that names its own seq
(a prompt's ``turn.started`` its ``prompt_seq``) cannot simply be renumbered: the caller is
told (:class:`Renumber`) and asks the core for it anew.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol, cast

import structlog

from bridge.clock import now_iso
from bridge.errors import LeaseLost, StoreError
from bridge.protocols.envelope import Frames, Page
from bridge.protocols.events import Event, Record
from bridge.sessions.announce import Announcer
from bridge.sessions.fanout import Fanout
from bridge.sessions.history import Compactor, committed
from bridge.sessions.history_read import HistoryPage, cached_page, read_page
from bridge.sessions.latency import Latency
from bridge.store import usage
from bridge.store.base import Store, ThreadRow, apply_fields, transcript_size

log = structlog.get_logger("bridge.journal")

# A read of stdout with at least this many lines is committed while the next is decoded
# (Journal.submit); at most PIPELINE_DEPTH such commits are in flight.
PIPELINE_MIN_LINES = 16
PIPELINE_DEPTH = 3
# An append whose seqs the transcript already holds (rows this daemon did not write): the
# seq is read again and the append numbered after it, at most this many times in a row.
SEQ_RETAKES = 3
FOLLOW_PAGE = 1000  # records read a page at a time (another replica's, a retake's search)
HISTORY_KEEP_ITEMS = 20_000  # a compacted history larger than this is not kept (paged from the store)

Fields = dict[str, Any]
Spawn = Callable[[Coroutine[Any, Any, None], str], None]


class Renumber(StoreError):
    """The emit names its own seqs (a prompt's ``turn.started`` its ``prompt_seq``): after
    its seq was taken and read again, the caller asks the core for it anew."""

    code = "seq_conflict"


class SeqMirror(Protocol):
    """Whoever keeps a copy of the newest committed seq (the conversation's core numbers a
    prompt's seq from it)."""

    last_seq: int


class _Flight:
    """One submitted emit: its records, the thread fields it writes, its append, its size."""

    __slots__ = ("fields", "records", "size", "task")

    def __init__(self, records: list[Record], fields: Fields, task: asyncio.Future[None]) -> None:
        self.records = records
        self.fields = fields
        self.task = task
        self.size = transcript_size(records)

    def failure(self) -> BaseException | None:
        return asyncio.CancelledError() if self.task.cancelled() else self.task.exception()


class _Refused:
    __slots__ = ("error", "fields", "records")

    def __init__(self, flight: _Flight, error: StoreError) -> None:
        self.records, self.fields, self.error = flight.records, flight.fields, error


class Ordered:
    """The conversation's lock: an asyncio.Lock whose holder finds nothing in flight —
    entering waits until every submitted emit is committed and published (or failed), so
    ``last_seq`` is the transcript's and whatever the holder emits comes after.
    ``undrained`` is the bare lock, for the stdout reader alone."""

    __slots__ = ("_journal", "undrained")

    def __init__(self, journal: Journal) -> None:
        self.undrained = asyncio.Lock()
        self._journal = journal

    def locked(self) -> bool:
        return self.undrained.locked()

    async def __aenter__(self) -> None:
        await self.undrained.acquire()
        if not self._journal.settled:
            try:
                await self._journal.drain()
            except BaseException:
                self.undrained.release()
                raise

    async def __aexit__(self, *exc: object) -> None:
        self.undrained.release()


def _names_own_seq(records: list[Record]) -> bool:
    """Whether an event of ``records`` names the seq of another of them (a prompt's
    ``turn.started`` its ``prompt_seq``): they cannot simply be numbered again."""
    first, last = records[0].seq, records[-1].seq
    named = (r.data.get("prompt_seq") for r in records if r.kind == "turn.started")
    return any(isinstance(seq, int) and first <= seq <= last for seq in named)


async def _unleased() -> int | None:
    return None


def _nothing() -> None:
    return None


class Journal:
    def __init__(
        self,
        thread: ThreadRow,
        store: Store,
        fanout: Fanout,
        *,
        hold: Callable[[], Awaitable[int | None]] = _unleased,
        on_fenced: Callable[[], None] = _nothing,
        on_published: Callable[[], None] = _nothing,
        spawn: Spawn | None = None,
        commits: Latency | None = None,
        max_bytes: int | None = None,
    ) -> None:
        """``thread``: the row, kept up to date as commits land (the same dict the caller
        reads). ``hold``: the lease's epoch for the next append (None: no leases), called
        before anything is numbered, since taking a thread over appends first.
        ``on_fenced``: the store refused an append for its epoch (the lease is lost).
        ``spawn``: runs a task the conversation cancels on close (re-committing refused emits).
        ``max_bytes``: what the transcript may hold ([capacity] max_transcript_mb; :attr:`full`)."""
        self.id: str = thread["id"]
        self.thread = thread
        self.store = store
        self.fanout = fanout
        self.announcer: Announcer = fanout  # where committed records go (a bus may wrap it)
        self.on_committed: Callable[[str, int], None] | None = None  # other replicas hear of it
        self.mirror: SeqMirror | None = None
        self._hold = hold
        self._on_fenced = on_fenced
        self._on_published = on_published
        self._spawn = spawn or self._spawn_own
        self._own: set[asyncio.Task[None]] = set()
        self._commits = commits
        self.max_bytes = max_bytes
        self._last = thread["last_seq"]
        self._numbered = self._last
        self._pipe: deque[_Flight] = deque()
        self._refused: list[_Refused] = []  # committed again after the rows that took their seqs
        self._failure: BaseException | None = None  # the first failure in flight, for the reader
        self.lock = Ordered(self)
        self._appended = asyncio.Event()  # replaced on every commit; wakes long-polls
        # The compacted history so far, kept up to date at commit from the start of a thread
        # created here (a loaded one's history is paged from the store).
        self._history: Compactor | None = Compactor() if self._last == 0 else None

    # ------------------------------------------------------------------ state

    @property
    def last_seq(self) -> int:
        """The newest committed seq (published, or known to the subscribers' store reads)."""
        return self._last

    @property
    def numbered(self) -> int:
        """The newest seq handed out: ``last_seq`` plus what is in flight."""
        return self._numbered if self._pipe else self._last

    @property
    def in_flight(self) -> int:
        return len(self._pipe)

    @property
    def settled(self) -> bool:
        """Nothing in flight and nothing refused waiting to be committed again."""
        return not self._pipe and not self._refused

    @property
    def size(self) -> int:
        """What the transcript holds (``transcript_bytes``), with what is in flight."""
        return self.thread.get("transcript_bytes", 0) + sum(f.size for f in self._pipe)

    @property
    def full(self) -> bool:
        """The transcript holds ``max_bytes`` or more (counting what is in flight): the
        agent is stopped, and nothing of a client's is written (issue #36)."""
        return self.max_bytes is not None and self.size >= self.max_bytes

    @property
    def failure(self) -> BaseException | None:
        """The first failure of what was in flight, until the stdout reader takes it."""
        return self._failure

    def reset(self, last_seq: int) -> None:
        """The thread row was read again (a new lease epoch, nothing in flight): its seq is
        the truth from here on."""
        self._moved(last_seq)

    def _moved(self, seq: int) -> None:
        self._last = seq
        self.thread["last_seq"] = seq
        if self.mirror is not None:
            self.mirror.last_seq = seq

    # ------------------------------------------------------------------ committing

    def _number(self, events: Sequence[Event], fields: Fields, after: int) -> tuple[list[Record], Fields]:
        ts = now_iso()
        records = [Record(after + i, ts, e.source, e.kind, e.data, e.raw, e.relay) for i, e in enumerate(events, 1)]
        return records, {"updated_at": ts, **fields}

    async def emit(
        self, events: Sequence[Event], fields: Fields | None = None, client_ids: Sequence[str | None] | None = None
    ) -> list[Record]:
        """Number, commit, then publish: durable before visible. Under :attr:`lock`."""
        epoch = await self._hold()  # first: a takeover it triggers appends before these
        return await self.commit(events, fields or {}, client_ids, epoch)

    async def commit(
        self, events: Sequence[Event], fields: Fields, client_ids: Sequence[str | None] | None, epoch: int | None
    ) -> list[Record]:
        """:meth:`emit` under an epoch the caller already holds (a takeover's own append)."""
        for retake in range(SEQ_RETAKES + 1):
            records, row = self._number(events, fields, self._last)
            try:
                await self._append(records, client_ids or [None] * len(records), row, epoch)
                break
            except StoreError as exc:
                if retake == SEQ_RETAKES or not await self._seq_taken(exc, records):
                    raise
                await self._retake_seq(records[0].seq, epoch)
                if _names_own_seq(records):
                    raise Renumber(f"thread {self.id}: seq {records[0].seq} was taken; numbered again") from exc
        self._published(records, row)
        return records

    async def _append(
        self, records: list[Record], client_ids: Sequence[str | None], fields: Fields, epoch: int | None
    ) -> None:
        started = time.monotonic()
        try:
            if epoch is None:
                await self.store.append(self.id, records, client_ids, fields)
            else:
                await self.store.append(self.id, records, client_ids, fields, epoch=epoch)
        except LeaseLost:
            self._on_fenced()
            raise
        if self._commits is not None:
            self._commits.observe(time.monotonic() - started)

    # ------------------------------------------------------------------ the pipeline

    async def submit(self, events: Sequence[Event], fields: Fields) -> None:
        """The stdout reader's emit of a burst: numbered after whatever is in flight and
        handed to the store without waiting for its commit; published in order once
        committed. Waits while PIPELINE_DEPTH are in flight; raises the first failure.
        Under ``lock.undrained``."""
        epoch = await self._hold()
        if self._refused:  # nothing more is numbered after what the store refused
            await self.drain()
            self.raise_failure()
        records, row = self._number(events, fields, self.numbered)
        self._numbered = records[-1].seq if records else self.numbered
        task = asyncio.ensure_future(self._append(records, [None] * len(records), row, epoch))
        self._pipe.append(_Flight(records, row, task))
        task.add_done_callback(self._settle)
        while len(self._pipe) > PIPELINE_DEPTH:
            await asyncio.wait({self._pipe[0].task})
        # A read of stdout that finds data buffered does not suspend, so without this the
        # reader could decode burst after burst while the subscribers' senders and the store
        # never ran; they get their turn once per burst.
        await asyncio.sleep(0)
        self.raise_failure()

    def _settle(self, _task: asyncio.Future[None]) -> None:
        """Publish every committed emit at the head of the pipe, in order."""
        # Emits committed together are published as one batch: a subscriber's buffer takes
        # one batch whole (fanout.Subscriber.push), where two bursts back to back would make
        # a subscriber that has not yet taken the first one re-read them from the store.
        ready: list[Record] = []
        while self._pipe and self._pipe[0].task.done():
            flight = self._pipe.popleft()
            if self._in_order(flight):
                self._advance(flight.records, flight.fields, flight.size)
                ready += flight.records
        if ready:
            try:
                self._visible(ready)
            except Exception:  # a callback of the loop's: it must not stall the pipe
                log.exception("journal.publish_failed", thread_id=self.id)
                self.fanout.resync_all()  # committed: subscribers read it from the store
        if self._refused and not self._pipe:
            # Not left until the agent's next output: the lock's entry drains, which
            # commits the refused emits again (or keeps their failure for the reader).
            self._spawn(self._drained(), "recommit")

    def _in_order(self, flight: _Flight) -> bool:
        """True when ``flight`` committed with nothing failed before it: it is published.
        After a failure nothing more is published live (it would leave a gap): what still
        commits moves the seq on, and subscribers re-read from the store."""
        failure = flight.failure()
        if failure is None:
            if self._failure is None and not self._refused:
                return True
            self._moved(max(self._last, flight.records[-1].seq if flight.records else 0))
            self.thread["transcript_bytes"] = self.thread.get("transcript_bytes", 0) + flight.size
            self._count_usage(flight.records)
            self.fanout.resync_all()
        elif self._failure is None and isinstance(failure, StoreError) and not isinstance(failure, LeaseLost):
            self._refused.append(_Refused(flight, failure))  # why: drain finds out
        elif self._failure is None:
            self._failure = failure
            log.error("journal.append_failed", thread_id=self.id, error=str(failure))
        return False

    async def _drained(self) -> None:
        async with self.lock:
            pass

    async def drain(self) -> None:
        """Until nothing is in flight (the lock's entry); then what the store refused is
        committed again after the rows that took its seqs, or its failure kept for the
        stdout reader."""
        while self._pipe:
            await asyncio.wait({self._pipe[-1].task})
        if self._refused:
            await self._recommit_refused()

    async def drain_reader(self) -> None:
        """The stdout reader's drain: raises the first failure of what was in flight."""
        await self.drain()
        self.raise_failure()

    def raise_failure(self) -> None:
        if (failure := self._failure) is not None:
            self._failure = None
            raise failure

    def clear_failure(self) -> None:
        """A new stdout reader starts (the last one may have been cancelled before it saw
        its failure)."""
        self._failure = None

    async def _recommit_refused(self) -> None:
        refused = self._refused.copy()
        self._refused.clear()
        first = refused[0]
        try:
            if not await self._seq_taken(first.error, first.records):
                raise first.error
            await self._retake_seq(first.records[0].seq, await self._hold())
            fields: Fields = {}
            for r in refused:
                fields.update(r.fields)
            events = [Event(cast(Any, x.source), x.kind, x.data, x.raw, x.relay) for r in refused for x in r.records]
            await self.emit(events, fields)
        except BaseException as failure:
            if self._failure is None:
                self._failure = failure
                log.error("journal.append_failed", thread_id=self.id, error=str(failure))

    # ------------------------------------------------------------------ a seq taken elsewhere

    async def _seq_taken(self, exc: StoreError, records: list[Record]) -> bool:
        """Whether the store refused ``records`` because it already holds one of their seqs
        (a row this daemon did not write: nothing of it is in flight when this is asked).
        A fenced append (LeaseLost) or a store that cannot write is never this."""
        if isinstance(exc, LeaseLost) or exc.code == "store_unavailable" or not records:
            return False
        first = await self.store.read_events(self.id, records[0].seq - 1, 1, with_raw=False)
        return bool(first) and first[0].seq <= records[-1].seq

    async def _retake_seq(self, taken: int, epoch: int | None) -> None:
        """Seq ``taken`` is held by a row this daemon did not write: read the newest seq
        again and record, after it, that this happened (a ``notice`` ``seq_conflict``).
        Subscribers re-read from the store what they were not sent (the rows found, then
        the notice)."""
        for attempt in range(SEQ_RETAKES):
            newest = taken - 1
            while page := await self.store.read_events(self.id, newest, FOLLOW_PAGE, with_raw=False):
                newest = page[-1].seq
            ts = now_iso()
            text = (
                f"seq {taken} of this thread's transcript was already taken by a row this daemon did not write "
                f"(rows up to seq {newest} were found); what it was recording follows this notice"
            )
            notice = Record(newest + 1, ts, "bridge", "notice", {"code": "seq_conflict", "text": text}, None, False)
            try:
                await self._append([notice], [None], {"updated_at": ts}, epoch)
                break
            except StoreError as exc:
                if attempt + 1 == SEQ_RETAKES or not await self._seq_taken(exc, [notice]):
                    raise
        log.warning("thread.seq_conflict", thread_id=self.id, taken=taken, newest=newest)
        self._history = None  # rebuilt from the store: it holds rows never published here
        self.fanout.resync_all()
        self._published([notice], {"updated_at": ts})

    # ------------------------------------------------------------------ publishing

    def _published(self, records: list[Record], fields: Fields) -> None:
        """Committed: now visible (the fan-out, the history, the other replicas, long-polls)."""
        self._advance(records, fields)
        self._visible(records)

    def _advance(self, records: list[Record], fields: Fields, size: int | None = None) -> None:
        """Committed: the seq and the thread row move on (the store counted the same size)."""
        apply_fields(self.thread, fields)
        self._count_usage(records)
        grown = transcript_size(records) if size is None else size
        self.thread["transcript_bytes"] = self.thread.get("transcript_bytes", 0) + grown
        self._moved(records[-1].seq if records else self._last)

    def _count_usage(self, records: list[Record]) -> None:
        """The thread's usage totals with the turns these records end, as the store added
        them up in the same commit (bridge/store/usage.py)."""
        for rec in records:
            if rec.kind == "turn.ended":
                self.thread["usage"] = usage.add(self.thread.get("usage"), usage.of_turn(rec.data))

    def _visible(self, records: list[Record]) -> None:
        self.announcer.committed(records)
        if self._history is not None:
            self._history = committed(self._history, records, HISTORY_KEEP_ITEMS)
        if self.on_committed is not None:
            self.on_committed(self.id, self._last)
        self._wake_polls()
        self._on_published()

    def _wake_polls(self) -> None:
        self._appended.set()
        self._appended = asyncio.Event()

    async def wait_beyond(self, seq: int, timeout: float) -> None:
        """Return once an event after ``seq`` is committed, or after ``timeout``."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while self._last <= seq and (left := end - loop.time()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._appended.wait(), left)

    async def follow(self) -> int:
        """Another replica writes this thread: publish to this replica's subscribers what it
        has committed since this journal last looked (the store is the truth; the bus only
        said "look"), and refresh the thread row. Under :attr:`lock`. Returns how many
        records were new."""
        new = 0
        while records := await self.store.read_events(self.id, self._last, FOLLOW_PAGE):
            self._moved(records[-1].seq)
            self.fanout.publish(records)
            new += len(records)
            if not records.more:  # (a short page is not the end: pages stop at PAGE_BYTES)
                break
        row = await self.store.get_thread(self.id)
        if row is not None:
            row["last_seq"] = max(row.get("last_seq", 0), self._last)
            self.thread.update(row)
        if new:
            self._wake_polls()
        return new

    async def read_page(self, after: int, limit: int) -> Page:
        """Records after ``after``, from the store (fanout.Transcript: a subscriber's replay)."""
        return await self.store.read_events(self.id, after, limit)

    async def read_frames(self, after: int, limit: int, *, raw: bool) -> Frames:
        """The same page as the frames a client is sent, joined from the stored rows."""
        return await self.store.read_frames(self.id, after, limit, raw=raw)

    async def history_page(self, before: int | None, limit: int) -> HistoryPage:
        """A page of the compacted history (sessions/history_read.py): from the compaction
        kept at commit when it has seen every committed event, else read from the store's
        last turns. A read never builds a whole thread's compaction: a thread loaded from
        the store is paged from it."""
        comp = self._history
        if comp is not None and comp.last_seq == self._last:
            return cached_page(comp, before, limit)
        self._history = None  # behind (another replica appended): paged from the store now
        return await read_page(self.store, self.id, before, limit)

    # ------------------------------------------------------------------ tasks

    def _spawn_own(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"{name}-{self.id}")
        self._own.add(task)
        task.add_done_callback(self._own.discard)
