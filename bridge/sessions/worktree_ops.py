"""A thread's own git worktree, the daemon's side (docs/api.md §4.27): made at creation,
its changes read, committed, merged into its base, discarded, removed with the thread.

The rules and the reading of git's answers are sessions/worktree.py's; each git call goes
through process/git.py (one argv, its own environment, nothing the repository names run).
Beyond that, the daemon never lets git find the repository from the worktree: the
worktree's ``.git`` file and its directory in the common git dir are the agent's to write,
so a rewritten ``gitdir``/``commondir`` could point git at a configuration of the agent's
choosing. Every call after creation names the common git dir recorded then (``GIT_DIR``),
the worktree as ``GIT_WORK_TREE`` and an index of the daemon's own (``GIT_INDEX_FILE`` in a
private temp dir): what is shown, committed and merged is read from the files themselves,
not from the stat data of an index the agent could have doctored.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
import tempfile
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import structlog

from bridge.config import AgentProfile
from bridge.errors import Conflict, InvalidRequest
from bridge.process import git
from bridge.process.git import GitError, Result
from bridge.sessions import worktree as rules
from bridge.sessions.worktree import Worktree

log = structlog.get_logger("bridge.worktree")

AUTHOR = ("agent-bridge", "agent-bridge@localhost")  # the daemon's commits: author and committer


# One operation at a time per repository: two threads' merges into one base branch, or a
# thread's commit and its merge, never interleave their reads and ref updates.
_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()


@contextlib.asynccontextmanager
async def locked(wt: Worktree) -> AsyncIterator[None]:
    lock = _locks.get(wt.git_dir)
    if lock is None:
        lock = _locks[wt.git_dir] = asyncio.Lock()
    async with lock:
        yield


class MergeConflict(Conflict):
    """409 ``merge_conflict``: the branch and the base change the same lines; nothing was
    changed. ``files``: the conflicting paths."""

    code = "merge_conflict"

    def __init__(self, files: list[str]) -> None:
        shown = ", ".join(files[:10]) + (f" and {len(files) - 10} more" if len(files) > 10 else "")
        super().__init__(f"the branch conflicts with its base in {len(files)} file(s): {shown}; nothing was changed")
        self.files = files


@dataclass(frozen=True, slots=True)
class Repo:
    """Where one git call runs: the common git dir (None: found from ``cwd``, only at
    creation), a work tree and an index of the call's own, and the drivers to silence."""

    cwd: str
    git_dir: str | None = None
    work_tree: str | None = None
    index: str | None = None
    bare: bool = False
    drivers: tuple[tuple[str, str], ...] = ()

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        pairs = [*git.HARDENED, *self.drivers]
        if self.bare:  # no work tree: attributes only from the git dir's info/, none an agent wrote
            pairs.append(("core.bare", "true"))
        env = {**git.base_env(), **git.overrides_env(pairs)}
        if self.git_dir is not None:
            env["GIT_DIR"] = self.git_dir
        if self.work_tree is not None:
            env["GIT_WORK_TREE"] = self.work_tree
        if self.index is not None:
            env["GIT_INDEX_FILE"] = self.index
        return {**env, **(extra or {})}

    async def run(
        self, *args: str, limit: int = git.OUT_LIMIT, stdin: bytes | None = None, extra: dict[str, str] | None = None
    ) -> Result:
        return await git.run(args, env=self.env(extra), cwd=self.cwd, limit=limit, stdin=stdin)

    async def out(self, *args: str) -> str:
        """A call that must succeed; its one line of output."""
        res = await self.run(*args)
        if not res.ok:
            raise GitError(f"git {args[0]} failed: {res.err or res.code}")
        return res.out.decode("utf-8", "surrogateescape").removesuffix("\n")

    async def oid(self, name: str) -> str | None:
        """The commit ``name`` (a full ref or an object id) names, or None."""
        res = await self.run("rev-parse", "--verify", "--quiet", "--end-of-options", name + "^{commit}")
        oid = res.out.decode("ascii", "replace").strip()
        return oid if res.ok and rules.OID.fullmatch(oid) else None


