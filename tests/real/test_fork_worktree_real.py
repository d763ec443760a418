"""A fork of a worktree thread with the real Claude Code (docs/api.md §4.26, §4.27): the
fork runs in a worktree of its own, a directory other than its source's, and its agent
still knows the turns before the fork point (Claude Code keeps a session under the
directory it ran in, so a fork that runs elsewhere must still find its source's)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import new_thread
from realagents import Real, fake_api, real
from test_claude_agent_acp import acp_profile
from test_claude_code import claude_profile
from test_fork_real import asked, fork, turn

__all__ = ["fake_api", "real"]  # fixtures used by the tests below

pytestmark = pytest.mark.timeout(240)


def git(cwd: Path, *args: str) -> None:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    ident = ["-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "core.hooksPath=/dev/null"]
    subprocess.run(["git", *ident, *args], cwd=cwd, env=env, check=True, capture_output=True)


def repository(real: Real) -> None:
    git(real.work, "init", "-q", "-b", "main")
    (real.work / "a.txt").write_text("a\n")
    git(real.work, "add", "-A")
    git(real.work, "commit", "-qm", "init")


async def test_claude_code_forked_from_a_worktree_thread_knows_its_turns_in_its_own_worktree(real: Real) -> None:
    repository(real)
    d = await real.daemon(real.config(claude_profile(real)))
    src = await new_thread(d, "claude", cwd=str(real.work), worktree=True)
    first = await turn(d, src["id"], "CHAT remember the word ALPHA")
    await turn(d, src["id"], "CHAT remember the word BRAVO")

    forked = await fork(d, src["id"])
    assert forked["cwd"] == forked["worktree"]["path"] != src["cwd"]
    await turn(d, forked["id"], "CHAT what do you remember WTQ")
    knew = asked(real, "CHAT what do you remember WTQ")
    assert "remember the word ALPHA" in knew and "remember the word BRAVO" in knew

    early = await fork(d, src["id"], after_seq=first["seq"])  # --resume-session-at, elsewhere too
    assert early["cwd"] == early["worktree"]["path"] not in (src["cwd"], forked["cwd"])
    await turn(d, early["id"], "CHAT what do you remember EARLYQ")
    knew = asked(real, "CHAT what do you remember EARLYQ")
    assert "remember the word ALPHA" in knew and "BRAVO" not in knew and "WTQ" not in knew


async def test_claude_agent_acp_forked_from_a_worktree_thread_knows_its_turns_in_its_own_worktree(
    real: Real,
) -> None:
    repository(real)
    d = await real.daemon(real.config(acp_profile(real)))
    src = await new_thread(d, "claude-acp", cwd=str(real.work), worktree=True)
    await turn(d, src["id"], "CHAT remember the word ALPHA")
    forked = await fork(d, src["id"])  # session/fork, with the fork's own cwd
    assert forked["cwd"] == forked["worktree"]["path"] != src["cwd"]
    await turn(d, forked["id"], "CHAT what do you remember ACPQ")
    assert "remember the word ALPHA" in asked(real, "CHAT what do you remember ACPQ")
