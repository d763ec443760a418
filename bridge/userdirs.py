"""Where an agent may run and what it calls home (issue #32; docs/security.md "Users mode:
homes, working directories and paths").

* **The data dir is nobody's working directory.** The token, the database, ``daemon.json``,
  the logs, every user's home and every thread's workspace live there. A thread's ``cwd``
  may lie in it only inside a workspace its creator owns: a thread workspace
  (``<data dir>/workspaces/<thread id>``) of a thread with the same owner, or one of the
  user's own workspace roots that lies in ``<data dir>/workspaces``. Everything is decided
  on the real path (symlinks followed, ``..`` folded), at creation (:func:`check_cwd`,
  which the thread then keeps as its ``cwd``) and again right before each spawn
  (:func:`launch_for_thread`), so a symlink swapped in later does not lead an agent in.
* **Homes** (users mode): each user's agents get ``HOME`` = ``[auth] user_home``
  (``{user}`` replaced by the name; default ``<data dir>/homes/{user}``), created 0700 on
  first need, so their CLI logins, settings and native sessions are their own. The
  operator's threads (no owner) and token mode keep the daemon's HOME.
* **Workspace roots** (users mode): a non-admin's ``cwd`` must lie under ``[auth]
  user_workspace_roots`` (default ``<data dir>/workspaces/users/{user}``) or in a thread
  workspace of their own; a thread created without a ``cwd`` still gets a fresh
  workspace of its own.
* **Paths shown to a non-admin** (users mode): the data dir's location is never shown.
  A path inside it is written ``<data-dir>/…`` (:func:`shown`), and such a path is
  accepted back wherever a client gives a directory (:func:`given`), so the page can
  browse and start threads in the user's roots without knowing where they are.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from bridge.config import Settings
from bridge.errors import Forbidden, InvalidRequest, LaunchRefused
from bridge.process.launch import LaunchSpec, within

DATA_DIR_MARK = "<data-dir>"  # what a non-admin sees in place of the data dir's path
USER = "{user}"
WORKSPACES = "workspaces"
DEFAULT_HOME = f"homes/{USER}"  # under the data dir
DEFAULT_ROOT = f"{WORKSPACES}/users/{USER}"  # under the data dir; "users" is never a thread id
THREAD_ID = re.compile(r"thr_[0-9a-f]{16}")
CWD_NOT_ALLOWED = "cwd_not_allowed"

# A thread id → (whether the thread exists, its owner): the store's answer, for a cwd in
# another thread's workspace.
ThreadOwner = Callable[[str], Awaitable[tuple[bool, str | None]]]


def users_mode(settings: Settings) -> bool:
    return settings.auth.mode == "users"


def _data(settings: Settings) -> str:
    return os.path.realpath(settings.data_dir)


def _fill(template: str, user: str) -> str:
    # A user name is letters, digits and _.@- (api/users.NAME): one path component, never "..".
    return os.path.normpath(os.path.expanduser(template.replace(USER, user)))


def home_of(settings: Settings, user: str) -> str:
    """The user's HOME (not created)."""
    template = settings.auth.user_home or os.path.join(settings.data_dir, DEFAULT_HOME)
    return _fill(template, user)


def roots_of(settings: Settings, user: str) -> list[str]:
    """The user's workspace roots as configured (not created, not resolved)."""
    templates = settings.auth.user_workspace_roots
    if templates is None:
        templates = [os.path.join(settings.data_dir, DEFAULT_ROOT)]
    return [_fill(t, user) for t in templates]


def _private_dir(path: str) -> str:
    """``path`` as a directory, created 0700 (its missing parents too) if it is not there."""
    if not os.path.isdir(path):
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)  # makedirs leaves the last one to the umask
    return path


def ensure_home(settings: Settings, user: str) -> str:
    """The user's HOME, created 0700 on first need."""
    return _private_dir(home_of(settings, user))


