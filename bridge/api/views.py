"""How a thread row is shown to clients (docs/api.md §4.3): the public fields only, and
the daemon's paths as the caller may see them (users mode: a non-admin never sees where the
data dir is; bridge/userdirs.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import HTTPConnection

from bridge.api.context import context
from bridge.api.users import User
from bridge.config import Settings
from bridge.protocols.mcp_servers import redacted
from bridge.store import usage
from bridge.store.base import PUBLIC_THREAD_FIELDS, ThreadRow
from bridge.userdirs import hides_paths, shown, shown_text, users_mode


def _same(text: str) -> str:
    return text


@dataclass(frozen=True, slots=True)
class Shown:
    """How one caller is shown the daemon's paths: ``path`` for a path, ``text`` for a
    message that may hold one."""

    path: Callable[[str], str] = _same
    text: Callable[[str], str] = _same


AS_IS = Shown()


def shown_to(settings: Settings, user: User) -> Shown:
    if not hides_paths(settings, user.admin):
        return AS_IS
    return Shown(
        lambda path: shown(settings, path, admin=user.admin), lambda text: shown_text(settings, text, admin=user.admin)
    )


def shown_message(conn: HTTPConnection, text: str) -> str:
    """An error message as the caller of ``conn`` may read it: in users mode, anyone but an
    admin (a caller not yet known included) reads ``<data-dir>`` for the data dir's path."""
    settings = context(conn).settings
    user = getattr(conn.state, "user", None)
    if not users_mode(settings) or (isinstance(user, User) and user.admin):
        return text
    return shown_text(settings, text, admin=False)


def _options_shown(options: dict[str, Any]) -> dict[str, Any]:
    """A thread's options as any answer shows them: MCP servers' env and header values
    (tokens, keys) replaced, as the agent alone needs them."""
    servers = options.get("mcp_servers")
    return {**options, "mcp_servers": redacted(servers)} if isinstance(servers, list) else options


def thread_view(row: ThreadRow, view: Shown = AS_IS) -> dict[str, Any]:
    out: dict[str, Any] = {k: row.get(k) for k in PUBLIC_THREAD_FIELDS}
    out["options"] = _options_shown(row.get("options") or {})
    out["pending_permissions"] = row.get("pending_permissions") or 0
    out["archived"] = bool(row.get("archived"))  # (a row made before it was read back has none)
    out["usage"] = usage.shown(row.get("usage"))  # (zeros for a thread no turn has ended in)
    if isinstance(fork := row.get("forked_from"), dict):  # (the native fork it keeps is the agent's)
        out["forked_from"] = {"thread": fork.get("thread"), "seq": fork.get("seq")}
    if view is not AS_IS:
        if isinstance(cwd := out.get("cwd"), str):
            out["cwd"] = view.path(cwd)
        if isinstance(wt := out.get("worktree"), dict):  # (its workspace lies in the data dir)
            out["worktree"] = {k: view.path(v) if k in ("repo", "path", "git_dir") else v for k, v in wt.items()}
        last_exit = out.get("last_exit")
        if isinstance(last_exit, dict) and isinstance(last_exit.get("error"), str):
            out["last_exit"] = {**last_exit, "error": view.text(last_exit["error"])}
    return out
