"""The interpreter of an agent CLI that is a script (``#!/usr/bin/env node``), found as the
kernel and ``env`` will find it for the agent, so the sandbox can let the agent run it
(process/sandbox.py; docs/security.md §6).

The npm CLIs start with ``#!/usr/bin/env node``: ``env`` looks ``node`` up on the agent's
PATH, and a node outside the system directories (nvm's, a Python wheel's) would be
refused execution under the sandbox. Only the interpreter's own directory is granted, read
and execute, and never a directory the rules refuse or one that would open far more than a
program (the root, a home, a shared temp dir).
"""

from __future__ import annotations

import functools
import os
import pwd
import tempfile
from collections.abc import Iterable, Mapping

from bridge.process.launch import within

# Linux reads at most this much of a script to find its interpreter line (BINPRM_BUF_SIZE).
HEAD = 256
# How many interpreters deep a script is followed (Linux stops at a handful).
NESTING = 4
# Directories that hold far more than one program: granting one would open them whole.
_SHARED = ("/", "/home", "/tmp", "/var/tmp", "/dev/shm", "/run", "/var", "/srv", "/mnt", "/media")  # noqa: S108
# env's options that take no argument, which may precede the program in ``env -S``.
_ENV_FLAGS = frozenset({"-i", "-", "--ignore-environment", "-v", "--debug"})


def interpreter(script: str, path_env: str | None) -> str | None:
    """The real path of the program that runs ``script`` when it is executed with
    ``path_env`` as PATH: its ``#!`` line's absolute interpreter, or for
    ``#!/usr/bin/env [-S] NAME`` the first executable NAME on that PATH. None for a
    file that is not a script, or a line this does not follow (kept to what is sure)."""
    try:
        fd = os.open(script, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        head = os.read(fd, HEAD)
    except OSError:
        return None
    finally:
        os.close(fd)
    if not head.startswith(b"#!") or b"\n" not in head:
        return None
    try:
        line = head[2 : head.index(b"\n")].decode("utf-8").strip(" \t")
    except UnicodeDecodeError:
        return None
    # The kernel: the interpreter ends at the first blank; the rest is one argument.
    interp, _, rest = line.replace("\t", " ").partition(" ")
    if not os.path.isabs(interp):
        return None
    found: str | None = interp
    if os.path.basename(interp) == "env":
        found = _env_program(rest.strip(" "), path_env)
    if found is None:
        return None
    real = os.path.realpath(found)
    return real if os.path.isfile(real) else None


def _env_program(arg: str, path_env: str | None) -> str | None:
    """What ``env ARG`` executes: ARG itself, or with ``-S`` the first word that is not an
    option or an assignment (a ``PATH=`` one changes the lookup, as with env)."""
    if not arg.startswith("-S"):
        return _lookup(arg, path_env)
    for word in arg[2:].split():
        if any(c in word for c in "\"'\\$"):
            return None  # quoting and expansions: not followed
        if word in _ENV_FLAGS:
            continue
        if word.startswith("-"):
            return None  # an option with an argument (-u, -C) or unknown: not followed
        name, eq, value = word.partition("=")
        if eq:
            if name == "PATH":
                path_env = value
            continue
        return _lookup(word, path_env)
    return None


def _lookup(name: str, path_env: str | None) -> str | None:
    if not name or " " in name:
        return None  # env would look for a program with a blank in its name: it fails
    if "/" in name:
        return name if os.path.isabs(name) else None
    for d in (os.defpath if path_env is None else path_env).split(os.pathsep):
        if not os.path.isabs(d):
            continue  # relative to the agent's cwd: not followed
        candidate = os.path.join(d, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def grantable(directory: str, *, deny: Iterable[str], homes: Iterable[str]) -> bool:
    """May an interpreter's ``directory`` (a real path) be granted read and execute: not in,
    nor holding, a denied path (deny wins), and none of the directories that hold far more
    than a program: the root, a shared temp dir, a home or what holds one."""
    if any(within(directory, d) or within(d, directory) for d in deny):
        return False
    if directory in _SHARED or directory == os.path.realpath(tempfile.gettempdir()):
        return False
    return not any(within(h, directory) for h in (*homes, *_user_homes()))


@functools.cache
def _user_homes() -> tuple[str, ...]:
    """Every account's home (read once: a spawn must not ask the user database each time)."""
    try:
        return tuple({os.path.realpath(p.pw_dir) for p in pwd.getpwall() if p.pw_dir.startswith("/")})
    except OSError:  # pragma: no cover - no user database
        return ()


def interpreter_dirs(
    scripts: Iterable[str],
    env: Mapping[str, str],
    *,
    deny: Iterable[str],
    homes: Iterable[str],
    writable: Iterable[str] = (),
) -> list[str]:
    """The real directories of the interpreters of ``scripts`` (those that are scripts) for
    an agent with ``env``, those that may be granted. An interpreter that is itself a
    script is followed too, as the kernel does, to a few levels.

    A file in ``writable`` (what the agent may write: its cwd, HOME, extra_write) is
    never read for its ``#!`` line, nor granted: the agent could have written that line
    itself, naming any file to have its directory opened at the next start, and what it
    can write it can already run."""
    out: list[str] = []
    deny, homes = tuple(deny), tuple(homes)
    writable = tuple(os.path.realpath(w) for w in writable)
    for script in scripts:
        current = script
        for _ in range(NESTING):
            if any(within(os.path.realpath(current), w) for w in writable):
                break
            found = interpreter(current, env.get("PATH"))
            if found is None or any(within(found, w) for w in writable):
                break
            current, directory = found, os.path.dirname(found)
            if directory not in out and grantable(directory, deny=deny, homes=homes):
                out.append(directory)
    return out


__all__ = ["HEAD", "NESTING", "grantable", "interpreter", "interpreter_dirs"]
