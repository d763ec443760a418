"""The git CLI as the daemon runs it (a thread's own worktree: docs/api.md §4.27).

Everything a repository holds is untrusted: an agent runs model-chosen commands in its
worktree and may plant ``.gitattributes`` filters, hooks, configuration, symlinks, huge
files and odd file names. So each of the daemon's git calls is one argv (no shell), with:

* an environment of its own: no system or global configuration (``GIT_CONFIG_NOSYSTEM``,
  ``GIT_CONFIG_GLOBAL=/dev/null``), no system attributes, no pager, no prompt, no optional
  locks, no replace refs, the C locale; nothing of the daemon's own environment but PATH;
* configuration given on the command line's level (``GIT_CONFIG_COUNT``, which outranks
  every file) that turns off whatever would run a program: hooks (``core.hooksPath``
  =/dev/null), the file system monitor, signing, the external diff, and every filter
  driver the repository's configuration names (its clean/smudge/process commands emptied:
  git runs no filter whose command is empty);
* an explicit ``GIT_DIR`` wherever the repository is known (never found by walking up
  from a directory an agent may write: a ``.git`` file or a ``commondir`` it rewrote would
  lead git to a configuration of its choosing);
* a timeout (the process group is killed), stdout read up to a bound (the rest is
  dropped and the process killed: ``truncated``), stderr bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bridge.errors import BridgeError

TIMEOUT_S = 60.0  # any one git call; a repository too large for it is refused, not waited for
OUT_LIMIT = 16 * 1024 * 1024  # stdout read at most (a caller may ask for less)
ERR_LIMIT = 64 * 1024  # stderr kept for the message
_CHUNK = 64 * 1024

# Settings that outrank the repository's own files: nothing the daemon runs starts a program.
HARDENED: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.untrackedCache", "false"),
    ("core.splitIndex", "false"),
    ("core.attributesFile", "/dev/null"),
    ("core.excludesFile", "/dev/null"),
    ("core.pager", "cat"),
    ("core.quotePath", "true"),  # diff headers keep odd names as octal escapes: ASCII
    ("core.sshCommand", "false"),
    ("core.askPass", ""),
    ("credential.helper", ""),
    ("protocol.allow", "never"),
    ("diff.external", ""),
    ("diff.noprefix", "false"),
    ("diff.mnemonicPrefix", "false"),
    ("diff.relative", "false"),
    ("color.ui", "false"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("submodule.recurse", "false"),
    ("advice.detachedHead", "false"),
    ("init.defaultBranch", "main"),
)

# A filter driver's commands: emptied for every driver the configuration names.
_FILTER_KEY = re.compile(r"filter\.(.+)\.(clean|smudge|process|required)", re.DOTALL)


class GitError(BridgeError):
    """A git call failed (the daemon's own side: a timeout, git missing, an answer it could
    not read)."""

    code = "git_failed"
    status = 500


@dataclass(frozen=True, slots=True)
class Result:
    code: int
    out: bytes
    err: str
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.code == 0


def base_env(path: str | None = None) -> dict[str, str]:
    """The environment of every git call, before the repository's place and overrides."""
    return {
        "PATH": path if path is not None else os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/nonexistent",  # no ~/.gitconfig, no XDG files (GIT_CONFIG_GLOBAL says so too)
        "XDG_CONFIG_HOME": "/nonexistent",
        "LANG": "C",
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_PAGER": "cat",
        "PAGER": "cat",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_NO_REPLACE_OBJECTS": "1",
        "GIT_ADVICE": "0",
        "GIT_EDITOR": "false",
    }


def overrides_env(pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """``pairs`` as GIT_CONFIG_COUNT variables: each key and value its own variable, so no
    name (a driver's may hold ``=`` or a newline) is ever parsed out of a string."""
    env = {"GIT_CONFIG_COUNT": str(len(pairs))}
    for i, (key, value) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


def driver_overrides(config_list: bytes) -> list[tuple[str, str]]:
    """From ``git config -z --list``: every filter driver's commands emptied and the driver
    made optional (an empty command runs nothing; a required one would fail the call)."""
    out: dict[tuple[str, str], str] = {}
    for item in config_list.split(b"\0"):
        key = item.split(b"\n", 1)[0].decode("utf-8", "surrogateescape")
        m = _FILTER_KEY.fullmatch(key)
        if m is None:
            continue
        name = m.group(1)
        for var, value in (("clean", ""), ("smudge", ""), ("process", ""), ("required", "false")):
            out[(name, var)] = value
    return [(f"filter.{name}.{var}", value) for (name, var), value in out.items()]


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def _read(stream: asyncio.StreamReader, limit: int, *, drain: bool = False) -> tuple[bytes, bool]:
    """Up to ``limit`` bytes of ``stream``; True when there was more. With ``drain`` the rest
    is read and dropped (stderr: git must never block on a full pipe), else reading stops."""
    buf = bytearray()
    more = False
    while True:
        chunk = await stream.read(_CHUNK)
        if not chunk:
            return bytes(buf), more
        room = limit - len(buf)
        if len(chunk) > room:
            buf += chunk[: max(room, 0)]
            more = True
            if not drain:
                return bytes(buf), more
            continue
        buf += chunk


async def run(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    timeout: float = TIMEOUT_S,
    limit: int = OUT_LIMIT,
    stdin: bytes | None = None,
    git: str = "git",
) -> Result:
    """``git ARGS`` with exactly ``env``; its exit status, stdout (at most ``limit`` bytes;
    ``truncated`` when git had more, and it is then killed) and stderr's head. Raises
    GitError when git cannot be run or outlasts ``timeout``."""
    try:
        proc = await asyncio.create_subprocess_exec(
            git,
            *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,  # its own group: a timeout kills whatever it started too
        )
    except OSError as exc:
        raise GitError(f"git cannot be run: {exc.strerror or exc}") from exc
    assert proc.stdout is not None and proc.stderr is not None
    try:
        async with asyncio.timeout(timeout):
            if stdin is not None:
                assert proc.stdin is not None
                proc.stdin.write(stdin)
                with contextlib.suppress(ConnectionError):
                    await proc.stdin.drain()
                proc.stdin.close()
            errors = asyncio.ensure_future(_read(proc.stderr, ERR_LIMIT, drain=True))
            try:
                out, more = await _read(proc.stdout, limit)
                if more:  # enough: git would otherwise wait on a pipe nobody reads
                    _kill(proc)
                err, _ = await errors
            finally:
                errors.cancel()
            code = await proc.wait()
    except TimeoutError:
        _kill(proc)
        await proc.wait()
        raise GitError(f"git {args[0] if args else ''} took longer than {timeout:g} s") from None
    except BaseException:
        _kill(proc)
        with contextlib.suppress(Exception):
            await proc.wait()
        raise
    return Result(code, out, err.decode("utf-8", "replace").strip(), truncated=more)


__all__ = ["HARDENED", "GitError", "Result", "base_env", "driver_overrides", "overrides_env", "run"]