def ensure_roots(settings: Settings, user: str) -> list[str]:
    """The user's workspace roots, resolved; the ones missing are created 0700 (a root that
    cannot be created is left out)."""
    out = []
    for root in roots_of(settings, user):
        try:
            _private_dir(root)
        except OSError:
            continue
        out.append(os.path.realpath(root))
    return out


def _real_roots(settings: Settings, user: str | None) -> list[str]:
    if user is None or not users_mode(settings):
        return []  # token mode and the operator have no roots of their own
    return [os.path.realpath(r) for r in roots_of(settings, user)]


def _in_data_roots(settings: Settings, real: str, user: str | None) -> bool:
    """``real`` lies in one of ``user``'s roots that are inside ``<data dir>/workspaces``
    (only there may a root in the data dir open it to a user: never the token's folder)."""
    workspaces = os.path.join(_data(settings), WORKSPACES)
    return any(
        within(real, root) and within(root, workspaces) and root != workspaces for root in _real_roots(settings, user)
    )


def thread_workspace(settings: Settings, real: str) -> str | None:
    """The id of the thread workspace (``<data dir>/workspaces/<thread id>``) that holds the
    real path ``real``, or None."""
    workspaces = os.path.join(_data(settings), WORKSPACES)
    if not within(real, workspaces) or real == workspaces:
        return None
    first = os.path.relpath(real, workspaces).split(os.sep, 1)[0]
    return first if THREAD_ID.fullmatch(first) else None


def _real_dir(cwd: str) -> str:
    if "\x00" in cwd or not os.path.isabs(cwd):
        raise InvalidRequest(f"cwd must be an existing absolute directory: {cwd}", code="bad_cwd")
    real = os.path.realpath(cwd)
    if not os.path.isdir(real):
        raise InvalidRequest(f"cwd must be an existing absolute directory: {cwd}", code="bad_cwd")
    return real


async def check_cwd(settings: Settings, cwd: str, *, owner: str | None, admin: bool, thread_owner: ThreadOwner) -> str:
    """The real path of ``cwd`` (given as a client wrote it, ``<data-dir>/…`` included) if
    the caller may run an agent there; raises ``bad_cwd`` (400) or ``cwd_not_allowed``
    (403). ``owner`` is what the caller's threads record as their owner (None: token mode or
    the operator); ``admin`` frees them from the workspace roots (users mode)."""
    real = _real_dir(given(settings, cwd))
    tid = thread_workspace(settings, real)
    own_workspace = False
    if tid is not None:
        exists, tid_owner = await thread_owner(tid)
        own_workspace = exists and tid_owner == owner
    if within(real, _data(settings)) and not (own_workspace or _in_data_roots(settings, real, owner)):
        raise Forbidden(
            "cwd may not be the daemon's data dir or lie inside it, except in a workspace of your own "
            "(a thread workspace of yours, or your workspace roots)",
            code=CWD_NOT_ALLOWED,
        )
    if users_mode(settings) and not admin and not own_workspace:
        roots = _real_roots(settings, owner)
        if not any(within(real, root) for root in roots):
            raise Forbidden(
                "cwd must lie under your workspace roots ([auth] user_workspace_roots; "
                "GET /v1/workspace/dirs lists them) or in a thread workspace of yours",
                code=CWD_NOT_ALLOWED,
            )
    return real


def spawn_problem(settings: Settings, thread: Mapping[str, Any]) -> str | None:
    """Why the thread's agent may not start in its ``cwd`` now, or None: the checks of
    :func:`check_cwd` again on where the path leads today. A thread keeps the real path it
    was created with, so a path that resolves elsewhere now has had a symlink put on its
    way; it may then lead only into the owner's own workspaces (users mode: their roots
    too)."""
    cwd, owner = thread["cwd"], thread.get("owner")
    real = os.path.realpath(cwd)
    moved = real != os.path.normpath(cwd)
    tid = thread_workspace(settings, real)
    # Another thread's workspace was checked to be the owner's at creation; through a
    # symlink put there later, only this thread's own.
    workspace_ok = tid is not None and (tid == thread["id"] or not moved)
    if within(real, _data(settings)) and not (workspace_ok or _in_data_roots(settings, real, owner)):
        return "the thread's cwd leads into the daemon's data dir, outside the workspaces of its owner"
    if moved and users_mode(settings) and owner is not None and not workspace_ok:
        if not any(within(real, root) for root in _real_roots(settings, owner)):
            return "the thread's cwd now leads (through a symlink) outside its owner's workspace roots"
    return None


