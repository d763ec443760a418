"""A long thread opens from its history's newest page and loads older pages as the reader
scrolls up (web/history.js, docs/api.md §4.16, issue #36): the page never replays the
transcript from its first event, shows every turn once and in order once the older pages
are in, and goes on live from where the page ended. Real chromium, real daemon; the
threshold for "long" is lowered for the test through localStorage."""

from __future__ import annotations

import re

import pytest
from playwright.async_api import expect
from test_page_e2e import Session, api_thread, browser, send, web

__all__ = ["browser", "web"]  # fixtures, used by name

pytestmark = pytest.mark.asyncio(loop_scope="module")

TURNS = 80  # 3 items a turn (prompt, reply, turn end): more than one page of 200 items
USER_TEXTS = "() => [...document.querySelectorAll('#transcript .msg.user .body')].map(n => n.textContent)"


async def test_a_long_thread_opens_from_its_history_and_loads_older_pages_on_scroll_up(web: Session) -> None:
    tid = await api_thread(web, "stream-json", title="long")
    c = await web.d.ws(tid)
    for n in range(TURNS):
        await c.turn(f"m{n}")
    await c.close()
    async with web.d.http() as http:
        last_seq = (await http.get(f"/v1/threads/{tid}")).json()["last_seq"]

    ctx = await web.context()
    await ctx.add_init_script("localStorage.setItem('agent-bridge.history-from', '50')")
    page = await web.page(ctx, thread=tid)
    await expect(page.locator("#transcript .msg.user .body").last).to_have_text(f"m{TURNS - 1}")
    shown = await page.evaluate(USER_TEXTS)
    assert 0 < len(shown) < TURNS and shown == [f"m{n}" for n in range(TURNS - len(shown), TURNS)]
    assert any(f"/v1/threads/{tid}/history?limit=200" in u for u in web.urls)
    replays = [u for u in web.urls if f"/v1/threads/{tid}/events?after=" in u or f"/v1/threads/{tid}/ws?after=" in u]
    assert replays and all(re.search(rf"after={last_seq}\b", u) for u in replays), replays

    await page.locator("#transcript").evaluate("t => { t.scrollTop = 0; }")
    await expect(page.locator("#transcript .msg.user")).to_have_count(TURNS)
    assert await page.evaluate(USER_TEXTS) == [f"m{n}" for n in range(TURNS)]
    await expect(page.locator(".older-history")).to_have_count(0)  # nothing older left
    await expect(page.locator("#transcript .turn-end")).to_have_count(TURNS)

    await send(page, "live")  # and it goes on live from the page's last_seq
    await expect(page.locator("#transcript .msg.assistant .body").last).to_have_text("echo: live")
    await expect(page.locator("#transcript .msg.user")).to_have_count(TURNS + 1)
    web.assert_clean()
