"""Confinement of every agent process tree (docs/security.md "Confinement", docs/api.md §10).

An agent runs shell commands a model chose, and a model can be steered by any file or web
page it reads, so each agent is treated as untrusted code. Before its ``exec`` the child
restricts itself with Landlock (an unprivileged Linux security module that also works in
containers); the restriction is inherited by everything the agent starts and cannot be
lifted. What an agent may do:

* read, write, create and remove beneath its thread's ``cwd``, its ``HOME`` and a private
  temp dir made for this process (``TMPDIR``), plus ``[sandbox] extra_write``;
* read and execute the system (``/usr``, ``/bin``, ``/lib*``, ``/etc``, ``/opt``), the agent
  CLI's install directory, the directory of its interpreter when it is a script
  (process/interpreter.py), the daemon's own Python (the demo agent runs on it),
  ``/proc`` and ``/sys`` (read only), a few devices, plus ``[sandbox] extra_read``;
* nothing else: not the data dir (token, database, ``daemon.json``, logs, other threads'
  workspaces, other users' homes), not ``/tmp`` or ``/dev/shm`` (shared with other agents).

The data dir often lies inside the HOME an agent needs (``~/.local/share/agent-bridge``):
Landlock grants whole trees and has no "except", so a granted directory that contains a
denied path is granted entry by entry instead, down to the denied path, which gets nothing
(:func:`_grant`). New entries made later directly in such a directory (``~`` itself, in
that layout) are therefore out of reach for the agent; docs/security.md says what follows.

Landlock's scopes (ABI 6) also keep the agent from signalling processes outside its
sandbox (the daemon, other agents) and from their abstract Unix sockets, and Landlock
refuses ``ptrace`` across the boundary, which is what guards ``/proc/<daemon>/mem`` and
``environ`` (the daemon is also not dumpable: :func:`harden_daemon`).

The rules are built in the daemon (paths opened ``O_PATH``) into a ruleset descriptor; the
child, between fork and exec, only sets ``no_new_privs`` and calls
``landlock_restrict_self`` on it: two system calls, nothing that allocates.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import shutil
import stat
import struct
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import structlog

from bridge.errors import LaunchRefused
from bridge.process import bwrap, interpreter
from bridge.process.launch import LaunchSpec, within

log = structlog.get_logger(__name__)

Mode = Literal["auto", "landlock", "bubblewrap", "none"]
Mechanism = Literal["landlock", "bubblewrap", "none"]

# linux/landlock.h (the syscall numbers are the same on every architecture).
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

# The rights a rule on a file (not a directory) may carry.
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
READ = EXECUTE | READ_FILE | READ_DIR
WRITE = (
    READ
    | WRITE_FILE
    | REMOVE_DIR
    | REMOVE_FILE
    | MAKE_CHAR
    | MAKE_DIR
    | MAKE_REG
    | MAKE_SOCK
    | MAKE_FIFO
    | MAKE_BLOCK
    | MAKE_SYM
    | REFER
    | TRUNCATE
    | IOCTL_DEV
)
DEVICE = READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV

# ABI 2 is the least this module uses: without REFER every rename across directories fails.
MIN_ABI = 2

# What every agent may read and execute: the system, not the machine's people.
SYSTEM_READ = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/nix/store")
# Read only: tools read their own process (/proc/self), the CPU count, cgroup limits.
KERNEL_READ = ("/proc", "/sys")
# Devices any program may open for reading and writing.
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx")
DEVICE_DIRS = ("/dev/pts",)

_libc: ctypes.CDLL | None = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - no libc symbols
        _libc = None


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (not Linux, not built in,
    not enabled at boot, or refused by a seccomp filter)."""
    if _libc is None:
        return 0
    version = int(
        _libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    )
    return max(version, 0)


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 40  # CAP_CHECKPOINT_RESTORE, the last one in Linux 6.x


def harden_daemon() -> bool:
    """Make this process not dumpable: other processes of the same user can then no
    longer read its memory or environment through ``/proc/<pid>/mem``/``environ`` nor
    ptrace it, and it leaves no core dump. Inherited by a ``fork`` until ``exec`` (agents
    are exec'd and become dumpable again: their own business). True when it took."""
    if _libc is None:
        return False
    return int(_libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)) == 0