def home_env(settings: Settings, owner: str | None) -> dict[str, str]:
    """``{"HOME": …}`` for the agents of ``owner`` (users mode, a user's thread), created
    0700 on first need; empty otherwise (the daemon's own HOME stays)."""
    if owner is None or not users_mode(settings):
        return {}
    try:
        return {"HOME": ensure_home(settings, owner)}
    except OSError as exc:
        raise LaunchRefused(f"the user's home cannot be created: {exc.strerror or exc}", code="home_unusable") from exc


def for_owner(spec: LaunchSpec, settings: Settings, owner: str | None) -> LaunchSpec:
    """``spec`` with the owner's HOME (users mode)."""
    home = home_env(settings, owner)
    return dataclasses.replace(spec, env={**spec.env, **home}) if home else spec


def launch_for_thread(spec: LaunchSpec, settings: Settings, thread: Mapping[str, Any]) -> LaunchSpec:
    """Right before a thread's agent is spawned: its ``cwd`` checked again (LaunchRefused
    ``cwd_not_allowed``), and its owner's HOME."""
    problem = spawn_problem(settings, thread)
    if problem:
        raise LaunchRefused(problem, code=CWD_NOT_ALLOWED)
    return for_owner(spec, settings, thread.get("owner"))


# --------------------------------------------------------------------------- paths shown


def hides_paths(settings: Settings, admin: bool) -> bool:
    """Whether this caller is shown ``<data-dir>/…`` instead of the data dir's path."""
    return users_mode(settings) and not admin


def shown(settings: Settings, path: str, *, admin: bool) -> str:
    """``path`` as this caller may see it: a non-admin (users mode) never sees where the data
    dir is; a path inside it reads ``<data-dir>/…``."""
    if not hides_paths(settings, admin):
        return path
    for data in dict.fromkeys((_data(settings), os.path.normpath(settings.data_dir))):
        if within(path, data):
            return DATA_DIR_MARK + path[len(data.rstrip(os.sep)) :]
    return path


def shown_text(settings: Settings, text: str, *, admin: bool) -> str:
    """A message as this caller may read it (the data dir's path replaced anywhere in it)."""
    if not hides_paths(settings, admin):
        return text
    for data in dict.fromkeys((_data(settings), os.path.normpath(settings.data_dir))):
        text = text.replace(data, DATA_DIR_MARK)
    return text


def given(settings: Settings, path: str) -> str:
    """A directory a client gave: ``<data-dir>/…`` (as :func:`shown` writes it) becomes the
    path it stands for; anything else is returned as it is."""
    if path == DATA_DIR_MARK or path.startswith(DATA_DIR_MARK + "/"):
        return _data(settings) + path[len(DATA_DIR_MARK) :]
    return path


def picker_roots(settings: Settings, user: str | None, admin: bool) -> list[str]:
    """The roots ``GET /v1/workspace/dirs`` offers: a non-admin's own workspace roots (users
    mode); ``[server] workspace_roots`` for the operator and for admins (with their own
    roots in users mode)."""
    mine = ensure_roots(settings, user) if user is not None and users_mode(settings) else []
    if users_mode(settings) and not admin:
        return mine
    return list(dict.fromkeys([*settings.server.workspace_roots, *mine]))


__all__ = [
    "CWD_NOT_ALLOWED",
    "DATA_DIR_MARK",
    "ThreadOwner",
    "check_cwd",
    "ensure_home",
    "ensure_roots",
    "for_owner",
    "given",
    "hides_paths",
    "home_env",
    "home_of",
    "launch_for_thread",
    "picker_roots",
    "roots_of",
    "shown",
    "shown_text",
    "spawn_problem",
    "thread_workspace",
]
