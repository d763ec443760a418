"""The daemon's side of the fence watchdog (bridge/process/fence_watchdog.py).

On a shared store a replica may run a thread's agent only while it holds the thread's
lease; it stops the agent itself before the lease can expire (sessions/ownership.py). That
needs the daemon's event loop to run. A daemon frozen by SIGSTOP or a VM pause, or one whose
loop is stuck, cannot stop anything, while its agents — other processes — keep writing
their native session files, which the replica that takes the thread over resumes. So each
live agent is also registered with a watchdog process, with the time by which it must be
dead (CLOCK_MONOTONIC); every renewal of the lease moves that time forward. A watchdog
that hears nothing new by then kills the agent's process group and its escaped
descendants itself.

The watchdog is started with ``os.posix_spawn`` (one exec, no fork of the daemon's memory)
in a session of its own, so a signal to the daemon's process group (a terminal's Ctrl-Z)
does not stop it with the daemon. The agent tracker (process/subreaper.py) is told it is
the daemon's own helper, never an orphan to sweep. Lines go out on a socket pair; the
watchdog's end of file is the daemon's exit (it then kills what is still registered and
exits). Should the watchdog die, it is started again and told everything at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import structlog

import bridge
from bridge.process.subreaper import TRACKER, Tracked

log = structlog.get_logger("bridge.fence")

RESTART_S = 0.5  # a lost watchdog is started again after this long
CLOSE_WAIT_S = 5.0  # a watchdog told to close is killed if it has not exited by then
_ENV_KEPT = ("PATH", "LD_LIBRARY_PATH", "PYTHONHOME", "LANG", "LC_ALL")


def _spawn(child: socket.socket) -> int:
    env = {k: os.environ[k] for k in _ENV_KEPT if k in os.environ}
    root = str(Path(bridge.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    argv = [sys.executable, "-m", "bridge.process.fence_watchdog", "3"]
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, 2, 1),  # the daemon's stdout is parsed by scripts: never the watchdog's
        (os.POSIX_SPAWN_DUP2, child.fileno(), 3),
    ]
    return os.posix_spawn(sys.executable, argv, env, file_actions=actions, setsid=True)


class Fence:
    def __init__(self) -> None:
        self.pid: int | None = None
        self._sock: socket.socket | None = None
        self._pidfd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._out = bytearray()
        self._armed: dict[str, tuple[Tracked, float]] = {}  # thread → its agent, the kill time
        self._closing = False
        self._restart: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ life

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._closing = False
        self._start()

    def _start(self) -> None:
        loop = self._loop
        assert loop is not None
        ours, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        if child.fileno() == 3:  # dup2(3, 3) would keep close-on-exec
            child2 = child.dup()
            child.close()
            child = child2
        TRACKER.spawn_started()
        pid: int | None = None
        try:
            pid = _spawn(child)
        except OSError as exc:
            ours.close()
            log.error("fence.unavailable", error=exc.strerror)
            self._retry()
            return
        finally:
            child.close()
            TRACKER.spared(pid)
        self.pid, self._sock = pid, ours
        ours.setblocking(False)
        loop.add_reader(ours.fileno(), self._readable)
        with contextlib.suppress(OSError, AttributeError):
            self._pidfd = os.pidfd_open(pid)
            loop.add_reader(self._pidfd, self._reap)
        log.info("fence.started", pid=pid)
        self._out.clear()
        for thread in self._armed:  # a watchdog started again is told everything at once
            self._send_entry(thread)

    async def close(self) -> None:
        """Closed for writing: the watchdog kills whatever is still registered (nothing,
        once every agent has been stopped) and exits; it is reaped here."""
        self._closing = True
        if self._restart is not None:
            self._restart.cancel()
        pid, sock = self.pid, self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
        self._drop_socket()
        if pid is not None:
            await asyncio.to_thread(_wait, pid, CLOSE_WAIT_S)
            self._reaped(pid)

    def _drop_socket(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None and self._loop is not None:
            self._loop.remove_reader(sock.fileno())
            self._loop.remove_writer(sock.fileno())
            sock.close()
        if self._pidfd is not None and self._loop is not None:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    def _readable(self) -> None:
        """The watchdog sends nothing: readable is its end of file (it died)."""
        sock = self._sock
        if sock is None:
            return
        try:
            data = sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._lost("exited")

    def _reap(self) -> None:
        pid = self.pid
        if pid is None:
            return
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            self._reaped(pid)
            self._lost("exited")

    def _reaped(self, pid: int) -> None:
        if self.pid == pid:
            self.pid = None
        TRACKER.unspared(pid)

    def _lost(self, why: str) -> None:
        if self._closing:
            return
        pid = self.pid
        self._drop_socket()
        if pid is not None:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    self._reaped(pid)
        log.error("fence.watchdog_lost", why=why, pid=pid, armed=len(self._armed))
        self._retry()

    def _retry(self) -> None:
        if not self._closing and self._loop is not None and (self._restart is None or self._restart.cancelled()):
            self._restart = self._loop.call_later(RESTART_S, self._restarted)

    def _restarted(self) -> None:
        self._restart = None
        if not self._closing and self._sock is None:
            old = self.pid
            if old is not None:  # the lost one, still unreaped: our child, so its pid is still its own
                with contextlib.suppress(ProcessLookupError):
                    os.kill(old, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(old, 0)
                self._reaped(old)
            self._start()

    # ------------------------------------------------------------------ registrations

    def arm(self, thread: str, proc: Tracked, kill_at: float) -> None:
        """``proc`` (the agent of ``thread``, leading its own group) must be dead by
        ``kill_at`` (time.monotonic) unless :meth:`extend` moves that later."""
        if proc.start_time is None:
            return  # already gone: nothing to kill, nothing its start time could check
        self._armed[thread] = (proc, kill_at)
        self._send_entry(thread)

    def extend(self, thread: str, kill_at: float) -> None:
        armed = self._armed.get(thread)
        if armed is not None:
            self._armed[thread] = (armed[0], kill_at)
            self._send_entry(thread)

    def forget(self, thread: str, proc: object) -> None:
        armed = self._armed.get(thread)
        if armed is not None and armed[0] is proc:
            del self._armed[thread]
            self._send({"t": thread})

    def _send_entry(self, thread: str) -> None:
        proc, kill_at = self._armed[thread]
        escaped = sorted(TRACKER.escaped(proc).items())
        self._send({"t": thread, "pgid": proc.pgid, "start": proc.start_time, "kill_at": kill_at, "escaped": escaped})

    def _send(self, msg: dict[str, object]) -> None:
        sock = self._sock
        if sock is None:
            return  # told again when it is started again
        self._out += json.dumps(msg, separators=(",", ":")).encode() + b"\n"
        self._flush()

    def _flush(self) -> None:
        sock, loop = self._sock, self._loop
        if sock is None or loop is None:
            return
        try:
            sent = sock.send(self._out)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._lost("unwritable")
            return
        del self._out[:sent]
        if self._out:
            loop.add_writer(sock.fileno(), self._flush)
        else:
            loop.remove_writer(sock.fileno())


def _wait(pid: int, timeout: float) -> None:
    """Reap the watchdog (in a worker thread); killed if it has not exited in ``timeout``."""
    end = time.monotonic() + timeout
    with contextlib.suppress(ChildProcessError):
        while not os.waitpid(pid, os.WNOHANG)[0]:
            if time.monotonic() >= end:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return
            time.sleep(0.01)
