"""How much memory the agents take, and how much they may take (issue #36; docs/api.md
"Capacity").

* An agent's memory is the resident set (RSS) of its whole process tree: the process the
  daemon spawned (bubblewrap, when the agent is sandboxed), everything below it, and the
  descendants that left its process group. The agent tracker (process/subreaper.py)
  already walks that tree once a second; :func:`tree_rss` adds one read of
  ``/proc/<pid>/statm`` per process it found.
* The budget for all agents together: ``[capacity] memory_budget_mb``; ``auto`` is 80% of
  what this daemon may use: the host's memory, or its cgroup v2 ``memory.max`` when that
  is lower (a container, a systemd unit with ``MemoryMax=``).

Sums shared pages (the interpreter's code, a page cache mapping) once per process, as
``ps`` does: an over-estimate on the safe side.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

MIB = 1024 * 1024
AUTO_SHARE = 0.8  # "auto": what the agents may take of the daemon's memory
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_rss(pid: int) -> int:
    """Bytes resident for ``pid`` now (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def tree_rss(pids: Iterable[int]) -> int:
    """Bytes resident for all of ``pids`` together."""
    return sum(process_rss(pid) for pid in pids)


def host_total_mb(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """MemTotal of the host, in MiB (None where it cannot be read)."""
    try:
        for line in meminfo.read_text(encoding="ascii", errors="replace").splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, IndexError, ValueError):
        return None
    return None


def own_cgroup(self_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> Path | None:
    """This process's cgroup v2 directory (the ``0::/path`` line), if the unified
    hierarchy is mounted at ``root``; None on cgroup v1 or without /proc."""
    try:
        lines = self_cgroup.read_text(encoding="ascii", errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            path = root / line[3:].strip().lstrip("/")
            if (path / "cgroup.controllers").exists():
                return path
            # A container that sees the host's path but has its own cgroup mounted at the
            # root (no cgroup namespace): the root is this process's cgroup.
            return root if (root / "memory.max").exists() else None
    return None


def cgroup_limit_mb(cgroup: Path | None) -> int | None:
    """The lowest ``memory.max`` from ``cgroup`` up to the root, in MiB (None: "max"
    everywhere, or no cgroup v2): a parent's limit binds its children too."""
    best: int | None = None
    path = cgroup
    while path is not None:
        try:
            text = (path / "memory.max").read_text(encoding="ascii").strip()
        except OSError:
            text = "max"
        if text != "max":
            try:
                mb = int(text) // MIB
            except ValueError:
                mb = None
            if mb is not None and (best is None or mb < best):
                best = mb
        path = path.parent if path.parent != path and (path.parent / "cgroup.controllers").exists() else None
    return best


def budget_mb(
    setting: int | str,
    *,
    meminfo: Path = Path("/proc/meminfo"),
    self_cgroup: Path = Path("/proc/self/cgroup"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
) -> int | None:
    """The budget in MiB for ``[capacity] memory_budget_mb``: None when it is off (0, or
    ``auto`` where nothing tells the host's memory)."""
    if setting == 0:
        return None
    if isinstance(setting, int):
        return setting
    sizes = [mb for mb in (host_total_mb(meminfo), cgroup_limit_mb(own_cgroup(self_cgroup, cgroup_root))) if mb]
    return int(min(sizes) * AUTO_SHARE) if sizes else None
