"""The sessions an agent itself knows for a directory (issue #17 item 4; docs/api.md
§4.13): ``GET /v1/agents/{name}/sessions``. The I/O around protocols/native_sessions.py
(the CLIs' own session files) and protocols/session_list.py (an ACP agent's ``session/list``).

Never a 500 for the store's sake: a missing or unreadable store, an agent that cannot
list, fails or is too slow, is an empty list with a ``reason``. Bounded everywhere: at
most :data:`MAX_SCAN` directory entries looked at, :data:`~HEAD_BYTES` and
:data:`~TAIL_BYTES` read of a listed file (never a whole file), last activity from the
file's mtime, one ACP agent spawned for at most :data:`ACP_TIMEOUT_S` and always stopped,
:data:`MAX_LISTINGS` of them at a time. Files are untrusted: a symlink (or anything but a
regular file) in the store is skipped, names must be valid session ids (docs/api.md §2.5).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from typing import Any

import structlog

from bridge import __version__
from bridge.config import THREAD_OPTION_KEYS, AgentProfile, Settings
from bridge.errors import BridgeError, InvalidRequest
from bridge.launching import spawn_options
from bridge.process.agent_io import AgentIO, Spawn
from bridge.process.agent_process import AgentProcess
from bridge.process.launch import build_launch, child_env, valid_session_id
from bridge.protocols.codecs import make_codec
from bridge.protocols.framing import LineTooLong
from bridge.protocols.native_sessions import (
    ACP,
    CLAUDE,
    HEAD_BYTES,
    TAIL_BYTES,
    BadCursor,
    NativeSession,
    acp_cursor,
    bounded_title,
    claude_project_dir,
    claude_title,
    iso_from_ns,
    page,
    parse_acp_cursor,
    parse_file_cursor,
    qwen_project_dir,
    qwen_title,
    store_of,
)
from bridge.protocols.session_list import AcpLister, Listed
from bridge.sessions.scrub import Scrubber
from bridge.userdirs import for_owner, home_env

log = structlog.get_logger("bridge.native")

MAX_SCAN = 10_000  # directory entries looked at per listing; past it, "truncated": true
ACP_TIMEOUT_S = 30.0  # spawn → initialize → session/list; real agents take seconds to start
MAX_LISTINGS = 2  # ACP agents spawned for listing at the same time (a 3rd waits its turn)
STOP_GRACE_S = 2.0
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_MAX_ISO = 64


def _files_dir(store: str, env: dict[str, str], cwd: str) -> str | None:
    """Where ``store`` keeps ``cwd``'s session files, from the agent's own environment."""
    home = env.get("HOME")
    if store == CLAUDE:
        base = env.get("CLAUDE_CONFIG_DIR") or (os.path.join(home, ".claude") if home else None)
        return os.path.join(base, "projects", claude_project_dir(cwd)) if base else None
    base = env.get("QWEN_RUNTIME_DIR") or env.get("QWEN_HOME") or (os.path.join(home, ".qwen") if home else None)
    return os.path.join(base, "projects", qwen_project_dir(cwd), "chats") if base else None


def _scan(dfd: int) -> tuple[list[tuple[int, str]], bool]:
    """(mtime_ns, id) of every regular ``<id>.jsonl`` in the directory; and whether the
    scan stopped at :data:`MAX_SCAN`."""
    files: list[tuple[int, str]] = []
    with os.scandir(dfd) as it:
        for n, entry in enumerate(it):
            if n >= MAX_SCAN:
                return files, True
            sid = entry.name[:-6] if entry.name.endswith(".jsonl") else ""
            if not valid_session_id(sid):
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode):
                    files.append((st.st_mtime_ns, sid))
    return files, False


def _windows(dfd: int, name: str) -> tuple[bytes, bytes, bool] | None:
    """The first and last KiBs of a file in the store, never following a symlink."""
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=dfd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        head = os.pread(fd, HEAD_BYTES, 0)
        if st.st_size <= HEAD_BYTES:
            return head, b"", True
        # One byte early: whether the window's first line is whole (protocols/native_sessions.py).
        offset = max(0, st.st_size - TAIL_BYTES - 1)
        return head, os.pread(fd, TAIL_BYTES + 1, offset), offset == 0
    except OSError:
        return None
    finally:
        os.close(fd)


def list_files(store: str, directory: str, limit: int, cursor: str | None) -> dict[str, Any]:
    """One page of a CLI's session files (blocking: run it in a thread)."""
    title_of = claude_title if store == CLAUDE else qwen_title
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return _empty("store_missing", f"no session files for this directory ({store})")
    except OSError as exc:
        return _empty("store_unreadable", f"the session store cannot be read: {exc.strerror or exc}")
    try:
        try:
            files, truncated = _scan(dfd)
        except OSError as exc:
            return _empty("store_unreadable", f"the session store cannot be read: {exc.strerror or exc}")
        chosen, next_cursor = page(files, limit, cursor)
        sessions = []
        for mtime_ns, sid in chosen:
            windows = _windows(dfd, f"{sid}.jsonl")
            title = title_of(windows[0], windows[1], tail_is_whole=windows[2]) if windows else None
            sessions.append(NativeSession(sid, title, iso_from_ns(mtime_ns), store).to_dict())
    finally:
        os.close(dfd)
    return {"sessions": sessions, "next_cursor": next_cursor, "reason": None, "detail": None, "truncated": truncated}


