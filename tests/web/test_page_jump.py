"""A search hit opens its thread at the event it found (issue #38 item 7, docs/api.md §4.22:
a hit's seq; web/jump.js): the block showing that event is scrolled into view, marked and
focused — in a long thread that opened from its history's newest page, after the older
pages that reach back to it were loaded; in a thread replayed from its first event, once
the replay has passed it; and in the thread already open, without opening it again. Real
chromium, real daemon; the threshold for "long" is lowered through localStorage."""

from __future__ import annotations

import pytest
from playwright.async_api import Page, expect
from test_page_e2e import Session, api_thread, browser, web

__all__ = ["browser", "web"]  # fixtures, used by name

pytestmark = pytest.mark.asyncio(loop_scope="module")

TURNS = 80  # 3 items a turn: the newest page of 200 items holds about the last 66 turns
USERS = "#transcript .msg.user"


async def search(page: Page, words: str) -> None:
    await page.fill("#thread-search", words)
    await page.press("#thread-search", "Enter")


async def filled(web: Session, tid: str, turns: int, needle: dict[int, str]) -> None:
    c = await web.d.ws(tid)
    for n in range(turns):
        await c.turn(f"m{n} {needle[n]}" if n in needle else f"m{n}")
    await c.close()


async def test_a_hit_on_an_older_page_of_a_long_thread_is_loaded_shown_and_focused(web: Session) -> None:
    tid = await api_thread(web, "stream-json", title="long")
    await filled(web, tid, TURNS, {2: "narwhal"})
    ctx = await web.context(viewport={"width": 1280, "height": 800})
    await ctx.add_init_script("localStorage.setItem('agent-bridge.history-from', '50')")
    page = await web.page(ctx)
    await search(page, "narwhal")
    hits = page.locator("#search-hits .search-hit")
    await expect(hits).to_have_count(2)  # the answer (newest first), then the prompt
    await hits.last.click()
    target = page.locator(f"{USERS}.jump-target")
    await expect(target.locator(".body")).to_have_text("m2 narwhal")
    await expect(target).to_be_in_viewport()
    await expect(target).to_be_focused()
    assert any(f"/v1/threads/{tid}/history?limit=200&before=" in u for u in web.urls)  # an older page
    # the newest page alone does not reach back to turn 2: older pages were put on top
    first = await page.locator(f"{USERS} .body").first.text_content()
    assert first is not None and int(first.split()[0][1:]) <= 2

    await hits.first.click()  # the answer, in the thread already open
    answer = page.locator("#transcript .msg.assistant.jump-target")
    await expect(answer.locator(".body")).to_have_text("echo: m2 narwhal")
    await expect(answer).to_be_in_viewport()
    await expect(page.locator("#transcript .jump-target")).to_have_count(1)
    web.assert_clean()


async def test_a_hit_in_a_replayed_thread_waits_for_the_replay_and_stays_in_view(web: Session) -> None:
    other = await api_thread(web, "stream-json", title="other")
    tid = await api_thread(web, "stream-json", title="replayed")
    await filled(web, tid, 40, {5: "okapi"})
    page = await web.page(thread=other, viewport={"width": 1280, "height": 700})
    await search(page, "okapi")
    hits = page.locator("#search-hits .search-hit")
    await expect(hits).to_have_count(2)
    await hits.first.click()
    answer = page.locator("#transcript .msg.assistant.jump-target")
    await expect(answer.locator(".body")).to_have_text("echo: m5 okapi")
    await expect(page.locator("#t-title")).to_have_text("replayed")
    await expect(page.locator(USERS)).to_have_count(40)  # the whole thread, replayed
    await expect(answer).to_be_in_viewport()
    # the reader stays at the hit: the view does not follow the bottom any more
    assert not await page.evaluate("() => window.agentBridge.current.view.pinned")
    await expect(page.locator(f"{USERS}").last).not_to_be_in_viewport()
    web.assert_clean()
