"""The fence watchdog process: ``python -m bridge.process.fence_watchdog FD``.

A daemon on a shared store runs a thread's agent only while it holds the thread's lease,
and stops the agent itself before the lease can expire (bridge/sessions/ownership.py). A
daemon that is frozen (SIGSTOP, a stalled event loop) cannot: its agents are other
processes and keep running. This process, started by the daemon (bridge/process/fence.py)
in a session of its own, kills them for it.

The daemon sends, on the socket at ``FD``, one JSON object a line:

* ``{"t": THREAD, "pgid": G, "start": S, "kill_at": T, "escaped": [[PID, START], ...]}`` —
  the agent of THREAD leads process group G (its leader started at S, in clock ticks since
  boot, ``/proc/<pid>/stat`` field 22) and must be dead by T (seconds on CLOCK_MONOTONIC,
  the clock both processes read); ESCAPED are its descendants that left the group. A new
  line for THREAD replaces the last one (a renewed lease moves T forward);
* ``{"t": THREAD}`` — forget it (the agent exited).

When T passes with no newer line, the group and every descendant are SIGKILLed (each
checked against its start time first, so a recycled pid is never touched), one line is
written to stderr, and THREAD is forgotten. At end of file (the daemon exited or died: the
kernel closes its end) whatever is still listed is killed the same way, and this process
exits. It kills nothing it was not told about, never the daemon or itself.

Standard library only, and nothing of the daemon's but bridge/process/reaper.py (itself
standard library only): it starts in tens of milliseconds and shares no state with the
daemon. SIGINT and SIGTERM are ignored (a terminal's Ctrl-C or a service manager's stop
reaches the daemon, whose exit is this process's end of file).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bridge.process.reaper import children, reap_group, start_time

READ_BYTES = 65536
MAX_LINE = 1 << 20  # a line longer than this is dropped: the daemon never sends one
MAX_WAIT_S = 60.0  # select() is re-armed at least this often (nothing depends on it)


@dataclass(slots=True)
class Agent:
    pgid: int
    start: int
    kill_at: float
    escaped: list[tuple[int, int]] = field(default_factory=list)


def _int(value: Any, least: int) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= least
    return value if ok else None


def _escaped(items: Any) -> list[tuple[int, int]]:
    out = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, list) and len(item) == 2:
            pid, start = _int(item[0], 2), _int(item[1], 0)
            if pid is not None and start is not None:
                out.append((pid, start))
    return out


def parse(line: bytes) -> tuple[str, Agent | None] | None:
    """A line from the daemon: (thread, its agent) to arm, (thread, None) to forget, None
    for anything malformed (ignored: a bad line must never kill)."""
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    if not isinstance(msg, dict) or not isinstance(thread := msg.get("t"), str):
        return None
    if set(msg) == {"t"}:
        return thread, None
    pgid, start, kill_at = _int(msg.get("pgid"), 2), _int(msg.get("start"), 0), msg.get("kill_at")
    if pgid is None or start is None or not isinstance(kill_at, (int, float)) or isinstance(kill_at, bool):
        return None
    return thread, Agent(pgid, start, float(kill_at), _escaped(msg.get("escaped")))


def descendants(pid: int, started: int) -> dict[int, int]:
    """Every live descendant of ``pid`` (if it is still the process that started at
    ``started``), whatever its group or session: pid → start time."""
    if start_time(pid) != started:
        return {}
    found: dict[int, int] = {}
    todo = children(pid)
    while todo:
        child = todo.pop()
        st = start_time(child)
        if child in found or st is None:
            continue
        found[child] = st
        todo += children(child)
    return found


class Watchdog:
    def __init__(self, sock: socket.socket, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.sock = sock
        self.clock = clock
        self.agents: dict[str, Agent] = {}
        self._buf = b""
        # Never signalled, whatever a line says: this process, the daemon, their groups.
        self._spared = {os.getpid(), os.getppid()}
        self._spared_groups = {os.getpgid(0)} | ({os.getpgid(os.getppid())} if os.getppid() > 1 else set())

    def feed(self, data: bytes) -> None:
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        if len(self._buf) > MAX_LINE:
            self._buf = b""
        for line in lines:
            got = parse(line)
            if got is None:
                continue
            thread, agent = got
            if agent is None:
                self.agents.pop(thread, None)
            elif agent.pgid not in self._spared_groups and agent.pgid not in self._spared:
                self.agents[thread] = agent

    def kill(self, thread: str, agent: Agent, why: str) -> list[int]:
        """SIGKILL the agent's group and its descendants, each checked by start time."""
        targets = dict(agent.escaped)
        targets.update(descendants(agent.pgid, agent.start))
        killed = reap_group(agent.pgid, agent.start)
        for pid, started in targets.items():
            if pid in self._spared or pid in killed or start_time(pid) != started:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except (ProcessLookupError, PermissionError):
                continue
        late = self.clock() - agent.kill_at
        _report(thread=thread, pids=sorted(killed), why=why, late_s=round(late, 4))
        return killed

    def expire(self) -> float | None:
        """Kill every agent past its deadline; seconds until the next one (None: none)."""
        now = self.clock()
        for thread, agent in list(self.agents.items()):
            if agent.kill_at <= now:
                del self.agents[thread]
                self.kill(thread, agent, "deadline")
        if not self.agents:
            return None
        return max(0.0, min(a.kill_at for a in self.agents.values()) - self.clock())

    def run(self) -> None:
        while True:
            wait = self.expire()
            ready, _, _ = select.select([self.sock], [], [], MAX_WAIT_S if wait is None else min(wait, MAX_WAIT_S))
            if not ready:
                continue
            try:
                data = self.sock.recv(READ_BYTES)
            except InterruptedError:
                continue
            except OSError:
                data = b""
            if not data:  # the daemon is gone: nothing it ran may outlive it
                for thread, agent in list(self.agents.items()):
                    self.kill(thread, agent, "daemon_gone")
                return
            self.feed(data)


def _report(**fields: Any) -> None:
    """One JSON line on stderr (the daemon's): written at once, even while the daemon is
    frozen, which is when this happens."""
    line = {"event": "fence.agent_killed", "level": "warning", "logger": "bridge.fence", **fields}
    line["timestamp"] = datetime.now(UTC).isoformat()
    try:
        sys.stderr.write(json.dumps(line) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=int(argv[1]))
    Watchdog(sock).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
