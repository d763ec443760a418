"""Fork from any message (issue #38 item 7, docs/api.md §4.26; web/fork.js): a reply's Fork
makes a thread with the conversation up to its turn's end, a prompt's Fork one with the
conversation before it and the prompt in the new thread's box; the fork opens, says where it
came from, and goes on as a thread of its own; the buttons work from the keyboard; an agent
that cannot fork says so. Real chromium, real daemon."""

from __future__ import annotations

import pytest
from playwright.async_api import Page, expect
from test_page_a11y import scan
from test_page_e2e import Session, api_thread, browser, send, web

__all__ = ["browser", "web"]  # fixtures, used by name

pytestmark = pytest.mark.asyncio(loop_scope="module")

USERS = "() => [...document.querySelectorAll('#transcript .msg.user .body')].map(n => n.textContent)"


async def source(web: Session, agent: str, prompts: list[str]) -> str:
    tid = await api_thread(web, agent, title="source")
    c = await web.d.ws(tid)
    for text in prompts:
        await c.turn(text)
    await c.close()
    return tid


async def opened_fork(page: Page, src: str) -> str:
    await expect(page.locator("#t-fork")).to_be_visible()  # (the source's is hidden)
    await expect(page.locator("#t-fork")).to_have_text("Forked from “source”")
    tid: str = await page.evaluate("() => window.agentBridge.current.id")
    assert tid != src
    return tid


async def test_a_reply_and_a_prompt_fork_the_conversation_at_their_turns(web: Session) -> None:
    src = await source(web, "stream-json", ["one", "two", "three"])
    page = await web.page(thread=src)
    await expect(page.locator(".turn-end")).to_have_count(3)

    # The second reply's Fork, from the keyboard: the conversation up to its turn's end.
    button = page.locator("#transcript .msg.assistant").nth(1).locator(".msg-fork")
    await button.focus()
    await expect(button).to_have_css("opacity", "1")  # shown when focused
    await page.keyboard.press("Enter")
    fork = await opened_fork(page, src)
    await expect(page.locator("#t-title")).not_to_have_text("")
    await expect(page.locator(".turn-end")).to_have_count(2)
    assert await page.evaluate(USERS) == ["one", "two"]
    async with web.d.http() as http:
        thread = (await http.get(f"/v1/threads/{fork}")).json()
        ends = [
            e["seq"]
            for e in (await http.get(f"/v1/threads/{src}/events", params={"limit": 1000})).json()["events"]
            if e["kind"] == "turn.ended"
        ]
    assert thread["forked_from"] == {"thread": src, "seq": ends[1]}
    problems: list[str] = []
    await page.locator("#transcript .msg.user .msg-fork").first.focus()
    await scan(page, "a fork: its link, a Fork button focused", problems)  # axe-core
    assert not problems, problems
    await send(page, "four")  # a thread of its own now
    await expect(page.locator(".turn-end")).to_have_count(3)
    await expect(page.locator("#transcript .msg.assistant .body").last).to_have_text("echo: four")

    # Back to the source by the header's link; its third prompt's Fork: the conversation
    # before it, the prompt in the new thread's box.
    await page.click("#t-fork")
    await expect(page.locator("#t-title")).to_have_text("source")
    await expect(page.locator(".turn-end")).to_have_count(3)
    await page.locator("#transcript .msg.user").nth(2).locator(".msg-fork").click()
    await opened_fork(page, src)
    await expect(page.locator(".turn-end")).to_have_count(2)
    assert await page.evaluate(USERS) == ["one", "two"]
    await expect(page.locator("#prompt")).to_have_value("three")
    await expect(page.locator("#prompt")).to_be_focused()
    await expect(page.locator("#thread-list .thread-item")).to_have_count(3)
    web.assert_clean()


async def test_an_agent_that_cannot_fork_says_so(web: Session) -> None:
    src = await source(web, "awp-jsonl", ["one"])
    page = await web.page(thread=src)
    await expect(page.locator(".turn-end")).to_have_count(1)
    await page.locator("#transcript .msg.assistant .msg-fork").click()
    await expect(page.locator("#send-error")).to_contain_text("This thread's agent cannot fork here: ")
    await expect(page.locator("#t-title")).to_have_text("source")
    await expect(page.locator("#thread-list .thread-item")).to_have_count(1)
    web.errors = [e for e in web.errors if "409" not in e]  # chromium logs the refusal
    web.assert_clean()
