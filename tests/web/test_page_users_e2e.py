"""The bundled page in users mode (issue #20), in a real browser (Debian's chromium driven
by Playwright) against a real daemon: it says who is signed in, an admin sees each
thread's owner, and a user sees only their own threads."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from conftest import STEP_TIMEOUT, Daemon
from playwright.async_api import Browser, async_playwright, expect
from test_users_e2e import add_user, bearer, users_config

pytestmark = pytest.mark.asyncio(loop_scope="module")
CHROMIUM = os.environ.get("AGENT_BRIDGE_CHROMIUM", "/usr/bin/chromium")
expect.set_options(timeout=STEP_TIMEOUT * 1000)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (Debian package chromium; scripts/test installs it)")
    async with async_playwright() as pw:
        b = await pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
        )
        yield b
        await b.close()


async def test_the_page_names_the_user_and_shows_an_admin_the_owners(
    browser: Browser, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    url = f"sqlite:///{tmp_path / 'data' / 'bridge.db'}"
    tokens = {n: await add_user(url, n, admin=n == "root") for n in ("alice", "bob", "root")}
    d = Daemon(tmp_path, users_config(tmp_path, agent_env, url))
    await d.start()
    try:
        async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as http:
            r = await http.post(
                "/v1/threads", json={"agent": "stream-json", "title": "alice's thread"}, headers=bearer(tokens["alice"])
            )
            assert r.status_code == 201, r.text
        errors: list[str] = []
        for name, shown in (("alice", "alice"), ("root", "root (admin)"), ("bob", "bob")):
            ctx = await browser.new_context()
            try:
                page = await ctx.new_page()
                page.on("pageerror", lambda e: errors.append(str(e)))
                await page.goto(f"{d.url}/")
                await expect(page.locator("#login")).to_be_visible()
                await page.fill("#token", tokens[name])
                await page.click("#login-form button[type=submit]")
                await expect(page.locator("#app")).to_be_visible()
                await expect(page.locator("#whoami")).to_have_text(shown)
                # The agent's own sessions are offered to everyone (each user's in their own home).
                await page.click("#new-thread")
                await expect(page.locator("#new-dialog")).to_be_visible()
                await expect(page.locator("#new-session")).to_be_visible()
                await page.keyboard.press("Escape")
                await expect(page.locator("#new-dialog")).to_be_hidden()
                items = page.locator(".thread-item")
                if name == "bob":
                    await expect(page.locator("#thread-list .empty-list")).to_be_visible()
                    await expect(items).to_have_count(0)
                    continue
                await expect(items).to_have_count(1)
                await expect(items.first).to_contain_text("alice's thread")
                owner = items.first.locator(".t-owner")
                if name == "root":
                    await expect(owner).to_have_text("alice · ")
                else:
                    await expect(owner).to_have_count(0)
            finally:
                await ctx.close()
        assert not errors, errors
    finally:
        await d.stop()
