"""The Changes panel of a thread in its own git worktree (issue #38 item 7, docs/api.md
§4.27; web/changes.js): the files the agent changed with their status and +/- counts and
the diff with line numbers, brought up to date when a turn ends; Commit with a message,
Merge into the base (a conflict names its files and changes nothing), Discard after a
confirmation. Real chromium, real daemon, real git."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from playwright.async_api import Page, expect
from test_page_a11y import scan
from test_page_e2e import Session, browser, send, web

__all__ = ["browser", "web"]  # fixtures, used by name

pytestmark = pytest.mark.asyncio(loop_scope="module")

LINES = [f"line {n}" for n in range(1, 13)]
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@localhost",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@localhost",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
}


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    out = subprocess.run(
        ["git", "-C", str(repo), *args], env=env, capture_output=True, text=True, timeout=15, check=True
    )
    return out.stdout.strip()


def edit(path: Path, number: int, text: str) -> None:
    lines = path.read_text().splitlines()
    lines[number - 1] = text
    path.write_text("\n".join(lines) + "\n")


async def problems_on(page: Page, screen: str) -> list[str]:
    problems: list[str] = []
    await scan(page, screen, problems)
    return problems


async def test_changes_are_shown_committed_merged_and_discarded(web: Session, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "a.txt").write_text("\n".join(LINES) + "\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "start")

    # Made in the new-thread dialog, its worktree box ticked and a base given.
    page = await web.page(viewport={"width": 1280, "height": 900})
    await page.click("#new-thread")
    await page.select_option("#new-agent", "stream-json")
    await page.fill("#new-cwd", str(repo))
    await page.fill("#new-title", "wt")
    await expect(page.locator("#new-base")).to_be_hidden()
    await page.check("#new-worktree")
    await page.fill("#new-base", "main")
    await page.click("#new-create")
    await expect(page.locator("#t-title")).to_have_text("wt")
    thread = await page.evaluate("() => window.agentBridge.current.thread")
    tid, wt = thread["id"], thread["worktree"]
    assert wt["branch"] == f"agent-bridge/{tid}" and wt["base"] == "main", wt
    work = Path(wt["path"])
    toggle = page.locator("#changes-toggle")
    await expect(toggle).to_be_visible()
    await expect(toggle).to_have_attribute("aria-expanded", "false")
    await expect(page.locator("#changes-count")).to_have_text("")

    # What the agent's tools would do, then its turn ends: the panel reads the changes again.
    edit(work / "a.txt", 2, "line two")
    (work / "new.txt").write_text("hello\n")
    await send(page, "hi")
    await expect(page.locator("#changes-count")).to_have_text("2")
    await toggle.click()
    await expect(toggle).to_have_attribute("aria-expanded", "true")
    files = page.locator("#changes-files li")
    await expect(files).to_have_text(["modifieda.txt+1 −1", "addednew.txt+1 −0"])
    await expect(page.locator("#changes-summary")).to_contain_text(
        f"2 files changed · +2 −1 on agent-bridge/{tid} against main"
    )
    rows = page.locator("#changes-diff .diff-line")
    removed = page.locator("#changes-diff .diff-del").first
    await expect(removed.locator(".ln").first).to_have_text("2")
    await expect(removed.locator(".code")).to_have_text("line 2")
    added = page.locator("#changes-diff .diff-add").first
    await expect(added.locator(".ln").nth(1)).to_have_text("2")
    await expect(added.locator(".code")).to_have_text("line two")
    assert await rows.count() >= 6  # the context around the change
    await files.nth(1).locator("button.changed-path").click()  # a file's name goes to its diff
    await expect(page.locator("#changes-diff .diff-file").nth(1)).to_be_focused()
    await expect(page.locator("#changes-diff .diff-file").nth(1)).to_contain_text("new.txt (new file)")
    assert not await problems_on(page, "the Changes panel")
    await page.set_viewport_size({"width": 390, "height": 844})  # a phone: nothing wider
    assert await page.evaluate("document.documentElement.scrollWidth") <= 390
    await page.screenshot(path=str(tmp_path / "changes-390.png"))
    await page.set_viewport_size({"width": 1280, "height": 900})
    await page.screenshot(path=str(tmp_path / "changes-1280.png"))

    # Commit: a message is needed; then the branch holds it.
    await page.click("#changes-commit")
    await expect(page.locator("#changes-error")).to_have_text("Write a commit message first.")
    await expect(page.locator("#changes-message")).to_be_focused()
    await page.keyboard.type("the agent's work")
    await page.keyboard.press("Enter")
    await expect(page.locator("#changes-status")).to_contain_text(f"on agent-bridge/{tid}.")
    assert git(repo, "log", "-1", "--format=%s", f"agent-bridge/{tid}") == "the agent's work"
    await expect(page.locator("#changes-message")).to_have_value("")

    # Merge into main: a fast-forward.
    await page.click("#changes-merge")
    await expect(page.locator("#changes-status")).to_contain_text("Merged into main (fast-forward")
    assert git(repo, "log", "-1", "--format=%s", "main") == "the agent's work"
    await expect(page.locator("#changes-count")).to_have_text("")
    await expect(page.locator("#changes-summary")).to_contain_text("No changes")

    # The same line changed on main and in the worktree: the conflict names the file, and
    # main is as it was.
    edit(repo / "a.txt", 5, "line five on main")
    git(repo, "commit", "-q", "-am", "main moves")
    main = git(repo, "rev-parse", "main")
    edit(work / "a.txt", 5, "line five in the worktree")
    await send(page, "again")
    await expect(page.locator("#changes-count")).to_have_text("1")
    await page.fill("#changes-message", "more work")
    await page.click("#changes-commit")
    await expect(page.locator("#changes-status")).to_contain_text("Committed")
    await page.click("#changes-merge")
    await expect(page.locator("#changes-error")).to_contain_text("Conflicting files: a.txt.")
    assert git(repo, "rev-parse", "main") == main
    web.errors = [e for e in web.errors if "409" not in e]  # chromium logs the refusal

    # Discard: asked first (Cancel keeps everything), then the worktree and branch go.
    await page.click("#changes-discard")
    await expect(page.locator("#discard-dialog")).to_be_visible()
    await expect(page.locator("#discard-no")).to_be_focused()
    await expect(page.locator("#discard-text")).to_contain_text(f"agent-bridge/{tid}")
    assert not await problems_on(page, "the discard dialog")
    await page.keyboard.press("Enter")  # Cancel
    await expect(page.locator("#discard-dialog")).to_be_hidden()
    assert work.exists()
    await page.click("#changes-discard")
    await page.click("#discard-yes")
    await expect(page.locator("#changes-status")).to_have_text("Discarded: the worktree and its branch were removed.")
    await expect(page.locator("#changes-form")).to_be_hidden()
    assert not work.exists()
    assert git(repo, "branch", "--list", f"agent-bridge/{tid}") == ""
    web.assert_clean()
