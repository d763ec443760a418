"""One thread's live conversation: the asyncio shell around the pure
:class:`~bridge.sessions.core.ConversationCore`.

The shell owns the I/O: the agent process (an :class:`~bridge.process.agent_io.AgentIO`),
the store, the fan-out, timers and background tasks. Every input is fed to the core and
the actions it returns are performed in order, under one lock.

Locks, always taken in this order (never the other way round):

1. ``_life`` — start, stop, close (a process comes and goes under it);
2. ``_lock`` — the core's state, the transcript's seq, and the agent's stdin: every input
   to the core and every action it returns, every emit. Whoever takes it finds no emit in
   flight (:class:`_Ordered`), except the stdout reader: a burst of agent output is
   submitted to the store before the previous one is committed, and each is published
   once it is, in order (``_emit_pipelined``).

Nothing awaits ``_life`` while holding ``_lock``: an action that stops the process runs
as a task of the conversation's own (created, cancelled and awaited by it), and so does
every timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

import structlog

from bridge import user_secrets
from bridge.clock import now_iso
from bridge.config import THREAD_OPTION_KEYS, AgentProfile, Settings
from bridge.errors import (
    BridgeError,
    Conflict,
    InvalidRequest,
    LaunchRefused,
    LeaseLost,
    NotFound,
    NotOwner,
    StoreError,
)
from bridge.launching import ThreadLaunch, spawn_options
from bridge.process.agent_io import AgentIO, ExitInfo, Spawn
from bridge.process.agent_process import AgentProcess
from bridge.process.launch import LaunchSpec
from bridge.protocols.codec import Codec
from bridge.protocols.codecs import may_have_modes, stored_content_refusal
from bridge.protocols.envelope import Frames, ephemeral
from bridge.protocols.events import Event, Record
from bridge.protocols.framing import LineTooLong
from bridge.sessions import acp_fs
from bridge.sessions.actions import Accepted, Action, ArmTimer, CancelTimer, Emit, Limits, Route, Serve, Stop, Write
from bridge.sessions.announce import Announcer
from bridge.sessions.commands import AnswerPermission, Command, Interrupt, Prompt, Raw, SetMode
from bridge.sessions.core import ConversationCore
from bridge.sessions.fanout import Fanout, Subscriber
from bridge.sessions.history import Compactor, Item, committed
from bridge.sessions.latency import Latency
from bridge.sessions.modes import MODE_TIMEOUT_S, ModeTimeout, check_mode_id, mode_answer
from bridge.sessions.owned import Owned
from bridge.sessions.ownership import (
    TAIL_EVENTS,
    Ownership,
    needs_takeover,
    open_turn,
    queued_turns,
    takeover_events,
)
from bridge.sessions.scrub import Scrubber
from bridge.sessions.tasks import TaskTable
from bridge.store.base import Store, ThreadRow, apply_fields
from bridge.userdirs import launch_for_thread

log = structlog.get_logger("bridge.conversation")

A = TypeVar("A")  # a command's answer (Conversation.run)

# After the process exits, its pipes get this long to drain before they are abandoned
# (a grandchild may hold them open).
DRAIN_TIMEOUT_S = 2.0
# A stop while the store cannot write waits this long for the exit to be recorded.
STOP_RECORD_WAIT_S = 1.0
# A follower reads what the owner committed in pages of this many records.
FOLLOW_PAGE = 1000
HISTORY_PAGE = 5000
HISTORY_KEEP_ITEMS = 20_000  # a compacted history larger than this is rebuilt per request


# A read of stdout with at least this many lines is committed while the next is decoded
# (Conversation._emit_pipelined); at most PIPELINE_DEPTH such commits are in flight.
PIPELINE_MIN_LINES = 16
PIPELINE_DEPTH = 3
# An append whose seqs the transcript already holds (rows this daemon did not write): the
# seq is read again and the append numbered after it, at most this many times in a row.
SEQ_RETAKES = 3


class _Renumber(StoreError):
    """The Emit names its own seqs (a prompt's ``turn.started`` its ``prompt_seq``): after
    its seq was taken and read again, the caller asks the core for it anew."""

    code = "seq_conflict"


class _Ordered:
    """The conversation's ``_lock``: an asyncio.Lock whose holder finds nothing in flight —
    entering waits until every pipelined emit is committed and published (or failed), so
    the core's ``last_seq`` is the transcript's and whatever the holder emits comes after.
    ``undrained`` is the bare lock, for the stdout reader alone."""

    __slots__ = ("_drain", "_pipe", "_refused", "undrained")

    def __init__(self, pipe: deque[Any], drain: Callable[[], Awaitable[None]], refused: list[Any]) -> None:
        self.undrained = asyncio.Lock()
        self._pipe = pipe
        self._drain = drain
        self._refused = refused  # emits the store refused, committed again by the drain

    def locked(self) -> bool:
        return self.undrained.locked()

    async def __aenter__(self) -> None:
        await self.undrained.acquire()
        if self._pipe or self._refused:
            try:
                await self._drain()
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


def _options(profile: AgentProfile | None, thread: ThreadRow) -> dict[str, Any]:
    """The profile's spawn options, overridden by the thread's own (docs/api.md §1.5)."""
    overrides = thread.get("options") or {}
    return spawn_options(profile, overrides, THREAD_OPTION_KEYS) if profile else dict(overrides)


class Conversation:
    def __init__(
        self,
        thread: ThreadRow,
        profile: AgentProfile | None,
        settings: Settings,
        store: Store,
        *,
        can_start: Callable[[Conversation], None],
        spawn: Spawn = AgentProcess.spawn,
        announcer: Announcer | None = None,
        ownership: Ownership | None = None,
        on_lost: Callable[[Conversation], None] | None = None,
        commits: Latency | None = None,
    ) -> None:
        self.thread = thread
        self.id: str = thread["id"]
        self.profile = profile
        self.settings = settings
        self.store = store
        self.fanout = Fanout()
        self._announce: Announcer = announcer if announcer is not None else self.fanout
        self._can_start = can_start
        self._spawn = spawn
        # A shared store: the agent runs and appends only under this replica's lease, every
        # append fenced by its epoch (sessions/ownership.py). None: one daemon, no leases.
        self._ownership = ownership
        self._on_lost = on_lost
        self._commits = commits
        self._epoch: int | None = None
        self.lost = False  # the lease was lost: this object is finished (the registry drops it)
        self.core = self._new_core(thread)
        self._life = asyncio.Lock()
        # Pipelined emits (records, thread fields, their append), oldest first; the newest
        # numbered seq; the first failure among them, for the stdout reader.
        self._pipe: deque[tuple[list[Record], dict[str, Any], asyncio.Task[None]]] = deque()
        self._numbered = self.core.last_seq
        self._pipe_error: BaseException | None = None
        # Pipelined emits the store refused, in order, until ``_drain`` finds out why
        # (their seqs taken by rows this daemon did not write: committed again after them).
        self._pipe_refused: list[tuple[list[Record], dict[str, Any], StoreError]] = []
        self._lock = _Ordered(self._pipe, self._drain, self._pipe_refused)
        self._proc: AgentIO | None = None
        self.starting = False  # a start holds its place under max_conversations
        self._watcher: asyncio.Task[None] | None = None
        self._owned = Owned(self.id, self._timer_fired)
        self.last_activity = time.monotonic()
        self.last_watched = self.last_activity  # a long-poll's last wait (it is no activity)
        self.deleted = False
        self._appended = asyncio.Event()  # replaced on every append; wakes long-polls
        self._raw_routes: dict[str, Subscriber] = {}  # raw-mode clients awaiting responses
        self._replies: dict[str, asyncio.Future[str]] = {}  # our own requests' routed answers (set_mode)
        self._scrub = Scrubber(profile.env if profile is not None else {})
        self._secret_env: dict[str, str] = {}  # the owner's secrets for the profile, read at each start
        # How its agent is started (bridge/launching.py): the registry's, checked at creation;
        # made at the first start of a thread loaded from the store.
        self.launch: ThreadLaunch | None = None
        # Many replicas (docs/api.md §6): who hears of this replica's commits. None on a
        # single daemon.
        self.on_committed: Callable[[str, int], None] | None = None
        # The compacted history so far (GET …/history), kept up to date at commit: from the
        # start for a new thread, from the first history read for a loaded one.
        self._history: Compactor | None = Compactor() if thread["last_seq"] == 0 else None
        self._history_lock = asyncio.Lock()

    def _new_core(self, thread: ThreadRow) -> ConversationCore:
        srv = self.settings.server
        return ConversationCore(
            last_seq=thread["last_seq"],
            native_session_id=thread.get("native_session_id"),
            options=_options(self.profile, thread),
            limits=Limits(srv.max_pending_prompts, srv.interrupt_timeout_s, srv.permission_timeout_s, srv.stop_grace_s),
            tasks=TaskTable.from_json(saved) if (saved := thread.get("tasks")) else None,
        )

    # ------------------------------------------------------------------ state

    @property
    def running(self) -> bool:
        return self._proc is not None

    @property
    def turn_active(self) -> bool:
        return self.core.active is not None

    @property
    def busy(self) -> bool:
        return self.core.busy

    @property
    def tasks(self) -> TaskTable:
        return self.core.tasks

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    def pending_permissions(self) -> list[dict[str, Any]]:
        return self.core.permissions.views()

    # ------------------------------------------------------------------ transcript

    async def emit(self, events: Sequence[Event], *, fields: dict[str, Any] | None = None) -> list[Record]:
        async with self._lock:
            return await self._emit(Emit(list(events), fields or {}))

    async def _emit(self, action: Emit) -> list[Record]:
        """Number, persist, then publish: durable before visible. Under ``_lock``."""
        epoch = await self._hold_locked()  # first: a takeover it triggers appends before these
        for retake in range(SEQ_RETAKES + 1):
            records, thread_fields = self._number(action, self.core.last_seq)
            try:
                await self._append(records, action.client_ids or [None] * len(records), thread_fields, epoch)
                break
            except StoreError as exc:
                if retake == SEQ_RETAKES or not await self._seq_taken(exc, records):
                    raise
                await self._retake_seq(records[0].seq, epoch)
                if _names_own_seq(records):
                    raise _Renumber(f"thread {self.id}: seq {records[0].seq} was taken; numbered again") from exc
        self._published(records, thread_fields)
        return records

    async def _seq_taken(self, exc: StoreError, records: list[Record]) -> bool:
        """Whether the store refused ``records`` because it already holds one of their seqs
        (a row this daemon did not write: nothing of it is in flight when this is asked).
        A fenced append (LeaseLost) or a store that cannot write is never this."""
        if isinstance(exc, LeaseLost) or exc.code == "store_unavailable" or not records:
            return False
        first = await self.store.read_events(self.id, records[0].seq - 1, 1, with_raw=False)
        return bool(first) and first[0].seq <= records[-1].seq

    async def _retake_seq(self, taken: int, epoch: int | None) -> None:
        """Seq ``taken`` of this thread is held by a row this daemon did not write: read the
        transcript's newest seq again and record, after it, that this happened (a
        ``notice`` ``seq_conflict``). The core's seq moves on to it; subscribers re-read
        from the store what they were not sent (the rows found, then the notice)."""
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

    def _number(self, action: Emit, after: int) -> tuple[list[Record], dict[str, Any]]:
        ts = now_iso()
        seq = after
        records = []
        for ev in action.events:
            seq += 1
            records.append(Record(seq, ts, ev.source, ev.kind, ev.data, ev.raw, ev.relay))
        thread_fields = {"updated_at": ts, **action.fields}
        pending = len(self.core.permissions)
        if "pending_permissions" not in thread_fields and pending != self.thread.get("pending_permissions", 0):
            # An answer, a withdrawal, an interrupt or an exit changed it before this Emit:
            # the row's count changes in the commit that records why (server-wide changes).
            thread_fields["pending_permissions"] = pending
        return records, thread_fields

    def _published(self, records: list[Record], thread_fields: dict[str, Any]) -> None:
        """Committed: now visible (the fan-out, the history, the other replicas, long-polls)."""
        self._advance(records, thread_fields)
        self._visible(records, self.core.last_seq)

    def _advance(self, records: list[Record], thread_fields: dict[str, Any]) -> None:
        """Committed: the seq and the thread row move on."""
        if records:
            self.core.last_seq = records[-1].seq
        apply_fields(self.thread, thread_fields)
        self.thread["last_seq"] = self.core.last_seq

    def _visible(self, records: list[Record], seq: int) -> None:
        self._announce.committed(records)
        if self._history is not None:
            self._history = committed(self._history, records, HISTORY_KEEP_ITEMS)
        if self.on_committed is not None:
            self.on_committed(self.id, seq)
        self._wake_polls()
        self.touch()

    async def _emit_pipelined(self, action: Emit) -> None:
        """The stdout reader's emit of a burst (issue #22): numbered after whatever is still
        in flight and handed to the store without waiting for its commit, so that the next
        read is decoded while the store (its writer process, on the other core) commits this
        one. Published in order once committed (``_settle``): durable before visible holds.
        Waits while PIPELINE_DEPTH emits are in flight; raises the first failure."""
        epoch = await self._hold_locked()
        if self._pipe_refused:  # nothing more is numbered after what the store refused
            await self._drain()
            self._raise_pipe_error()
        after = self._numbered if self._pipe else self.core.last_seq
        records, fields = self._number(action, after)
        self._numbered = records[-1].seq if records else after
        task = asyncio.ensure_future(self._append(records, [None] * len(records), fields, epoch))
        self._pipe.append((records, fields, task))
        task.add_done_callback(self._settle)
        while len(self._pipe) > PIPELINE_DEPTH:
            await asyncio.wait({self._pipe[0][2]})
        # A read of stdout that finds data buffered does not suspend, so without this the
        # reader could decode burst after burst while the subscribers' senders and the store
        # never ran; they get their turn once per burst.
        await asyncio.sleep(0)
        self._raise_pipe_error()

    def _settle(self, _task: asyncio.Task[None]) -> None:
        """Publish every committed emit at the head of the pipe, in order. After a failure
        nothing more is published live (it would leave a gap): what still commits moves the
        seq on, and subscribers re-read from the store."""
        # Emits committed together are published as one batch: a subscriber's buffer takes
        # one batch whole (fanout.Subscriber.push), where two bursts back to back would make
        # a subscriber that has not yet taken the first one re-read them from the store.
        ready: list[Record] = []
        while self._pipe and self._pipe[0][2].done():
            records, fields, task = self._pipe.popleft()
            failure = task.exception() if not task.cancelled() else asyncio.CancelledError()
            if failure is None and self._pipe_error is None and not self._pipe_refused:
                self._advance(records, fields)
                ready += records
                continue
            if failure is None:  # committed after an earlier one failed
                self.core.last_seq = self.thread["last_seq"] = max(
                    self.core.last_seq, records[-1].seq if records else 0
                )
                self.fanout.resync_all()
            elif self._pipe_error is None and isinstance(failure, StoreError) and not isinstance(failure, LeaseLost):
                self._pipe_refused.append((records, fields, failure))  # why: _drain finds out
            elif self._pipe_error is None:
                self._pipe_error = failure
                log.error("conversation.append_failed", thread_id=self.id, error=str(failure))
        if ready:
            try:
                self._visible(ready, ready[-1].seq)
            except Exception:  # a callback of the loop's: it must not stall the pipe
                log.exception("conversation.publish_failed", thread_id=self.id)
                self.fanout.resync_all()  # committed: subscribers read it from the store
        if self._pipe_refused and not self._pipe:
            # Not left until the agent's next output: the lock's entry drains, which
            # commits the refused emits again (or keeps their failure for the reader).
            self._owned.spawn(self._drained(), "recommit")

    async def _drained(self) -> None:
        async with self._lock:
            pass

    async def _drain(self) -> None:
        """Until nothing is in flight (``_lock``'s entry); then what the store refused is
        committed again after the rows that took its seqs, or its failure kept for the
        stdout reader."""
        while self._pipe:
            await asyncio.wait({self._pipe[-1][2]})
        if self._pipe_refused:
            await self._recommit_refused()

    async def _recommit_refused(self) -> None:
        refused = self._pipe_refused.copy()
        self._pipe_refused.clear()  # (the list _lock watches)
        first, _, exc = refused[0]
        try:
            if not await self._seq_taken(exc, first):
                raise exc
            await self._retake_seq(first[0].seq, await self._hold_locked())
            fields: dict[str, Any] = {}
            for _, more, _ in refused:
                fields.update(more)
            events = [
                Event(cast(Any, r.source), r.kind, r.data, r.raw, r.relay) for recs, _, _ in refused for r in recs
            ]
            await self._emit(Emit(events, fields))
        except BaseException as failure:
            if self._pipe_error is None:
                self._pipe_error = failure
                log.error("conversation.append_failed", thread_id=self.id, error=str(failure))

    async def _drain_reader(self) -> None:
        """The stdout reader's drain: raises the first failure of what was in flight."""
        await self._drain()
        self._raise_pipe_error()

    def _raise_pipe_error(self) -> None:
        if (failure := self._pipe_error) is not None:
            self._pipe_error = None
            raise failure

    def _wake_polls(self) -> None:
        self._appended.set()
        self._appended = asyncio.Event()

    async def follow(self) -> int:
        """Another replica runs this thread: publish to this replica's subscribers what it
        has committed since this replica last looked (the store is the truth; the bus only
        said "look"), and refresh the thread row. Returns how many records were new."""
        if self._proc is not None:
            return 0
        new = 0
        async with self._lock:
            if self._proc is not None:
                return 0
            while True:
                records = await self.store.read_events(self.id, self.core.last_seq, FOLLOW_PAGE)
                if not records:
                    break
                self.core.last_seq = records[-1].seq
                self.fanout.publish(records)
                new += len(records)
                if len(records) < FOLLOW_PAGE:
                    break
            row = await self.store.get_thread(self.id)
            if row is not None:
                row["last_seq"] = max(row.get("last_seq", 0), self.core.last_seq)
                self.thread.update(row)
            else:
                self.thread["last_seq"] = self.core.last_seq
        if new:
            self._wake_polls()
        return new

    async def _append(
        self, records: list[Record], client_ids: Sequence[str | None], fields: dict[str, Any], epoch: int | None
    ) -> None:
        started = time.monotonic()
        try:
            if epoch is None:
                await self.store.append(self.id, records, client_ids, fields)
            else:
                await self.store.append(self.id, records, client_ids, fields, epoch=epoch)
        except LeaseLost:
            self.lease_lost()
            raise
        if self._commits is not None:
            self._commits.observe(time.monotonic() - started)

    # ------------------------------------------------------------------ ownership

    async def claim(self, *, reason: str = "owner_lost") -> int | None:
        """Hold this thread's lease (acquire it if needed): its epoch, None with no
        leases. A new epoch over a row that says a process or a turn was live closes that
        life's books first (``reason``). Raises NotOwner while another replica owns it."""
        async with self._lock:
            return await self._hold_locked(reason)

    async def _hold_locked(self, reason: str = "owner_lost") -> int | None:
        if self._ownership is None:
            return None
        if self.lost:
            raise LeaseLost(f"thread {self.id}: this replica lost its lease")
        try:
            epoch = await self._ownership.ensure(self.id)
        except NotOwner:
            if self._epoch is not None:  # it was ours: taken over while this replica could not renew
                self.lease_lost()
            raise
        if self._epoch is not None and epoch != self._epoch:
            # Our lease lapsed and was granted again: whatever ran meanwhile is not ours to trust.
            self.lease_lost()
            raise LeaseLost(f"thread {self.id}: this replica's lease lapsed")
        if epoch != self._epoch:
            await self._adopt(epoch, reason)
            self._epoch = epoch
        return epoch

    async def _adopt(self, epoch: int, reason: str) -> None:
        """A new epoch: the row is read again (another replica may have written since this
        object last looked), and a life the previous owner left open is closed."""
        fresh = await self.store.get_thread(self.id)
        if fresh is None:
            raise NotFound(f"no thread {self.id}", code="thread_not_found")
        if self._proc is None:  # nothing runs here: the row is the truth (native session, tasks, seq)
            behind = fresh["last_seq"] != self.core.last_seq
            cast(dict[str, Any], self.thread).clear()
            apply_fields(self.thread, fresh)
            self.core = self._new_core(self.thread)
            if behind:
                self.fanout.resync_all()  # what another replica appended reaches our clients
        if not needs_takeover(fresh):
            return
        tail = await self.store.read_events(self.id, max(0, fresh["last_seq"] - TAIL_EVENTS), TAIL_EVENTS)
        turn_id = open_turn(tail)
        events, fields = takeover_events(fresh, reason, turn_id, queued_turns(tail))
        ts = now_iso()
        seq = self.core.last_seq
        records = [
            Record(seq + i + 1, ts, ev.source, ev.kind, ev.data, ev.raw, ev.relay) for i, ev in enumerate(events)
        ]
        fields = {"updated_at": ts, **fields}
        await self._append(records, [None] * len(records), fields, epoch)
        self.core.last_seq = records[-1].seq
        apply_fields(self.thread, fields)
        self.thread["last_seq"] = self.core.last_seq
        self._announce.committed(records)
        if self.on_committed is not None:
            self.on_committed(self.id, self.core.last_seq)
        self._wake_polls()
        log.warning("thread.taken_over", thread_id=self.id, epoch=epoch, reason=reason, turn_id=turn_id)

    def lease_lost(self) -> None:
        """The lease is gone (the store refused an append, or it could not be renewed in
        time): the agent is killed now, clients are told and disconnected (they reconnect,
        anywhere, with ``after=``), and the registry drops this object."""
        if self.lost:
            return
        self.lost = True
        if self._ownership is not None:
            self._ownership.forget(self.id)
        proc = self._proc
        if proc is not None:
            self.core.stopping("owner_lost")
            proc.signal_group(signal.SIGKILL)  # never two replicas running one native session
        self.fanout.broadcast_side(
            ephemeral(
                "notice",
                now_iso(),
                code="owner_lost",
                text="this replica lost its ownership of the thread; reconnect with after= to follow it",
            )
        )
        self.fanout.close_all("owner_lost")
        log.warning("thread.owner_lost", thread_id=self.id, pid=None if proc is None else proc.pid)
        if self._on_lost is not None:
            self._on_lost(self)

    async def release_if_idle(self) -> None:
        """After the agent exited: the lease goes back at once (unless a new start is
        already under way), so any replica may run the thread next."""
        async with self._lock:
            if self._ownership is None or self.lost or self._proc is not None or self.starting:
                return
            self._epoch = None
            await self._ownership.release(self.id)

    async def wait_beyond(self, seq: int, timeout: float) -> None:
        """Return once the transcript has an event after ``seq``, or after ``timeout``.
        A long-poll is not a subscriber: it does not keep an idle agent alive."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        self.last_watched = time.monotonic()
        while self.core.last_seq <= seq and (left := end - loop.time()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._appended.wait(), left)

    async def set_fields(self, fields: dict[str, Any]) -> None:
        self._require_writable()
        async with self._lock:
            fields = {"updated_at": now_iso(), **fields}
            await self.store.update_thread(self.id, fields)
            apply_fields(self.thread, fields)

    def _require_writable(self) -> None:
        """A write that cannot succeed now is refused at once, never queued behind appends
        that wait for the store (a full disk)."""
        if not self.store.healthy:
            raise StoreError("the transcript store cannot be written right now; retry later", code="store_unavailable")

    async def history(self) -> tuple[list[Item], int]:
        """The compacted history (sessions/history.py) and the last seq it covers: what was
        compacted before is kept, only newer records are read."""
        async with self._history_lock:
            comp = self._history or Compactor()
            while True:
                page = await self.store.read_events(self.id, comp.last_seq, HISTORY_PAGE, with_raw=False)
                comp.feed(page)
                if len(page) < HISTORY_PAGE:
                    break
            self._history = comp if len(comp.items) <= HISTORY_KEEP_ITEMS else None
            return comp.snapshot(), comp.last_seq

    async def read_page(self, after: int, limit: int) -> list[Record]:
        return await self.store.read_events(self.id, after, limit)

    async def read_frames(self, after: int, limit: int, *, raw: bool) -> Frames:
        return await self.store.read_frames(self.id, after, limit, raw=raw)

    def subscribe(self, *, raw: bool = False) -> Subscriber:
        self.touch()
        return self.fanout.subscribe(self.settings.server.subscriber_buffer, raw=raw)

    def unsubscribe(self, sub: Subscriber) -> None:
        self.fanout.unsubscribe(sub)
        self._raw_routes = {k: v for k, v in self._raw_routes.items() if v is not sub}
        self.touch()

    # ------------------------------------------------------------------ performing actions

    async def _perform(self, actions: Sequence[Action]) -> list[Record]:
        """Perform the core's actions in order (under ``_lock``); returns what was stored."""
        stored: list[Record] = []
        todo = list(actions)
        while todo:
            action = todo.pop(0)
            if isinstance(action, Emit):
                records = await self._emit(action)
                stored += records
                if action.committed is not None:
                    todo[0:0] = action.committed(records)
            elif isinstance(action, Write):
                await self._write(action)
            elif isinstance(action, ArmTimer):
                self._owned.arm(action.key, action.delay_s)
            elif isinstance(action, CancelTimer):
                self._owned.disarm(action.key)
            else:
                todo[0:0] = await self._perform_other(action)
        return stored

    async def _perform_other(self, action: Action) -> list[Action]:
        if isinstance(action, Serve):
            req = action.request
            try:
                result = await acp_fs.serve(self.thread["cwd"], req.method, req.params)
            except acp_fs.FsError as exc:
                return self.core.served(req, error=(exc.code, exc.message))
            return self.core.served(req, result)
        if isinstance(action, Route):
            if (reply := self._replies.pop(action.route, None)) is not None:
                if not reply.done():
                    reply.set_result(action.text)
            elif (sub := self._raw_routes.get(action.route)) is not None:
                sub.push_routed(action.text, self.core.last_seq)
        elif isinstance(action, Stop):
            self.stop_soon(action.reason, grace_s=action.grace_s)
        return []

    def stop_soon(self, reason: str, *, grace_s: float | None = None) -> None:
        """Stop the process in a task of the conversation's own (it must not wait for
        ``_life`` where it is asked: under ``_lock``, or in the registry's reaper)."""
        self._owned.spawn(self.stop(reason, grace_s=grace_s), "stop")

    async def _write(self, action: Write) -> None:
        proc = self._proc
        try:
            if proc is None:
                raise BrokenPipeError("no agent process")
            await proc.write_line(action.line)
        except (BrokenPipeError, ConnectionResetError) as exc:
            if action.required:
                raise Conflict("the agent process closed its stdin", code="agent_exited") from exc
            log.info("agent.stdin_closed", thread_id=self.id, error=str(exc))  # the watcher ends the turn

    async def _step(self, actions: Sequence[Action]) -> list[Record]:
        async with self._lock:
            return await self._perform(actions)

    async def _timer_fired(self, key: str) -> None:
        async with self._lock:
            if self._owned.claim(key):
                with contextlib.suppress(BridgeError):
                    await self._perform(self.core.timer_fired(key))

    # ------------------------------------------------------------------ process life

    async def ensure_started(self) -> None:
        async with self._life:
            if self._proc is not None:
                return
            if self.deleted:
                raise Conflict("thread was deleted", code="thread_deleted")
            await self._start()

    def _launch(self, profile: AgentProfile, resume: str | None) -> tuple[Codec, LaunchSpec]:
        if self.launch is None:
            thread = self.thread
            self.launch = ThreadLaunch(profile, self.core.options, cwd=thread["cwd"], model=thread.get("model"))
        codec, spec = self.launch.start(resume, {**self._secret_env, **profile.env})
        spec = launch_for_thread(spec, self.settings, self.thread)  # its cwd checked again; the owner's HOME
        spec = self.settings.confine(spec, profile)
        return codec, spec

    async def _start(self) -> None:
        profile = self.profile
        if profile is None:
            raise LaunchRefused(
                f"agent profile {self.thread['agent']!r} is no longer configured", code="agent_not_found"
            )
        self.starting = True  # holds its place under max_conversations, and the lease from release
        try:
            # This replica's lease first (NotOwner while another holds it): taking it over
            # reads the row again, so the launch below resumes the session the last owner
            # recorded.
            await self.claim()
            resume = self.core.native_session_id
            await self._load_secrets(profile)
            codec, spec = self._launch(profile, resume)
            self._can_start(self)
            await self.set_fields({"state": "starting"})
            try:
                proc = await self._spawn(spec)
            except BridgeError:
                await self.set_fields({"state": "exited" if self.thread.get("last_exit") else "idle"})
                raise
            self._proc = proc
        except BaseException:
            self.starting = False
            with contextlib.suppress(BridgeError):
                await self.release_if_idle()
            raise
        finally:
            self.starting = False
        log.info(
            "agent.spawned",
            thread_id=self.id,
            pid=proc.pid,
            agent=profile.name,
            argv0=spec.argv[0],
            resume=resume is not None,
        )
        reader = asyncio.create_task(self._read_stdout(proc), name=f"stdout-{self.id}")
        errs = asyncio.create_task(proc.pump_stderr(self._on_stderr), name=f"stderr-{self.id}")
        self._watcher = asyncio.create_task(self._watch(proc, reader, errs), name=f"watch-{self.id}")
        await self._step(self.core.process_started(codec, proc.pid, proc.start_time, resume))

    async def _load_secrets(self, profile: AgentProfile) -> None:
        """The thread owner's secrets for the profile (bridge/user_secrets.py): given to the
        agent at launch, and scrubbed from everything it writes, whatever their names."""
        owner = user_secrets.owner_of(self.thread.get("owner"))
        ring = user_secrets.keyring(self.settings.data_dir)
        self._secret_env = await user_secrets.agent_env(self.store, ring, owner, profile)
        self._scrub = Scrubber(profile.env, extra=self._secret_env.values())

    async def _on_stderr(self, text: str) -> None:
        text = self._scrub.text(text)
        await self.emit([Event("agent", "diagnostic", {"stream": "stderr", "text": text})])

    async def _read_stdout(self, proc: AgentIO) -> None:
        self._pipe_error = None  # (a previous life's reader may have been cancelled before it saw one)
        try:
            async for lines in proc.stdout_batches():
                # Everything one read brought is decoded, stored and published together:
                # one transaction for a burst of deltas instead of one per line.
                lines = self._scrub.lines(lines)
                async with self._lock.undrained:
                    codec = self.core.codec
                    if codec is None:
                        return
                    actions = self.core.agent_output(codec.decode_many(lines))
                    if self._pipelined(actions, len(lines)):
                        await self._emit_pipelined(cast(Emit, actions[0]))
                        continue
                    await self._drain_reader()
                    await self._perform(actions)
            async with self._lock.undrained:
                await self._drain_reader()
        except LineTooLong as exc:
            log.warning("agent.line_too_long", thread_id=self.id, pid=proc.pid)
            await self._step(self.core.line_too_long(str(exc)))
            return
        # stdout is closed: the protocol is over. An agent that exits does so now; one that
        # keeps running is stopped after the grace period (its turn ends naming the cause).
        try:
            async with asyncio.timeout(self.settings.server.stop_grace_s):
                await proc.wait()
        except TimeoutError:
            log.warning("agent.stdout_closed", thread_id=self.id, pid=proc.pid)
            await self._step(self.core.stdout_closed())

    def _pipelined(self, actions: list[Action], lines: int) -> bool:
        """Output alone (nothing to write, arm or serve after its commit), in a burst, with
        this replica's lease already held (a first hold may take the thread over, which
        appends before)."""
        return (
            len(actions) == 1
            and isinstance(action := actions[0], Emit)
            and action.committed is None
            and (lines >= PIPELINE_MIN_LINES or bool(self._pipe))
            and (self._ownership is None or self._epoch is not None)
        )

    async def _watch(self, proc: AgentIO, reader: asyncio.Task[None], errs: asyncio.Task[None]) -> None:
        info = await proc.wait()
        _done, pending = await asyncio.wait({reader, errs}, timeout=DRAIN_TIMEOUT_S)
        for t in pending:
            t.cancel()
        for t in (reader, errs):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        proc.signal_group(signal.SIGKILL)  # anything the agent left in its group
        proc.release()
        await self._on_exit(proc, info)
        await self.release_if_idle()

    async def _on_exit(self, proc: AgentIO, info: ExitInfo) -> None:
        async with self._lock:
            actions = self.core.process_exited(proc.pid, info.code, info.signal)
            self._proc = None
            for reply in self._replies.values():  # our requests die with the process
                if not reply.done():
                    reply.set_exception(Conflict("the agent process exited before it answered", code="agent_exited"))
            if self.lost:
                return  # its books are closed by the replica that takes the thread over
            with contextlib.suppress(LeaseLost):  # lost just now: the same
                await self._perform(actions)
            log.info("agent.exited", thread_id=self.id, pid=proc.pid, **(self.thread.get("last_exit") or {}))

    async def stop(self, reason: str = "stopped", *, grace_s: float | None = None) -> None:
        async with self._life:
            await self._stop_locked(reason, grace_s)

    async def _stop_locked(self, reason: str, grace_s: float | None = None) -> None:
        proc, watcher, codec = self._proc, self._watcher, self.core.codec
        if proc is None or watcher is None:
            return
        self.core.stopping(reason)
        # A stop never waits for the store (Hardening II #5): with appends blocked (a full
        # disk) the process is still stopped at once, and its exit recorded when the store
        # can write again.
        if self.lost:
            pass  # the row is the next owner's now
        elif self.store.healthy and not self._lock.locked():
            await self.set_fields({"state": "stopping"})
        else:
            self.thread["state"] = "stopping"
        grace = self.settings.server.stop_grace_s if grace_s is None else grace_s
        await proc.stop(grace, shutdown_line=codec.encode_shutdown() if codec else None)
        if self.store.healthy:
            await watcher
        else:
            await asyncio.wait({watcher}, timeout=STOP_RECORD_WAIT_S)

    async def close(self, reason: str) -> None:
        """Stop the process and disconnect every subscriber (delete, daemon shutdown)."""
        async with self._life:
            if reason == "deleted":
                self.deleted = True
            await self._stop_locked(reason)
            self.fanout.close_all(reason)
        await self._owned.cancel_all()

    # ------------------------------------------------------------------ client operations

    async def run(self, command: Command[A], *, answer_to: Subscriber | None = None) -> A:
        """:class:`~bridge.sessions.commands.ThreadPort` on this replica: the command runs
        here and is never forwarded (whether another replica runs the thread is the
        forwarding port's question, sessions/forwarding.py; a command another replica
        forwarded runs here too, sessions/remote.py). Each operation is one entry of
        ``_LOCAL`` (at the end of this module) calling one of the methods below."""
        handler = _LOCAL.get(type(command))
        if handler is None:
            raise InvalidRequest(f"{command.KIND!r} is not an operation this thread runs")
        return cast(A, await handler(self, command, answer_to))

    async def submit(
        self, content: list[dict[str, Any]], client_id: str | None, *, actor: str | None = None
    ) -> Accepted:
        """A prompt (:class:`~bridge.sessions.commands.Prompt`), run here. ``actor``: who
        sent it, recorded as ``by`` in its client events."""
        if not self.store.healthy:
            raise StoreError("the transcript store cannot be written right now; retry later", code="store_unavailable")
        if client_id is not None and (dup := await self._duplicate(client_id)) is not None:
            return dup
        self.core.check_room()
        self._refuse_stored(content)  # what the agent said it takes last time
        await self.ensure_started()
        async with self._lock:
            # Under the lock: a resent client_id can never race its twin.
            if client_id is not None and (dup := await self._duplicate(client_id)) is not None:
                return dup
            for retake in range(SEQ_RETAKES + 1):
                acc, actions = self.core.prompt(content, client_id, actor)
                try:
                    await self._perform(actions)
                except _Renumber:
                    self.core.prompt_failed(acc.turn_id)
                    if retake == SEQ_RETAKES:
                        raise
                    continue  # its seq was taken and read again: numbered anew
                except BaseException:
                    self.core.prompt_failed(acc.turn_id)
                    raise
                return acc
            raise AssertionError("unreachable")

    async def _duplicate(self, client_id: str) -> Accepted | None:
        seq = await self.store.find_client_event(self.id, client_id)
        return None if seq is None else Accepted(seq=seq, turn_id=None, duplicate=True)

    def _refuse_stored(self, content: list[dict[str, Any]]) -> None:
        if self.core.codec is None:
            reason = stored_content_refusal(self.thread.get("protocol") or "", self.thread.get("agent_info"), content)
            if reason is not None:
                raise InvalidRequest(reason, code="unsupported_content")

    async def interrupt(self, *, actor: str | None = None) -> bool:
        """Cancel the active turn. Idempotent; False when no turn is active."""
        async with self._lock:
            active, actions = self.core.interrupt(actor)
            await self._perform(actions)
            return active

    async def answer_permission(
        self,
        request_id: str,
        decision: str,
        *,
        channel: str,
        option_id: str | None = None,
        message: str | None = None,
        actor: str | None = None,
    ) -> dict[str, Any]:
        """One answer per request: the first wins; later ones are refused (409).
        ``channel``: how it came, recorded as ``permission.resolved``'s ``by``; ``actor``:
        who sent it, recorded as ``by`` in the client event of the answer written."""
        async with self._lock:
            data, actions = self.core.answer(
                request_id, decision, by=channel, option_id=option_id, message=message, user=actor
            )
            await self._perform(actions)
            return data

    async def set_mode(self, mode_id: str, *, actor: str | None = None) -> dict[str, Any]:
        """Switch the agent's session mode (sessions/modes.py), starting the agent first
        when it is not running; answers once the agent accepted it, else raises its refusal."""
        check_mode_id(mode_id)
        if self.profile is not None and not may_have_modes(self.profile.protocol):
            raise InvalidRequest("this thread's agent has no session modes", code="modes_not_supported")
        self._require_writable()
        await self.ensure_started()
        route = f"mode-{id(self)}-{time.monotonic_ns()}"
        reply: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(MODE_TIMEOUT_S):
                await self.until_ready()
                async with self._lock:
                    self._replies[route] = reply
                    await self._perform(self.core.set_mode(mode_id, route, actor))
                text = await reply
        except TimeoutError:
            raise ModeTimeout(f"the agent did not answer session/set_mode within {MODE_TIMEOUT_S:g} s") from None
        finally:
            self._replies.pop(route, None)
        return mode_answer(text, mode_id)

    async def until_ready(self) -> None:
        """Until the agent's handshake is done (its session exists); Conflict if it exits."""
        while self.core.codec is None or not self.core.codec.ready:
            if self._proc is None:
                raise Conflict("the agent process is not running", code="agent_exited")
            await self.wait_beyond(self.core.last_seq, 1.0)
        # The codec is ready as soon as the line that made it so is decoded; what that line
        # brought (agent_info and its modes) is the thread's once its emit is performed,
        # under the lock (and committed: nothing is in flight when the lock is taken).
        async with self._lock:
            pass

    async def write_raw(
        self, message: dict[str, Any], sub: Subscriber | None = None, *, actor: str | None = None
    ) -> int:
        """The ``raw`` op / raw mode: write a client's JSON object to stdin, as the dialect
        says; the codec may route the agent's response back to ``sub`` (a raw-mode client)
        only. Answers the newest seq (the write's record)."""
        await self.ensure_started()
        route = f"r{id(sub)}" if sub is not None else ""
        async with self._lock:
            if self._proc is None:
                raise Conflict("the agent process is not running", code="agent_exited")
            actions = self.core.raw(message, route, actor)
            if sub is not None:
                self._raw_routes[route] = sub
            await self._perform(actions)
            return self.core.last_seq


# What each command runs here (Conversation.run). A new operation is one line: its command
# type (sessions/commands.py) and the method of the conversation that performs it.
_Local = Callable[[Conversation, Any, "Subscriber | None"], Awaitable[Any]]
_LOCAL: dict[type[Command[Any]], _Local] = {
    Prompt: lambda conv, c, _to: conv.submit(c.content, c.client_id, actor=c.actor),
    Interrupt: lambda conv, c, _to: conv.interrupt(actor=c.actor),
    AnswerPermission: lambda conv, c, _to: conv.answer_permission(
        c.request_id, c.decision, channel=c.channel, option_id=c.option_id, message=c.message, actor=c.actor
    ),
    SetMode: lambda conv, c, _to: conv.set_mode(c.mode_id, actor=c.actor),
    Raw: lambda conv, c, to: conv.write_raw(c.message, to if c.routed else None, actor=c.actor),
}
