"""The pure rules of a thread's own worktree (sessions/worktree.py) and the git runner's
environment (process/git.py): names, grants, and git's -z answers read as hostile bytes."""

from __future__ import annotations

import pytest

from bridge.process import git
from bridge.sessions import worktree as rules


@pytest.mark.parametrize("name", ["main", "feature/x", "v1.2", "a" * 40, "release-2026.12", "agent-bridge/thr_1"])
def test_ref_names_git_takes_are_taken(name: str) -> None:
    assert rules.ref_problem(name) is None


@pytest.mark.parametrize(
    "name",
    [
        "",
        "-c",
        "--upload-pack=x",
        "a..b",
        "ma in",
        "x\ny",
        "tab\t",
        "HEAD~1",
        "HEAD^",
        "a:b",
        "what?",
        "glob*",
        "br[",
        "back\\slash",
        "main@{1}",
        "@",
        "/abs",
        "trail/",
        "dou//ble",
        "end.",
        ".hidden",
        "refs/heads/.hidden",
        "x.lock",
        "a/b.lock/c",
        "\x7f",
        "a" * 257,
    ],
)
def test_ref_names_that_could_be_options_or_expressions_are_refused(name: str) -> None:
    assert rules.ref_problem(name) is not None


def test_a_row_that_does_not_read_as_a_worktree_is_none() -> None:
    good = {
        "repo": "/r",
        "path": "/d/workspaces/thr_1",
        "branch": "agent-bridge/thr_1",
        "base": "main",
        "base_commit": "a" * 40,
        "base_ref": "refs/heads/main",
        "git_dir": "/r/.git",
    }
    wt = rules.from_json(good)
    assert wt is not None and wt.to_json() == {**good, "discarded": False}
    assert wt.admin_dir == "/r/.git/worktrees/thr_1"
    for bad in ({**good, "branch": "main"}, {**good, "base_commit": "HEAD"}, {**good, "repo": 3}, None, [], "x"):
        assert rules.from_json(bad) is None
    read, write = rules.grants(wt)
    assert read == ["/r/.git"]
    assert write == [
        "/d/workspaces/thr_1",
        "/r/.git/objects",
        "/r/.git/worktrees/thr_1",
        "/r/.git/refs/heads/agent-bridge",
        "/r/.git/logs/refs/heads/agent-bridge/thr_1",
    ]
    assert not any(p.endswith(("config", "hooks", "info", "HEAD", "packed-refs")) for p in write)
    assert rules.grants_of({**good, "discarded": True}) == ([], [])
    assert rules.grants_of(None) == ([], [])


def test_git_answers_are_read_by_nul_never_by_line() -> None:
    names = b"M\0a.txt\0A\0odd\n\xff name\0D\0gone\0"
    stats = b"1\t2\ta.txt\0-\t-\todd\n\xff name\x000\t3\tgone\0"
    files = rules.files(rules.parse_name_status(names), rules.parse_numstat(stats))
    assert files == [
        {"path": "a.txt", "status": "modified", "additions": 1, "deletions": 2, "binary": False},
        {"path": "odd\n\\xff name", "status": "added", "additions": None, "deletions": None, "binary": True},
        {"path": "gone", "status": "deleted", "additions": 0, "deletions": 3, "binary": False},
    ]
    tree = "b" * 40
    assert rules.parse_merge_tree(f"{tree}\0a.txt\0a.txt\0b\nc\0\0".encode()) == (tree, ["a.txt", "b\nc"])
    listed = rules.parse_worktree_list(
        b"worktree /r\0HEAD " + b"c" * 40 + b"\0branch refs/heads/main\0\0worktree /w\0bare\0\0"
    )
    assert listed == [
        {"worktree": b"/r", "HEAD": b"c" * 40, "branch": b"refs/heads/main"},
        {"worktree": b"/w", "bare": b""},
    ]


def test_a_diff_is_cut_after_a_whole_line_and_says_so() -> None:
    text, cut = rules.cut_diff(b"line 1\nline 2\nline 3\n", truncated=False, limit=10)
    assert (text, cut) == ("line 1\n", True)
    assert rules.cut_diff(b"ok\n\xff\n", truncated=False) == ("ok\n\ufffd\n", False)
    assert rules.cut_diff(b"partial line", truncated=True) == ("", True)


def test_every_filter_driver_the_configuration_names_is_emptied() -> None:
    config = b"core.bare\nfalse\0filter.lfs.clean\ngit-lfs clean\0filter.we=ird.na me.smudge\nx\0diff.d.textconv\ny\0"
    pairs = git.driver_overrides(config)
    assert ("filter.lfs.clean", "") in pairs and ("filter.lfs.required", "false") in pairs
    assert ("filter.we=ird.na me.process", "") in pairs
    assert not any(k.startswith(("core.", "diff.")) for k, _ in pairs)
    env = git.overrides_env([*git.HARDENED, *pairs])
    n = int(env["GIT_CONFIG_COUNT"])
    keys = {env[f"GIT_CONFIG_KEY_{i}"]: env[f"GIT_CONFIG_VALUE_{i}"] for i in range(n)}
    assert keys["core.hooksPath"] == "/dev/null" and keys["core.fsmonitor"] == "false"
    assert keys["filter.we=ird.na me.smudge"] == ""
    base = git.base_env("/usr/bin")
    assert base["GIT_CONFIG_NOSYSTEM"] == "1" and base["GIT_CONFIG_GLOBAL"] == "/dev/null"
    assert set(base) >= {"PATH", "HOME", "GIT_TERMINAL_PROMPT", "GIT_PAGER"} and "GIT_DIR" not in base


async def test_git_output_is_bounded_and_a_slow_git_is_killed() -> None:
    res = await git.run(["--version"], env=git.base_env(), cwd="/", limit=3)
    assert res.out == b"git" and res.truncated
    res = await git.run(["--version"], env=git.base_env(), cwd="/")
    assert res.ok and res.out.startswith(b"git version") and not res.truncated
    with pytest.raises(git.GitError, match="took longer"):  # (sleep standing for a git that hangs)
        await git.run(["30"], env=git.base_env(), cwd="/", timeout=0.05, git="sleep")
