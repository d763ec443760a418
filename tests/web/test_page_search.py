"""Search, export and archive on the page (issue #38 item 4, docs/api.md §4.22-§4.24):
the thread box's words searched in what was said (Enter or the button), each hit with its
thread's title and the matched words marked, its snippet shown as text (a prompt holding
markup stays text), a click opening the thread; Export downloads the Markdown document;
Archive takes the thread out of the list, where "Archived" finds it, and Unarchive brings
it back. Real chromium, real daemon."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import expect
from test_page_e2e import Session, api_thread, browser, web

__all__ = ["browser", "web"]  # fixtures, used by name

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_search_export_and_archive_on_the_page(web: Session, tmp_path: Path) -> None:
    alpha = await api_thread(web, "stream-json", title="alpha")
    beta = await api_thread(web, "stream-json", title="beta")
    c = await web.d.ws(alpha)
    await c.turn("hello <b>narwhal</b> friend")
    await c.close()
    c = await web.d.ws(beta)
    await c.turn("nothing to see")
    await c.close()

    page = await web.page()
    await expect(page.locator("#thread-list .thread-item")).to_have_count(2)
    await page.fill("#thread-search", "narwhal")
    await page.press("#thread-search", "Enter")
    hits = page.locator("#search-hits .search-hit")
    await expect(hits).to_have_count(2)  # the prompt and the answer
    await expect(page.locator("#search-status")).to_have_text("2 found in messages")
    await expect(hits.first.locator(".hit-thread")).to_have_text("alpha")
    await expect(hits.first.locator("mark")).to_have_text("narwhal")
    assert await page.locator("#search-hits b").count() == 0  # the prompt's markup is text
    await expect(hits.last.locator(".hit-snippet")).to_contain_text("<b>narwhal</b>")
    await hits.last.click()
    await expect(page.locator("#t-title")).to_have_text("alpha")

    async with page.expect_download() as info:
        await page.click("#export")
    download = await info.value
    assert download.suggested_filename == f"{alpha}.md"
    saved = tmp_path / "export.md"
    await download.save_as(saved)
    text = saved.read_text()
    assert text.startswith("# alpha\n") and "hello <b>narwhal</b> friend" in text and "*Turn ended: success*" in text

    await page.click("#archive")
    await expect(page.locator("#archive")).to_have_text("Unarchive")
    await page.fill("#thread-search", "")
    items = page.locator("#thread-list .thread-item")
    await expect(items).to_have_count(1)
    await expect(items.first.locator(".t-title")).to_have_text("beta")
    await page.select_option("#thread-state", "archived")
    await expect(items).to_have_count(1)
    await expect(items.first.locator(".t-title")).to_have_text("alpha")
    await page.click("#archive")
    await expect(page.locator("#archive")).to_have_text("Archive")
    await expect(page.locator("#thread-list .empty-list")).to_have_text("No thread matches.")
    await page.select_option("#thread-state", "")
    await expect(items).to_have_count(2)
    web.assert_clean()

    # a query with no word: the daemon's 400 says why (the browser logs the 400 itself)
    await page.fill("#thread-search", "*** (((")
    await page.click("#search-messages")
    await expect(page.locator("#search-status")).to_have_text("q has no word to look for")
    await expect(hits).to_have_count(0)
