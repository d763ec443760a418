"""The page's chrome (issue #34 items 4 and 6): no empty side column, a search box that
is not cut at 390, 800 and 1280 px, the agent's messages without a card or a label, one
status line, the thread's state in plain words, and why a profile cannot run, in the
new-thread dialog. Real chromium, real daemon."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, expect
from test_page_e2e import Session, api_thread, browser, config, send, session_on, web

__all__ = ["browser", "web"]  # fixtures, used by name

pytestmark = pytest.mark.asyncio(loop_scope="module")

MISSING = "/nonexistent/agent-bridge-test/agent"

# The search box's width against what its placeholder needs (the input's own font and
# padding): a box narrower than its own hint is the cut box of the issue.
FITS = """(input) => {
  const style = getComputedStyle(input);
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.font = `${style.fontSize} ${style.fontFamily}`;
  const need = ctx.measureText(input.placeholder).width
    + parseFloat(style.paddingLeft) + parseFloat(style.paddingRight);
  return {width: input.clientWidth, need: Math.ceil(need)};
}"""


async def visible_width(page: Page, selector: str) -> float:
    box = await page.locator(selector).bounding_box()
    assert box is not None, selector
    return float(box["width"])


@pytest.mark.parametrize("width", [390, 800, 1280])
async def test_the_search_box_has_room_for_its_text(web: Session, width: int) -> None:
    await api_thread(web, "stream-json", title="one thread")
    page = await web.page(viewport={"width": width, "height": 800})
    if width <= 900:
        await page.click("#toggle-threads")
    search = page.locator("#thread-search")
    await expect(search).to_be_visible()
    fit = await search.evaluate(FITS)
    assert fit["width"] >= fit["need"] + 40, f"at {width} px the search box is cut: {fit}"
    await search.fill("a longer query of several words")
    await expect(page.locator("#thread-count")).to_have_text("0 of 1 threads")
    web.assert_clean()


async def test_no_empty_side_column_and_the_panel_opens_for_tasks(web: Session) -> None:
    tid = await api_thread(web, "stream-json", title="wide")
    page = await web.page(thread=tid, viewport={"width": 1280, "height": 800})
    await send(page, "hello")
    await expect(page.locator(".turn-end")).to_have_count(1)
    # Nothing to show on the side: no column; the conversation takes the width.
    await expect(page.locator("#side")).to_be_hidden()
    sidebar = await visible_width(page, "#sidebar")
    assert await visible_width(page, "#main") >= 1280 - sidebar - 2
    await expect(page.locator("#toggle-side")).to_have_attribute("aria-expanded", "false")
    # Tasks appear: the panel opens by itself beside the conversation, with a count.
    await send(page, "workflow")
    await expect(page.locator("#side")).to_be_visible()
    await expect(page.locator('#tasks .task[data-task-id="wf1"]')).to_be_visible()
    await expect(page.locator("#side-count")).to_have_text("1")
    await expect(page.locator("#toggle-side")).to_have_attribute("aria-expanded", "true")
    # The reader closes it: it stays closed.
    await page.click("#toggle-side")
    await expect(page.locator("#side")).to_be_hidden()
    assert await visible_width(page, "#main") >= 1280 - sidebar - 2
    web.assert_clean()


async def test_messages_states_and_one_status_line(web: Session) -> None:
    tid = await api_thread(web, "asker", title="plain words")
    page = await web.page(thread=tid, viewport={"width": 390, "height": 800})
    state = page.locator("#t-state")
    await expect(state).to_have_text("not started")
    await expect(page.locator("#resume")).to_have_text("Start")
    await expect(page.locator("#stop")).to_be_hidden()
    await send(page, "ask")
    await expect(page.locator("#perm-dialog")).to_be_visible()
    await expect(state).to_have_text("needs approval")
    await page.keyboard.press("Escape")
    badge = page.locator(f'.thread-item[data-thread-id="{tid}"] .badge')
    await expect(badge).to_have_text("needs approval")
    await page.click("#perm-review")
    await page.click("#perm-allow")
    await expect(page.locator(".turn-end")).to_have_count(1)
    await expect(state).to_have_text("ready")
    await expect(page.locator("#turn-status-text")).to_have_text("")
    # The agent's reply: plain text on the page, no card, no visible label (the label is
    # there for screen readers).
    reply = page.locator(".msg.assistant").last
    await expect(reply).to_contain_text("permission: allow")
    look = await reply.evaluate(
        """m => ({border: getComputedStyle(m).borderTopWidth,
                  label: m.querySelector('.who').getBoundingClientRect().width,
                  said: m.querySelector('.who').textContent})"""
    )
    assert look == {"border": "0px", "label": 1, "said": "Agent:"}, look
    # One line says how the turn ended.
    await expect(page.locator(".turn-end")).to_have_text(re.compile(r"^Done · 3 in · 5 out tokens$"))
    await page.click("#stop")
    await expect(state).to_have_text("stopped")
    await expect(page.locator("#turn-status-text")).to_have_text(
        "Stopped: your next message starts the agent again, or press Resume."
    )
    await expect(page.locator("#resume")).to_have_text("Resume")
    web.assert_clean()


@pytest_asyncio.fixture(loop_scope="module")
async def broken(browser: Browser, tmp_path: Path, agent_env: dict[str, str]) -> AsyncIterator[Session]:
    cfg = config(agent_env) + f'[agents.broken]\nprotocol = "stream-json"\nexecutable = {json.dumps(MISSING)}\n'
    async with session_on(browser, tmp_path, cfg) as s:
        yield s


async def test_the_dialog_says_why_a_profile_cannot_run(broken: Session) -> None:
    async with broken.d.http() as http:
        agents = {a["name"]: a for a in (await http.get("/v1/agents")).json()}
    problem = agents["broken"]["problem"]
    assert agents["broken"]["available"] is False and problem
    page = await broken.page(viewport={"width": 390, "height": 800})
    await page.click("#toggle-threads")
    await page.click("#new-thread")
    option = page.locator('#new-agent option[value="broken"]')
    await expect(option).to_be_disabled()
    await expect(option).to_contain_text("cannot run")
    why = page.locator('#new-unusable .unusable[data-agent="broken"]')
    await expect(why).to_be_visible()
    await expect(why).to_have_text(f"broken cannot run: {problem}")
    # Only the profiles that cannot run are named there.
    await expect(page.locator("#new-unusable .unusable")).to_have_count(1)
    broken.assert_clean()
