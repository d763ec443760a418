"""PURE rules of a thread's own git worktree (docs/api.md §4.27): names, where things are,
what its agent may write, and the reading of git's ``-z`` answers. No I/O: the git calls
are sessions/worktree_ops.py's (over process/git.py).

Every byte git prints about a worktree came from files an agent wrote, so each answer is
read as NUL-separated fields (``-z``), never split on newlines or spaces, and a path is
shown as text with its undecodable bytes written ``\\xNN`` (JSON holds no raw bytes).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

BRANCH_PREFIX = "agent-bridge/"
MAX_REF = 256  # a base's name, as a client may give it
MAX_DIFF = 1024 * 1024  # the unified diff's bytes in one answer (GET …/changes)
MAX_FILES = 5000  # files listed in one answer
MAX_MESSAGE = 10_000  # a commit message's characters
OID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # sha1 or sha256, as git prints them
_REF_BAD_CHARS = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")


def branch_for(thread_id: str) -> str:
    return BRANCH_PREFIX + thread_id


def ref_problem(name: str) -> str | None:
    """Why ``name`` is not a base a client may give, or None. git's own ref-name rules
    (git-check-ref-format(1), one-level names allowed: ``main``, an object id), checked
    here before git is asked (it is asked too: ``git check-ref-format``), plus ours: not
    empty, not too long, no leading ``-`` (never an option), no ``@{`` (no reflog
    expressions: a base is a name, not a revision walk)."""
    if not name or len(name) > MAX_REF:
        return f"must be 1 to {MAX_REF} characters"
    if name.startswith("-"):
        return "must not start with '-'"
    if _REF_BAD_CHARS.search(name):
        return "must not hold spaces, control characters or any of ~ ^ : ? * [ \\"
    if ".." in name or "@{" in name or name == "@":
        return "must not hold '..' or '@{' nor be '@'"
    if name.startswith("/") or name.endswith("/") or "//" in name or name.endswith("."):
        return "must not start or end with '/', hold '//' or end with '.'"
    for part in name.split("/"):
        if part.startswith(".") or part.endswith(".lock"):
            return "no part of it may start with '.' or end with '.lock'"
    return None


@dataclass(frozen=True, slots=True)
class Worktree:
    """A thread's worktree as its row keeps it (threads.worktree, JSON)."""

    repo: str  # the working tree the thread was asked for (its top directory)
    path: str  # the worktree: the thread's own workspace
    branch: str  # agent-bridge/<thread id>
    base: str  # the base as asked for (a branch's short name, a tag, an object id)
    base_commit: str  # the commit the worktree started from
    base_ref: str | None  # refs/heads/<name> when the base is a local branch: where merge goes
    git_dir: str  # the repository's common git dir (its objects, refs, config)
    discarded: bool = False  # POST …/changes/discard removed it (the thread stays readable)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def ref(self) -> str:
        return "refs/heads/" + self.branch

    @property
    def admin_dir(self) -> str:
        """The worktree's own directory in the common git dir (its HEAD, index, logs): git
        names it after the worktree's last path component, the thread id."""
        return posixpath.join(self.git_dir, "worktrees", posixpath.basename(self.path))


def from_json(value: Any) -> Worktree | None:
    """The row's worktree, or None (no worktree, or one that no longer reads as one)."""
    if not isinstance(value, Mapping):
        return None
    fields = ("repo", "path", "branch", "base", "base_commit", "git_dir")
    if not all(isinstance(value.get(k), str) and value.get(k) for k in fields):
        return None
    base_ref = value.get("base_ref")
    if not (base_ref is None or isinstance(base_ref, str)):
        return None
    if not value["branch"].startswith(BRANCH_PREFIX) or not OID.fullmatch(value["base_commit"]):
        return None
    return Worktree(**{k: value[k] for k in fields}, base_ref=base_ref, discarded=value.get("discarded") is True)


def grants_of(value: Any) -> tuple[list[str], list[str]]:
    """:func:`grants` for a row's worktree column (nothing for a thread without one)."""
    wt = from_json(value)
    return ([], []) if wt is None else grants(wt)


def grants(wt: Worktree) -> tuple[list[str], list[str]]:
    """What a worktree thread's agent may reach besides its cwd (in the worktree), as (read,
    write) paths for its sandbox: the common git dir to read (objects, refs, config,
    hooks: its own git needs them), and to write the whole worktree and only what its own
    commits write — the object store, its worktree's own directory there (HEAD, index,
    logs), the directory of the agent-bridge/ branches (a ref is replaced by a rename in
    its directory) and its branch's reflog (appended to). Never the repository's config,
    hooks, info, packed-refs, other branches or the main working tree."""
    if wt.discarded:
        return [], []
    git_dir = wt.git_dir
    write = [
        wt.path,  # the whole worktree, when the thread's cwd is a directory in it
        posixpath.join(git_dir, "objects"),
        wt.admin_dir,
        posixpath.join(git_dir, "refs", "heads", BRANCH_PREFIX.rstrip("/")),
        posixpath.join(git_dir, "logs", "refs", "heads", wt.branch),
    ]
    return [git_dir], write


# ---------------------------------------------------------------------- git's answers


def show_path(raw: bytes) -> str:
    """A path git printed, as text: UTF-8, an undecodable byte written ``\\xNN``."""
    return raw.decode("utf-8", "backslashreplace")


def _fields(out: bytes) -> list[bytes]:
    parts = out.split(b"\0")
    if parts and parts[-1] == b"":
        parts.pop()
    return parts


def parse_name_status(out: bytes) -> list[tuple[str, bytes]]:
    """``diff-tree -z --name-status --no-renames``: (status letter, path) pairs."""
    parts = _fields(out)
    return [(parts[i].decode("ascii", "replace")[:1], parts[i + 1]) for i in range(0, len(parts) - 1, 2)]


def parse_numstat(out: bytes) -> dict[bytes, tuple[int | None, int | None]]:
    """``diff-tree -z --numstat --no-renames``: path → (added, deleted) lines; None for
    both on a binary file (git prints ``-``)."""
    stats: dict[bytes, tuple[int | None, int | None]] = {}
    for item in _fields(out):
        added, _, rest = item.partition(b"\t")
        deleted, _, path = rest.partition(b"\t")
        stats[path] = (_count(added), _count(deleted))
    return stats


def _count(field: bytes) -> int | None:
    return int(field) if field.isdigit() else None


def files(names: list[tuple[str, bytes]], stats: Mapping[bytes, tuple[int | None, int | None]]) -> list[dict[str, Any]]:
    status = {"A": "added", "D": "deleted", "M": "modified", "T": "type_changed"}
    out = []
    for letter, path in names[:MAX_FILES]:
        added, deleted = stats.get(path, (None, None))
        out.append(
            {
                "path": show_path(path),
                "status": status.get(letter, "modified"),
                "additions": added,
                "deletions": deleted,
                "binary": added is None,
            }
        )
    return out


def cut_diff(out: bytes, *, truncated: bool, limit: int = MAX_DIFF) -> tuple[str, bool]:
    """The unified diff as text (its content is the files' own: invalid UTF-8 replaced),
    at most ``limit`` bytes, cut after a whole line; True when anything was left out."""
    if len(out) > limit:
        out, truncated = out[:limit], True
    if truncated:
        end = out.rfind(b"\n")
        out = out[: end + 1] if end >= 0 else b""
    return out.decode("utf-8", "replace"), truncated


def parse_merge_tree(out: bytes) -> tuple[str, list[str]]:
    """``merge-tree --write-tree -z --name-only --no-messages``: the tree written and, on a
    conflict, the conflicted paths (each once)."""
    parts = _fields(out)
    tree = parts[0].decode("ascii", "replace") if parts else ""
    seen: dict[str, None] = {}
    for p in parts[1:]:
        if p == b"":
            break  # the informational messages' section (none were asked for)
        seen.setdefault(show_path(p), None)
    return tree, list(seen)


def parse_worktree_list(out: bytes) -> list[dict[str, bytes]]:
    """``worktree list --porcelain -z``: one dict per worktree (``worktree``, ``HEAD``,
    ``branch``, and a key with an empty value for ``bare``/``detached``/``locked``…)."""
    entries: list[dict[str, bytes]] = []
    current: dict[str, bytes] = {}
    for item in out.split(b"\0"):
        if item == b"":
            if current:
                entries.append(current)
            current = {}
            continue
        key, _, value = item.partition(b" ")
        current[key.decode("ascii", "replace")] = value
    if current:
        entries.append(current)
    return entries


def commit_message(text: str) -> str | None:
    """Why a commit message cannot be used, or None."""
    if not text.strip():
        return "must not be empty"
    if len(text) > MAX_MESSAGE:
        return f"must be at most {MAX_MESSAGE} characters"
    if "\x00" in text:
        return "must not hold a NUL character"
    return None


__all__ = [
    "BRANCH_PREFIX",
    "MAX_DIFF",
    "Worktree",
    "branch_for",
    "commit_message",
    "cut_diff",
    "files",
    "from_json",
    "grants",
    "grants_of",
    "parse_merge_tree",
    "parse_name_status",
    "parse_numstat",
    "parse_worktree_list",
    "ref_problem",
    "show_path",
]
