"""A profile's ``memory_limit_mb`` as a kernel limit (issue #36; docs/deploy.md "Memory").

Where this daemon may make cgroups, every agent whose profile has a ``memory_limit_mb``
runs in a cgroup of its own, ``agent-<daemon pid>-<n>``, made before it is spawned and
removed after it exits; the child joins it between fork and exec, so nothing the agent
runs (bubblewrap, its tools, descendants that left its process group) is ever outside it.
The kernel then refuses the agent more memory than its limit: past it, its OOM killer
kills inside that cgroup only. Where no cgroup can be made, the limit is what the agent
tracker's once-a-second sample of the tree enforces (sessions/memory_guard.py), and that
sample stays on as a second line where the kernel enforces it too.

Two places may hold agents' cgroups:

* cgroup v2, when the memory controller reaches the daemon's own cgroup and that cgroup
  is writable (delegated to it: systemd's ``Delegate=yes``, a container with a writable
  cgroup namespace). A v2 cgroup that hands a controller to its children may not hold
  processes itself, so what is in the daemon's cgroup first moves into a leaf ``daemon/``;
  then ``+memory`` is enabled for the children. Per agent: ``memory.max``, no swap
  (``memory.swap.max`` 0, so swapping does not dodge the limit) and ``memory.oom.group``
  (the OOM killer takes the whole agent, not one of its processes).
* cgroup v1's memory hierarchy, when the daemon's memory cgroup is writable: per agent
  ``memory.limit_in_bytes`` and, where swap is accounted, the same
  ``memory.memsw.limit_in_bytes``.

An exit after the kernel's OOM killer struck inside the agent's cgroup (v2
``memory.events``, v1 ``memory.oom_control``: ``oom_kill``) is reported as reason
``memory_limit``, not as a crash by signal 9.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger("bridge.memory")

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")
MODES = ("cgroup_v2", "cgroup_v1", "sampling")
PREFIX = "agent-"
# A cgroup is removable once its last process is gone; a SIGKILLed tree takes a moment.
# Removal is retried this often, this many times (about 5 s), then left to the next
# daemon's start, which removes what a dead daemon left.
RETRY_S = 0.1
RETRIES = 50


def _read(path: Path) -> str:
    return path.read_text(encoding="ascii", errors="replace")


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)


def parse_self_cgroup(text: str) -> tuple[str | None, str | None]:
    """(the cgroup v2 path, the v1 memory hierarchy's path) in a /proc/<pid>/cgroup text;
    None where the process has none."""
    unified = memory = None
    for line in text.splitlines():
        num, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if num == "0" and controllers == "":
            unified = path.strip()
        elif "memory" in controllers.split(","):
            memory = path.strip()
    return unified, memory


def _within_mount(mount: Path, rel: str, marker: str) -> Path | None:
    """The directory of cgroup ``rel`` under ``mount``; a container that sees the host's
    path but has its own cgroup at the mount's root (no cgroup namespace) has it there."""
    path = mount / rel.lstrip("/")
    if (path / marker).exists():
        return path
    try:
        procs = _read(mount / "cgroup.procs").split()
    except OSError:
        return None
    return mount if str(os.getpid()) in procs else None


@dataclass(slots=True)
class Place:
    """Where agents' cgroups are made: ``parent``'s children, of cgroup ``version``."""

    version: int
    parent: Path

    @property
    def mode(self) -> str:
        return f"cgroup_v{self.version}"


def _probe(parent: Path, limit_file: str) -> str | None:
    """Make one child cgroup and set a limit in it (then remove it): the problem, or None."""
    probe = parent / f"{PREFIX}{os.getpid()}-probe"
    try:
        probe.mkdir(exist_ok=True)
    except OSError as exc:
        return f"cannot make a cgroup in {parent}: {exc.strerror}"
    try:
        if not (probe / limit_file).exists():
            return f"{parent} is no memory cgroup (a child has no {limit_file})"
        _write(probe / limit_file, "max" if limit_file == "memory.max" else "-1")
        return None
    except OSError as exc:
        return f"cannot set {limit_file} in {parent}: {exc.strerror}"
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


def _delegate_v2(own: Path, rel: str) -> str | None:
    """Enable the memory controller for ``own``'s children (``rel``: its path as this
    process sees it), the daemon first moved into the leaf ``own/daemon``: the problem, or
    None. At the root of a cgroup namespace (a container's, systemd's private one) all that
    is there is this daemon's own (a container's init, say) and moves with it; elsewhere
    only the daemon moves, and anything else left in ``own`` makes the kernel refuse. The
    root of the whole hierarchy (no ``cgroup.type``) may hold processes and controllers at
    once: nothing moves out of it."""
    try:
        if "memory" not in _read(own / "cgroup.controllers").split():
            return f"the memory controller is not available in the daemon's cgroup {own} (not delegated)"
        if "memory" in _read(own / "cgroup.subtree_control").split():
            return None
    except OSError as exc:
        return f"cannot read {own}: {exc.strerror}"
    try:
        if (own / "cgroup.type").exists():
            leaf = own / "daemon"
            leaf.mkdir(exist_ok=True)
            pids = _read(own / "cgroup.procs").split() if rel.strip() == "/" else ["0"]
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    _write(leaf / "cgroup.procs", pid)
        _write(own / "cgroup.subtree_control", "+memory")
    except OSError as exc:
        busy = " (other processes share the daemon's cgroup)" if exc.errno == errno.EBUSY else ""
        return f"cannot enable the memory controller under {own}: {exc.strerror}{busy}"
    return None


def find(root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> tuple[Place | None, list[str]]:
    """Where this daemon may make agents' cgroups (v2 first), and why not where it may not."""
    try:
        unified, memory = parse_self_cgroup(_read(self_cgroup))
    except OSError as exc:
        return None, [f"cannot read {self_cgroup}: {exc.strerror}"]
    why: list[str] = []
    mount2 = root if (root / "cgroup.controllers").exists() else root / "unified"
    own2 = None if unified is None else _within_mount(mount2, unified, "cgroup.controllers")
    if own2 is None:
        why.append(f"cgroup v2: no unified hierarchy with the daemon's cgroup under {root}")
    elif (problem := _delegate_v2(own2, unified or "") or _probe(own2, "memory.max")) is not None:
        why.append(f"cgroup v2: {problem}")
    else:
        return Place(2, own2), why
    own1 = None if memory is None else _within_mount(root / "memory", memory, "memory.limit_in_bytes")
    if own1 is None:
        why.append(f"cgroup v1: no memory hierarchy with the daemon's cgroup under {root}")
    elif (problem := _probe(own1, "memory.limit_in_bytes")) is not None:
        why.append(f"cgroup v1: {problem}")
    else:
        return Place(1, own1), why
    return None, why


@dataclass(slots=True)
class AgentCgroup:
    """One agent's cgroup. ``procs_fd`` (its ``cgroup.procs``, open for writing) is what the
    child writes itself into; it is closed in the daemon once the child is spawned."""

    path: Path
    version: int
    procs_fd: int = -1
    oom_seen: bool = False  # the kernel's OOM killer struck inside it (counted once)
    stopped: bool = False  # the daemon stopped the agent over its limit (counted there)
    tries: int = 0  # removals tried

    def joining(self, then: Callable[[], None] | None) -> Callable[[], None]:
        """A ``preexec_fn``: the child moves itself ("0": the writer) into this cgroup
        before anything else, so what it becomes is inside from its first instruction."""
        fd = self.procs_fd

        def join() -> None:  # between fork and exec: one write
            os.write(fd, b"0")
            if then is not None:
                then()

        return join

    def close_fd(self) -> None:
        if self.procs_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.procs_fd)
            self.procs_fd = -1

    def _counts(self, name: str) -> dict[str, int]:
        try:
            text = _read(self.path / name)
        except OSError:
            return {}
        pairs = (line.partition(" ") for line in text.splitlines())
        return {key: int(value) for key, _, value in pairs if value.strip().isdigit()}

    def oom_kills(self) -> int:
        """Processes the kernel's OOM killer killed in this cgroup because it reached its own
        limit (0 where unknown). The kernel counts a kill in the victim's cgroup whichever
        limit ran out (the container's, the host's): that counts only once this cgroup has
        hit its own (v2 ``oom``; v1 a charge that failed there, or its peak at it)."""
        if self.version == 2:
            events = self._counts("memory.events")
            return events.get("oom_kill", 0) if events.get("oom", 0) > 0 else 0
        kills = self._counts("memory.oom_control").get("oom_kill", 0)
        return kills if kills and (self._reached("memory") or self._reached("memory.memsw")) else 0

    def _reached(self, prefix: str) -> bool:
        """cgroup v1: a charge failed at this cgroup's limit, or its peak reached it (some
        kernels keep no ``failcnt``; the peak stops at the limit)."""
        limit = self._number(f"{prefix}.limit_in_bytes")
        peak = self._number(f"{prefix}.max_usage_in_bytes")
        return self._number(f"{prefix}.failcnt") > 0 or (limit > 0 and peak >= limit)

    def _number(self, name: str) -> int:
        try:
            return int(_read(self.path / name))
        except (OSError, ValueError):
            return 0

    def kill_rest(self) -> None:
        """SIGKILL whatever is still inside: v2's ``cgroup.kill`` at once where the kernel
        has it, else each process listed."""
        if self.version == 2 and (self.path / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                _write(self.path / "cgroup.kill", "1")
            return
        try:
            pids = _read(self.path / "cgroup.procs").split()
        except OSError:
            return
        for pid in pids:
            with contextlib.suppress(OSError, ValueError):
                _kill_member(int(pid), self.path.name)

    def remove(self) -> bool:
        """Kill what is left and remove the cgroup: True once it is gone."""
        self.close_fd()
        if not self.path.exists():
            return True
        self.kill_rest()
        try:
            self.path.rmdir()
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                log.warning("agent.cgroup_unremovable", path=str(self.path), error=exc.strerror)
            return False
        return True


class AgentCgroups:
    """The daemon's agents' cgroups: where they go (found once, at start), the live ones
    by the agent's pid, and the counts /metrics shows."""

    def __init__(self) -> None:
        self.place: Place | None = None
        self.mode = "sampling"
        self.why: list[str] = ["not set up (the daemon sets it up at start)"]
        self.oom_lives = 0  # agents in whose cgroup the kernel's OOM killer struck
        self.kernel_stops = 0  # of those, agents that ended by it (the daemon had not stopped them)
        self._live: dict[int, AgentCgroup] = {}
        self._removing: set[str] = set()
        self._names = itertools.count(1)

    def setup(self, setting: str, *, self_cgroup: Path = SELF_CGROUP) -> None:
        """Find where agents' cgroups may go (``setting``: ``auto``, ``off``, or the cgroup
        file system's mount point) and say once which way memory limits are enforced."""
        if setting == "off":
            self.place, self.why = None, ['[capacity] agent_cgroups = "off"']
        else:
            root = CGROUP_ROOT if setting == "auto" else Path(setting)
            try:
                self.place, self.why = find(root, self_cgroup)
            except OSError as exc:  # a path it may not even look at: no cgroups, as anywhere else
                self.place, self.why = None, [f"cannot look under {root}: {exc.strerror}"]
        self.mode = "sampling" if self.place is None else self.place.mode
        if self.place is None:
            log.info("agent.memory_limits", mode=self.mode, why="; ".join(self.why))
            return
        # (on cgroup v1, why not v2: the way to the better one, for an operator who wants it)
        log.info("agent.memory_limits", mode=self.mode, parent=str(self.place.parent), why="; ".join(self.why) or None)
        with contextlib.suppress(OSError):
            self._sweep()

    def _sweep(self) -> None:
        """Remove the cgroups a daemon that died left (its agents died with it)."""
        assert self.place is not None
        for entry in self.place.parent.glob(f"{PREFIX}*"):
            owner = entry.name[len(PREFIX) :].split("-")[0]
            if entry.is_dir() and owner.isdigit() and int(owner) != os.getpid() and not _alive(int(owner)):
                self._remove_now(AgentCgroup(entry, self.place.version), tries=3)

    def create(self, limit_mb: int | None) -> AgentCgroup | None:
        """A new agent's cgroup with its limit set, ``cgroup.procs`` open for its child; None
        without a limit or a place (then only the sample bounds it), or if it cannot be made."""
        place = self.place
        if limit_mb is None or place is None:
            return None
        cg = AgentCgroup(place.parent / f"{PREFIX}{os.getpid()}-{next(self._names)}", place.version)
        limit = str(limit_mb * 1024 * 1024)
        try:
            cg.path.mkdir()
            if place.version == 2:
                _write(cg.path / "memory.max", limit)
                _optional(cg.path / "memory.swap.max", "0")
                _optional(cg.path / "memory.oom.group", "1")
            else:
                _write(cg.path / "memory.limit_in_bytes", limit)
                _optional(cg.path / "memory.memsw.limit_in_bytes", limit)
            cg.procs_fd = os.open(cg.path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        except OSError as exc:
            log.warning("agent.cgroup_failed", path=str(cg.path), error=exc.strerror)
            self.discard(cg)
            return None
        return cg

    def attach(self, pid: int, cg: AgentCgroup) -> None:
        self._live[pid] = cg

    def of(self, pid: int) -> AgentCgroup | None:
        return self._live.get(pid)

    def oom_killed(self, cg: AgentCgroup) -> bool:
        """The kernel's OOM killer struck inside ``cg`` (counted once per agent)."""
        if not cg.oom_seen and cg.oom_kills() > 0:
            cg.oom_seen = True
            self.oom_lives += 1
            log.warning("agent.memory_oom_kill", path=str(cg.path), kills=cg.oom_kills())
        return cg.oom_seen

    def exit_reason(self, cg: AgentCgroup) -> str | None:
        """``memory_limit`` for an agent that exited after an OOM kill in its cgroup."""
        if not self.oom_killed(cg):
            return None
        if not cg.stopped:
            cg.stopped = True
            self.kernel_stops += 1
        return "memory_limit"

    def discard(self, cg: AgentCgroup) -> None:
        """The agent is gone: its cgroup is removed, now or (processes still dying) in a
        few retries on the event loop."""
        for pid in [p for p, c in self._live.items() if c is cg]:
            del self._live[pid]
        if cg.remove():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._remove_now(cg)
            return
        self._removing.add(str(cg.path))
        loop.call_later(RETRY_S, self._retry, cg)

    def _retry(self, cg: AgentCgroup) -> None:
        cg.tries += 1
        if cg.remove() or cg.tries >= RETRIES:
            self._removing.discard(str(cg.path))
            if cg.path.exists():
                log.warning("agent.cgroup_left", path=str(cg.path))
            return
        asyncio.get_running_loop().call_later(RETRY_S, self._retry, cg)

    def _remove_now(self, cg: AgentCgroup, tries: int = RETRIES) -> None:
        for _ in range(tries):
            if cg.remove():
                return
            time.sleep(RETRY_S)
        log.warning("agent.cgroup_left", path=str(cg.path))

    def close(self) -> None:
        """The daemon stops: remove what is still pending (waiting here, bounded)."""
        for path in list(self._removing):
            self._remove_now(AgentCgroup(Path(path), 2 if self.mode == "cgroup_v2" else 1))
        self._removing.clear()
        for cg in list(self._live.values()):
            self._remove_now(cg)
        self._live.clear()


def _optional(path: Path, value: str) -> None:
    """A setting some kernels lack (no swap accounting, an older kernel): set where it is."""
    if path.exists():
        try:
            _write(path, value)
        except OSError as exc:
            log.info("agent.cgroup_setting_refused", path=str(path), error=exc.strerror)


def _kill_member(pid: int, name: str) -> None:
    """SIGKILL ``pid`` if it is still in cgroup ``name``: held by a pidfd while that is
    checked, so a pid reused since the list was read is never the one signalled."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd here: the list was read just now
        os.kill(pid, signal.SIGKILL)
        return
    try:
        if any(line.endswith(f"/{name}") for line in _read(Path(f"/proc/{pid}/cgroup")).splitlines()):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# The daemon's one registry of agents' cgroups (set up by `agent-bridge serve`; in-process
# test daemons leave it unset: their agents are bounded by the sample alone).
AGENT_CGROUPS = AgentCgroups()