def scrub_process(secrets: Iterable[str]) -> int:
    """Overwrite every occurrence of each secret in this process's command line and initial
    environment (what ``/proc/<pid>/cmdline`` and ``environ`` show; ``os.environ`` is
    Python's copy and keeps them) with ``*``; returns how many bytes changed. Must run
    before :func:`harden_daemon` (a process that is not dumpable cannot open its own
    ``/proc/self/mem`` unless it is root)."""
    wanted = [s.encode() for s in secrets if s and len(s) >= 4]
    if not wanted or not sys.platform.startswith("linux"):
        return 0
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        # stat fields 48-51 (1-based; index 0 here is field 3): arg_start, arg_end,
        # env_start, env_end.
        areas = [(int(fields[45]), int(fields[46])), (int(fields[47]), int(fields[48]))]
        changed = 0
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            for start, end in areas:
                mem.seek(start)
                area = bytearray(mem.read(end - start))
                n = _blank(area, wanted)
                if n:
                    mem.seek(start)
                    mem.write(bytes(area))
                    changed += n
        return changed
    except (OSError, ValueError, IndexError) as exc:
        log.warning("sandbox.process_not_scrubbed", error=str(exc))
        return 0


def _blank(area: bytearray, wanted: Sequence[bytes]) -> int:
    changed = 0
    for secret in wanted:
        at = area.find(secret)
        while at >= 0:
            area[at : at + len(secret)] = b"*" * len(secret)
            changed += len(secret)
            at = area.find(secret, at + len(secret))
    return changed


@dataclass(frozen=True, slots=True)
class SandboxConfig:
    """``[sandbox]`` as the process layer needs it (bridge/config.py SandboxSettings)."""

    mode: Mode = "auto"
    extra_read: tuple[str, ...] = ()
    extra_write: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Sandbox:
    """The daemon's confinement: the mechanism in force, and what no agent may reach."""

    mechanism: Mechanism
    requested: Mode
    abi: int
    # Never granted to any agent, whatever its cwd or HOME: the data dir, the config file.
    deny: tuple[str, ...] = ()
    # Subtrees of a denied path whose subdirectories may be an agent's own (workspaces,
    # users' homes), and paths in a denied one that may be granted as they are.
    agent_areas: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()
    extra_read: tuple[str, ...] = ()
    extra_write: tuple[str, ...] = ()
    problem: str | None = None  # why the requested mechanism is not in force
    bwrap: str | None = None  # bubblewrap's executable, where it is the mechanism

    @property
    def confined(self) -> bool:
        return self.mechanism != "none"

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {"mechanism": self.mechanism, "requested": self.requested}
        if self.mechanism == "landlock":
            out["landlock_abi"] = self.abi
        if self.problem:
            out["problem"] = self.problem
        return out

    def for_profile(self, mode: Mode | None) -> Sandbox:
        """This sandbox as a profile with its own ``sandbox`` mode sees it (resolved once
        per mode: it is asked at every spawn and every listing of the profiles)."""
        if mode is None or mode == self.requested:
            return self
        return _for_mode(self, mode)

    def plan(
        self,
        *,
        cwd: str,
        env: Mapping[str, str],
        executable: str,
        args: Sequence[str] = (),
        extra_write: Sequence[str] = (),
        extra_read: Sequence[str] = (),
    ) -> Plan | None:
        """The rules for one agent process, or None when agents run unconfined. Raises
        LaunchRefused (``cwd_not_allowed``) for a cwd that is, or lies in, a denied path
        outside the agent areas."""
        if not self.confined:
            return None
        real_cwd = os.path.realpath(cwd)
        if not self._may_own(real_cwd):
            raise LaunchRefused(
                "working directory lies in the daemon's data dir, which no agent may reach", code="cwd_not_allowed"
            )
        if system_path(real_cwd):
            raise LaunchRefused(
                f"working directory {real_cwd} is, or holds, a system directory, which agents may only read",
                code="cwd_not_allowed",
            )
        write = [real_cwd]
        home = env.get("HOME")
        if home and os.path.isabs(home):
            real_home = os.path.realpath(home)
            if self._may_own(real_home) and not system_path(real_home):
                write.append(real_home)
            else:
                log.warning("sandbox.home_not_granted", reason="HOME lies in the data dir or is a system directory")
        for p in (*self.extra_write, *extra_write):
            real = os.path.realpath(p)
            if real in self.allow:  # the daemon's own area for it (the demo's histories): made here
                os.makedirs(real, mode=0o700, exist_ok=True)
            if self._may_own(real) and not system_path(real):
                write.append(real)
        # Besides the system (SYSTEM_READ), which every agent reads whatever its plan.
        read = [*install_dirs(executable), *_python_dirs(), *self.extra_read, *extra_read]
        for arg in args:  # a script run by an interpreter (node cli.js), an --mcp-config file
            path = arg.split("=", 1)[-1]
            if os.path.isabs(path) and os.path.isfile(path):
                read += install_dirs(path)
        read += self._interpreter_dirs(executable, env, write)
        return Plan(
            mechanism=self.mechanism,
            bwrap=self.bwrap,
            abi=self.abi,
            read=tuple(read),
            write=tuple(write),
            deny=self.deny,
            agent_areas=self.agent_areas,
            allow=self.allow,
        )

    def _may_own(self, real: str) -> bool:
        return _may_own(real, self.deny, self.agent_areas, self.allow)

    def _interpreter_dirs(self, executable: str, env: Mapping[str, str], write: list[str]) -> list[str]:
        """An executable that is a script (``#!/usr/bin/env node``) runs the node on the
        agent's PATH, which may lie outside the system (nvm's): that node's directory, to
        read and execute, unless the rules refuse it (deny wins) or it holds a home. Only
        the executed file's line counts: the kernel reads no other."""
        homes = [os.path.realpath(h) for h in (env.get("HOME", ""), os.path.expanduser("~")) if os.path.isabs(h)]
        found = interpreter.interpreter_dirs([executable], env, deny=self.deny, homes=homes, writable=write)
        return [d for d in found if not any(within(d, s) for s in SYSTEM_READ)]


