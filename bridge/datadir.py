"""The data directory: private to the daemon's user, and held by one daemon at a time.

* :func:`make_private` sets the daemon's umask to 077, so everything it creates (the data
  dir, ``bridge.db`` and its ``-wal``/``-shm``, workspaces, the token, the lock) is 0700 /
  0600 whatever umask it was started with, and tightens what an older version left wider.
  Agents are spawned with the umask the daemon was started with (process/umask.py): they
  work on the operator's files, and those keep the operator's usual modes.
* :func:`lock` takes an exclusive ``flock`` on ``<data-dir>/daemon.lock`` and writes the
  daemon's pid into it. A second daemon on the same data dir is refused, naming the pid
  that holds it; a lock left by a daemon that died is free again (the kernel drops a
  ``flock`` with its last descriptor), so the next daemon simply takes it over. The lock is
  taken before the store is opened and before the start-up reaper runs, so a daemon never
  touches the processes of another live one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from pathlib import Path

import structlog

from bridge.errors import BridgeError
from bridge.process.umask import make_private as _private_umask

log = structlog.get_logger("bridge.datadir")

LOCK_NAME = "daemon.lock"
# What the daemon itself creates or owns in the data dir, tightened at start.
PRIVATE_DIRS = ("workspaces", "homes")
PRIVATE_FILES = ("bridge.db", "bridge.db-wal", "bridge.db-shm", "token", LOCK_NAME, "daemon.json", "vapid.pem")


class DataDirLocked(BridgeError):
    code = "data_dir_locked"
    status = 409


def make_private(data_dir: Path) -> None:
    """umask 077 for the daemon; the data dir created 0700 (or tightened), and the files
    and directories the daemon owns there tightened to 0600 / 0700."""
    _private_umask()
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise BridgeError(f"cannot create data dir {data_dir}: {exc.strerror}", code="data_dir_unusable") from exc
    # The data dir itself may be given as a symlink (the operator's choice): its target is
    # tightened. Nothing inside it is ever followed.
    _tighten(data_dir.resolve(), 0o700, want_dir=True)
    for name in PRIVATE_DIRS:
        _tighten(data_dir / name, 0o700, want_dir=True)
    for name in PRIVATE_FILES:
        _tighten(data_dir / name, 0o600, want_dir=False)


def _tighten(path: Path, mode: int, *, want_dir: bool) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        log.warning("datadir.cannot_inspect", path=str(path), error=exc.strerror)
        return
    if stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode) != want_dir:
        return  # not ours to change: a symlink (never followed) or something unexpected
    if stat.S_IMODE(st.st_mode) & ~mode:
        try:
            os.chmod(path, stat.S_IMODE(st.st_mode) & mode)
            log.info("datadir.tightened", path=str(path), mode=oct(stat.S_IMODE(st.st_mode) & mode))
        except OSError as exc:
            log.warning("datadir.cannot_tighten", path=str(path), error=exc.strerror)


def holder_pid(data_dir: Path) -> int | None:
    """The pid written in the lock file (the holder's, or a dead daemon's), if any."""
    try:
        text = (data_dir / LOCK_NAME).read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def lock(data_dir: Path) -> int:
    """Hold ``<data-dir>/daemon.lock`` for the life of this process; returns its
    descriptor (close it, or exit, to release). Raises DataDirLocked naming the holder."""
    path = data_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise BridgeError(f"cannot open lock file {path}: {exc.strerror}", code="data_dir_unusable") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        pid = holder_pid(data_dir)
        who = f"pid {pid}" if pid is not None else "a process whose pid is not recorded"
        raise DataDirLocked(
            f"data dir {data_dir} is in use by another agent-bridge daemon ({who}); "
            "stop it, or give this one another --data-dir"
        ) from None
    previous = holder_pid(data_dir)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as exc:
        os.close(fd)
        raise BridgeError(f"cannot write lock file {path}: {exc.strerror}", code="data_dir_unusable") from exc
    if previous is not None and previous != os.getpid():
        log.info("datadir.stale_lock_taken_over", previous_pid=previous)
    return fd


def unlock(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
