"""The bubblewrap form of an agent's sandbox (``[sandbox] mode = "bubblewrap"``;
docs/security.md §6): the same rules as Landlock's (process/sandbox.py), made of mounts in
namespaces of the agent's own instead of access rules.

The agent sees a root of its own: the system and what it may read mounted read-only, its
``cwd``, ``HOME`` and ``extra_write`` read-write, its private temp dir as ``/tmp``, a fresh
``/proc`` of a pid namespace of its own (the daemon and other agents are not in it), a
minimal ``/dev``; every denied path that would show through a mount (the data dir inside
HOME, the config file) is covered by an empty tmpfs (a file by ``/dev/null``), and what the
agent owns inside one (its workspace, a user's home) is mounted again on top. Unlike
Landlock's rules, a mount has an "except": so the agent may create anything directly in a
HOME that holds the data dir. It needs bubblewrap (``bwrap``) and namespaces the host
grants (user namespaces unless run as root): not in a default container, nor under the
systemd unit's ``RestrictNamespaces=yes``; ``auto`` prefers Landlock for that reason.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
from collections.abc import Sequence

from bridge.process.launch import within

# Where the agent's private temp dir is mounted in its root (its own: nobody else's /tmp).
AGENT_TMP = "/tmp"  # noqa: S108
# Where /etc/resolv.conf often points.
RESOLVER = ("/run/systemd/resolve", "/run/resolvconf")


def find() -> str | None:
    """The bwrap executable on PATH (or in /usr/bin), as a real path; None without one."""
    found = shutil.which("bwrap") or shutil.which("bwrap", path="/usr/bin:/usr/local/bin")
    if found is None:
        return None
    real = os.path.realpath(found)
    try:
        if not stat.S_ISREG(os.stat(real).st_mode) or not os.access(real, os.X_OK):
            return None
    except OSError:
        return None
    return real


@functools.lru_cache(maxsize=4)
def problem(bwrap: str | None) -> str | None:
    """Why bubblewrap cannot confine agents here, or None: it is missing, or the host
    refuses it the namespaces it needs (tried once a process, with a command that does
    nothing)."""
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed"
    try:
        done = subprocess.run(
            [bwrap, "--die-with-parent", "--unshare-pid", "--ro-bind", "/", "/", "--proc", "/proc", "true"],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bubblewrap cannot run: {exc}"
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"bubblewrap cannot make its namespaces here: {why[-1] if why else done.returncode}"
    return None


def argv(
    bwrap: str,
    *,
    read: Sequence[str],
    write: Sequence[str],
    deny: Sequence[str],
    tmpdir: str,
    cwd: str,
    program: Sequence[str],
) -> list[str]:
    """bwrap's command line for ``program`` (its first item the path to execute) under
    these rules (``read``: everything mounted read-only, the system included). Paths are
    real paths; those that do not exist are left out."""
    out = [
        bwrap,
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--cap-drop",
        "ALL",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        # First: every mount below may lie under /tmp (a test's workspace, say) and stays visible.
        "--bind",
        tmpdir,
        AGENT_TMP,
    ]
    mounted: list[str] = []  # real paths, as the masks below compare them
    owned_in_denied: list[str] = []
    for path in dict.fromkeys((*RESOLVER, *read)):
        if os.path.exists(path) and not _denied(os.path.realpath(path), deny):
            out += ["--ro-bind", path, path]
            mounted.append(os.path.realpath(path))
    for path in dict.fromkeys(write):
        if not os.path.exists(path):
            continue
        if _denied(path, deny):
            owned_in_denied.append(path)  # a workspace or a home in the data dir: after the masks
            continue
        out += ["--bind", path, path]
        mounted.append(path)
    out += _masks(deny, mounted, owned_in_denied)
    out += ["--chdir", cwd, "--", *program]
    return out


def _denied(path: str, deny: Sequence[str]) -> bool:
    return any(within(path, d) for d in deny)


def _masks(deny: Sequence[str], mounted: Sequence[str], owned_in_denied: Sequence[str]) -> list[str]:
    """What hides the denied paths that a mount made visible (an empty tmpfs over a
    directory, /dev/null over a file), then the agent's own places inside them bound again,
    then the masks made read-only: nothing can be put in a mask, while what is mounted in
    it stays writable."""
    out: list[str] = []
    masked: list[str] = []
    for d in deny:
        if not os.path.exists(d) or not any(within(d, m) for m in mounted):
            continue  # not visible anyway
        if os.path.isdir(d):
            out += ["--tmpfs", d]
            masked.append(d)
        else:
            out += ["--ro-bind", "/dev/null", d]
    for path in owned_in_denied:
        out += ["--bind", path, path]
    for d in masked:
        out += ["--remount-ro", d]
    return out
