"""A thread's own git worktree end to end (issue #38 item 3, docs/api.md §4.27): a real
daemon, a real git, an agent (tests/agents/git_agent.py) that edits files and runs git in
its cwd under the sandbox (Landlock here), and a repository the daemon must treat as
hostile once the agent has had its way with the worktree."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import PYTHON, ROOT, STEP_TIMEOUT, Daemon
from test_users_e2e import add_user, bearer

from bridge.process import bwrap
from bridge.process.sandbox import landlock_abi
from bridge.sessions.worktree import MAX_DIFF

pytestmark = pytest.mark.timeout(120)

GIT_AGENT = ROOT / "tests" / "agents" / "git_agent.py"
IDENTITY = {
    "GIT_AUTHOR_NAME": "agent",
    "GIT_AUTHOR_EMAIL": "agent@example.invalid",
    "GIT_COMMITTER_NAME": "agent",
    "GIT_COMMITTER_EMAIL": "agent@example.invalid",
}
# The test's own git calls: nothing of the repository's runs in them either.
SAFE = ["-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false"]
for _name in ("marker",):
    SAFE += ["-c", f"filter.{_name}.clean=", "-c", f"filter.{_name}.smudge=", "-c", f"filter.{_name}.process="]


def config(extra: str = "", mechanism: str = "landlock") -> str:
    env = ", ".join(f"{k} = {json.dumps(v)}" for k, v in IDENTITY.items())
    return (
        "[server]\nstop_grace_s = 2\n\n"
        "[agents.git]\n"
        'protocol = "stream-json"\n'
        f"executable = {json.dumps(PYTHON)}\n"
        f"args = {json.dumps(['-I', str(GIT_AGENT)])}\n"
        'protocol_flags = ["--output-format", "stream-json", "--input-format", "stream-json", "--verbose"]\n'
        f"env = {{ {env} }}\n"
        "memory_estimate_mb = 32\n"
        # Its own sandbox: nothing of the test's temp dir (where the repository is) granted.
        f'\n[sandbox]\nmode = "{mechanism}"\nextra_read = [{json.dumps(str(GIT_AGENT.parent))}]\n' + extra
    )


def git(cwd: Path | str, *args: str, check: bool = True) -> str:
    done = subprocess.run(
        ["git", *SAFE, *args],
        cwd=cwd,
        capture_output=True,
        check=False,
        env={**os.environ, **IDENTITY, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"},
    )
    if check:
        assert done.returncode == 0, (args, done.stderr)
    return done.stdout.decode("utf-8", "surrogateescape")


def make_repo(where: Path) -> Path:
    where.mkdir(parents=True)
    git(where, "init", "-q", "-b", "main")
    (where / "a.txt").write_text("one\ntwo\nthree\n")
    (where / "sub").mkdir()
    (where / "sub" / "b.txt").write_text("bee\n")
    git(where, "add", "-A")
    git(where, "commit", "-qm", "init")
    return where


def state(repo: Path) -> dict[str, Any]:
    """Everything a merge must leave alone when it refuses: refs, HEAD, the index's bytes,
    status, and every file of the working tree (hashed)."""
    files = {}
    for path in sorted(repo.rglob("*")):
        if ".git" in path.relative_to(repo).parts or not path.is_file():
            continue
        files[str(path.relative_to(repo))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return {
        "status": git(repo, "status", "--porcelain=v2", "-z", "--untracked-files=all"),
        "head": (repo / ".git" / "HEAD").read_text(),
        "refs": git(repo, "for-each-ref", "--format=%(refname) %(objectname)"),
        "index": hashlib.sha256((repo / ".git" / "index").read_bytes()).hexdigest(),
        "files": files,
    }


async def start(daemon_factory: Any, tmp_path: Path, extra: str = "", mechanism: str = "landlock") -> Daemon:
    if mechanism == "landlock" and landlock_abi() < 2:
        pytest.skip("this kernel has no Landlock")
    if mechanism == "bubblewrap" and bwrap.find() is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    d: Daemon = await daemon_factory(config(extra, mechanism), extra_env={"HOME": str(home)})
    return d


async def create(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    r = await http.post("/v1/threads", json={"agent": "git", **body})
    assert r.status_code == 201, r.text
    return dict(r.json())


async def turn(http: httpx.AsyncClient, thread: str, steps: list[dict[str, Any]]) -> list[Any]:
    """One turn of the git agent; its results, one per step."""
    r = await http.post(f"/v1/threads/{thread}/messages", json={"text": json.dumps(steps)})
    assert r.status_code == 202, r.text
    after = r.json()["seq"]
    deadline = time.monotonic() + STEP_TIMEOUT * 2
    report: list[Any] | None = None
    while time.monotonic() < deadline:
        r = await http.get(f"/v1/threads/{thread}/events", params={"after": after, "wait": 5})
        assert r.status_code == 200, r.text
        for e in r.json()["events"]:
            after = e["seq"]
            if e["kind"] == "message" and e["source"] == "agent":
                report = list(json.loads(e["data"]["text"]))
            if e["kind"] == "turn.ended":
                assert e["data"]["status"] == "success", e
                assert report is not None
                return report
    raise AssertionError("the agent's turn did not end")


@pytest.mark.parametrize("store_kind", ["sqlite", "postgresql"])
async def test_a_worktree_thread_edits_commits_merges_and_discards(
    daemon_factory: Any, tmp_path: Path, store_kind: str, request: pytest.FixtureRequest
) -> None:
    repo = make_repo(tmp_path / "repo")
    extra = ""
    if store_kind == "postgresql":
        extra = f"\n[store]\nurl = {json.dumps(str(request.getfixturevalue('pg_url')))}\n"
    d = await start(daemon_factory, tmp_path, extra)
    async with d.http() as http:
        thread = await create(http, cwd=str(repo / "sub"), worktree=True)
        tid = thread["id"]
        wt = thread["worktree"]
        main = git(repo, "rev-parse", "main").strip()
        assert wt["branch"] == f"agent-bridge/{tid}" and wt["base"] == "main" and wt["base_commit"] == main
        assert wt["repo"] == str(repo.resolve()) and wt["base_ref"] == "refs/heads/main"
        assert wt["path"] == str((d.data_dir / "workspaces" / tid).resolve())
        assert thread["cwd"] == os.path.join(wt["path"], "sub")
        assert (await http.get(f"/v1/threads/{tid}")).json()["worktree"] == wt  # as the store keeps it
        assert f"refs/heads/agent-bridge/{tid}" in git(repo, "for-each-ref")

        # The agent edits in its cwd and commits on its own branch itself (its sandbox lets it).
        done = await turn(
            http,
            tid,
            [
                {"append": "b.txt", "text": "more bee\n"},
                {"write": "new.txt", "text": "fresh\nlines\n"},
                {"run": ["git", "add", "-A"]},
                {"run": ["git", "commit", "-qm", "agent's own commit"]},
                {"write": "../a.txt", "text": "one\n2\nthree\n"},
            ],
        )
        assert done[:2] == ["ok", "ok"] and done[4] == "ok", done
        assert done[3]["rc"] == 0, done
        r = await http.get(f"/v1/threads/{tid}/changes")
        assert r.status_code == 200, r.text
        changes = r.json()
        assert changes["base"] == "main" and changes["branch"] == wt["branch"] and changes["uncommitted"] is True
        files = {f["path"]: f for f in changes["files"]}
        assert set(files) == {"a.txt", "sub/b.txt", "sub/new.txt"}, files
        assert (files["sub/new.txt"]["status"], files["sub/new.txt"]["additions"]) == ("added", 2)
        assert (files["a.txt"]["status"], files["a.txt"]["additions"], files["a.txt"]["deletions"]) == (
            "modified",
            1,
            1,
        )
        assert "+more bee\n" in changes["diff"] and "-two\n+2\n" in changes["diff"] and "truncated" not in changes

        r = await http.post(f"/v1/threads/{tid}/changes/commit", json={"message": "the rest"})
        assert r.status_code == 200, r.text
        commit = r.json()["commit"]
        assert git(repo, "rev-parse", wt["branch"]).strip() == commit
        assert git(repo, "log", "-1", "--format=%s|%an", commit).strip().startswith("the rest|agent-bridge")
        r = await http.post(f"/v1/threads/{tid}/changes/commit", json={"message": "again"})
        assert (r.status_code, r.json()["error"]["code"]) == (409, "nothing_to_commit"), r.text
        # The agent's own git sees its branch with everything committed.
        assert (await turn(http, tid, [{"run": ["git", "status", "--porcelain"]}]))[0]["out"] == ""

        r = await http.post(f"/v1/threads/{tid}/changes/merge")
        assert r.status_code == 200, r.text
        assert r.json()["fast_forward"] is True and r.json()["commit"] == commit
        assert git(repo, "rev-parse", "main").strip() == commit
        assert (repo / "sub" / "new.txt").read_text() == "fresh\nlines\n"  # main is checked out: it follows
        assert git(repo, "status", "--porcelain") == ""
        r = await http.post(f"/v1/threads/{tid}/changes/merge")
        assert (r.status_code, r.json()["error"]["code"]) == (409, "nothing_to_merge"), r.text
        assert (await http.get(f"/v1/threads/{tid}/changes")).json()["files"] == []  # all merged

        r = await http.post(f"/v1/threads/{tid}/changes/discard")
        assert r.status_code == 200, r.text
        assert not Path(wt["path"]).exists()
        assert f"agent-bridge/{tid}" not in git(repo, "branch", "--list")
        assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
        assert not (repo / ".git" / "worktrees" / tid).exists()
        r = await http.get(f"/v1/threads/{tid}/changes")
        assert (r.status_code, r.json()["error"]["code"]) == (409, "worktree_discarded"), r.text
        assert (await http.get(f"/v1/threads/{tid}")).json()["worktree"]["discarded"] is True
        r = await http.post(f"/v1/threads/{tid}/messages", json={"text": "[]"})  # its directory is gone
        assert (r.status_code, r.json()["error"]["code"]) == (422, "bad_cwd"), r.text


async def test_a_conflicting_merge_changes_nothing_and_a_clean_one_keeps_local_work(
    daemon_factory: Any, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    d = await start(daemon_factory, tmp_path)
    async with d.http() as http:
        tid = (await create(http, cwd=str(repo), worktree=True, base="main"))["id"]
        await turn(http, tid, [{"write": "a.txt", "text": "one\nTWO by the agent\nthree\n"}])
        assert (await http.post(f"/v1/threads/{tid}/changes/merge")).json()["error"]["code"] == "uncommitted_changes"
        assert (await http.post(f"/v1/threads/{tid}/changes/commit", json={"message": "agent"})).status_code == 200
        # Meanwhile main moved on the same line, and its working tree has work of its own.
        (repo / "a.txt").write_text("one\nTWO by the user\nthree\n")
        git(repo, "commit", "-qam", "user")
        (repo / "sub" / "b.txt").write_text("local edit, not staged\n")
        (repo / "untracked.txt").write_text("mine\n")
        before = state(repo)
        r = await http.post(f"/v1/threads/{tid}/changes/merge")
        assert r.status_code == 409, r.text
        error = r.json()["error"]
        assert error["code"] == "merge_conflict" and error["files"] == ["a.txt"], error
        assert state(repo) == before

        # The agent puts the line back and adds a file: the merge is clean, a merge commit on
        # main, and the local edit and the untracked file are still there.
        await turn(http, tid, [{"write": "a.txt", "text": "one\ntwo\nthree\n"}, {"write": "c.txt", "text": "c\n"}])
        assert (await http.post(f"/v1/threads/{tid}/changes/commit", json={"message": "agent 2"})).status_code == 200
        user_tip = git(repo, "rev-parse", "main").strip()
        r = await http.post(f"/v1/threads/{tid}/changes/merge")
        assert r.status_code == 200, r.text
        assert r.json()["fast_forward"] is False
        parents = git(repo, "log", "-1", "--format=%P", "main").split()
        assert parents == [user_tip, git(repo, "rev-parse", f"agent-bridge/{tid}").strip()]
        assert (repo / "c.txt").read_text() == "c\n" and (repo / "a.txt").read_text() == "one\nTWO by the user\nthree\n"
        assert (repo / "sub" / "b.txt").read_text() == "local edit, not staged\n"
        assert git(repo, "status", "--porcelain") == " M sub/b.txt\n?? untracked.txt\n"

        # A local change in the way of the next merge: refused, nothing changed.
        await turn(http, tid, [{"write": "sub/b.txt", "text": "agent's bee\n"}])
        assert (await http.post(f"/v1/threads/{tid}/changes/commit", json={"message": "agent 3"})).status_code == 200
        before = state(repo)
        r = await http.post(f"/v1/threads/{tid}/changes/merge")
        assert (r.status_code, r.json()["error"]["code"]) == (409, "base_not_clean"), r.text
        assert state(repo) == before


async def test_the_daemon_runs_nothing_the_agent_planted(daemon_factory: Any, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    repo = make_repo(tmp_path / "repo")
    # Drivers the operator configured: an agent's .gitattributes may name them.
    for key in ("filter.marker.clean", "filter.marker.smudge", "diff.marker.textconv", "merge.marker.driver"):
        git(repo, "config", key, f"touch {marker}; cat")
    git(repo, "config", "filter.marker.process", f"touch {marker}")
    git(repo, "config", "filter.marker.required", "true")
    d = await start(daemon_factory, tmp_path)
    async with d.http() as http:
        thread = await create(http, cwd=str(repo), worktree=True)
        tid, wt = thread["id"], thread["worktree"]
        admin = repo / ".git" / "worktrees" / tid
        fake = Path(wt["path"]) / "fake"
        hook = f"#!/bin/sh\ntouch {marker}\n"
        steps: list[dict[str, Any]] = [
            {"write": ".gitattributes", "text": "* filter=marker diff=marker merge=marker\n"},
            {"write": "a.txt", "text": "one\ntwo\nthree\nfour\n"},
            # A git dir of its own, with a monitor and hooks that would run, and the worktree's
            # .git file and its commondir pointed at it.
            {"run": ["git", "init", "--bare", "-q", str(fake)]},
            {"run": ["mkdir", "-p", str(fake / "hooks")]},
            {"write": str(fake / "config"), "text": f"[core]\n\tfsmonitor = touch {marker}\n\thooksPath = hooks\n"},
            {"write": str(fake / "hooks" / "post-checkout"), "text": hook},
            {"write": str(fake / "hooks" / "reference-transaction"), "text": hook},
            {
                "run": [
                    "chmod",
                    "+x",
                    str(fake / "hooks" / "post-checkout"),
                    str(fake / "hooks" / "reference-transaction"),
                ]
            },
            {"write": str(admin / "commondir"), "text": str(fake) + "\n"},
            {"write": str(admin / "config.worktree"), "text": f"[core]\n\tfsmonitor = touch {marker}\n"},
            {"write": ".git", "text": f"gitdir: {fake}\n"},
            {"run": ["mkdir", "nested"]},  # and a "submodule" whose git dir is that one
            {"write": "nested/.git", "text": f"gitdir: {fake}\n"},
            # Odd names, a symlink out, a file only the agent can read.
            {"write_bytes_hex": (wt["path"].encode() + b"/odd\n\xff.bin").hex(), "hex": "000102"},
            {"symlink": "passwd-link", "to": "/etc/passwd"},
        ]
        done = await turn(http, tid, steps)
        assert all(r == "ok" or (isinstance(r, dict) and r["rc"] == 0) for r in done), done
        r = await http.get(f"/v1/threads/{tid}/changes")
        assert r.status_code == 200, r.text
        changes = r.json()
        paths = {f["path"] for f in changes["files"]}
        assert {"a.txt", ".gitattributes", "odd\n\\xff.bin", "passwd-link", "fake/config"} <= paths, paths
        assert "+/etc/passwd" in changes["diff"] and "root:" not in changes["diff"]
        assert (await http.post(f"/v1/threads/{tid}/changes/commit", json={"message": "planted"})).status_code == 200
        # main moves on elsewhere: the merge is a real one (merge drivers would be asked).
        (repo / "sub" / "b.txt").write_text("user bee\n")
        git(repo, "commit", "-qam", "user")
        r = await http.post(f"/v1/threads/{tid}/changes/merge")
        assert r.status_code == 200, r.text
        assert not marker.exists(), "the daemon ran something the repository named"
        assert (repo / "passwd-link").is_symlink() and (repo / "a.txt").read_text().endswith("four\n")
        r = await http.post(f"/v1/threads/{tid}/changes/discard")
        assert r.status_code == 200, r.text
        assert not marker.exists()
        # The traps were live: git found from the worktree, as a naive caller would run it.
        (Path(wt["path"]) / "fake").mkdir(parents=True)
        fake_dir = Path(wt["path"]) / "fake"
        git(fake_dir, "init", "--bare", "-q")
        (fake_dir / "config").write_text(f"[core]\n\tfsmonitor = touch {marker}\n\tbare = false\n")
        (Path(wt["path"]) / ".git").write_text(f"gitdir: {fake_dir}\n")
        naive = await asyncio.create_subprocess_exec("git", "status", cwd=wt["path"], stdout=asyncio.subprocess.DEVNULL)
        await asyncio.wait_for(naive.wait(), STEP_TIMEOUT)
        assert marker.exists()


@pytest.mark.parametrize("mechanism", ["landlock", "bubblewrap"])
async def test_the_agent_cannot_write_the_repositorys_config_hooks_or_main_tree(
    daemon_factory: Any, tmp_path: Path, mechanism: str
) -> None:
    repo = make_repo(tmp_path / "repo")
    d = await start(daemon_factory, tmp_path, mechanism=mechanism)
    async with d.http() as http:
        tid = (await create(http, cwd=str(repo), worktree=True))["id"]
        git_dir = repo / ".git"
        before = state(repo)
        config_before = (git_dir / "config").read_bytes()
        targets = [
            {"append": str(git_dir / "config"), "text": "[core]\n\tfsmonitor = evil\n"},
            {"write": str(git_dir / "hooks" / "pre-commit"), "text": "#!/bin/sh\n"},
            {"write": str(git_dir / "info" / "attributes"), "text": "* filter=x\n"},
            {"write": str(git_dir / "refs" / "heads" / "main"), "text": "0" * 40 + "\n"},
            {"write": str(git_dir / "HEAD"), "text": "ref: refs/heads/evil\n"},
            {"append": str(repo / "a.txt"), "text": "planted\n"},
            {"write": str(repo / "planted.txt"), "text": "planted\n"},
            # What is its own: its worktree and the objects and branch its commits write.
            {"write": "mine.txt", "text": "mine\n"},
            {"run": ["git", "add", "-A"]},
            {"run": ["git", "commit", "-qm", "mine"]},
        ]
        done = await turn(http, tid, targets)
        if mechanism == "landlock":
            assert done[:7] == ["denied"] * 7, done
        else:  # the git dir is mounted read-only, the main working tree not at all: a new file
            # there lands in the sandbox's own empty directory, never in the repository (below)
            assert done[:6] == ["denied"] * 5 + ["error:ENOENT"], done
        assert not (repo / "planted.txt").exists()
        assert done[7] == "ok" and done[8]["rc"] == 0 and done[9]["rc"] == 0, done
        assert (git_dir / "config").read_bytes() == config_before
        assert not (git_dir / "hooks" / "pre-commit").exists()
        after = state(repo)
        assert {k: v for k, v in after.items() if k != "refs"} == {k: v for k, v in before.items() if k != "refs"}
        assert git(repo, "log", "-1", "--format=%s", f"agent-bridge/{tid}").strip() == "mine"


async def test_a_large_diff_is_cut_and_says_so(daemon_factory: Any, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    d = await start(daemon_factory, tmp_path)
    async with d.http() as http:
        tid = (await create(http, cwd=str(repo), worktree=True))["id"]
        big = "".join(f"line {i:07d} of a large file\n" for i in range(100_000))  # ~3 MiB
        await turn(http, tid, [{"write": "big.txt", "text": big}])
        changes = (await http.get(f"/v1/threads/{tid}/changes")).json()
        assert changes["truncated"] is True
        assert len(changes["diff"].encode()) <= MAX_DIFF and changes["diff"].endswith("\n")
        assert changes["files"] == [
            {"path": "big.txt", "status": "added", "additions": 100_000, "deletions": 0, "binary": False}
        ]


async def test_bad_bases_and_places_are_refused(daemon_factory: Any, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    plain = tmp_path / "plain"
    plain.mkdir()
    git(repo, "tag", "v1")
    d = await start(daemon_factory, tmp_path)
    async with d.http() as http:
        for base in ("-c", "a..b", "ma in", "x\ny", "HEAD~1", "main@{1}", "refs/heads/.hidden", "nosuchbranch", ""):
            r = await http.post("/v1/threads", json={"agent": "git", "cwd": str(repo), "worktree": True, "base": base})
            assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_ref"), (base, r.text)
        r = await http.post("/v1/threads", json={"agent": "git", "cwd": str(plain), "worktree": True})
        assert (r.status_code, r.json()["error"]["code"]) == (400, "not_a_git_repository"), r.text
        r = await http.post("/v1/threads", json={"agent": "git", "worktree": True})
        assert (r.status_code, r.json()["error"]["code"]) == (400, "not_a_git_repository"), r.text
        r = await http.post("/v1/threads", json={"agent": "git", "cwd": str(repo), "base": "main"})
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_request"), r.text
        assert not (d.data_dir / "workspaces").exists() or not any((d.data_dir / "workspaces").iterdir())
        assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1

        # A tag is a base to start from, not a branch to merge into.
        tagged = await create(http, cwd=str(repo), worktree=True, base="v1")
        assert tagged["worktree"]["base"] == "v1" and tagged["worktree"]["base_ref"] is None
        await turn(http, tagged["id"], [{"write": "t.txt", "text": "t\n"}])
        assert (await http.post(f"/v1/threads/{tagged['id']}/changes/commit", json={"message": "t"})).status_code == 200
        r = await http.post(f"/v1/threads/{tagged['id']}/changes/merge")
        assert (r.status_code, r.json()["error"]["code"]) == (409, "base_not_a_branch"), r.text
        for message in ("", " \n"):
            r = await http.post(f"/v1/threads/{tagged['id']}/changes/commit", json={"message": message})
            assert r.status_code == 400, r.text

        plain_thread = await create(http, cwd=str(repo))
        assert plain_thread["worktree"] is None
        r = await http.get(f"/v1/threads/{plain_thread['id']}/changes")
        assert (r.status_code, r.json()["error"]["code"]) == (409, "no_worktree"), r.text


async def test_an_operation_waits_for_the_turn_and_deleting_keeps_the_branch(
    daemon_factory: Any, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    d = await start(daemon_factory, tmp_path)
    async with d.http() as http:
        thread = await create(http, cwd=str(repo), worktree=True)
        tid, wt = thread["id"], thread["worktree"]
        go = Path(wt["path"]) / "go"
        r = await http.post(
            f"/v1/threads/{tid}/messages",
            json={"text": json.dumps([{"write": "w.txt", "text": "w\n"}, {"wait_for": str(go)}])},
        )
        assert r.status_code == 202
        deadline = time.monotonic() + STEP_TIMEOUT
        while not (Path(wt["path"]) / "w.txt").exists():  # the turn is under way
            assert time.monotonic() < deadline
            r = await http.get(f"/v1/threads/{tid}/events", params={"after": 0, "wait": 1})
        for op, body in (("commit", {"message": "m"}), ("merge", None), ("discard", None)):
            r = await http.post(f"/v1/threads/{tid}/changes/{op}", json=body)
            assert (r.status_code, r.json()["error"]["code"]) == (409, "turn_active"), (op, r.text)
        go.write_text("")
        r = await http.get(f"/v1/threads/{tid}/events", params={"after": 0, "wait": 10, "until": "turn_end"})
        assert (await http.post(f"/v1/threads/{tid}/changes/commit", json={"message": "m"})).status_code == 200
        tip = git(repo, "rev-parse", wt["branch"]).strip()
        assert (await http.delete(f"/v1/threads/{tid}")).status_code == 204
        assert not Path(wt["path"]).exists() and not (repo / ".git" / "worktrees" / tid).exists()
        assert git(repo, "rev-parse", wt["branch"]).strip() == tip  # the committed work stays


async def test_another_users_worktree_thread_is_not_found(daemon_factory: Any, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    url = f"sqlite:///{data / 'bridge.db'}"
    alice, bob = await add_user(url, "alice"), await add_user(url, "bob")
    root = data / "workspaces" / "users" / "alice"
    repo = make_repo(root / "proj")
    for p in (data / "workspaces", data / "workspaces" / "users", root):
        p.chmod(0o700)
    d = await start(daemon_factory, tmp_path, '\n[auth]\nmode = "users"\n' + f"[store]\nurl = {json.dumps(url)}\n")
    async with d.http() as http:
        r = await http.post(
            "/v1/threads",
            json={"agent": "git", "cwd": "<data-dir>/workspaces/users/alice/proj", "worktree": True},
            headers=bearer(alice),
        )
        assert r.status_code == 201, r.text
        thread = r.json()
        assert thread["worktree"]["path"].startswith("<data-dir>/workspaces/")  # never the data dir's place
        tid = thread["id"]
        assert (await http.get(f"/v1/threads/{tid}/changes", headers=bearer(alice))).status_code == 200
        for method, path in (("GET", "changes"), ("POST", "changes/commit"), ("POST", "changes/merge")):
            body = {"message": "m"} if path.endswith("commit") else None
            r = await http.request(method, f"/v1/threads/{tid}/{path}", json=body, headers=bearer(bob))
            assert (r.status_code, r.json()["error"]["code"]) == (404, "thread_not_found"), (path, r.text)
        r = await http.post(f"/v1/threads/{tid}/changes/discard", headers=bearer(bob))
        assert r.status_code == 404
        assert Path(str(thread["worktree"]["path"]).replace("<data-dir>", str(data))).is_dir()
        # Nor may bob start a worktree of her repository.
        r = await http.post(
            "/v1/threads",
            json={"agent": "git", "cwd": str(repo), "worktree": True},
            headers=bearer(bob),
        )
        assert r.status_code == 403, r.text