@functools.lru_cache(maxsize=16)
def _for_mode(box: Sandbox, mode: Mode) -> Sandbox:
    return resolve(
        SandboxConfig(mode, box.extra_read, box.extra_write),
        deny=box.deny,
        agent_areas=box.agent_areas,
        allow=box.allow,
    )


def _may_own(real: str, deny: Iterable[str], areas: Iterable[str], allow: Iterable[str]) -> bool:
    """May ``real`` be granted: not a denied path, and not inside one unless strictly inside
    one of the agent areas, or one of the paths in ``allow`` itself. (An ancestor of a
    denied path is fine: the grant is split around it.)"""
    if real in allow:
        return True
    for d in deny:
        if within(real, d):
            return any(within(real, a) and real != a for a in areas)
    return True


def resolve(
    config: SandboxConfig,
    *,
    deny: Iterable[str] = (),
    agent_areas: Iterable[str] = (),
    allow: Iterable[str] = (),
) -> Sandbox:
    """The mechanism ``config.mode`` gives on this host. ``auto``: Landlock when the kernel
    has ABI ≥ 2, else bubblewrap where it is installed and may make its namespaces, else
    none (with ``problem`` saying why). ``landlock`` or ``bubblewrap`` without it: none,
    with the problem (the caller refuses to start)."""
    deny_t = tuple(dict.fromkeys(os.path.realpath(p) for p in deny))
    areas = tuple(dict.fromkeys(os.path.realpath(p) for p in agent_areas))
    common = {
        "requested": config.mode,
        "deny": deny_t,
        "agent_areas": areas,
        "allow": tuple(dict.fromkeys(os.path.realpath(p) for p in allow)),
        "extra_read": tuple(config.extra_read),
        "extra_write": tuple(config.extra_write),
    }
    if config.mode == "none":
        return Sandbox(mechanism="none", abi=0, **common)  # type: ignore[arg-type]
    abi = landlock_abi()
    if config.mode != "bubblewrap" and abi >= MIN_ABI:
        return Sandbox(mechanism="landlock", abi=abi, **common)  # type: ignore[arg-type]
    landlock_problem = (
        "this kernel has no Landlock (CONFIG_SECURITY_LANDLOCK, and 'landlock' in the lsm= boot list)"
        if abi == 0
        else f"this kernel's Landlock ABI {abi} is older than {MIN_ABI}"
    )
    if config.mode == "landlock":
        return Sandbox(mechanism="none", abi=abi, problem=landlock_problem, **common)  # type: ignore[arg-type]
    path = bwrap.find()
    bwrap_problem = bwrap.problem(path)
    if bwrap_problem is None:
        return Sandbox(mechanism="bubblewrap", abi=abi, bwrap=path, **common)  # type: ignore[arg-type]
    problem = bwrap_problem if config.mode == "bubblewrap" else f"{landlock_problem}; and {bwrap_problem}"
    return Sandbox(mechanism="none", abi=abi, problem=problem, **common)  # type: ignore[arg-type]


