"""Every descendant of an agent is found and stopped, even one that left the agent's process
group with ``setsid()`` (issue #15 item 10).

* ``agent-bridge serve`` makes the daemon a child subreaper (Linux
  ``PR_SET_CHILD_SUBREAPER``, :func:`install`): a process whose parent dies is reparented
  to the daemon instead of to init, so nothing an agent started can slip out of the
  daemon's process tree.
* Each live agent's descendants are found by walking ``/proc/<pid>/task/*/children`` from
  the agent (whatever their process group or session), once a second and whenever the
  agent is signalled; those outside the agent's group ("escaped") are signalled with it, so
  the stop ladder (shutdown line → SIGTERM → SIGKILL) reaches them too. An orphan
  reparented to the daemon is attributed to the agent it was seen under, or whose session
  or group it is in; one that cannot be attributed is killed once no agent runs.
  Orphans that die are reaped by the daemon (only zombies it never spawned: an agent's own
  exit status stays with asyncio).
* Every live agent group and every escaped descendant is recorded, with its start time, in
  ``<data-dir>/agents.json``; the next daemon kills what is left of them (:func:`reap_recorded`)
  after taking the data dir lock, checking start times so that a recycled pid is never
  touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import structlog

from bridge.process.memory import tree_rss
from bridge.process.reaper import children, reap_group

log = structlog.get_logger("bridge.process")

_PR_SET_CHILD_SUBREAPER = 36
RECORD_NAME = "agents.json"
TRACK_INTERVAL_S = 1.0


class Tracked(Protocol):
    """What the tracker needs of an AgentProcess."""

    pid: int
    pgid: int
    start_time: int | None


@dataclass(slots=True)
class _Proc:
    ppid: int
    pgid: int
    sid: int
    start: int
    zombie: bool


@dataclass(slots=True)
class _Agent:
    proc: Tracked
    seen: dict[int, int] = field(default_factory=dict)  # every descendant seen: pid → start
    escaped: dict[int, int] = field(default_factory=dict)  # those outside the agent's group
    rss: int | None = None  # bytes resident in the whole tree at the last tick (None: not sampled yet)
    peak: int = 0  # the most seen at any tick


def _stat(pid: int) -> _Proc | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state); ppid 4, pgrp 5, session 6, starttime 22.
    try:
        return _Proc(int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]), fields[0] in ("Z", "X"))
    except (IndexError, ValueError):
        return None


def _walk(roots: list[int]) -> dict[int, _Proc]:
    """Every live descendant of ``roots`` (the roots included), by pid."""
    found: dict[int, _Proc] = {}
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        st = _stat(pid)
        if st is None:
            continue
        found[pid] = st
        todo += children(pid)
    return found


def _kill(pid: int, start: int, sig: int) -> bool:
    """Signal ``pid`` only if it is still the process that started at ``start``."""
    st = _stat(pid)
    if st is None or st.start != start:
        return False
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class Tracker:
    def __init__(self) -> None:
        self._agents: dict[int, _Agent] = {}
        self._unowned: dict[int, int] = {}  # orphans nobody could be attributed: pid → start
        self._record: Path | None = None
        self._written: object = None
        self.subreaper = False
        self.spawning = 0  # spawns in flight: their child is the daemon's but not registered yet
        self._spared: set[int] = set()  # the daemon's own helpers (the store's writer process)
        self._task: asyncio.Task[None] | None = None
        # The periodic walk runs in a worker thread (it reads /proc: ~0.5 ms per agent), the
        # rest on the event loop; everything that reads or changes the tables holds this.
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ set-up

    def install(self, data_dir: Path | None) -> bool:
        """Become a child subreaper (Linux) and record tracked processes in ``data_dir``."""
        self._record = data_dir / RECORD_NAME if data_dir is not None else None
        self.subreaper = _set_subreaper()
        if not self.subreaper:
            log.warning("subreaper.unavailable", platform=sys.platform)
        return self.subreaper

    def spawn_started(self) -> None:
        with self._lock:
            self.spawning += 1

    def spawn_ended(self, proc: Tracked | None) -> None:
        """The spawn is over: its child (if any) is registered in the same step, so the
        orphan sweep can never take a just-spawned agent's exit status."""
        with self._lock:
            self.spawning -= 1
            if proc is not None:
                self.register(proc)

    def spared(self, pid: int | None) -> None:
        """A helper's spawn is over (``spawn_started`` before it): its child is the daemon's
        own (the SQLite writer process), never an orphan to sweep; it reaps it itself."""
        with self._lock:
            self.spawning -= 1
            if pid is not None:
                self._spared.add(pid)

    def unspared(self, pid: int) -> None:
        with self._lock:
            self._spared.discard(pid)

    def register(self, proc: Tracked) -> None:
        with self._lock:
            self._agents[proc.pid] = _Agent(proc)
            self._save()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no running loop: tracked when signalled only
            return
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._run(), name="agent-tracker")

    def unregister(self, proc: Tracked) -> None:
        with self._lock:
            agent = self._agents.get(proc.pid)
            if agent is not None and agent.proc is proc:
                del self._agents[proc.pid]
            if not self._agents:
                self._sweep_orphans(kill_unowned=True)
            self._save()

    def escaped(self, proc: Tracked) -> dict[int, int]:
        with self._lock:
            agent = self._agents.get(proc.pid)
            return dict(agent.escaped) if agent is not None else {}

    # ------------------------------------------------------------------ tracking

    def refresh(self, proc: Tracked) -> None:
        with self._lock:
            agent = self._agents.get(proc.pid)
            if agent is None or agent.proc is not proc:
                return
            self._refresh(agent)
            self._sweep_orphans(kill_unowned=False)
            self._save()

    def _refresh(self, agent: _Agent) -> None:
        proc = agent.proc
        leader = _stat(proc.pid)
        live: dict[int, _Proc] = {}
        if leader is not None and leader.start == proc.start_time and not leader.zombie:
            live = _walk([proc.pid])
            live.pop(proc.pid, None)
        # Those seen before and reparented since (to the daemon, or to init) are still
        # this agent's, as long as they are the same processes.
        for pid, start in list(agent.seen.items()):
            if pid not in live:
                st = _stat(pid)
                if st is None or st.start != start or st.zombie:
                    agent.seen.pop(pid, None)
                    agent.escaped.pop(pid, None)
                else:
                    live.update({p: s for p, s in _walk([pid]).items() if p not in live})
        self._adopt(agent, live)

    def _adopt(self, agent: _Agent, procs: dict[int, _Proc]) -> None:
        for pid, st in procs.items():
            if st.zombie:
                continue
            agent.seen[pid] = st.start
            if st.pgid != agent.proc.pgid:
                agent.escaped[pid] = st.start
            else:
                agent.escaped.pop(pid, None)

    def _sweep_orphans(self, *, kill_unowned: bool) -> None:
        """The daemon's children that are not agents: reap the dead, attribute the living."""
        if not self.subreaper:
            return
        agents = {a.proc.pid for a in self._agents.values()}
        for pid in children(os.getpid()):
            if pid not in agents and pid not in self._spared:
                self._sweep_child(pid)
        self._sweep_unowned(kill_unowned=kill_unowned)

    def _sweep_child(self, pid: int) -> None:
        st = _stat(pid)
        if st is None:
            return
        if st.zombie:
            if self.spawning == 0:  # never a just-forked agent's exit status
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)
            self._unowned.pop(pid, None)
            return
        if self.spawning:
            return  # may be an agent being spawned right now
        tree = _walk([pid])
        owner = next(
            (
                a
                for a in self._agents.values()
                if a.seen.get(pid) == st.start or st.sid == a.proc.pid or st.pgid == a.proc.pgid
            ),
            None,
        )
        if owner is not None:
            self._adopt(owner, tree)
            self._unowned.pop(pid, None)
            return
        for p, s in tree.items():
            if not s.zombie:
                self._unowned[p] = s.start

    def _sweep_unowned(self, *, kill_unowned: bool) -> None:
        for pid, start in list(self._unowned.items()):
            st = _stat(pid)
            if st is None or st.start != start or st.zombie:
                self._unowned.pop(pid, None)
            elif kill_unowned and self.spawning == 0:
                if _kill(pid, start, signal.SIGKILL):
                    log.warning("agent.orphan_killed", pid=pid)
                self._unowned.pop(pid, None)

    def signal_escaped(self, proc: Tracked, sig: int) -> list[int]:
        """Signal every descendant of ``proc`` that left its process group; their pids."""
        with self._lock:
            agent = self._agents.get(proc.pid)
            if agent is None or agent.proc is not proc:
                return []
            self._refresh(agent)
            self._sweep_orphans(kill_unowned=False)
            hit = [pid for pid, start in list(agent.escaped.items()) if _kill(pid, start, sig)]
            self._save()
        if hit:
            log.info("agent.escaped_signalled", pid=proc.pid, signal=signal.Signals(sig).name, pids=hit)
        return hit

    def memory(self, pid: int) -> tuple[int | None, int]:
        """(bytes resident in the tree of the agent ``pid`` at the last tick, or None before
        the first; the peak seen): its leader, every descendant, the escaped ones included.
        Read without the lock, which the walk holds for a while in its thread: a dict look-up
        and two attributes are each read whole, and a sample a tick old is as good."""
        agent = self._agents.get(pid)
        return (None, 0) if agent is None else (agent.rss, agent.peak)

    def _tick(self) -> bool:
        with self._lock:
            for agent in list(self._agents.values()):
                self._refresh(agent)
                # One statm read per process the walk just found (process/memory.py).
                agent.rss = tree_rss([agent.proc.pid, *agent.seen])
                agent.peak = max(agent.peak, agent.rss)
            self._sweep_orphans(kill_unowned=not self._agents)
            self._save()
            return bool(self._agents or self._unowned)

    def _last_sweep(self) -> None:
        with self._lock:
            self._sweep_orphans(kill_unowned=not self._agents)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TRACK_INTERVAL_S)
            if not await asyncio.to_thread(self._tick):
                break
        # Dead orphans reparented to us after the last agent went: reap them once more.
        await asyncio.sleep(TRACK_INTERVAL_S)
        await asyncio.to_thread(self._last_sweep)

    # ------------------------------------------------------------------ the record

    def _entries(self) -> list[dict[str, int | bool]]:
        out: list[dict[str, int | bool]] = []
        for agent in self._agents.values():
            if agent.proc.start_time is not None:
                out.append({"pid": agent.proc.pgid, "start": agent.proc.start_time, "group": True})
            out += [{"pid": pid, "start": start, "group": False} for pid, start in sorted(agent.escaped.items())]
        out += [{"pid": pid, "start": start, "group": False} for pid, start in sorted(self._unowned.items())]
        return out

    def _save(self) -> None:
        if self._record is None:
            return
        entries = self._entries()
        if entries == self._written:
            return
        tmp = self._record.with_name(self._record.name + ".tmp")
        try:
            tmp.write_text(json.dumps({"daemon_pid": os.getpid(), "processes": entries}) + "\n", encoding="utf-8")
            os.replace(tmp, self._record)
        except OSError as exc:
            log.warning("agents_record.unwritable", error=exc.strerror)
            return
        self._written = entries


def _set_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def reap_recorded(data_dir: Path) -> list[int]:
    """At start (data dir lock held): SIGKILL what is left of every agent group and every
    escaped descendant a previous daemon recorded; start times are checked first."""
    path = data_dir / RECORD_NAME
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        entries = list(record.get("processes", []))
    except FileNotFoundError:
        return []
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        log.warning("agents_record.unreadable", path=str(path), error=str(exc))
        entries = []
    killed: list[int] = []
    for e in entries:
        try:
            pid, start, group = int(e["pid"]), int(e["start"]), bool(e.get("group"))
        except (KeyError, TypeError, ValueError):
            continue
        if pid <= 1 or pid == os.getpid():
            continue
        st = _stat(pid)
        if group or (st is not None and st.pgid == pid and st.start == start):
            killed += reap_group(pid, start)
        if _kill(pid, start, signal.SIGKILL):
            killed.append(pid)
    with contextlib.suppress(OSError):
        path.unlink()
    return sorted(set(killed))


TRACKER = Tracker()
