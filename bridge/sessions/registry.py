"""thread id → Conversation; thread creation, capacity, idle reaping, daemon shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from bridge.clock import now_iso
from bridge.config import DEMO_PROFILE, THREAD_OPTION_KEYS, AgentProfile, Settings
from bridge.errors import Busy, Capacity, Conflict, Draining, HeldElsewhere, InvalidRequest, NotFound
from bridge.ids import new_id
from bridge.launching import ThreadLaunch, spawn_options
from bridge.process.agent_io import Spawn
from bridge.process.agent_process import AgentProcess
from bridge.process.fence import Fence
from bridge.process.reaper import reap_group
from bridge.protocols.envelope import ephemeral
from bridge.sessions import worktree as worktree_rules
from bridge.sessions import worktree_ops
from bridge.sessions.announce import Also, Listener
from bridge.sessions.caps import Caps
from bridge.sessions.changes import ChangeNotifier
from bridge.sessions.commands import ThreadPort
from bridge.sessions.config_options import agent_models
from bridge.sessions.conversation import Conversation
from bridge.sessions.fenced import FencedSpawn
from bridge.sessions.fork import Fork
from bridge.sessions.forwarding import DrainGate, Forwarding, handover_wait_s
from bridge.sessions.latency import Latency
from bridge.sessions.lease import closing_events
from bridge.sessions.local_port import LocalPort
from bridge.sessions.memory_guard import MemoryGuard
from bridge.sessions.ownership import Ownership
from bridge.sessions.remote import HolderGone, LeaseHolders
from bridge.sessions.samples import write_demo_samples
from bridge.sessions.sweep import OrphanSweep, sweep_interval
from bridge.store.base import Store, ThreadRow
from bridge.userdirs import check_cwd

log = structlog.get_logger("bridge.registry")

IDLE_SCAN_S = 1.0
FOLLOW_RECENT_S = 60.0  # a thread used here this recently is followed without a subscriber


class Registry:
    def __init__(self, settings: Settings, store: Store, *, spawn: Spawn = AgentProcess.spawn) -> None:
        self.settings = settings
        self.store = store
        self._spawn = spawn
        self._convs: dict[str, Conversation] = {}
        self._lock = asyncio.Lock()
        self._reaper: asyncio.Task[None] | None = None
        self.changes = ChangeNotifier()  # wakes the server-wide change streams (GET /v1/events)
        self.commits = Latency()  # store commit latency, as conversations see it (/metrics)
        self.draining = False  # SIGTERM: no new threads (503 draining)
        # Leases only on a shared store: a SQLite file is one daemon's (its data dir is
        # locked), so nothing else could ever run its threads (docs/DESIGN.md "Ownership").
        cluster = settings.cluster
        self.ownership = (
            Ownership(store, cluster.replica_id, cluster.lease_ttl_s, on_lost=self._leases_lost)
            if store.shared
            else None
        )
        # With leases, every agent is also registered with a watchdog process that kills it
        # should this daemon be frozen past its lease's deadline (sessions/fenced.py).
        self.fenced = None if self.ownership is None else FencedSpawn(Fence(), self.ownership, spawn)
        self._leases: asyncio.Task[None] | None = None
        self._sweep: asyncio.Task[None] | None = None  # closes what dead replicas left open (sessions/sweep.py)
        self._closing: set[asyncio.Task[None]] = set()  # conversations closed after a lost lease
        # Many replicas (sessions/cluster.py): who holds a thread's lease elsewhere, and who hears of
        # this replica's commits.
        self.holders: LeaseHolders | None = None
        self.on_committed: Callable[[str, int], None] | None = None
        # Told of every commit of a thread run here, with its row (bridge/push: Web Push).
        self.on_records: Listener | None = None
        self.caps = Caps(settings.capacity, store)  # max_threads, max_transcript_mb (sessions/caps.py)
        # The agents' memory on this host: admission, idle eviction, limits (issue #36).
        self.memory = MemoryGuard(settings, lambda: list(self._convs.values()))
        self._memory_watch: asyncio.Task[None] | None = None

    def join_cluster(self, holders: LeaseHolders, on_committed: Callable[[str, int], None]) -> None:
        self.holders = holders
        self.on_committed = on_committed
        for conv in self._convs.values():
            conv.journal.on_committed = on_committed

    def port(self, conv: Conversation) -> ThreadPort:
        """Where a client's commands for ``conv`` go (sessions/commands.py): run here on a
        single daemon (sessions/local_port.py); among replicas, a port that forwards them
        to the replica running the thread (sessions/forwarding.py)."""
        local = LocalPort(conv)
        if self.holders is None:
            return DrainGate(local, lambda: self.draining)
        handover_s = handover_wait_s(self.settings.server.stop_grace_s)
        return Forwarding(local, self.holders, draining=lambda: self.draining, handover_s=handover_s)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.store.listeners.add(health=self._on_store_health, change=self.changes.notify)
        if self.fenced is not None:
            self.fenced.fence.start()
        if self.ownership is not None:
            self._leases = asyncio.create_task(self.ownership.run(), name="lease-renewal")
        await self._recover()
        self._reaper = asyncio.create_task(self._reap_idle(), name="idle-reaper")
        self._memory_watch = asyncio.create_task(self.memory.run(), name="memory-watch")
        if self.ownership is not None:
            sweep = OrphanSweep(self.store, self.ownership, self, every_s=sweep_interval(self.ownership.ttl_s))
            self._sweep = asyncio.create_task(sweep.run(), name="orphan-sweep")

    async def _recover(self) -> None:
        """A previous daemon died with processes or turns in flight: close their books so
        every accepted turn still ends exactly once and the thread is resumable. On a shared
        store only this replica's rows are listed, and each is first leased: one another
        live replica holds now is left alone (its process is not ours to reap)."""
        for row in await self.store.live_threads():
            if self.ownership is not None:
                await self._recover_leased(row)
                continue
            pid, pid_start = row.get("pid"), row.get("pid_start")
            if pid and pid_start is not None:
                killed = reap_group(pid, pid_start)
                if killed:
                    log.warning("agent.orphans_reaped", thread_id=row["id"], pids=killed)
            conv = await self.get(row["id"])
            # the same closing events as a takeover's (sessions/lease.py): the turn and the
            # queued prompts end once each, the pending permissions are cancelled
            events, fields = await closing_events(self.store, row, "daemon_stopped")
            await conv.emit(events, fields=fields)
            log.info("thread.recovered", thread_id=row["id"])

    async def _recover_leased(self, row: ThreadRow) -> None:
        conv = await self.get(row["id"])
        try:
            await conv.claim(reason="daemon_stopped")  # closes the books under the lease
        except HeldElsewhere as exc:
            log.info("thread.recovery_skipped", thread_id=row["id"], holder=exc.holder)
            self._convs.pop(row["id"], None)
            return
        pid, pid_start = row.get("pid"), row.get("pid_start")
        if pid and pid_start is not None:
            killed = reap_group(pid, pid_start)
            if killed:
                log.warning("agent.orphans_reaped", thread_id=row["id"], pids=killed)
        await conv.release_if_idle()
        log.info("thread.recovered", thread_id=row["id"])

    def _leases_lost(self, thread_ids: list[str]) -> None:
        """Self-fencing (sessions/ownership.py): these leases could not be kept."""
        for tid in thread_ids:
            conv = self._convs.get(tid)
            if conv is not None:
                conv.lease_lost()

    def _conv_lost(self, conv: Conversation) -> None:
        """A conversation lost its lease: dropped at once (the next request loads the row
        afresh) and closed in the background."""
        if self._convs.get(conv.id) is conv:
            del self._convs[conv.id]
        task = asyncio.create_task(conv.close("owner_lost"), name=f"lost-{conv.id}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _refuse_if_draining(self) -> None:
        if self.draining:
            raise Draining(
                "this daemon is shutting down: it takes no new thread and starts no agent; use another replica"
            )

    def drain(self) -> None:
        """SIGTERM: take no new work from now on — no thread created, no prompt run here,
        no lease taken, no agent started (503 ``draining``) — and stop every agent now, not
        after the HTTP server's graceful wait: each lease is let go as soon as its agent's
        exit is recorded, so another replica can run the thread at once (the hand-over;
        sessions/forwarding.py). shutdown() waits for these stops."""
        if self.draining:
            return
        self.draining = True
        if self.ownership is not None:
            self.ownership.drain()
        for conv in list(self._convs.values()):
            conv.retiring = True
            task = asyncio.create_task(self._retire(conv), name=f"drain-{conv.id}")
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _retire(conv: Conversation) -> None:
        try:
            await conv.close("daemon_shutdown")
            await conv.release_if_idle()  # also a lease taken for an append with no agent
        except Exception as exc:  # shutdown() goes on; its release_all is the last resort
            log.warning("thread.drain_failed", thread_id=conv.id, error=type(exc).__name__)

    def _on_store_health(self, healthy: bool, error: str | None) -> None:
        """Tell every live client at once: while the store cannot be written, agents are
        held back and prompts are refused; nothing already shown is lost."""
        if healthy:
            frame = ephemeral(
                "notice", now_iso(), code="store_recovered", text="the transcript store is writable again"
            )
        else:
            frame = ephemeral(
                "notice",
                now_iso(),
                code="store_unavailable",
                text=f"the transcript store cannot be written ({error}); agents are "
                "paused and new prompts are refused until it recovers",
            )
        for conv in self._convs.values():
            conv.fanout.broadcast_side(frame)

    async def shutdown(self) -> None:
        for task in (self._reaper, self._sweep, self._memory_watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self.draining = True
        convs = list(self._convs.values())
        await asyncio.gather(*(c.close("daemon_shutdown") for c in convs), return_exceptions=True)
        await asyncio.gather(*self._closing, return_exceptions=True)
        if self.fenced is not None:  # before the leases go: an agent still registered dies first
            await self.fenced.fence.close()
        if self._leases is not None:
            self._leases.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._leases
        if self.ownership is not None:
            await self.ownership.release_all()  # the next holder need not wait for expiry

    async def _reap_idle(self) -> None:
        idle_s = self.settings.server.idle_timeout_s
        while True:
            await asyncio.sleep(min(IDLE_SCAN_S, idle_s / 2))
            now = time.monotonic()
            for conv in list(self._convs.values()):
                if conv.running and not conv.busy and len(conv.fanout) == 0 and now - conv.last_activity >= idle_s:
                    log.info("agent.idle_stop", thread_id=conv.id)
                    conv.stop_soon("idle_timeout")
                elif self.ownership is not None and self.ownership.holds(conv.id) and not conv.running:
                    await conv.release_if_idle()  # a lease taken for an append with no agent

    # ------------------------------------------------------------------ threads

    def profile(self, name: str) -> AgentProfile:
        prof = self.settings.agents.get(name)
        if prof is None:
            raise NotFound(f"no agent profile named {name!r}", code="agent_not_found")
        return prof

    async def models(self, name: str, *, owner: str | None) -> dict[str, Any]:
        """The models a profile's threads may run (config_options.agent_models): an ACP
        agent's as it advertised them on the newest of ``owner``'s threads of it (anyone's
        with None) that reported them, among the 50 most recently active; the profile's own."""
        prof = self.profile(name)
        # Only an ACP agent's threads hold config options; the others' rows add nothing.
        rows, _ = await self.list_threads(limit=50, cursor=None, agent=name, owner=owner, archived=None)
        return agent_models(prof.model, prof.models or (), rows)

    async def _check_capacity(self, conv: Conversation) -> None:
        self._refuse_if_draining()  # no agent starts after SIGTERM
        others = [c for c in self._convs.values() if (c.running or c.starting) and c is not conv]
        if len(others) >= self.settings.server.max_conversations:
            raise Capacity(f"{len(others)} agents are running (max_conversations); stop one or retry later")
        self._check_user_capacity(conv, others)
        await self.memory.admit(conv)  # the memory budget: may stop idle agents (sessions/memory_guard.py)

    def _check_user_capacity(self, conv: Conversation, others: list[Conversation]) -> None:
        """[auth] max_conversations_per_user: the thread's owner's other running agents."""
        owner, cap = conv.thread.get("owner"), self.settings.auth.max_conversations_per_user
        if owner is None or cap is None:
            return
        mine = sum(1 for c in others if c.thread.get("owner") == owner)
        if mine >= cap:
            raise Busy(
                f"{mine} of your agents are running (max_conversations_per_user); stop one or retry later",
                code="user_conversation_limit",
            )

    def _fresh_workspace(self, tid: str, prof: AgentProfile) -> None:
        """Make the directory of a thread created without a cwd, once the thread is accepted;
        the bundled demo's holds a few sample files, so that its "list files" shows something."""
        path = self.settings.data_dir / "workspaces" / tid
        path.mkdir(parents=True, exist_ok=True)
        if prof.builtin and prof.name == DEMO_PROFILE:
            write_demo_samples(path)

    async def create(
        self,
        *,
        agent: str | None,
        cwd: str | None,
        model: str | None,
        title: str | None,
        options: dict[str, Any] | None,
        native_session_id: str | None = None,
        owner: str | None = None,
        admin: bool = False,
        fork: Fork | None = None,
        worktree: bool = False,
        base: str | None = None,
    ) -> Conversation:
        self._refuse_if_draining()
        name = agent or self.settings.default_profile()
        prof = self.profile(name)
        self.settings.check_runnable(name)  # a launch rule its own settings break (docs/api.md §1.5)
        options = dict(options or {})
        unknown = set(options) - THREAD_OPTION_KEYS
        if unknown:
            raise InvalidRequest(f"unknown options: {', '.join(sorted(unknown))}", code="unknown_option")
        try:
            AgentProfile.model_validate({**prof.model_dump(), **options})
        except ValueError as exc:
            raise InvalidRequest(f"invalid options: {exc}", code="invalid_option") from exc
        tid = new_id("thr")
        fresh = cwd is None
        if cwd is None:
            cwd = str(self.settings.data_dir / "workspaces" / tid)  # made once the thread is accepted
        else:  # kept as its real path: what was checked is where the agent runs (bridge/userdirs.py)
            cwd = await self.allowed_cwd(cwd, owner=owner, admin=admin)
        source_wt = fork.worktree if fork is not None else None
        planned = await self._plan_worktree(tid, None if fresh else cwd, worktree, base, owner, admin, source_wt)
        cwd = planned.cwd if planned is not None else cwd
        # Every launch rule that depends on the profile and this thread: one that could
        # never be spawned is refused now, not at its first prompt. Its codec starts the
        # thread's first process (bridge/launching.py).
        launch = ThreadLaunch.checked(
            prof,
            spawn_options(prof, options, THREAD_OPTION_KEYS),
            cwd=cwd,
            model=model,
            native_session_id=native_session_id,
        )
        ts = now_iso()
        row: ThreadRow = {
            "id": tid,
            "agent": name,
            "protocol": prof.protocol,
            "model": model or prof.model,
            "cwd": cwd,
            "title": title or "",
            "native_session_id": native_session_id,  # adopted: its first start resumes it
            "state": "idle",
            "turn_active": False,
            "last_seq": 0,
            "created_at": ts,
            "updated_at": ts,
            "last_exit": None,
            "options": options,
            "pid": None,
            "pending_permissions": 0,
            "owner": owner,  # the creating user (users mode); None in token mode
        }
        if fork is not None:
            row["forked_from"], row["agent_info"] = fork.fields()
        # 429 thread_limit: no row, no directory; its own worktree made last, removed on a failure
        async with self.caps.room_for_thread(owner), worktree_ops.made(planned) as made:
            row["worktree"] = made
            if fresh:
                self._fresh_workspace(tid, prof)
            await self.store.create_thread(row)
            if fork is not None:  # before anything can load the thread (sessions/fork.py)
                row["last_seq"] = await self._copied(fork, tid)
        conv = self._make(row)
        conv.launch = launch
        log.info("thread.created", thread_id=tid, agent=name)
        return conv

    async def _copied(self, fork: Fork, tid: str) -> int:
        """A fork's transcript copied; a copy that fails takes the half-made fork with it."""
        try:
            return await fork.copy(self.store, tid)
        except BaseException:
            with contextlib.suppress(Exception):
                await self.store.delete_thread(tid)
            raise

    async def fork(
        self, source: Conversation, point: Mapping[str, Any], *, title: str | None, owner: str | None, admin: bool
    ) -> Conversation:
        """A new thread forked from ``source`` at ``point`` (the ForkPoint command's answer):
        the same agent, cwd, model and options, owned by the caller, its transcript the
        source's up to ``point["seq"]`` (docs/api.md §4.26). A source with its own worktree
        gives the fork one of its own, from the source's branch (409 ``worktree_discarded``
        when the source's was discarded: there is nothing to make it from)."""
        thread = source.thread
        wt = worktree_rules.from_json(thread.get("worktree"))
        if wt is not None and wt.discarded:
            raise Conflict(
                "the source's worktree was discarded: a fork has nothing to start from", code="worktree_discarded"
            )
        return await self.create(
            agent=thread["agent"],
            cwd=thread["cwd"],
            model=thread.get("model"),
            title=thread.get("title") if title is None else title,
            options=thread.get("options"),
            native_session_id=point["session"],
            owner=owner,
            admin=admin,
            fork=Fork(source.id, point["seq"], point["session"], point["at"], thread.get("agent_info"), wt),
        )

    async def _plan_worktree(
        self,
        tid: str,
        cwd: str | None,
        wanted: bool,
        base: str | None,
        owner: str | None,
        admin: bool,
        source: worktree_rules.Worktree | None = None,
    ) -> worktree_ops.Planned | None:
        """A thread's own git worktree (docs/api.md §4.27), checked, in its workspace; a
        fork's (``source``: its source's worktree) from the source's branch."""

        async def allowed(path: str) -> str:
            return await self.allowed_cwd(path, owner=owner, admin=admin)

        path = os.path.realpath(self.settings.data_dir / "workspaces" / tid)
        if source is not None and cwd is not None:
            return await worktree_ops.plan_fork(source, tid, path, cwd, allowed)
        if not wanted:
            if base is not None:
                raise InvalidRequest("base goes with worktree: true", code="invalid_request")
            return None
        if cwd is None:
            raise InvalidRequest("a worktree needs a cwd inside a git repository", code="not_a_git_repository")
        return await worktree_ops.plan(cwd, base, tid, path, allowed)

    async def allowed_cwd(self, cwd: str, *, owner: str | None, admin: bool) -> str:
        """The real path of ``cwd`` if a caller whose threads record ``owner`` may run an
        agent there (bridge/userdirs.py); raises ``bad_cwd`` or ``cwd_not_allowed``."""

        async def thread_owner(tid: str) -> tuple[bool, str | None]:
            row = await self.store.get_thread(tid)
            return (False, None) if row is None else (True, row.get("owner"))

        return await check_cwd(self.settings, cwd, owner=owner, admin=admin, thread_owner=thread_owner)

    def _make(self, row: ThreadRow) -> Conversation:
        conv = Conversation(
            row,
            self.settings.agents.get(row["agent"]),
            self.settings,
            self.store,
            can_start=self._check_capacity,
            spawn=self._spawn if self.fenced is None else self.fenced.for_thread(row["id"]),
            ownership=self.ownership,
            on_lost=self._conv_lost,
            commits=self.commits,
            caps=self.caps,
        )
        conv.journal.on_committed = self.on_committed
        if self.on_records is not None:
            conv.journal.announcer = Also(conv.journal.announcer, conv.thread, self.on_records)
        self._convs[row["id"]] = conv
        return conv

    def loaded(self, thread_id: str) -> Conversation | None:
        return self._convs.get(thread_id)

    def followed(self) -> list[Conversation]:
        """Loaded threads this replica does not run, that a client here watches or used
        lately: what another replica commits to them is read from the store."""
        now = time.monotonic()
        return [
            c
            for c in self._convs.values()
            if not c.running and (len(c.fanout) or now - max(c.last_activity, c.last_watched) < FOLLOW_RECENT_S)
        ]

    async def get(self, thread_id: str) -> Conversation:
        conv = self._convs.get(thread_id)
        if conv is not None:
            return conv
        async with self._lock:
            conv = self._convs.get(thread_id)
            if conv is not None:
                return conv
            row = await self.store.get_thread(thread_id)
            if row is None:
                raise NotFound(f"no thread {thread_id}", code="thread_not_found")
            return self._make(row)

    async def delete(self, thread_id: str, *, forward: bool = True) -> None:
        conv = await self.get(thread_id)
        if forward and self.holders is not None and not conv.running:
            holder = await self.holders.elsewhere(thread_id)
            if holder is not None:  # its agent runs there: stopped there, before the row goes
                with contextlib.suppress(HolderGone):  # it died meanwhile: nothing runs there now
                    await self.holders.forward(holder, "stop", thread_id, {"reason": "deleted"})
        await conv.close("deleted")
        await worktree_ops.on_delete(conv.thread.get("worktree"), thread_id)  # its branch stays
        await self.store.delete_thread(thread_id)
        self._convs.pop(thread_id, None)
        if self.ownership is not None:
            self.ownership.forget(thread_id)  # the lease went with the row
        log.info("thread.deleted", thread_id=thread_id)

    async def close_clients(self, reason: str) -> None:
        """Disconnect every WebSocket/SSE subscriber (daemon shutdown) and wait until their
        handlers have let go (each unsubscribes once its close frame is out)."""
        convs = list(self._convs.values())
        for conv in convs:
            conv.fanout.close_all(reason)
        self.changes.close(reason)
        await asyncio.gather(*(conv.fanout.wait_empty() for conv in convs), self.changes.wait_empty())

    def live_count(self) -> int:
        return sum(1 for c in self._convs.values() if c.running)

    def subscriber_count(self) -> int:
        return sum(len(c.fanout) for c in self._convs.values()) + len(self.changes)

    def loaded_count(self) -> int:
        return len(self._convs)

    def current(self, row: ThreadRow) -> ThreadRow:
        """A listed row, or the live copy when the thread is loaded."""
        conv = self._convs.get(row["id"])
        return conv.thread if conv is not None else row

    async def list_threads(
        self, *, limit: int, cursor: str | None, agent: str | None, owner: str | None, archived: bool | None = False
    ) -> tuple[list[ThreadRow], str | None]:
        """One page of threads, newest activity first, each as it is now (:meth:`current`):
        for a surface that lists threads without reaching into the store. Archived threads
        only when asked for (``archived``: base.ThreadStore.list_threads)."""
        rows, next_cursor = await self.store.list_threads(
            limit=limit, cursor=cursor, agent=agent, owner=owner, archived=archived
        )
        return [self.current(row) for row in rows], next_cursor