# Never writable, whatever an agent's cwd, HOME or extra_write: a daemon run as root would
# otherwise let its agent rewrite the system it and everyone else runs.
# (/opt is left to the operator: projects live there too.)
READ_ONLY = (*(d for d in SYSTEM_READ if d != "/opt"), *KERNEL_READ, "/dev", "/boot")


def system_path(real: str) -> bool:
    """``real`` is the root, or lies in (or is) a directory agents may only read."""
    return real == "/" or any(within(real, d) for d in READ_ONLY)


def install_dirs(executable: str) -> list[str]:
    """What an agent CLI needs to read of its own install: the tree of the outermost
    ``node_modules`` on its path (an npm prefix: the CLI, its dependencies and ``.bin``),
    else the executable's directory."""
    parts = executable.split("/node_modules/", 1)
    if len(parts) == 2 and parts[0]:
        return [parts[0] + "/node_modules"]
    return [os.path.dirname(executable)]


def _python_dirs() -> list[str]:
    """The daemon's own Python: the demo agent runs on it, and so do agents in Python."""
    return list(dict.fromkeys(os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, _bridge_dir())))


def _bridge_dir() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(slots=True)
class Plan:
    """One agent process's rules, before they are made."""

    mechanism: Mechanism
    bwrap: str | None
    abi: int
    read: tuple[str, ...]
    write: tuple[str, ...]
    deny: tuple[str, ...]
    agent_areas: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()
    rules: int = 0


class Confined:
    """A plan made real for one spawn: a private temp dir and the ruleset descriptor.
    ``env`` adds ``TMPDIR``; ``preexec`` runs in the child; ``close`` after the spawn (the
    descriptor); ``cleanup`` once the agent is gone (the temp dir)."""

    def __init__(self, plan: Plan, tmp_parent: str | None = None) -> None:
        self.plan = plan
        self.tmpdir = tempfile.mkdtemp(prefix="agent-bridge-tmp-", dir=tmp_parent)
        self.fd = -1
        if plan.mechanism != "landlock":
            return  # bubblewrap: its command line is the sandbox (command())
        try:
            self.fd = _make_ruleset(plan, extra_write=(self.tmpdir,))
        except BaseException:
            self.cleanup()
            raise

    @property
    def env(self) -> dict[str, str]:
        return {"TMPDIR": bwrap.AGENT_TMP if self.plan.mechanism == "bubblewrap" else self.tmpdir}

    def command(self, program: Sequence[str], cwd: str) -> tuple[str, list[str]] | None:
        """bubblewrap: (the executable to run, its argv) around ``program``; None for
        Landlock, which runs ``program`` itself."""
        plan, exe = self.plan, self.plan.bwrap
        if plan.mechanism != "bubblewrap" or exe is None:
            return None
        return exe, bwrap.argv(
            exe,
            read=[*SYSTEM_READ, *KERNEL_READ[1:], *plan.read],
            write=plan.write,
            deny=plan.deny,
            tmpdir=self.tmpdir,
            cwd=os.path.realpath(cwd),
            program=program,
        )

    def preexec(self, before: Callable[[], None] | None) -> Callable[[], None] | None:
        if self.plan.mechanism != "landlock":
            return before  # bubblewrap drops the capabilities and sets no_new_privs itself
        libc = _libc
        assert libc is not None
        fd = self.fd
        syscall, prctl = libc.syscall, libc.prctl
        # A daemon run as root would hand its agents every capability: CAP_SYS_PTRACE reads
        # its environment, CAP_SYS_MODULE loads code into the kernel. The bounding set is
        # emptied, so the agent's exec gives it none.
        caps = range(_last_cap() + 1) if os.geteuid() == 0 else range(0)

        def setup() -> None:  # between fork and exec: a few system calls, nothing else
            if before is not None:
                before()
            for cap in caps:
                if prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                    raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")
            if caps and prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_CAP_AMBIENT_CLEAR_ALL) failed")
            if prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
            if syscall(_SYS_RESTRICT_SELF, fd, 0) != 0:
                raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")

        return setup

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1

    def cleanup(self) -> None:
        self.close()
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def _handled(abi: int) -> int:
    rights = WRITE & ~(REFER | TRUNCATE | IOCTL_DEV)
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