def _empty(reason: str, detail: str) -> dict[str, Any]:
    return {"sessions": [], "next_cursor": None, "reason": reason, "detail": detail, "truncated": False}


def _acp_entry(s: dict[str, Any], cwd: str) -> NativeSession | None:
    sid, where, updated = s.get("sessionId"), s.get("cwd"), s.get("updatedAt")
    if not isinstance(sid, str) or not valid_session_id(sid) or (where is not None and where != cwd):
        return None
    when = updated if isinstance(updated, str) and len(updated) <= _MAX_ISO else None
    return NativeSession(sid, bounded_title(s.get("title")), when, ACP)


def acp_page(listed: Listed, cwd: str, agent_cursor: str | None, skip: int, limit: int) -> dict[str, Any]:
    """Our page of an ACP agent's answer: its sessions checked (valid ids, this cwd),
    bounded, and a cursor that continues inside its page or onto its next one."""
    if listed.reason is not None:
        return _empty(listed.reason, listed.detail or "")
    valid = [e.to_dict() for s in listed.sessions if (e := _acp_entry(s, cwd)) is not None]
    rest = valid[skip:]
    if len(rest) > limit:
        nxt: str | None = acp_cursor(agent_cursor, skip + limit)
    else:
        nxt = acp_cursor(listed.next_cursor, 0) if listed.next_cursor else None
    return {"sessions": rest[:limit], "next_cursor": nxt, "reason": None, "detail": None, "truncated": False}


