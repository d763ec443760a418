"""The page's card for an agent's questions (elicitations, docs/api.md §6.10): a form built
from the agent's schema, answered in one tab and gone from every tab; a URL shown as a
link with its host and a warning, never opened by itself. Real chromium, real daemon, the
fake ACP agent."""

from __future__ import annotations

import json

import pytest
from playwright.async_api import expect
from test_page_e2e import Session, api_thread, browser, send, web

__all__ = ["browser", "web"]  # fixtures, used by name

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_a_form_answered_in_one_tab_closes_in_every_tab(web: Session) -> None:
    tid = await api_thread(web, "acp")
    page = await web.page(thread=tid)
    other = await web.tab(page.context, tid)
    await send(page, "elicit form")
    card = page.locator("#elicit")
    await expect(card).to_be_visible()
    await expect(other.locator("#elicit")).to_be_visible()
    await expect(card.locator(".elicit-message")).to_have_text("Tell me about it")
    await expect(card.locator("label", has_text="Name")).to_be_visible()
    count = card.locator("input[type=number]")
    await expect(count).to_have_value("2")  # the schema's default
    await expect(count).to_have_attribute("max", "5")
    await card.locator("input[type=text]").fill("Ada")
    await count.fill("3")
    await card.locator("select").select_option("green")
    await card.locator("label", has_text="Agree").locator("input").check()
    await card.locator(".elicit-choices label", has_text="B").locator("input").check()
    await card.locator("button", has_text="Accept").click()
    await expect(card).to_be_hidden()
    await expect(other.locator("#elicit")).to_be_hidden()
    said = {"agree": True, "color": "green", "count": 3, "name": "Ada", "tags": ["b"]}
    await expect(page.locator(".msg.assistant .body").last).to_have_text(
        f"elicit: accept {json.dumps(said, sort_keys=True)}"
    )
    web.assert_clean()


async def test_a_url_is_a_link_with_its_host_and_a_warning(web: Session) -> None:
    tid = await api_thread(web, "acp")
    page = await web.page(thread=tid)
    await send(page, "elicit url")
    card = page.locator("#elicit")
    await expect(card).to_be_visible()
    link = card.locator("a.elicit-link")
    await expect(link).to_have_text("https://example.com/connect?e=fake-1")
    await expect(link).to_have_attribute("rel", "noopener noreferrer")
    await expect(card.locator(".elicit-warning").first).to_contain_text("example.com")
    await card.locator("button", has_text="Decline").click()
    await expect(card).to_be_hidden()
    await expect(page.locator(".msg.assistant .body").last).to_have_text("elicit: decline null")
    web.assert_clean()


async def test_a_question_still_waiting_is_shown_after_a_reload(web: Session) -> None:
    tid = await api_thread(web, "acp")
    page = await web.page(thread=tid)
    await send(page, "elicit form")
    await expect(page.locator("#elicit")).to_be_visible()
    await page.reload()
    await expect(page.locator("#thread")).to_be_visible()
    card = page.locator("#elicit")
    await expect(card).to_be_visible()
    await card.locator("button", has_text="Cancel").click()
    await expect(card).to_be_hidden()
    await expect(page.locator(".msg.assistant .body").last).to_have_text("elicit: cancel null")
    web.assert_clean()