async def _drivers(cwd: str, git_dir: str | None) -> tuple[tuple[str, str], ...]:
    """The repository's filter drivers, to be emptied (reading configuration runs nothing)."""
    res = await Repo(cwd, git_dir=git_dir, bare=git_dir is not None).run("config", "-z", "--list")
    return tuple(git.driver_overrides(res.out)) if res.ok else ()


async def repo_for(wt: Worktree) -> Repo:
    """The common git dir with no work tree (refs, objects, merges)."""
    return Repo(wt.git_dir, git_dir=wt.git_dir, bare=True, drivers=await _drivers(wt.git_dir, wt.git_dir))


# ---------------------------------------------------------------------- creation


async def _check_base(base: str) -> None:
    problem = rules.ref_problem(base)
    if problem is None:
        res = await Repo("/").run("check-ref-format", "--allow-onelevel", base)
        problem = None if res.ok else "is not a valid ref name (git check-ref-format)"
    if problem:
        raise InvalidRequest(f"base {problem}", code="invalid_ref")


async def _discover(cwd: str) -> tuple[str, str]:
    """(top of the working tree holding ``cwd``, the common git dir), real paths; 400
    ``not_a_git_repository`` when there is none."""
    probe = Repo(cwd)
    top = await probe.run("rev-parse", "--show-toplevel")
    common = await probe.run("rev-parse", "--path-format=absolute", "--git-common-dir")
    if not (top.ok and common.ok) or not top.out.strip():
        why = top.err or common.err or "no working tree"
        raise InvalidRequest(f"cwd is not inside a git working tree: {why}", code="not_a_git_repository")
    paths = [r.out.decode("utf-8", "surrogateescape").removesuffix("\n") for r in (top, common)]
    return os.path.realpath(paths[0]), os.path.realpath(paths[1])


async def _resolve_base(probe: Repo, base: str | None) -> tuple[str, str, str | None]:
    """(the base as shown, its commit, refs/heads/<name> when it is a local branch)."""
    name = base or "HEAD"
    oid = await probe.oid(name)
    if oid is None:
        raise InvalidRequest(f"base {name!r} names no commit in this repository", code="invalid_ref")
    full = (await probe.run("rev-parse", "--verify", "--quiet", "--symbolic-full-name", "--end-of-options", name)).out
    ref = full.decode("utf-8", "surrogateescape").strip()
    base_ref = ref if ref.startswith("refs/heads/") else None
    shown = base if base else (base_ref.removeprefix("refs/heads/") if base_ref else oid)
    return shown, oid, base_ref


def granted(profile: AgentProfile, value: Any) -> AgentProfile:
    """``profile`` as a thread with the worktree ``value`` (its row's column) runs it: its
    sandbox also grants what the agent's own git needs of the repository (worktree.grants)."""
    read, write = rules.grants_of(value)
    if not (read or write):
        return profile
    return profile.model_copy(
        update={
            "sandbox_extra_read": [*profile.sandbox_extra_read, *read],
            "sandbox_extra_write": [*profile.sandbox_extra_write, *write],
        }
    )


@dataclass(frozen=True, slots=True)
class Planned:
    """A worktree checked and resolved, not made yet (:func:`plan`); ``cwd``: the thread's."""

    worktree: Worktree
    cwd: str
    drivers: tuple[tuple[str, str], ...]
    start: str | None = None  # the commit it is checked out at, when not its base_commit (a fork's)


async def plan(
    cwd: str, base: str | None, thread_id: str, path: str, allowed: Callable[[str], Awaitable[str]]
) -> Planned:
    """A worktree of the repository holding ``cwd``, to be made at ``path`` (the thread's
    workspace) on a new branch agent-bridge/<thread id> from ``base`` (default: the
    current HEAD); the thread's cwd in it is the place ``cwd`` has in the repository.
    ``allowed`` checks a path the caller may run an agent in (it raises otherwise): the
    repository's top and its git dir, which the agent will read, must be such paths. 400
    ``invalid_ref`` for a bad or unknown base, ``not_a_git_repository``."""
    if base is not None:
        await _check_base(base)
    top, git_dir = await _discover(cwd)
    for p in (top, git_dir):
        await allowed(p)
    rel = os.path.relpath(os.path.realpath(cwd), top)
    if rel.startswith(".."):
        raise InvalidRequest("cwd lies outside its repository's working tree", code="not_a_git_repository")
    shown, oid, base_ref = await _resolve_base(Repo(top, drivers=await _drivers(top, None)), base)
    wt = Worktree(
        repo=top,
        path=path,
        branch=rules.branch_for(thread_id),
        base=shown,
        base_commit=oid,
        base_ref=base_ref,
        git_dir=git_dir,
    )
    return Planned(wt, os.path.normpath(os.path.join(path, rel)), await _drivers(git_dir, git_dir))


