"""The page on a phone and pairing one (issue #39 items 3 and 4), in real chromium against a
real daemon: "Sign in another device" shows a fresh one-time QR code each time, which a
second browser context signs in with, once, and not after it expired; at 390 px with touch
emulation a permission request is answered with one tap on a large button and unblocks
the fake agent waiting on it, nothing is wider than the screen, the thread list is one tap
away, and the composer stays above the on-screen keyboard."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, expect
from support.qr_read import decode_gray
from test_page_e2e import Session, api_thread, browser, config, send, session_on, web

__all__ = ["browser", "web"]  # fixtures, used by name

pytestmark = pytest.mark.asyncio(loop_scope="module")

PHONE: dict[str, Any] = {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True}

# The QR code as the page shows it: the <img> drawn into a canvas at twice its natural size,
# read back as grey pixels (what a camera would see of the screen).
READ_IMG = """async () => {
  const img = document.querySelector('#pair-qr');
  await img.decode();
  const w = img.naturalWidth * 2, h = img.naturalHeight * 2;
  const c = document.createElement('canvas');
  c.width = w; c.height = h;
  const g = c.getContext('2d');
  g.imageSmoothingEnabled = false;
  g.drawImage(img, 0, 0, w, h);
  const d = g.getImageData(0, 0, w, h).data;
  const grey = new Array(w * h);
  for (let i = 0; i < w * h; i++) grey[i] = d[i * 4];
  return {w, h, grey};
}"""

# Every visible element whose box reaches past the viewport's right edge or is wider than
# it, outside scroll containers (a wide code block scrolls inside its own box).
TOO_WIDE = """() => {
  const vw = document.documentElement.clientWidth, out = [];
  const clipped = (e) => {
    for (let p = e.parentElement; p && p !== document.body; p = p.parentElement) {
      if (getComputedStyle(p).overflowX !== 'visible') return true;
    }
    return false;
  };
  for (const e of document.querySelectorAll('body *')) {
    const r = e.getBoundingClientRect();
    if (!r.width || !r.height || r.right <= 0) continue;
    const wide = r.right > vw + 0.5 || r.width > vw + 0.5;
    if (wide && !clipped(e)) out.push(`${e.tagName}#${e.id} ${r.left}..${r.right}`);
  }
  return out;
}"""


async def shown_qr(page: Page) -> str:
    """What the dialog's QR code says, read from its pixels by zxing-cpp."""
    await expect(page.locator("#pair-qr")).to_be_visible()
    shot = await page.evaluate(READ_IMG)
    found = decode_gray(bytes(shot["grey"]), shot["w"], shot["h"])
    assert len(found) == 1, found
    return found[0]


async def test_a_fresh_qr_code_each_time_signs_another_browser_in_once(web: Session) -> None:
    page = await web.page()
    await page.click("#pair")
    dialog = page.locator("#pair-dialog")
    await expect(dialog).to_be_visible()
    first = await shown_qr(page)
    assert re.fullmatch(re.escape(web.d.url) + r"/#login=[\w-]{43}", first), first
    await expect(page.locator("#pair-link")).to_have_text(first)
    await expect(page.locator("#pair-status")).to_contain_text(re.compile(r"expires in (10:00|9:[0-5]\d)"))
    # The daemon is on loopback here: the page says a phone could not reach it.
    await expect(page.locator("#pair-loopback")).to_be_visible()
    await page.click("#pair-new")
    await expect(page.locator("#pair-link")).not_to_have_text(first)
    second = await shown_qr(page)
    assert second != first
    # Closed, the code is gone from the page; opened again, another one.
    await page.click("#pair-close")
    await expect(dialog).to_be_hidden()
    assert await page.locator("#pair-qr").get_attribute("src") is None
    assert await page.locator("#pair-link").text_content() == ""
    await page.click("#pair")
    third = await shown_qr(page)
    assert third not in (first, second)

    # The phone: a second context, never signed in, opens what the camera read.
    phone = web.watch(await (await web.context(**PHONE)).new_page())
    await phone.goto(second)
    await expect(phone.locator("#app")).to_be_visible()
    await expect(phone.locator("#login")).to_be_hidden()
    assert "#login" not in phone.url  # the code left the address bar
    # Used once: a third context with the same link is refused.
    again = web.watch(await (await web.context()).new_page())
    await again.goto(second)
    await expect(again.locator("#login")).to_be_visible()
    await expect(again.locator("#login-error")).to_contain_text("already used or has expired")
    # The first code was never used: it still works, once.
    late = web.watch(await (await web.context()).new_page())
    await late.goto(first)
    await expect(late.locator("#app")).to_be_visible()
    # Signing the pairing browser out takes back the code it showed last.
    await page.click("#pair-close")
    await page.click("#logout")
    await expect(page.locator("#login")).to_be_visible()
    after = web.watch(await (await web.context()).new_page())
    await after.goto(third)
    await expect(after.locator("#login-error")).to_contain_text("already used or has expired")
    web.errors = [e for e in web.errors if "401" not in e]  # the refused sign-ins, logged by chromium
    web.assert_clean()


@pytest_asyncio.fixture(loop_scope="module")
async def short_codes(browser: Browser, tmp_path: Path, agent_env: dict[str, str]) -> AsyncIterator[Session]:
    cfg = config(agent_env).replace("[server]\n", "[server]\nlogin_code_ttl_s = 5\n", 1)
    async with session_on(browser, tmp_path, cfg) as s:
        yield s


