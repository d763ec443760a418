"""What the tests see of agents' cgroups from outside the daemon (process/cgroup.py), read
straight from /proc and /sys/fs/cgroup and written here on their own terms, so a test can
hold the daemon's choice against the machine's facts.

* :func:`v1_writable` is whether a child cgroup can be made under this process's memory
  cgroup (cgroup v1): where it can, the daemon (a child of the tests, in the same cgroup)
  must choose the kernel's limit; the daemon tries cgroup v2 first, so there it may have
  chosen that instead.
* :func:`agent_cgroup` is the memory cgroup a process is in, when it is an agent's own.
* :func:`left_by` lists the agents' cgroups a daemon left behind.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _paths(pid: int | str) -> tuple[str | None, str | None]:
    """(cgroup v2 path, v1 memory path) of ``pid``."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None, None
    v2 = v1 = None
    for line in text.splitlines():
        num, _, rest = line.partition(":")
        names, _, path = rest.partition(":")
        if num == "0" and not names:
            v2 = path
        elif "memory" in names.split(","):
            v1 = path
    return v2, v1


def _dirs(pid: int | str) -> list[tuple[int, Path]]:
    """The memory cgroup directories ``pid`` is in: (version, directory)."""
    v2, v1 = _paths(pid)
    out: list[tuple[int, Path]] = []
    mount2 = ROOT if (ROOT / "cgroup.controllers").exists() else ROOT / "unified"
    if v2 is not None and (mount2 / v2.lstrip("/") / "memory.max").exists():
        out.append((2, mount2 / v2.lstrip("/")))
    if v1 is not None and (ROOT / "memory" / v1.lstrip("/") / "memory.limit_in_bytes").exists():
        out.append((1, ROOT / "memory" / v1.lstrip("/")))
    return out


def v1_writable() -> bool:
    """A child cgroup with a memory limit can be made under this process's v1 memory cgroup."""
    for version, path in _dirs("self"):
        if version != 1:
            continue
        probe = path / f"tests-probe-{os.getpid()}"
        try:
            probe.mkdir()
        except OSError:
            return False
        try:
            (probe / "memory.limit_in_bytes").write_text(str(64 * 1024 * 1024))
            return True
        except OSError:
            return False
        finally:
            probe.rmdir()
    return False


def agent_cgroup(pid: int) -> tuple[Path, int] | None:
    """The agent's own memory cgroup (its directory and memory limit in bytes), or None
    when ``pid`` is in no ``agent-`` cgroup."""
    for version, path in _dirs(pid):
        if path.name.startswith("agent-"):
            text = (path / ("memory.max" if version == 2 else "memory.limit_in_bytes")).read_text().strip()
            return path, int(text)
    return None


def left_by(daemon_pid: int) -> list[Path]:
    """Agents' cgroups daemon ``daemon_pid`` made that still exist, next to this process's
    cgroups (where the daemon, this process's child, makes them; under v2 it moved itself
    into a leaf ``daemon/`` first, so its parent is looked at too)."""
    found: list[Path] = []
    for _, path in _dirs("self"):
        for parent in {path, path.parent}:
            found += [p for p in parent.glob(f"agent-{daemon_pid}-*") if p.is_dir()]
    return sorted(set(found))