async def plan_fork(
    source: Worktree, thread_id: str, path: str, source_cwd: str, allowed: Callable[[str], Awaitable[str]]
) -> Planned:
    """A fork's own worktree (docs/api.md §4.26): at ``path`` on agent-bridge/<thread id>,
    checked out at the commit the source's branch holds now, with the source's base and
    base commit (its changes are read against the same base, the source's commits among
    them); its cwd has the place in it the source's has in the source's. What the source
    has not committed stays there: its agent may be writing those files this moment, and
    a commit is the one state of them that is whole. The repository is checked again for
    the caller, as :func:`plan` checks it. 409 ``branch_missing`` when the source's branch
    is gone."""
    for p in (source.repo, source.git_dir):
        await allowed(p)
    repo = await repo_for(source)
    tip = await repo.oid(source.ref)
    if tip is None:
        raise Conflict(f"the source's branch {source.branch} is gone", code="branch_missing")
    rel = os.path.relpath(os.path.realpath(source_cwd), source.path)
    if rel.startswith(".."):  # (a cwd the source's row holds outside its worktree: its top)
        rel = "."
    wt = replace(source, path=path, branch=rules.branch_for(thread_id), discarded=False)
    return Planned(wt, os.path.normpath(os.path.join(path, rel)), repo.drivers, start=tip)


async def make(planned: Planned) -> Worktree:
    """``git worktree add`` of a planned worktree, checked to be where it was asked for."""
    wt = planned.worktree
    repo = Repo(wt.git_dir, git_dir=wt.git_dir, drivers=planned.drivers)
    start = planned.start or wt.base_commit
    res = await repo.run(
        "worktree", "add", "--quiet", "--no-track", "-b", wt.branch, "--end-of-options", wt.path, start
    )
    if not res.ok:
        # git makes the branch before it checks the files out, and leaves it when the
        # checkout fails: it is this new thread's name, so it goes too (and whatever of the
        # worktree git left).
        with contextlib.suppress(Exception):
            await remove(wt, keep_branch=False)
        raise InvalidRequest(f"git worktree add failed: {res.err}", code="worktree_failed")
    if not _points_back(wt):
        await remove(wt, keep_branch=False)
        raise GitError("git made the worktree somewhere other than expected")
    os.makedirs(planned.cwd, exist_ok=True)  # a directory the base commit does not hold
    log.info("worktree.created", branch=wt.branch, base=wt.base_commit, start=start)
    return wt


@contextlib.asynccontextmanager
async def made(planned: Planned | None) -> AsyncIterator[dict[str, Any] | None]:
    """The worktree made for a thread being created (its row's column), removed again,
    branch and all, if the creation fails after it; None without one."""
    if planned is None:
        yield None
        return
    wt = await make(planned)
    try:
        yield wt.to_json()
    except BaseException:
        await remove(wt, keep_branch=False)
        raise


async def on_delete(value: Any, thread_id: str) -> None:
    """A deleted thread's worktree goes (its files and its entry in the repository); its
    branch stays, with whatever was committed on it. Never fails the deletion."""
    wt = rules.from_json(value)
    if wt is None or wt.discarded:
        return
    try:
        await remove(wt, keep_branch=True)
    except Exception as exc:
        log.warning("worktree.not_removed", thread_id=thread_id, error=str(exc))


def _points_back(wt: Worktree) -> bool:
    try:
        with open(os.path.join(wt.path, ".git"), encoding="utf-8", errors="surrogateescape") as f:
            gitdir = f.read(8192).strip()
    except OSError:
        return False
    return gitdir == f"gitdir: {wt.admin_dir}"


# ---------------------------------------------------------------------- the worktree's state


