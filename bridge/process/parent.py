"""Sidecar mode (``serve --parent-pid PID``, docs/desktop.md): the daemon follows the
process that owns it.

:class:`ParentWatch` calls back once ``PID`` has exited. On Linux it waits on a pidfd
(``pidfd_open``), which refers to that very process, so a recycled pid can never be
mistaken for the parent, and costs nothing while it waits; elsewhere (or where pidfds are
refused, as in some sandboxes) it polls every :data:`POLL_S` seconds.

:func:`quiet_broken_stdio`: a shell that dies usually took the read ends of the daemon's
stdout and stderr with it; a write there would fail with EPIPE in the middle of the
graceful shutdown. A standard stream whose pipe has no reader left is pointed at
``/dev/null`` first, so the shutdown runs to its end (agents stopped, the transcript
flushed). A stream that still has a reader (a log collector) is left alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
from collections.abc import Callable
from pathlib import Path

import structlog

log = structlog.get_logger("bridge.process")

POLL_S = 0.5


def alive(pid: int) -> bool:
    """``pid`` is a live process (not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


class ParentWatch:
    def __init__(self, pid: int, on_exit: Callable[[], None]) -> None:
        self.pid = pid
        self._on_exit = on_exit
        self._pidfd: int | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fired = False

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # no pidfd here (or the parent is already gone)
            self._pidfd = None
        if self._pidfd is not None:
            self._loop.add_reader(self._pidfd, self._fire)
            log.info("parent.watching", pid=self.pid, how="pidfd")
        else:
            log.info("parent.watching", pid=self.pid, how="poll", interval_s=POLL_S)
            self._poll()

    def _poll(self) -> None:
        if not alive(self.pid):
            self._fire()
            return
        assert self._loop is not None
        self._timer = self._loop.call_later(POLL_S, self._poll)

    def _fire(self) -> None:
        if self._fired:
            return
        self._fired = True
        self.close()
        self._on_exit()  # first: it may have to quiet a broken stderr before anything logs

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pidfd is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._pidfd)
            with contextlib.suppress(OSError):
                os.close(self._pidfd)
            self._pidfd = None


def quiet_broken_stdio(fds: tuple[int, ...] = (1, 2)) -> list[int]:
    """Point each of ``fds`` that is a pipe with no reader left at /dev/null; returns
    those it changed."""
    changed = []
    for fd in fds:
        if _reader_gone(fd):
            null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.dup2(null, fd)
                changed.append(fd)
            finally:
                os.close(null)
    return changed


def _reader_gone(fd: int) -> bool:
    # Linux reports POLLERR on the write end of a pipe (and POLLHUP on a socket) whose
    # every reader has gone.
    try:
        p = select.poll()
        p.register(fd, select.POLLOUT)
        events = p.poll(0)
    except (OSError, ValueError):
        return False
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in events)
