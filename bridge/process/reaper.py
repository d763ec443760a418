"""Agents must not outlive the daemon (issue #3).

* While it runs, every agent is spawned with the parent-death signal set (Linux
  ``PR_SET_PDEATHSIG``): if the daemon dies, even by SIGKILL, the kernel kills the agent.
* What the agent itself started (tools, sub-processes) is in the agent's process group.
  The daemon records each agent's pid and its start time (``/proc/<pid>/stat`` field 22);
  on the next start it kills what is left of every group it recorded as live, after
  checking the start times so that a recycled pid is never touched.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_libc: ctypes.CDLL | None = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - no libc symbols available
        _libc = None


def child_setup() -> Callable[[], None] | None:
    """A ``preexec_fn`` that ties the child's life to this process (Linux only)."""
    libc = _libc
    if libc is None:
        return None
    parent = os.getpid()
    prctl = libc.prctl

    def setup() -> None:  # runs in the child between fork and exec: keep it minimal
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the daemon died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return setup


def _stat(pid: int) -> tuple[int, int] | None:
    """(process group, start time in clock ticks) of a live process, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = text.rsplit(")", 1)[1].split()
    # fields[0] is state (field 3); pgrp is field 5, starttime field 22.
    return int(fields[2]), int(fields[19])


def start_time(pid: int) -> int | None:
    st = _stat(pid)
    return st[1] if st else None


def children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (each thread's ``/proc/<pid>/task/<tid>/children``);
    empty once it is gone."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                out += [int(x) for x in fh.read().split()]
        except (OSError, ValueError):
            continue
    return out


def reap_group(pgid: int, started: int) -> list[int]:
    """SIGKILL every live member of the process group ``pgid`` that a daemon recorded
    with leader start time ``started``. Returns the pids killed."""
    if pgid <= 1:
        return []
    leader = _stat(pgid)
    if leader is not None and (leader[0] != pgid or leader[1] != started):
        return []  # the pid now belongs to someone else
    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = _stat(int(entry))
        # Members started no earlier than the leader we recorded: a group id is not reused
        # while any member of the old group lives.
        if st is not None and st[0] == pgid and st[1] >= started:
            try:
                os.kill(int(entry), signal.SIGKILL)
                killed.append(int(entry))
            except (ProcessLookupError, PermissionError):
                continue
    return killed