@dataclass(frozen=True, slots=True)
class Snapshot:
    tip: str  # the branch's commit
    tip_tree: str
    tree: str  # the worktree's files as a tree (committed, uncommitted and untracked)


@contextlib.asynccontextmanager
async def _own_index() -> AsyncIterator[str]:
    tmp = tempfile.mkdtemp(prefix="agent-bridge-index-")
    try:
        yield os.path.join(tmp, "index")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def snapshot(wt: Worktree, repo: Repo) -> Snapshot:
    """The branch's tip and the worktree's files written as a tree (their blobs go to the
    object store; nothing else of the repository changes)."""
    tip = await repo.oid(wt.ref)
    if tip is None:
        raise Conflict(f"the thread's branch {wt.branch} is gone", code="branch_missing")
    if not os.path.isdir(wt.path):
        raise Conflict("the thread's worktree is gone", code="worktree_missing")
    tip_tree = await repo.out("rev-parse", "--verify", "--end-of-options", tip + "^{tree}")
    async with _own_index() as index:
        files = replace(repo, cwd=wt.path, work_tree=wt.path, index=index, bare=False)
        for args in (("read-tree", "--end-of-options", tip), ("add", "--all", "--ignore-errors")):
            res = await files.run(*args)
            if not res.ok and args[0] == "read-tree":
                raise GitError(f"git {args[0]} failed: {res.err}")
        tree = await files.out("write-tree")
    return Snapshot(tip, tip_tree, tree)


async def _diff_base(wt: Worktree, repo: Repo, tip: str) -> str:
    """What the changes are read against: where the branch left its base branch (the merge
    base: after a merge only what came since shows), else the commit it started from."""
    if wt.base_ref is None:
        return wt.base_commit
    res = await repo.run("merge-base", "--end-of-options", wt.base_ref, tip)
    oid = res.out.decode("ascii", "replace").strip()
    return oid if res.ok and rules.OID.fullmatch(oid) else wt.base_commit


async def changes(wt: Worktree) -> dict[str, Any]:
    repo = await repo_for(wt)
    snap = await snapshot(wt, repo)
    start = await _diff_base(wt, repo, snap.tip)
    common = ("diff-tree", "-r", "-z", "--no-renames", "--no-ext-diff", "--no-textconv")
    names = await repo.run(*common, "--name-status", "--end-of-options", start, snap.tree)
    stats = await repo.run(*common, "--numstat", "--end-of-options", start, snap.tree)
    patch = await repo.run(
        "diff-tree", "-r", "-p", "--no-renames", "--no-ext-diff", "--no-textconv", "--no-color",
        "--end-of-options", start, snap.tree, limit=rules.MAX_DIFF + 1,
    )  # fmt: skip
    for res in (names, stats):
        if not res.ok:
            raise GitError(f"git diff-tree failed: {res.err}")
    listed = rules.parse_name_status(names.out)
    diff, cut = rules.cut_diff(patch.out, truncated=patch.truncated)
    out: dict[str, Any] = {
        "base": wt.base,
        "base_commit": start,
        "branch": wt.branch,
        "head": snap.tip,
        "uncommitted": snap.tree != snap.tip_tree,
        "files": rules.files(listed, rules.parse_numstat(stats.out)),
        "diff": diff,
    }
    if cut:
        out["truncated"] = True
    if len(listed) > rules.MAX_FILES:
        out["files_truncated"] = len(listed)
    return out


def _identity(extra_name: str) -> dict[str, str]:
    name, email = AUTHOR
    return {
        "GIT_AUTHOR_NAME": f"{name} ({extra_name})",
        "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
    }


