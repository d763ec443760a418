"""One thread's live conversation: the asyncio shell around the pure
:class:`~bridge.sessions.core.ConversationCore`.

The shell decides when the agent process starts and stops; one life of it (the stdout
reader, stderr, the exit watch) is an :class:`~bridge.sessions.agent_run.AgentRun`. It owns
its timers and background tasks. Every input is fed to the core and the actions it returns
are performed in order, under one lock (:meth:`Conversation.perform`). What it writes goes
through the thread's :class:`~bridge.sessions.journal.Journal` (seqs, commits, the
pipeline, publishing), under its :class:`~bridge.sessions.lease.ThreadLease` on a shared
store. A client's commands come in through the thread's port (``Registry.port``): on this
replica, :class:`~bridge.sessions.local_port.LocalPort`, which runs them with the public
pieces below; the conversation itself knows no command.

Locks, always taken in this order (never the other way round):

1. ``_life`` — start, stop, close (a process comes and goes under it);
2. ``journal.lock`` (:class:`~bridge.sessions.journal.Ordered`; ``_lock`` here) — the
   core's state, the transcript's seq, and the agent's stdin: every input to the core and
   every action it returns, every emit. Whoever takes it finds no emit in flight, except
   the stdout reader: a burst of agent output is submitted to the store before the
   previous one is committed (``Journal.submit``).

Nothing awaits ``_life`` while holding ``_lock``: an action that stops the process runs
as a task of the conversation's own (created, cancelled and awaited by it), and so does
every timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import structlog

from bridge import user_secrets
from bridge.clock import now_iso
from bridge.config import THREAD_OPTION_KEYS, AgentProfile, Settings
from bridge.errors import BridgeError, Conflict, LaunchRefused, LeaseLost, StoreError
from bridge.launching import ThreadLaunch, spawn_options
from bridge.process.agent_io import ExitInfo, Spawn
from bridge.process.agent_process import AgentProcess
from bridge.process.launch import LaunchSpec
from bridge.protocols.codec import Codec
from bridge.protocols.envelope import ephemeral
from bridge.protocols.events import Event, Record
from bridge.protocols.forking import pending_fork
from bridge.sessions import acp_fs, mcp_config, worktree_ops
from bridge.sessions.actions import Action, ArmTimer, CancelTimer, Emit, Limits, Route, Serve, Stop, Write
from bridge.sessions.agent_run import AgentRun
from bridge.sessions.agent_title import with_titles
from bridge.sessions.announce import Announcer
from bridge.sessions.caps import MIB, Caps, full_text
from bridge.sessions.core import ConversationCore
from bridge.sessions.fanout import Fanout, Subscriber
from bridge.sessions.journal import Journal
from bridge.sessions.latency import Latency
from bridge.sessions.lease import ThreadLease, waiting_in_transcript
from bridge.sessions.owned import Owned
from bridge.sessions.ownership import Ownership
from bridge.sessions.routes import Routes
from bridge.sessions.scrub import Scrubber
from bridge.sessions.tasks import TaskTable
from bridge.store.base import Store, ThreadRow, apply_fields
from bridge.userdirs import launch_for_thread

log = structlog.get_logger("bridge.conversation")

# A stop while the store cannot write waits this long for the exit to be recorded.
STOP_RECORD_WAIT_S = 1.0


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
        can_start: Callable[[Conversation], Awaitable[None]],
        spawn: Spawn = AgentProcess.spawn,
        announcer: Announcer | None = None,
        ownership: Ownership | None = None,
        on_lost: Callable[[Conversation], None] | None = None,
        commits: Latency | None = None,
        caps: Caps | None = None,
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
            max_bytes=settings.capacity.max_transcript_mb * MIB,
        )  # fmt: skip
        self._caps = caps
        if announcer is not None:
            self.journal.announcer = announcer
        self._lock = self.journal.lock
        # A shared store: the agent runs and appends only under this replica's lease, every
        # append fenced by its epoch (sessions/lease.py). No ownership: one daemon, no leases.
        self.lease = ThreadLease(self.journal, ownership, refresh=self._refresh, on_lost=self.lease_lost)
        self.core = self._new_core(thread)
        self._life = asyncio.Lock()
        self._run: AgentRun | None = None  # the agent process's life, while it lives
        self.starting = False  # a start holds its place under max_conversations
        self.last_activity = time.monotonic()
        self.last_watched = self.last_activity  # a long-poll's last wait (it is no activity)
        self.deleted = False
        # The daemon drains (SIGTERM): no prompt is recorded from now on, even one that passed
        # the port's check just before the signal (sessions/local_port.py, under the lock).
        self.retiring = False
        self.routes = Routes()  # where the agent's routed answers go (a mode switch, raw mode)
        # How its agent is started (bridge/launching.py): the registry's, checked at creation;
        # made at the first start of a thread loaded from the store.
        self.launch: ThreadLaunch | None = None
        self.mcp_file: Path | None = None  # the running agent's generated --mcp-config (sessions/mcp_config.py)
        self.mcp_scrub: Scrubber | None = None  # … and what keeps its secrets out of the transcript
        self._unmarked_title: str | None = None  # sessions/agent_title.py: with_titles

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
        core.model = thread.get("model")  # what an agent's model option is held to (core._keep_model)
        self.journal.mirror = core
        return core

    # ------------------------------------------------------------------ state

    @property
    def running(self) -> bool:
        return self._run is not None

    @property
    def agent_pid(self) -> int | None:
        return None if self._run is None else self._run.pid

    def kill_now(self, reason: str) -> bool:
        """SIGKILL the agent's whole group now (over its memory limit): its exit gets
        ``reason``, its turn ends once, the thread stays usable. False if none runs."""
        run = self._run
        if run is None:
            return False
        self.core.stopping(reason)
        run.kill()
        return True

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

    async def waiting_permissions(self) -> list[dict[str, Any]]:
        """The requests that wait for an answer, wherever the agent that asked runs: here,
        from memory; on another replica (a shared store), as the transcript shows them."""
        if self._run is not None or not self.store.shared:
            return self.pending_permissions()
        row = await self.store.get_thread(self.id)
        return [] if row is None else await waiting_in_transcript(self.store, row)

    # ------------------------------------------------------------------ transcript

    async def emit(self, events: Sequence[Event], *, fields: dict[str, Any] | None = None) -> list[Record]:
        """Number, persist, then publish events of the daemon's own (Journal.emit)."""
        async with self._lock:
            return await self.journal.emit(events, self.emit_fields(Emit(list(events), fields or {})))

    def emit_fields(self, action: Emit) -> dict[str, Any]:
        """The thread fields an Emit writes, with the pending permissions' count when the
        core's differs from the row's, and the title a prompt or the agent gives the thread."""
        # sessions/agent_title.py; a prompt title waits here for the thread's first agent_info
        fields, self._unmarked_title = with_titles(self.thread, action.fields, action.events, self._unmarked_title)
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
        if self._run is not None:
            return 0
        async with self._lock:
            return 0 if self._run is not None else await self.journal.follow()

    # ------------------------------------------------------------------ lease

    async def claim(self, *, reason: str = "owner_lost") -> int | None:
        """Hold this thread's lease (acquire it if needed): its epoch, None with no
        leases. A new epoch over a row that says a process or a turn was live closes that
        life's books first (``reason``). Raises HeldElsewhere while another replica holds it."""
        async with self._lock:
            return await self.lease.hold(reason)

    def _refresh(self, fresh: ThreadRow) -> None:
        """A new epoch read the row again: with no process running here, the row is the
        truth (native session, tasks, seq), and a stale core is rebuilt from it."""
        if self._run is not None:
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
        run = self._run
        if run is not None:
            self.core.stopping("owner_lost")
            run.kill()  # never two replicas running one native session
        text = "this replica lost the thread's lease; reconnect with after= to follow it"
        self.fanout.broadcast_side(ephemeral("notice", now_iso(), code="owner_lost", text=text))
        self.fanout.close_all("owner_lost")
        log.warning("thread.owner_lost", thread_id=self.id, pid=None if run is None else run.pid)
        if self._on_lost is not None:
            self._on_lost(self)

    async def release_if_idle(self) -> None:
        """After the agent exited: the lease goes back at once (unless a new start is
        already under way), so any replica may run the thread next."""
        async with self._lock:
            # (Prompts carried over a model switch wait for the next process here.)
            if self._run is None and not self.starting and not self.core.queue:
                await self.lease.release()

    async def wait_beyond(self, seq: int, timeout: float) -> None:
        """Return once the transcript has an event after ``seq``, or after ``timeout``.
        A long-poll is not a subscriber: it does not keep an idle agent alive."""
        self.last_watched = time.monotonic()
        await self.journal.wait_beyond(seq, timeout)

    async def wait_turns_over(self, timeout: float) -> None:
        """Return once no turn runs or waits on this thread and the events that ended them
        are stored, or after ``timeout`` (the long-poll ``until=turn_end``, docs/api.md
        §4.10). Like :meth:`wait_beyond`, it keeps no idle agent alive."""
        self.last_watched = time.monotonic()
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while (left := end - loop.time()) > 0:
            seq = self.journal.last_seq
            if self._turns_open():
                await self.journal.wait_beyond(seq, left)
                continue
            # The core ends a turn under the lock and commits its turn.ended before letting
            # go: once the lock is ours, that event is in the transcript.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(end), self._lock:
                    if not self._turns_open():
                        return

    def _turns_open(self) -> bool:
        # The thread row's flag, for a thread whose agent runs on another replica.
        return self.busy or bool(self.thread.get("turn_active"))

    async def set_fields(self, fields: dict[str, Any]) -> None:
        self.require_writable()
        async with self._lock:
            fields = {"updated_at": now_iso(), **fields}
            await self.store.update_thread(self.id, fields)
            apply_fields(self.thread, fields)

    def require_room(self) -> None:
        """A thread whose transcript reached [capacity] max_transcript_mb takes no prompt
        and starts no agent (409 ``transcript_full``); it stays readable."""
        if self.journal.full:
            cap = self.settings.capacity.max_transcript_mb
            raise Conflict(
                f"this thread's transcript reached its cap ([capacity] max_transcript_mb = {cap}): "
                "it takes no new prompt; its events and history stay readable: continue in a new thread",
                code="transcript_full",
            )

    def transcript_full(self) -> list[Action]:
        """The agent's output took the transcript to its cap: what stops the agent (once)."""
        if self._caps is not None:
            self._caps.transcript_full()
        log.warning("agent.transcript_full", thread_id=self.id, size=self.journal.size)
        return self.core.transcript_full(full_text(self.journal.size, self.settings.capacity.max_transcript_mb))

    def require_writable(self) -> None:
        """A write that cannot succeed now is refused at once, never queued behind appends
        that wait for the store (a full disk)."""
        if not self.store.healthy:
            raise StoreError("the transcript store cannot be written right now; retry later", code="store_unavailable")

    def subscribe(self, *, raw: bool = False) -> Subscriber:
        self.touch()
        return self.fanout.subscribe(self.settings.server.subscriber_buffer, raw=raw)

    def unsubscribe(self, sub: Subscriber) -> None:
        self.fanout.unsubscribe(sub)
        self.routes.drop_client(sub)
        self.touch()

    # ------------------------------------------------------------------ performing actions

    async def perform(self, actions: Sequence[Action]) -> list[Record]:
        """Perform the core's actions in order, under ``journal.lock`` (the caller holds
        it); returns what was stored."""
        stored: list[Record] = []
        todo = list(actions)
        while todo:
            action = todo.pop(0)
            if isinstance(action, Emit):
                events = mcp_config.scrubbed(action.events, self.mcp_scrub)
                records = await self.journal.emit(events, self.emit_fields(action), action.client_ids)
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
            self.routes.deliver(action.route, action.text, self.core.last_seq)
        elif isinstance(action, Stop):
            if action.resume_queue:
                self._owned.spawn(self._restart(action.reason), "restart")
            else:
                self.stop_soon(action.reason, grace_s=action.grace_s)
        return []

    def stop_soon(self, reason: str, *, grace_s: float | None = None) -> None:
        """Stop the process in a task of the conversation's own (it must not wait for
        ``_life`` where it is asked: under ``_lock``, or in the registry's reaper)."""
        self._owned.spawn(self.stop(reason, grace_s=grace_s), "stop")

    async def _restart(self, reason: str) -> None:
        """A model switch at its turn boundary: the agent stopped, then started again (on
        the thread's launch, resuming its session) when prompts wait for it; if it cannot
        start, they end "not started" with why."""
        await self.stop(reason)
        if not self.core.queue or self.deleted:
            await self.release_if_idle()
            return
        try:
            await self.ensure_started()
        except BridgeError as exc:
            log.info("agent.restart_failed", thread_id=self.id, code=exc.code)
            with contextlib.suppress(BridgeError):
                async with self._lock:
                    await self.perform(self.core.queue_not_started(f"the agent could not start again ({exc.message})"))
            await self.release_if_idle()

    async def switch_model(self, launch: ThreadLaunch, actions: Callable[[], list[Action]]) -> None:
        """Give the thread a new launch (its new model) and perform what the core says of
        it, between two lives of the agent: a start under way finishes first, so the
        process that runs after this either was started with ``launch`` or is told to
        stop for it."""
        self.require_writable()
        async with self._life, self._lock:
            self.launch = launch
            await self.perform(actions())

    async def _write(self, action: Write) -> None:
        run = self._run
        try:
            if run is None:
                raise BrokenPipeError("no agent process")
            await run.proc.write_line(action.line)
        except (BrokenPipeError, ConnectionResetError) as exc:
            if action.required:
                raise Conflict("the agent process closed its stdin", code="agent_exited") from exc
            log.info("agent.stdin_closed", thread_id=self.id, error=str(exc))  # the watcher ends the turn

    async def step(self, actions: Sequence[Action]) -> list[Record]:
        """:meth:`perform`, taking the lock."""
        async with self._lock:
            return await self.perform(actions)

    async def _timer_fired(self, key: str) -> None:
        async with self._lock:
            if self._owned.claim(key):
                with contextlib.suppress(BridgeError):
                    await self.perform(self.core.timer_fired(key))

    # ------------------------------------------------------------------ process life

    async def ensure_started(self) -> None:
        async with self._life:
            if self._run is not None:
                return
            if self.deleted:
                raise Conflict("thread was deleted", code="thread_deleted")
            await self._start()

    async def _launch(self, profile: AgentProfile, resume: str | None) -> tuple[Codec, LaunchSpec, Scrubber]:
        """How this start's agent is launched, and what is kept out of its output: the
        thread owner's secrets for the profile (bridge/user_secrets.py), read at each start,
        are given to the agent and scrubbed from everything it writes, whatever their names."""
        owner = user_secrets.owner_of(self.thread.get("owner"))
        ring = user_secrets.keyring(self.settings.data_dir)
        secrets = await user_secrets.agent_env(self.store, ring, owner, profile)
        if self.launch is None:
            thread = self.thread
            self.launch = ThreadLaunch(profile, self.core.options, cwd=thread["cwd"], model=thread.get("model"))
        # A fork's first process copies its source's session (protocols/forking.py).
        fork = pending_fork(self.thread.get("forked_from"), resume)
        codec, spec = self.launch.start(resume, {**secrets, **profile.env}, fork)
        spec = launch_for_thread(spec, self.settings, self.thread)  # its cwd checked again; the owner's HOME
        spec, self.mcp_file = mcp_config.with_servers(spec, self.id, self.launch.options, profile.protocol)
        self.mcp_scrub = mcp_config.scrubber(self.launch.options)  # MCP env and header values
        # A thread's own worktree: its agent's git also writes the repository's objects and its branch.
        spec = self.settings.confine(spec, worktree_ops.granted(profile, self.thread.get("worktree")))
        spec = replace(spec, memory_limit_mb=profile.memory_limit_mb)  # a kernel limit where it can be
        mcp_secrets = mcp_config.secrets(self.launch.options)  # the agent may echo its MCP servers' env
        return codec, spec, Scrubber(profile.env, extra=[*secrets.values(), *mcp_secrets])

    async def _start(self) -> None:
        profile = self.profile
        if profile is None:
            raise LaunchRefused(
                f"agent profile {self.thread['agent']!r} is no longer configured", code="agent_not_found"
            )
        self.starting = True  # holds its place under max_conversations, and the lease from release
        try:
            # This replica's lease first (HeldElsewhere while another holds it): taking it over
            # reads the row again, so the launch below resumes the session the last holder
            # recorded.
            await self.claim()
            self.require_room()  # (after the claim: a takeover reads the row again)
            resume = self.core.native_session_id
            codec, spec, scrub = await self._launch(profile, resume)
            await self._can_start(self)  # the agents' count and the memory budget (registry)
            await self.set_fields({"state": "starting"})
            try:
                proc = await self._spawn(spec)
            except BridgeError:
                await self.set_fields({"state": "exited" if self.thread.get("last_exit") else "idle"})
                raise
            self._run = AgentRun(proc, self, scrub, grace_s=self.settings.server.stop_grace_s)
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
        await self.step(self.core.process_started(codec, proc.pid, proc.start_time, resume))

    async def until_ready(self) -> None:
        """Until the agent's handshake is done (its session exists); Conflict if it exits."""
        while self.core.codec is None or not self.core.codec.ready:
            if self._run is None:
                raise Conflict("the agent process is not running", code="agent_exited")
            await self.wait_beyond(self.core.last_seq, 1.0)
        # The codec is ready as soon as the line that made it so is decoded; what that line
        # brought (agent_info and its modes) is the thread's once its emit is performed,
        # under the lock (and committed: nothing is in flight when the lock is taken).
        async with self._lock:
            pass

    async def exited(self, run: AgentRun, info: ExitInfo) -> None:
        """``run``'s process exited (its watcher saw it go): the core closes the life's
        books, answers awaited from it fail, and the lease goes back."""
        async with self._lock:
            if info.reason is not None and self.core.exit_reason is None:
                self.core.stopping(info.reason)  # the kernel's OOM kill in its cgroup: memory_limit
            actions = self.core.process_exited(run.pid, info.code, info.signal)
            self._run = None
            mcp_config.discard(self.mcp_file)
            self.routes.fail_all(lambda: Conflict("the agent process exited before it answered", code="agent_exited"))
            if not self.lease.lost:  # else its books are closed by the replica that takes it over
                with contextlib.suppress(LeaseLost):  # lost just now: the same
                    await self.perform(actions)
                log.info("agent.exited", thread_id=self.id, pid=run.pid, **(self.thread.get("last_exit") or {}))
        await self.release_if_idle()

    async def stop(self, reason: str = "stopped", *, grace_s: float | None = None) -> None:
        async with self._life:
            await self._stop_locked(reason, grace_s)

    async def _stop_locked(self, reason: str, grace_s: float | None = None) -> None:
        run, codec = self._run, self.core.codec
        if run is None:
            return
        self.core.stopping(reason)
        # A stop never waits for the store (Hardening II #5): with appends blocked (a full
        # disk) the process is still stopped at once, and its exit recorded when the store
        # can write again.
        if self.lease.lost:
            pass  # the row is the next lease holder's now
        elif self.store.healthy and not self._lock.locked():
            await self.set_fields({"state": "stopping"})
        else:
            self.thread["state"] = "stopping"
        grace = self.settings.server.stop_grace_s if grace_s is None else grace_s
        await run.stop(grace, codec.encode_shutdown() if codec else None)
        await run.recorded(None if self.store.healthy else STOP_RECORD_WAIT_S)

    async def close(self, reason: str) -> None:
        """Stop the process and disconnect every subscriber (delete, daemon shutdown)."""
        async with self._life:
            if reason == "deleted":
                self.deleted = True
            await self._stop_locked(reason)
            self.fanout.close_all(reason)
        await self._owned.cancel_all()