def _make_ruleset(plan: Plan, *, extra_write: Sequence[str] = ()) -> int:
    libc = _libc
    if libc is None:
        raise LaunchRefused("Landlock needs Linux", code="sandbox_unavailable")
    handled = _handled(plan.abi)
    scoped = (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if plan.abi >= 6 else 0
    if plan.abi >= 6:
        attr = struct.pack("=QQQ", handled, 0, scoped)
    elif plan.abi >= 4:
        attr = struct.pack("=QQ", handled, 0)
    else:
        attr = struct.pack("=Q", handled)
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = int(libc.syscall(_SYS_CREATE_RULESET, buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0)))
    if fd < 0:
        err = ctypes.get_errno()
        raise LaunchRefused(f"cannot create the agent's sandbox: {os.strerror(err)}", code="sandbox_failed")
    try:
        os.set_inheritable(fd, False)
        adder = _Rules(libc, fd, handled, plan)
        for path in (*SYSTEM_READ, *KERNEL_READ):
            adder.grant(path, READ if path not in KERNEL_READ else READ_FILE | READ_DIR)
        for path in plan.read:
            adder.grant(path, READ)
        for path in DEVICES:
            adder.grant(path, DEVICE)
        for path in DEVICE_DIRS:
            adder.grant(path, DEVICE | READ_DIR)
        for path in (*plan.write, *extra_write):
            adder.grant(path, WRITE)
        plan.rules = adder.count
    except BaseException:
        os.close(fd)
        raise
    return fd


class _Rules:
    def __init__(self, libc: ctypes.CDLL, fd: int, handled: int, plan: Plan) -> None:
        self._libc, self._fd, self._handled, self._plan = libc, fd, handled, plan
        self.count = 0

    def grant(self, path: str, rights: int) -> None:
        """``rights`` beneath ``path``, except beneath any denied path: a directory that
        contains one is granted entry by entry (symlinks skipped: a rule follows the
        inode, and the link's target has its own ancestors)."""
        real = os.path.realpath(path)
        if not _may_own(real, self._plan.deny, self._plan.agent_areas, self._plan.allow):
            return  # a denied path itself, or inside one outside the agent areas
        inside = [d for d in self._plan.deny if within(d, real)]
        if not inside:
            self._add(real, rights)
            return
        try:
            entries = list(os.scandir(real))
        except OSError:
            return
        for entry in entries:
            if entry.is_symlink():
                continue
            self.grant(entry.path, rights)

    def _add(self, path: str, rights: int) -> None:
        try:
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return  # not on this host: nothing to grant
        try:
            mode = os.fstat(pfd).st_mode
            allowed = rights & self._handled
            if not stat.S_ISDIR(mode):
                allowed &= _FILE_RIGHTS
            if not allowed:
                return
            attr = struct.pack("=Qi", allowed, pfd)
            buf = ctypes.create_string_buffer(attr, len(attr))
            if int(self._libc.syscall(_SYS_ADD_RULE, self._fd, _RULE_PATH_BENEATH, buf, ctypes.c_uint32(0))) != 0:
                # Fails closed: the path stays out of reach.
                log.warning("sandbox.rule_refused", path=path, error=os.strerror(ctypes.get_errno()))
                return
            self.count += 1
        finally:
            os.close(pfd)


def confine(
    spec: LaunchSpec, sandbox: Sandbox, *, extra_read: Sequence[str] = (), extra_write: Sequence[str] = ()
) -> LaunchSpec:
    """``spec`` with ``sandbox``'s plan for it (None where agents run unconfined). Raises
    LaunchRefused (``cwd_not_allowed``)."""
    plan = sandbox.plan(
        cwd=spec.cwd,
        env=spec.env,
        executable=spec.argv[0],
        args=spec.argv[1:],
        extra_read=extra_read,
        extra_write=extra_write,
    )
    return replace(spec, sandbox=plan)


__all__ = [
    "Confined",
    "Mode",
    "Plan",
    "Sandbox",
    "SandboxConfig",
    "confine",
    "harden_daemon",
    "install_dirs",
    "landlock_abi",
    "resolve",
    "scrub_process",
]