async def test_an_expired_qr_code_is_taken_off_the_page_and_refused(short_codes: Session) -> None:
    s = short_codes
    page = await s.page()
    await page.click("#pair")
    link = await shown_qr(page)
    # The page counts the code's life down and takes it away when it is over (the daemon
    # issued it before the page heard of it, so it is over there too).
    await expect(page.locator("#pair-status")).to_contain_text("expired")
    await expect(page.locator("#pair-qr")).to_be_hidden()
    await expect(page.locator("#pair-link")).to_have_text("")
    phone = s.watch(await (await s.context(**PHONE)).new_page())
    await phone.goto(link)
    await expect(phone.locator("#login-error")).to_contain_text("already used or has expired")
    # "New code" brings another.
    await page.click("#pair-new")
    assert await shown_qr(page) != link
    s.errors = [e for e in s.errors if "401" not in e]
    s.assert_clean()


async def test_on_a_phone_one_tap_answers_a_permission_and_unblocks_the_agent(web: Session) -> None:
    other = await api_thread(web, "stream-json", title="another thread")
    tid = await api_thread(web, "asker", title="asking")
    page = await web.page(thread=tid, **PHONE)
    assert await page.evaluate(TOO_WIDE) == []
    await send(page, "ask")
    dialog = page.locator("#perm-dialog")
    await expect(dialog).to_be_visible()
    # However long the request, the answers stay on screen: a long input scrolls inside.
    await page.evaluate("document.querySelector('#perm-input').textContent = 'x\\n'.repeat(400) + 'y'.repeat(3000)")
    for sel in ("#perm-deny", "#perm-allow"):
        box = await page.locator(sel).bounding_box()
        assert box is not None, sel
        assert box["height"] >= 44, (sel, box)
        assert box["x"] >= 0 and box["x"] + box["width"] <= 390, (sel, box)
        assert box["y"] >= 0 and box["y"] + box["height"] <= 844, (sel, box)
    assert await page.evaluate(TOO_WIDE) == []
    await page.tap("#perm-allow")
    await expect(dialog).to_be_hidden()
    # The fake agent was waiting on the answer: it goes on with it.
    await expect(page.locator(".msg.assistant .body").last).to_have_text("permission: allow")
    await expect(page.locator(".turn-end")).to_have_count(1)
    # The thread list is one tap on "Threads" away, and a tap on a thread opens it.
    toggle = page.locator("#toggle-threads")
    box = await toggle.bounding_box()
    assert box is not None and box["height"] >= 44
    await page.tap("#toggle-threads")
    await expect(page.locator("#sidebar")).to_be_visible()
    assert await page.evaluate(TOO_WIDE) == []
    await page.locator(".thread-item", has_text="another thread").tap()
    await expect(page.locator("#sidebar")).to_be_hidden()
    await expect(page.locator("#t-title")).to_have_text("another thread")
    assert other in page.url
    assert await page.evaluate(TOO_WIDE) == []
    web.assert_clean()


async def composer_bottom(page: Page) -> float:
    box = await page.locator("#composer").bounding_box()
    assert box is not None
    return float(box["y"] + box["height"])


async def test_on_a_phone_the_composer_stays_above_the_on_screen_keyboard(web: Session) -> None:
    tid = await api_thread(web, "stream-json", title="typing")
    page = await web.page(thread=tid, **PHONE)
    await page.tap("#prompt")
    await expect(page.locator("#prompt")).to_be_focused()
    # A keyboard that shrinks the layout (Chrome on Android with resizes-content).
    await page.set_viewport_size({"width": 390, "height": 480})
    await wait_until_true(page, "document.querySelector('#composer').getBoundingClientRect().bottom <= 480")
    assert await composer_bottom(page) <= 480
    assert await page.evaluate(TOO_WIDE) == []
    await page.keyboard.type("typed on a phone")
    await page.keyboard.press("Enter")
    await expect(page.locator(".msg.assistant .body").last).to_have_text("echo: typed on a phone")
    assert await composer_bottom(page) <= 480
    # A keyboard that covers only the visual viewport (Safari on iOS): the page follows
    # visualViewport's resize. The browser's keyboard is stood in for by the height it
    # reports and the event it fires.
    await page.set_viewport_size({"width": 390, "height": 844})
    await page.evaluate(
        """() => { Object.defineProperty(window.visualViewport, 'height', {configurable: true, get: () => 400});
                   window.visualViewport.dispatchEvent(new Event('resize')); }"""
    )
    await wait_until_true(page, "document.querySelector('#composer').getBoundingClientRect().bottom <= 400")
    assert await page.evaluate("getComputedStyle(document.querySelector('#app')).height") == "400px"
    prompt = await page.locator("#prompt").bounding_box()
    assert prompt is not None and prompt["y"] >= 0 and prompt["y"] + prompt["height"] <= 400
    # The keyboard goes away: the whole screen again.
    await page.evaluate(
        """() => { delete window.visualViewport.height;
                   window.visualViewport.dispatchEvent(new Event('resize')); }"""
    )
    await wait_until_true(page, "document.querySelector('#composer').getBoundingClientRect().bottom > 800")
    assert await page.evaluate(TOO_WIDE) == []
    web.assert_clean()


async def wait_until_true(page: Page, js: str) -> None:
    await page.wait_for_function(js)