class NativeSessions:
    """Lists what an agent knows; owns the bound on ACP agents spawned for it."""

    def __init__(self, settings: Settings, *, spawn: Spawn = AgentProcess.spawn) -> None:
        self.settings = settings
        self._spawn = spawn
        self._slots = asyncio.Semaphore(MAX_LISTINGS)

    async def list(
        self, profile: AgentProfile, cwd: str, limit: int, cursor: str | None, *, owner: str | None = None
    ) -> dict[str, Any]:
        """``owner``: whose agents' store to read (users mode: the user's own HOME,
        bridge/userdirs.py); None: the daemon's."""
        if not os.path.isabs(cwd) or not os.path.isdir(cwd):
            raise InvalidRequest(f"cwd must be an existing absolute directory: {cwd}", code="bad_cwd")
        real = os.path.realpath(cwd)  # the CLIs key their stores by the real path
        store = store_of(profile.protocol, profile.executable, profile.args)
        try:
            out = await self._list(store, profile, real, limit, cursor, owner)
        except BadCursor as exc:
            raise InvalidRequest(f"cursor: {exc}", code="invalid_cursor") from exc
        return {"agent": profile.name, "cwd": real, "store": store, **out}

    async def _list(
        self, store: str | None, profile: AgentProfile, cwd: str, limit: int, cursor: str | None, owner: str | None
    ) -> dict[str, Any]:
        if store == ACP:
            agent_cursor, skip = parse_acp_cursor(cursor) if cursor else (None, 0)
            async with self._slots:
                listed = await self._acp_list(profile, cwd, agent_cursor, owner)
            return acp_page(listed, cwd, agent_cursor, skip, limit)
        if cursor is not None:
            parse_file_cursor(cursor)  # a bad cursor is the client's error, whatever the store holds
        if store is None:
            return _empty("no_store", "the bridge knows no session store of this agent")
        try:
            home = home_env(self.settings, owner)
        except BridgeError as exc:
            return _empty("store_unreadable", str(exc))
        directory = _files_dir(store, {**child_env(os.environ, profile.env), **home}, cwd)
        if directory is None:
            return _empty("no_home", "the agent's environment has no HOME")
        return await asyncio.to_thread(list_files, store, directory, limit, cursor)

    async def _acp_list(self, profile: AgentProfile, cwd: str, agent_cursor: str | None, owner: str | None) -> Listed:
        codec = make_codec(
            profile.protocol,
            cwd=cwd,
            executable=profile.executable,
            args=profile.args,
            protocol_flags=profile.protocol_flags,
        )
        try:
            spec = build_launch(
                executable=profile.executable,
                args=profile.args,
                protocol_flags=codec.launch_flags(spawn_options(profile, None, THREAD_OPTION_KEYS)),
                profile_env=profile.env,
                cwd=cwd,
                model=profile.model,
                model_form=codec.model_args,
                resume_id=None,
                mcp_config=profile.mcp_config,
                remote_api_opt_in=profile.remote_api_opt_in,
            )
            spec = for_owner(spec, self.settings, owner)  # the owner's HOME (users mode)
            spec = self.settings.confine(spec, profile)
            proc = await self._spawn(spec)
        except BridgeError as exc:
            return Listed(reason="agent_unavailable", detail=str(exc))
        lister = AcpLister(cwd=cwd, cursor=agent_cursor, auth_method=profile.auth_method, client_version=__version__)
        scrub = Scrubber(profile.env)
        errs = asyncio.create_task(proc.pump_stderr(_discard), name=f"list-stderr-{proc.pid}")
        try:
            listed = await _converse(proc, lister, ACP_TIMEOUT_S)
        finally:
            await proc.stop(STOP_GRACE_S, shutdown_line=codec.encode_shutdown())
            with contextlib.suppress(Exception):
                await asyncio.wait_for(errs, STOP_GRACE_S)
            errs.cancel()
            proc.release()
        if listed.detail:
            listed.detail = scrub.text(listed.detail)
        log.info("agent.sessions_listed", agent=profile.name, pid=proc.pid, reason=listed.reason)
        return listed


async def _discard(_: str) -> None:
    return None


async def _converse(proc: AgentIO, lister: AcpLister, timeout_s: float) -> Listed:
    try:
        async with asyncio.timeout(timeout_s):
            for line in lister.start():
                await proc.write_line(line)
            async for batch in proc.stdout_batches():
                for raw in batch:
                    replies, outcome = lister.feed(raw)
                    for reply in replies:
                        await proc.write_line(reply)
                    if outcome is not None:
                        return outcome
    except TimeoutError:
        return Listed(reason="agent_timeout", detail=f"no session list within {timeout_s:g} s")
    except LineTooLong:
        return Listed(reason="agent_error", detail="the agent wrote a line over the line cap")
    except (BrokenPipeError, ConnectionResetError):
        return Listed(reason="agent_error", detail="the agent closed its input before answering")
    return Listed(reason="agent_error", detail="the agent exited before answering")


__all__ = ["ACP_TIMEOUT_S", "MAX_SCAN", "NativeSessions", "acp_page", "list_files"]
