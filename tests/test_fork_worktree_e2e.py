"""A fork of a thread that has its own git worktree (docs/api.md §4.26, §4.27), end to end:
a real daemon, a real git, the git agent (tests/agents/git_agent.py) under Landlock. The
fork gets a worktree of its own, from the source's branch as committed, with the source's
base; each agent is confined to its own; removing the source's leaves the fork's alone."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_worktree_e2e import create, git, make_repo, start, turn

pytestmark = pytest.mark.timeout(120)


async def fork(http: httpx.AsyncClient, source: str) -> dict[str, Any]:
    # At seq 0: the git agent has no way to copy its session (the worktree is what is tested).
    r = await http.post(f"/v1/threads/{source}/fork", json={"after_seq": 0})
    assert r.status_code == 201, r.text
    return dict(r.json())


async def thread_ids(http: httpx.AsyncClient) -> set[str]:
    return {t["id"] for t in (await http.get("/v1/threads")).json()["threads"]}


@pytest.mark.parametrize("store_kind", ["sqlite", "postgresql"])
async def test_a_fork_gets_its_own_worktree_from_the_sources_branch(
    daemon_factory: Any, tmp_path: Path, store_kind: str, request: pytest.FixtureRequest
) -> None:
    repo = make_repo(tmp_path / "repo")
    extra = ""
    if store_kind == "postgresql":
        extra = f'\n[store]\nurl = "{request.getfixturevalue("pg_url")}"\n'
    d = await start(daemon_factory, tmp_path, extra)
    async with d.http() as http:
        source = await create(http, cwd=str(repo / "sub"), worktree=True)
        sid, swt = source["id"], source["worktree"]
        done = await turn(
            http,
            sid,
            [
                {"append": "b.txt", "text": "source bee\n"},
                {"run": ["git", "add", "-A"]},
                {"run": ["git", "commit", "-qm", "the source's commit"]},
                {"write": "wip.txt", "text": "not committed\n"},
            ],
        )
        assert done[0] == "ok" and done[2]["rc"] == 0 and done[3] == "ok", done
        source_tip = git(repo, "rev-parse", swt["branch"]).strip()

        forked = await fork(http, sid)
        fid, fwt = forked["id"], forked["worktree"]
        assert fwt["branch"] == f"agent-bridge/{fid}"
        assert fwt["path"] == str((d.data_dir / "workspaces" / fid).resolve()) != swt["path"]
        assert (fwt["base"], fwt["base_commit"], fwt["base_ref"]) == (swt["base"], swt["base_commit"], swt["base_ref"])
        assert (fwt["repo"], fwt["git_dir"]) == (swt["repo"], swt["git_dir"]) and not fwt.get("discarded")
        assert forked["cwd"] == os.path.join(fwt["path"], "sub")
        assert (await http.get(f"/v1/threads/{fid}")).json()["worktree"] == fwt
        assert git(repo, "rev-parse", fwt["branch"]).strip() == source_tip  # what the source committed
        fork_dir = Path(fwt["path"])
        assert (fork_dir / "sub" / "b.txt").read_text() == "bee\nsource bee\n"
        assert not (fork_dir / "sub" / "wip.txt").exists()  # not committed: not carried

        # The fork's agent edits and commits in its own worktree, and cannot write the source's.
        theirs = Path(swt["path"]) / "sub"
        done = await turn(
            http,
            fid,
            [
                {"write": "fork.txt", "text": "the fork's\n"},
                {"append": "../a.txt", "text": "four\n"},
                {"run": ["git", "add", "fork.txt"]},
                {"run": ["git", "commit", "-qm", "the fork's commit"]},
                {"write": str(theirs / "b.txt"), "text": "overwritten by the fork\n"},
                {"write": str(theirs / "planted.txt"), "text": "planted\n"},
                {"run": ["git", "rev-parse", "--abbrev-ref", "HEAD"]},
            ],
        )
        assert done[:2] == ["ok", "ok"] and done[3]["rc"] == 0, done
        assert done[4:6] == ["denied", "denied"], done
        assert done[6]["out"].strip() == fwt["branch"], done
        assert (theirs / "b.txt").read_text() == "bee\nsource bee\n" and not (theirs / "planted.txt").exists()
        assert (theirs / "wip.txt").read_text() == "not committed\n"
        assert not (theirs / "fork.txt").exists() and (Path(swt["path"]) / "a.txt").read_text() == "one\ntwo\nthree\n"
        assert git(repo, "rev-parse", swt["branch"]).strip() == source_tip  # the source's branch stays

        # The fork's changes: the source's committed change and its own, against the same base.
        r = await http.get(f"/v1/threads/{fid}/changes")
        assert r.status_code == 200, r.text
        changes = r.json()
        assert changes["branch"] == fwt["branch"] and changes["base"] == swt["base"]
        assert changes["base_commit"] == swt["base_commit"] and changes["uncommitted"] is True
        assert {f["path"]: f["status"] for f in changes["files"]} == {
            "sub/b.txt": "modified",
            "sub/fork.txt": "added",
            "a.txt": "modified",
        }, changes["files"]
        assert "+source bee\n" in changes["diff"] and "+four\n" in changes["diff"]
        source_files = {f["path"] for f in (await http.get(f"/v1/threads/{sid}/changes")).json()["files"]}
        assert source_files == {"sub/b.txt", "sub/wip.txt"}

        # The source's worktree discarded: the fork's stays and works; no new fork of the source.
        r = await http.post(f"/v1/threads/{sid}/changes/discard")
        assert r.status_code == 200, r.text
        assert not Path(swt["path"]).exists() and (fork_dir / "sub" / "fork.txt").read_text() == "the fork's\n"
        assert (repo / ".git" / "worktrees" / fid).is_dir()
        assert (await turn(http, fid, [{"run": ["git", "status", "--porcelain"]}]))[0]["out"] == " M a.txt\n"
        assert (await http.get(f"/v1/threads/{fid}/changes")).status_code == 200
        before = await thread_ids(http)
        r = await http.post(f"/v1/threads/{sid}/fork", json={"after_seq": 0})
        assert (r.status_code, r.json()["error"]["code"]) == (409, "worktree_discarded"), r.text
        assert await thread_ids(http) == before


async def test_deleting_the_source_keeps_the_forks_worktree_and_a_failed_one_leaves_no_fork(
    daemon_factory: Any, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    d = await start(daemon_factory, tmp_path)
    async with d.http() as http:
        source = await create(http, cwd=str(repo), worktree=True)
        sid, swt = source["id"], source["worktree"]
        await turn(http, sid, [{"write": "s.txt", "text": "s\n"}])
        assert (await http.post(f"/v1/threads/{sid}/changes/commit", json={"message": "s"})).status_code == 200
        forked = await fork(http, sid)
        fid, fwt = forked["id"], forked["worktree"]
        assert forked["cwd"] == fwt["path"] and (Path(fwt["path"]) / "s.txt").read_text() == "s\n"

        # A fork of a fork: its own worktree again, from the fork's branch, the same base.
        grand = await fork(http, fid)
        assert grand["worktree"]["base_commit"] == swt["base_commit"]
        assert (
            git(repo, "rev-parse", grand["worktree"]["branch"]).strip() == git(repo, "rev-parse", fwt["branch"]).strip()
        )

        assert (await http.delete(f"/v1/threads/{sid}")).status_code == 204
        assert not Path(swt["path"]).exists()
        assert (Path(fwt["path"]) / "s.txt").read_text() == "s\n" and (repo / ".git" / "worktrees" / fid).is_dir()
        assert (await turn(http, fid, [{"write": "f.txt", "text": "f\n"}])) == ["ok"]
        files = {f["path"] for f in (await http.get(f"/v1/threads/{fid}/changes")).json()["files"]}
        assert files == {"s.txt", "f.txt"}

        # The worktree cannot be made (a file of the branch's commit is missing from the object
        # store, so git cannot check it out): no fork is left, neither a thread nor a
        # directory nor a branch.
        workspaces = set(os.listdir(d.data_dir / "workspaces"))
        branches = git(repo, "for-each-ref", "--format=%(refname)", "refs/heads/")
        before = await thread_ids(http)
        blob = git(repo, "rev-parse", f"{fwt['branch']}:s.txt").strip()
        (repo / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
        r = await http.post(f"/v1/threads/{fid}/fork", json={"after_seq": 0})
        assert (r.status_code, r.json()["error"]["code"]) == (400, "worktree_failed"), r.text
        assert await thread_ids(http) == before
        assert set(os.listdir(d.data_dir / "workspaces")) == workspaces
        assert git(repo, "for-each-ref", "--format=%(refname)", "refs/heads/") == branches

        # The source's branch gone (removed by hand): 409 branch_missing, nothing made.
        git(repo, "update-ref", "-d", f"refs/heads/{fwt['branch']}")
        r = await http.post(f"/v1/threads/{fid}/fork", json={"after_seq": 0})
        assert (r.status_code, r.json()["error"]["code"]) == (409, "branch_missing"), r.text
        assert await thread_ids(http) == before
