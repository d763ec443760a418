"""A thread nobody named takes its first prompt's first line (issue #38 item 6, docs/api.md
§4.3): sent from the page, the thread's header and the thread list show it at once, and a
page that only lists threads sees it arrive live. Real chromium, real daemon."""

from __future__ import annotations

import pytest
from playwright.async_api import expect
from test_page_e2e import Session, api_thread, browser, send, web

__all__ = ["browser", "web"]  # fixtures, used by name

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_the_first_prompt_names_the_thread_in_every_tab(web: Session) -> None:
    tid = await api_thread(web, "stream-json")
    page = await web.page(thread=tid)
    other = await web.page()  # another browser, on the list alone
    item = other.locator("#thread-list .thread-item")
    await expect(item.locator(".t-title")).to_have_text("Untitled")
    await expect(page.locator("#t-title")).to_have_text("Untitled")
    await page.fill("#prompt", "fix the login bug\nit fails after the redirect")
    await page.press("#prompt", "Enter")
    await expect(page.locator("#t-title")).to_have_text("fix the login bug")
    await expect(page.locator("#thread-list .thread-item .t-title")).to_have_text("fix the login bug")
    await expect(item.locator(".t-title")).to_have_text("fix the login bug")
    await send(page, "a second prompt names nothing")
    await expect(page.locator(".turn-end")).to_have_count(2)
    await expect(item.locator(".t-title")).to_have_text("fix the login bug")