async def commit(wt: Worktree, message: str, thread_id: str) -> dict[str, Any]:
    """The worktree's changes as one commit on its branch (409 ``nothing_to_commit``)."""
    problem = rules.commit_message(message)
    if problem:
        raise InvalidRequest(f"message {problem}", code="invalid_request")
    repo = await repo_for(wt)
    snap = await snapshot(wt, repo)
    if snap.tree == snap.tip_tree:
        raise Conflict("the worktree has no changes beyond its branch", code="nothing_to_commit")
    res = await repo.run(
        "commit-tree", "--no-gpg-sign", "-p", snap.tip, "-F", "-", "--end-of-options", snap.tree,
        stdin=message.encode("utf-8", "surrogateescape"), extra=_identity(thread_id),
    )  # fmt: skip
    new = res.out.decode("ascii", "replace").strip()
    if not res.ok or not rules.OID.fullmatch(new):
        raise GitError(f"git commit-tree failed: {res.err}")
    await _move(repo, wt.ref, new, snap.tip, "agent-bridge: commit", code="branch_moved")
    # The agent's own index follows its branch, so that its git status shows nothing staged
    # the wrong way round (its directory is the agent's: a failure here changes nothing else).
    own = replace(repo, cwd=wt.path, work_tree=wt.path, index=os.path.join(wt.admin_dir, "index"), bare=False)
    refreshed = await own.run("read-tree", "--end-of-options", new)
    if not refreshed.ok:
        log.info("worktree.index_not_refreshed", thread_id=thread_id, error=refreshed.err)
    return {"commit": new, "branch": wt.branch}


async def _move(repo: Repo, ref: str, new: str, old: str, why: str, *, code: str) -> None:
    """``ref`` from ``old`` to ``new``, only if it is still at ``old`` (409 ``code``)."""
    res = await repo.run("update-ref", "-m", why, "--end-of-options", ref, new, old)
    if not res.ok:
        raise Conflict(f"{ref} moved meanwhile: {res.err}", code=code)


# ---------------------------------------------------------------------- merge


async def merge(wt: Worktree, thread_id: str) -> dict[str, Any]:
    """The branch merged into its base branch in the original repository: a fast-forward
    where it can be, else a merge commit (by the daemon). A conflict is 409
    ``merge_conflict`` with the files and changes nothing: the merge is computed with
    ``merge-tree --write-tree`` (objects only) before any ref or file is touched. Where the
    base branch is checked out in the repository's main working tree, that tree and its
    index follow the merge as ``git merge`` would move them, unless local changes there
    would be overwritten (409 ``base_not_clean``, nothing changed)."""
    if wt.base_ref is None:
        raise Conflict(f"the base {wt.base!r} is not a local branch: nothing to merge into", code="base_not_a_branch")
    repo = await repo_for(wt)
    snap = await snapshot(wt, repo)
    if snap.tree != snap.tip_tree:
        raise Conflict("the worktree has uncommitted changes: commit or discard them first", code="uncommitted_changes")
    target = await repo.oid(wt.base_ref)
    if target is None:
        raise Conflict(f"the base branch {wt.base_ref} is gone", code="base_missing")
    if (await repo.run("merge-base", "--is-ancestor", snap.tip, target)).ok:
        raise Conflict(f"{wt.base_ref} already holds everything on {wt.branch}", code="nothing_to_merge")
    fast = (await repo.run("merge-base", "--is-ancestor", target, snap.tip)).ok
    new = snap.tip if fast else await _merge_commit(wt, repo, target, snap.tip, thread_id)
    checkout = await _checked_out(wt, repo)
    why = f"agent-bridge: merge {wt.branch}"
    if checkout is None:
        await _move(repo, wt.base_ref, new, target, why, code="base_moved")
    else:
        await _merge_checked_out(repo, checkout, wt.base_ref, target, new, why)
    log.info("worktree.merged", thread_id=thread_id, base=wt.base_ref, commit=new, fast_forward=fast)
    return {"merged": True, "commit": new, "fast_forward": fast, "base": wt.base, "base_ref": wt.base_ref}


async def _merge_commit(wt: Worktree, repo: Repo, target: str, tip: str, thread_id: str) -> str:
    res = await repo.run(
        "merge-tree", "--write-tree", "-z", "--name-only", "--no-messages", "--end-of-options", target, tip
    )
    tree, conflicted = rules.parse_merge_tree(res.out)
    if res.code == 1:
        raise MergeConflict(conflicted)
    if not res.ok or not rules.OID.fullmatch(tree):
        raise GitError(f"git merge-tree failed: {res.err}")
    message = f"Merge branch '{wt.branch}' into {wt.base_ref.removeprefix('refs/heads/') if wt.base_ref else ''}\n"
    made = await repo.run(
        "commit-tree", "--no-gpg-sign", "-p", target, "-p", tip, "-F", "-", "--end-of-options", tree,
        stdin=message.encode(), extra=_identity(thread_id),
    )  # fmt: skip
    new = made.out.decode("ascii", "replace").strip()
    if not made.ok or not rules.OID.fullmatch(new):
        raise GitError(f"git commit-tree failed: {made.err}")
    return new


