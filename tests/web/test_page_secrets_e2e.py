"""The page's "My secrets" section (issue #32 item 2, docs/web.md) in a real browser
(Debian's chromium driven by Playwright) against a real daemon in users mode: a user
stores a secret from the write-only field, sees its name listed (never its value, which
the page does not keep), deletes it; another user sees none of it; no page error, no
console error but refused requests' (a CSP violation is one)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from conftest import STEP_TIMEOUT, Daemon
from playwright.async_api import Browser, expect
from test_page_users_e2e import browser  # noqa: F401 -- the module's browser fixture
from test_users_e2e import add_user, bearer, users_config

pytestmark = pytest.mark.asyncio(loop_scope="module")
VALUE = "page-s3cret-Value-51ab"


async def test_a_user_stores_lists_and_deletes_a_secret_on_the_page(
    browser: Browser,  # noqa: F811
    tmp_path: Path,
    agent_env: dict[str, str],
) -> None:
    url = f"sqlite:///{tmp_path / 'data' / 'bridge.db'}"
    tokens = {n: await add_user(url, n) for n in ("alice", "bob")}
    d = Daemon(tmp_path, users_config(tmp_path, agent_env, url))
    await d.start()
    errors: list[str] = []
    ctx = await browser.new_context()
    try:
        page = await ctx.new_page()
        page.on("pageerror", lambda e: errors.append(str(e)))
        # (A refused request is a console error of its own: the sign-in probe's 401, PATH's 400.)
        page.on(
            "console",
            lambda m: errors.append(m.text) if m.type == "error" and "Failed to load resource" not in m.text else None,
        )
        await page.goto(f"{d.url}/")
        await page.fill("#token", tokens["alice"])
        await page.click("#login-form button[type=submit]")
        await expect(page.locator("#whoami")).to_have_text("alice")
        await page.click("#toggle-side")  # the side panel holds "My secrets"
        await page.click("#secret-panel > summary")
        await expect(page.locator("#secret-empty")).to_be_visible()
        await expect(page.locator("#secret-value")).to_have_attribute("type", "password")
        await page.select_option("#secret-profile", "stream-json")
        await page.fill("#secret-key", "lower")
        await page.fill("#secret-value", VALUE)
        await page.click("#secret-save")
        await expect(page.locator("#secret-error")).to_contain_text("environment variable")
        await page.fill("#secret-key", "PATH")
        await page.click("#secret-save")
        await expect(page.locator("#secret-error")).to_contain_text("reserved")  # the daemon's refusal
        await page.fill("#secret-key", "MY_TOKEN")
        await page.click("#secret-save")
        rows = page.locator("#secret-list li")
        await expect(rows).to_have_count(1)
        await expect(rows.first).to_contain_text("MY_TOKEN")
        await expect(rows.first).to_contain_text("stream-json")
        await expect(page.locator("#secret-value")).to_have_value("")
        await expect(page.locator("#secret-count")).to_have_text("(1)")
        assert VALUE not in await page.content()
        async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as http:
            mine = (await http.get("/v1/me/secrets", headers=bearer(tokens["alice"]))).json()["secrets"]
            assert [(s["profile"], s["key"]) for s in mine] == [("stream-json", "MY_TOKEN")]
            assert (await http.get("/v1/me/secrets", headers=bearer(tokens["bob"]))).json() == {"secrets": []}
        await page.click("#secret-list li button")
        await expect(rows).to_have_count(0)
        await expect(page.locator("#secret-empty")).to_be_visible()
        async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as http:
            assert (await http.get("/v1/me/secrets", headers=bearer(tokens["alice"]))).json() == {"secrets": []}
        assert not errors, errors
    finally:
        await ctx.close()
        await d.stop()
