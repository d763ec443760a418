"""What turns used, on the page (issue #38 items 5 and 7, docs/api.md §4.25): the thread
header's line with the open thread's totals, the sidebar's line with everything the user's
threads used (GET /v1/usage), both brought up to date as turns end. Real chromium, real
daemon, the fake stream-json agent (3 tokens in, 5 out and 0.125 USD a turn)."""

from __future__ import annotations

import pytest
from playwright.async_api import expect
from test_page_e2e import Session, api_thread, browser, web

__all__ = ["browser", "web"]  # fixtures, used by name

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_thread_header_and_sidebar_show_what_turns_used(web: Session) -> None:
    alpha = await api_thread(web, "stream-json", title="alpha")
    beta = await api_thread(web, "stream-json", title="beta")
    c = await web.d.ws(alpha)
    await c.turn("one")
    await c.turn("two")
    await c.close()

    page = await web.page()
    await expect(page.locator("#thread-list .thread-item")).to_have_count(2)
    await expect(page.locator("#usage-total")).to_have_text("Used: 2 turns · 6 in · 10 out · $0.25")
    await page.locator("#thread-list .thread-item", has_text="alpha").click()
    await expect(page.locator("#t-usage")).to_have_text("2 turns · 6 in · 10 out · $0.25")
    await page.locator("#thread-list .thread-item", has_text="beta").click()
    await expect(page.locator("#t-title")).to_have_text("beta")
    await expect(page.locator("#t-usage")).to_have_text("")  # no turn has ended in it

    c = await web.d.ws(beta)  # a turn ends while the page watches
    await c.turn("three")
    await c.close()
    await expect(page.locator("#t-usage")).to_have_text("1 turn · 3 in · 5 out · $0.13")
    await expect(page.locator("#usage-total")).to_have_text("Used: 3 turns · 9 in · 15 out · $0.38")
