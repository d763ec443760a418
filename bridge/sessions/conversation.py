"""One thread's live conversation: the asyncio shell around the pure
:class:`~bridge.sessions.core.ConversationCore`.

The shell owns the agent process (an :class:`~bridge.process.agent_io.AgentIO`), its
timers and background tasks. Every input is fed to the core and the actions it returns
are performed in order, under one lock. What it writes goes through the thread's
:class:`~bridge.sessions.journal.Journal` (seqs, commits, the pipeline, publishing), under
its :class:`~bridge.sessions.lease.ThreadLease` on a shared store.

Locks, always taken in this order (never the other way round):

1. ``_life`` — start, stop, close (a process comes and goes under it);
2. ``_lock`` (the journal's :class:`~bridge.sessions.journal.Ordered`) — the core's
   state, the transcript's seq, and the agent's stdin: every input to the core and every
   action it returns, every emit. Whoever takes it finds no emit in flight, except the
   stdout reader: a burst of agent output is submitted to the store before the previous
   one is committed (``Journal.submit``).

Nothing awaits ``_life`` while holding ``_lock``: an action that stops the process runs
as a task of the conversation's own (created, cancelled and awaited by it), and so does
every timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
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
    StoreError,
)
from bridge.launching import ThreadLaunch, spawn_options
from bridge.process.agent_io import AgentIO, ExitInfo, Spawn
from bridge.process.agent_process import AgentProcess
from bridge.process.launch import LaunchSpec
from bridge.protocols.codec import Codec
from bridge.protocols.codecs import may_have_modes, stored_content_refusal
from bridge.protocols.envelope import ephemeral
from bridge.protocols.events import Event, Record
from bridge.protocols.framing import LineTooLong
from bridge.sessions import acp_fs
from bridge.sessions.actions import Accepted, Action, ArmTimer, CancelTimer, Emit, Limits, Route, Serve, Stop, Write
from bridge.sessions.announce import Announcer
from bridge.sessions.commands import AnswerPermission, Command, Interrupt, Prompt, Raw, SetMode
from bridge.sessions.core import ConversationCore
from bridge.sessions.fanout import Fanout, Subscriber
from bridge.sessions.journal import PIPELINE_MIN_LINES, SEQ_RETAKES, Journal, Renumber
from bridge.sessions.latency import Latency
from bridge.sessions.lease import ThreadLease
from bridge.sessions.modes import MODE_TIMEOUT_S, ModeTimeout, check_mode_id, mode_answer
from bridge.sessions.owned import Owned
from bridge.sessions.ownership import Ownership
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
_Renumber = Renumber  # (the client operations' name for it)


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
        self._can_start = can_start
        self._spawn = spawn
        self._on_lost = on_lost
        self._owned = Owned(self.id, self._timer_fired)
        self.journal = Journal(
            thread, store, self.fanout, hold=lambda: self.lease.hold(), on_fenced=self.lease_lost,
            on_published=self.touch, spawn=self._owned.spawn, commits=commits,
        )  # fmt: skip
        if announcer is not None:
            self.journal.announcer = announcer
        self._lock = self.journal.lock
        # A shared store: the agent runs and appends only under this replica's lease, every
        # append fenced by its epoch (sessions/lease.py). No ownership: one daemon, no leases.
        self.lease = ThreadLease(self.journal, ownership, refresh=self._refresh, on_lost=self.lease_lost)
        self.core = self._new_core(thread)
        self._life = asyncio.Lock()
        self._proc: AgentIO | None = None
        self.starting = False  # a start holds its place under max_conversations
        self._watcher: asyncio.Task[None] | None = None
        self.last_activity = time.monotonic()
        self.last_watched = self.last_activity  # a long-poll's last wait (it is no activity)
        self.deleted = False
        self._raw_routes: dict[str, Subscriber] = {}  # raw-mode clients awaiting responses
        self._replies: dict[str, asyncio.Future[str]] = {}  # our own requests' routed answers (set_mode)
        self._scrub = Scrubber(profile.env if profile is not None else {})
        self._secret_env: dict[str, str] = {}  # the owner's secrets for the profile, read at each start
        # How its agent is started (bridge/launching.py): the registry's, checked at creation;
        # made at the first start of a thread loaded from the store.
        self.launch: ThreadLaunch | None = None

    def _new_core(self, thread: ThreadRow) -> ConversationCore:
        """A core for ``thread``'s row, numbering prompts from the journal's seq."""
        srv = self.settings.server
        core = ConversationCore(
            last_seq=thread["last_seq"],
            native_session_id=thread.get("native_session_id"),
            options=_options(self.profile, thread),
            limits=Limits(srv.max_pending_prompts, srv.interrupt_timeout_s, srv.permission_timeout_s, srv.stop_grace_s),
            tasks=TaskTable.from_json(saved) if (saved := thread.get("tasks")) else None,
        )
        self.journal.mirror = core
        return core

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

    @property
    def requests_in_flight(self) -> int:
        """The daemon's own requests to the agent (a mode switch) still awaiting its answer."""
        return len(self._replies)

    # ------------------------------------------------------------------ transcript

    async def emit(self, events: Sequence[Event], *, fields: dict[str, Any] | None = None) -> list[Record]:
        """Number, persist, then publish events of the daemon's own (Journal.emit)."""
        async with self._lock:
            return await self.journal.emit(events, self._fields(Emit(list(events), fields or {})))

    def _fields(self, action: Emit) -> dict[str, Any]:
        """The thread fields an Emit writes, with the pending permissions' count when the
        core's differs from the row's."""
        fields = action.fields
        pending = len(self.core.permissions)
        if "pending_permissions" not in fields and pending != self.thread.get("pending_permissions", 0):
            # An answer, a withdrawal, an interrupt or an exit changed it before this Emit:
            # the row's count changes in the commit that records why (server-wide changes).
            fields = {**fields, "pending_permissions": pending}
        return fields

    async def follow(self) -> int:
        """Another replica runs this thread: publish to this replica's subscribers what it
        has committed since this replica last looked (Journal.follow). Returns how many
        records were new."""
        if self._proc is not None:
            return 0
        async with self._lock:
            return 0 if self._proc is not None else await self.journal.follow()

    # ------------------------------------------------------------------ ownership

    async def claim(self, *, reason: str = "owner_lost") -> int | None:
        """Hold this thread's lease (acquire it if needed): its epoch, None with no
        leases. A new epoch over a row that says a process or a turn was live closes that
        life's books first (``reason``). Raises NotOwner while another replica owns it."""
        async with self._lock:
            return await self.lease.hold(reason)

    def _refresh(self, fresh: ThreadRow) -> None:
        """A new epoch read the row again: with no process running here, the row is the
        truth (native session, tasks, seq), and a stale core is rebuilt from it."""
        if self._proc is not None:
            return
        behind = fresh["last_seq"] != self.journal.last_seq
        cast(dict[str, Any], self.thread).clear()
        apply_fields(self.thread, fresh)
        self.core = self._new_core(self.thread)
        self.journal.reset(self.thread["last_seq"])
        if behind:
            self.fanout.resync_all()  # what another replica appended reaches our clients

    def lease_lost(self) -> None:
        """The lease is gone (the store refused an append, or it could not be renewed in
        time): the agent is killed now, clients are told and disconnected (they reconnect,
        anywhere, with ``after=``), and the registry drops this object."""
        if not self.lease.lose():
            return
        proc = self._proc
        if proc is not None:
            self.core.stopping("owner_lost")
            proc.signal_group(signal.SIGKILL)  # never two replicas running one native session
        text = "this replica lost its ownership of the thread; reconnect with after= to follow it"
        self.fanout.broadcast_side(ephemeral("notice", now_iso(), code="owner_lost", text=text))
        self.fanout.close_all("owner_lost")
        log.warning("thread.owner_lost", thread_id=self.id, pid=None if proc is None else proc.pid)
        if self._on_lost is not None:
            self._on_lost(self)

    async def release_if_idle(self) -> None:
        """After the agent exited: the lease goes back at once (unless a new start is
        already under way), so any replica may run the thread next."""
        async with self._lock:
            if self._proc is None and not self.starting:
                await self.lease.release()

    async def wait_beyond(self, seq: int, timeout: float) -> None:
        """Return once the transcript has an event after ``seq``, or after ``timeout``.
        A long-poll is not a subscriber: it does not keep an idle agent alive."""
        self.last_watched = time.monotonic()
        await self.journal.wait_beyond(seq, timeout)

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
                records = await self.journal.emit(action.events, self._fields(action), action.client_ids)
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
        self.journal.clear_failure()  # (a previous life's reader may have been cancelled before it saw one)
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
                        emit = cast(Emit, actions[0])
                        await self.journal.submit(emit.events, self._fields(emit))
                        continue
                    await self.journal.drain_reader()
                    await self._perform(actions)
            async with self._lock.undrained:
                await self.journal.drain_reader()
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
            and (lines >= PIPELINE_MIN_LINES or self.journal.in_flight > 0)
            and self.lease.held
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
            if self.lease.lost:
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
        if self.lease.lost:
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
                request_id, decision, channel=channel, option_id=option_id, message=message, actor=actor
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