async def _checked_out(wt: Worktree, repo: Repo) -> str | None:
    """The main working tree's top when it has the base branch checked out, else None;
    409 ``base_checked_out`` when another linked worktree has it (merge there)."""
    # (Not as a bare repository: that would list the main working tree as bare, branchless.)
    res = await replace(repo, bare=False).run("worktree", "list", "--porcelain", "-z")
    if not res.ok:
        raise GitError(f"git worktree list failed: {res.err}")
    entries = rules.parse_worktree_list(res.out)
    want = wt.base_ref.encode() if wt.base_ref else b""
    for i, entry in enumerate(entries):
        if entry.get("branch") != want:
            continue
        where = entry.get("worktree", b"").decode("utf-8", "surrogateescape")
        if i == 0 and "bare" not in entry:
            return where
        raise Conflict(f"{wt.base_ref} is checked out in the worktree {where}: merge there", code="base_checked_out")
    return None


async def _merge_checked_out(repo: Repo, top: str, ref: str, old: str, new: str, why: str) -> None:
    """The base branch, checked out in the main working tree, moved from ``old`` to
    ``new`` with its index and files (a two-tree ``read-tree -m -u``, which keeps local
    changes that do not touch what the merge changes and refuses the rest): tried first
    (``-n``), then the ref (compare-and-swap), then the files."""
    tree = replace(repo, cwd=top, work_tree=top, index=None, bare=False)
    await tree.run("update-index", "-q", "--refresh")  # stat data only: a touched file is not a change
    trial = await tree.run("read-tree", "-m", "-u", "-n", "--end-of-options", old, new)
    if not trial.ok:
        raise Conflict(
            f"{ref} is checked out in {top} with local changes the merge would overwrite: {trial.err}",
            code="base_not_clean",
        )
    await _move(repo, ref, new, old, why, code="base_moved")
    done = await tree.run("read-tree", "-m", "-u", "--end-of-options", old, new)
    if not done.ok:  # changed meanwhile: the ref goes back, the files were not touched
        await repo.run("update-ref", "-m", "agent-bridge: merge undone", "--end-of-options", ref, old, new)
        raise Conflict(f"the working tree {top} changed during the merge: {done.err}", code="base_not_clean")


# ---------------------------------------------------------------------- removal


def _rmtree(path: str) -> None:
    """Remove a tree an agent wrote (symlinks removed, never followed; a directory it made
    unreadable opened up first)."""

    def again(func: Callable[..., Any], p: str, _exc: Any) -> None:
        parent = os.path.dirname(p)
        with contextlib.suppress(OSError):
            os.chmod(parent, stat.S_IRWXU)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, stat.S_IRWXU)
                shutil.rmtree(p, ignore_errors=True)
            else:
                func(p)

    if os.path.lexists(path):
        shutil.rmtree(path, onerror=again)


async def remove(wt: Worktree, *, keep_branch: bool) -> None:
    """The worktree's files and its directory in the git dir removed (the repository then
    knows no such worktree); the branch too unless ``keep_branch``."""
    await asyncio.to_thread(_rmtree, wt.path)
    admin = wt.admin_dir
    if os.path.dirname(admin) == os.path.join(wt.git_dir, "worktrees"):
        await asyncio.to_thread(_rmtree, admin)
    if not keep_branch:
        repo = await repo_for(wt)
        res = await repo.run("update-ref", "-m", "agent-bridge: discard", "-d", "--end-of-options", wt.ref)
        if not res.ok and await repo.oid(wt.ref) is not None:
            raise GitError(f"git update-ref -d failed: {res.err}")


__all__ = [
    "MergeConflict",
    "Planned",
    "changes",
    "commit",
    "granted",
    "locked",
    "made",
    "make",
    "merge",
    "on_delete",
    "plan",
    "plan_fork",
    "remove",
]
