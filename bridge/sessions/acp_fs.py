"""``fs/read_text_file`` and ``fs/write_text_file`` for ACP agents (docs/api.md §7.3),
served strictly inside the thread's working directory.

Every path is resolved (symlinks followed) before the check, so neither ``..`` nor a
symlink that points outside the workspace gets through; a refusal is a JSON-RPC error
the agent can show, never an exception in the bridge.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from bridge.protocols.jsonrpc import ACCESS_DENIED, INVALID_PARAMS, RESOURCE_NOT_FOUND, RpcError

MAX_FILE_BYTES = 16 * 1024 * 1024


class FsError(RpcError):
    """A refusal the agent is answered with: a JSON-RPC error (invalid params, resource not
    found, or access denied for a path outside the working directory; docs/api.md §7.3)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)


def _inside(root: str, path: Any) -> str:
    if not isinstance(path, str) or not os.path.isabs(path) or "\x00" in path:
        raise FsError(INVALID_PARAMS, "path must be an absolute path")
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if os.path.commonpath([real_root, real]) != real_root:
        raise FsError(ACCESS_DENIED, f"access denied: {path} is outside the thread's working directory")
    return real


def _read(root: str, params: dict[str, Any]) -> dict[str, Any]:
    path = _inside(root, params.get("path"))
    line, limit = params.get("line"), params.get("limit")
    for name, value in (("line", line), ("limit", limit)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise FsError(INVALID_PARAMS, f"{name} must be a positive integer")
    try:
        if os.path.getsize(path) > MAX_FILE_BYTES:
            raise FsError(INVALID_PARAMS, f"file is larger than {MAX_FILE_BYTES} bytes")
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except FileNotFoundError as exc:
        raise FsError(RESOURCE_NOT_FOUND, f"Resource not found: {params.get('path')}") from exc
    except IsADirectoryError as exc:
        raise FsError(INVALID_PARAMS, "path is a directory") from exc
    except OSError as exc:
        raise FsError(ACCESS_DENIED, f"cannot read: {exc.strerror}") from exc
    if line is not None or limit is not None:
        lines = text.splitlines(keepends=True)
        start = (line or 1) - 1
        text = "".join(lines[start : start + limit if limit is not None else None])
    return {"content": text}


def _write(root: str, params: dict[str, Any]) -> None:
    path = _inside(root, params.get("path"))
    content = params.get("content")
    if not isinstance(content, str):
        raise FsError(INVALID_PARAMS, "content must be a string")
    data = content.encode("utf-8", "surrogatepass")
    if len(data) > MAX_FILE_BYTES:
        raise FsError(INVALID_PARAMS, f"content is larger than {MAX_FILE_BYTES} bytes")
    if not os.path.isdir(os.path.dirname(path)):
        raise FsError(RESOURCE_NOT_FOUND, f"Resource not found: parent directory of {params.get('path')}")
    try:
        # O_NOFOLLOW: the path was resolved above; a symlink planted since is refused.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    except OSError as exc:
        raise FsError(ACCESS_DENIED, f"cannot write: {exc.strerror}") from exc


async def serve(root: str, method: str, params: dict[str, Any]) -> Any:
    """Result for the request, or raises FsError."""
    if method == "fs/read_text_file":
        return await asyncio.to_thread(_read, root, params)
    await asyncio.to_thread(_write, root, params)
    return None
