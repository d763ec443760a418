"""The new-thread dialog (issue #21 item 2): the model (the profile's default, editable)
and a working directory browsed within ``[server] workspace_roots`` (no symlink out of
them offered). Real chromium against a real daemon."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from conftest import Daemon, _own_agents, wait_until
from playwright.async_api import Browser, expect
from test_page_e2e import Session, browser, config, send, web

__all__ = ["browser", "web"]  # fixtures, used by name

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module")
async def rooted(browser: Browser, tmp_path: Path, agent_env: dict[str, str]) -> AsyncIterator[tuple[Session, Path]]:
    root = tmp_path / "src"
    for d in ("app/lib", "docs"):
        (root / d).mkdir(parents=True)
    (tmp_path / "private").mkdir()
    (root / "escape").symlink_to(tmp_path / "private")
    cfg = config(agent_env).replace("[server]\n", f"[server]\nworkspace_roots = [{str(root)!r}]\n", 1)
    d = Daemon(tmp_path, cfg.replace("'", '"'))
    await d.start()
    s = Session(d, browser)
    try:
        yield s, root
    finally:
        for ctx in s.contexts:
            await ctx.close()
        await d.stop()
        await wait_until(lambda: not _own_agents(tmp_path), what="agents to exit")


async def test_pick_a_model_and_browse_to_a_working_directory(rooted: tuple[Session, Path]) -> None:
    s, root = rooted
    page = await s.page()
    await page.click("#new-thread")
    await page.select_option("#new-agent", "demo")
    await expect(page.locator("#new-model")).to_have_value("demo")  # the profile's default
    # What the agent can reach is said before it is started (docs/security.md §6).
    await expect(page.locator("#new-sandbox")).to_contain_text("Confined (landlock)")
    await page.select_option("#new-agent", "stream-json")
    await expect(page.locator("#new-model")).to_have_value("")  # this profile names none
    await page.fill("#new-model", "model-x")
    await page.select_option("#new-agent", "awp-jsonl")
    await expect(page.locator("#new-model")).to_have_value("model-x")  # typed: kept
    await page.select_option("#new-agent", "stream-json")

    await page.click("#new-browse")
    dirs = page.locator("#new-dirs button")
    await expect(dirs).to_have_text([str(root)])
    await dirs.first.click()
    await expect(page.locator("#new-dirs-path")).to_have_text(str(root))
    # The symlink that leads out of the root is not offered.
    await expect(dirs).to_have_text(["↑ Roots", "app", "docs"])
    await expect(page.locator("#new-cwd")).to_have_value(str(root))
    await dirs.nth(1).click()
    await expect(dirs).to_have_text(["↑ Up", "lib"])
    await expect(dirs.first).to_be_focused()
    await expect(page.locator("#new-cwd")).to_have_value(str(root / "app"))
    await page.fill("#new-title", "picked")
    await page.click("#new-create")
    await expect(page.locator("#t-title")).to_have_text("picked")
    await expect(page.locator("#t-meta")).to_have_text(f"stream-json · model-x · {root / 'app'}")
    await send(page, "hi")
    await expect(page.locator(".msg.assistant .body").last).to_have_text("echo: hi")
    async with s.d.http() as http:
        threads = (await http.get("/v1/threads")).json()["threads"]
    assert [(t["title"], t["model"], t["cwd"]) for t in threads] == [("picked", "model-x", str(root / "app"))]
    s.assert_clean()


async def test_a_typed_path_outside_the_roots_browses_from_the_roots(rooted: tuple[Session, Path]) -> None:
    s, root = rooted
    page = await s.page()
    await page.click("#new-thread")
    await page.fill("#new-cwd", str(root / "escape"))
    await page.click("#new-browse")
    await expect(page.locator("#new-dirs button")).to_have_text([str(root)])
    await expect(page.locator("#new-dirs-path")).to_have_text("Workspace roots")
    s.errors = [e for e in s.errors if "403" not in e]  # chromium logs the refused request
    s.assert_clean()


async def test_without_roots_there_is_nothing_to_browse_and_the_model_is_optional(web: Session) -> None:
    page = await web.page()
    await page.click("#new-thread")
    await expect(page.locator("#new-dialog")).to_be_visible()
    await page.select_option("#new-agent", "demo")
    await expect(page.locator("#new-browse")).to_be_hidden()
    await page.click("#new-create")  # the default model is not sent: the profile's is used
    await expect(page.locator("#t-meta")).to_contain_text("demo · demo ·")
    async with web.d.http() as http:
        (thread,) = (await http.get("/v1/threads")).json()["threads"]
    assert thread["model"] == "demo" and Path(thread["cwd"]).parent.name == "workspaces"
    await send(page, "list files")
    await expect(page.locator(".tool .tool-output")).to_contain_text("hello.py")  # the demo's samples
    web.assert_clean()
