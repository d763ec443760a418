"""``GET /v1/workspace/dirs?path=`` (docs/api.md §4.17): the directories a thread can be
started in, for the page's working-directory picker — the subdirectories of
``[server] workspace_roots`` and nothing outside them.

Confinement is decided on resolved paths (``os.path.realpath``: symlinks followed, ``..``
folded): a path whose real location is not inside a root is refused (403
``path_outside_roots``), whatever it looks like, and a symlink inside a root that points
outside it is left out of a listing. Names only: no file is opened, no content read."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from fastapi import APIRouter, Depends, Query, Request

from bridge.api.auth import require_auth
from bridge.api.context import Ctx
from bridge.api.users import current_user
from bridge.api.views import AS_IS, Shown, shown_to
from bridge.errors import BridgeError, InvalidRequest, NotFound
from bridge.process.launch import within
from bridge.userdirs import given, picker_roots

MAX_ENTRIES = 1000  # subdirectories listed at most (sorted by name; `truncated` says so)

router = APIRouter(prefix="/v1", dependencies=[Depends(require_auth)])


class OutsideRoots(BridgeError):
    code = "path_outside_roots"
    status = 403


def _root_of(real: str, roots: list[str]) -> str | None:
    """The (resolved) root that holds the resolved path ``real``, the deepest if several."""
    holders = [r for r in roots if within(real, r)]
    return max(holders, key=len) if holders else None


def _subdirs(real: str, roots: list[str]) -> tuple[list[dict[str, str]], bool]:
    found: list[dict[str, str]] = []
    with os.scandir(real) as it:
        for entry in it:
            if entry.name.startswith("."):
                continue
            try:
                if not entry.is_dir(follow_symlinks=True):
                    continue
                if entry.is_symlink() and _root_of(os.path.realpath(entry.path), roots) is None:
                    continue  # a way out of the roots: not offered
            except OSError:
                continue
            found.append({"name": entry.name, "path": os.path.join(real, entry.name)})
    found.sort(key=lambda d: d["name"])
    return found[:MAX_ENTRIES], len(found) > MAX_ENTRIES


def _resolve(path: str, roots: list[str]) -> tuple[str, str]:
    """The resolved directory ``path`` names and the root that holds it, or the error."""
    if "\0" in path or not os.path.isabs(path):
        raise InvalidRequest("path must be an absolute directory path", code="bad_path")
    real = os.path.realpath(path)
    root = _root_of(real, roots)
    if root is None:
        raise OutsideRoots("that directory is not inside your workspace roots")
    if not os.path.isdir(real):
        raise NotFound("no such directory", code="not_found")
    return real, root


def listing(roots: list[str], path: str | None, view: Shown = AS_IS) -> dict[str, Any]:
    """What the route answers, its paths as ``view`` shows them; raises the route's errors."""
    real_roots = [os.path.realpath(r) for r in roots if os.path.isdir(r)]
    if path is None:
        dirs = [{"name": view.path(r), "path": view.path(r)} for r in real_roots]
        return {"path": None, "parent": None, "dirs": dirs, "truncated": False}
    real, root = _resolve(path, real_roots)
    try:
        dirs, truncated = _subdirs(real, real_roots)
    except OSError as exc:
        raise NotFound(f"cannot list that directory: {exc.strerror or 'error'}", code="not_found") from None
    parent = None if real == root else view.path(os.path.dirname(real))
    dirs = [{"name": d["name"], "path": view.path(d["path"])} for d in dirs]
    return {"path": view.path(real), "parent": parent, "dirs": dirs, "truncated": truncated}


@router.get("/workspace/dirs")
async def workspace_dirs(
    request: Request, ctx: Ctx, path: str | None = Query(None, max_length=4096, description="an absolute directory")
) -> dict[str, Any]:
    """The roots are the caller's (bridge/userdirs.py): in users mode a non-admin's own
    workspace roots, where their threads' ``cwd`` must lie."""
    settings = ctx.settings
    user = current_user(request)
    view = shown_to(settings, user)
    roots = await asyncio.to_thread(picker_roots, settings, user.owner, user.admin)
    return await asyncio.to_thread(listing, roots, None if path is None else given(settings, path), view)


__all__ = ["listing", "router"]
