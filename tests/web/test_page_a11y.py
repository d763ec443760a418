"""Accessibility (issue #21 item 6): axe-core (vendored under tests/web/vendor, injected
by the test, never served) scans every screen of the page — sign-in, the thread list,
a conversation with tool cards and a diff, each dialog, the permission prompt, a phone-
sized screen and dark mode — and finds no serious or critical violation. Focus moves
into each dialog and back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, expect
from test_page_e2e import Session, api_thread, browser, send, web
from test_page_tools import EVENTS

__all__ = ["browser", "web"]  # fixtures, used by name

pytestmark = pytest.mark.asyncio(loop_scope="module")

AXE = (Path(__file__).parent / "vendor" / "axe-core" / "axe.min.js").read_text()
BLOCKING = ("serious", "critical")


async def scan(page: Page, screen: str, problems: list[str]) -> None:
    """Runs axe on the page as it is now; adds each serious or critical violation."""
    if not await page.evaluate("() => typeof window.axe === 'object'"):
        await page.evaluate(AXE)  # DevTools evaluation: not subject to the page's CSP
    result: dict[str, Any] = await page.evaluate(
        "() => axe.run(document, {resultTypes: ['violations']})"
        ".then(r => r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,"
        " nodes: v.nodes.map(n => n.target.join(' ')).slice(0, 5)})))"
        ".then(violations => ({violations}))"
    )
    for v in result["violations"]:
        if v["impact"] in BLOCKING:
            problems.append(f"{screen}: {v['impact']} {v['id']} ({v['help']}) at {v['nodes']}")


async def test_no_serious_violation_on_any_screen(web: Session) -> None:
    problems: list[str] = []
    tid = await api_thread(web, "asker", title="accessible")
    ctx = await web.context(viewport={"width": 1280, "height": 800})
    page = web.watch(await ctx.new_page())
    await page.goto(f"{web.d.url}/")
    await expect(page.locator("#login")).to_be_visible()
    await scan(page, "sign-in", problems)
    await page.fill("#token", "wrong-token-wrong-token-wrong")
    await page.click("#login-form button[type=submit]")
    await expect(page.locator("#login-error")).to_have_text("That token is not right.")
    await scan(page, "sign-in refused", problems)
    web.errors = [e for e in web.errors if "401" not in e]  # chromium logs the refusal
    await page.close()

    page = await web.page(ctx, thread=tid)
    await scan(page, "thread, empty", problems)
    await send(page, "ask")
    await expect(page.locator("#perm-dialog")).to_be_visible()
    await expect(page.locator("#perm-deny")).to_be_focused()
    await scan(page, "permission dialog", problems)
    await page.click("#perm-allow")
    await expect(page.locator(".turn-end")).to_have_count(1)
    await expect(page.locator("#prompt")).to_be_focused()  # back where the user types
    await send(page, "tool")
    await expect(page.locator(".turn-end")).to_have_count(2)
    await page.locator(".tool > summary").first.click()  # a tool card, open
    await scan(page, "conversation with a tool card", problems)
    await page.click("#toggle-side")  # the side panel (closed while there are no tasks), all open
    for panel in ("#tasks-panel", "#diag-panel", "#secret-panel"):
        await page.eval_on_selector(panel, "d => { d.open = true; }")
    await scan(page, "side panel", problems)
    await page.click("#toggle-side")

    for opener, dialog, focused in [
        ("#new-thread", "#new-dialog", "#new-agent"),
        ("#rename", "#rename-dialog", "#rename-input"),
        ("#delete", "#confirm-dialog", "#confirm-no"),
        ("#show-keys", "#keys-dialog", "#keys-close"),
    ]:
        await page.click(opener)
        await expect(page.locator(dialog)).to_be_visible()
        await expect(page.locator(focused)).to_be_focused()
        await scan(page, dialog, problems)
        await page.keyboard.press("Escape")
        await expect(page.locator(dialog)).to_be_hidden()
        await expect(page.locator(opener)).to_be_focused()  # focus comes back

    # Every kind of tool card (diffs, a failed command, images), open, in the conversation.
    await page.evaluate(
        """async (events) => {
            const { TranscriptView } = await import('/assets/transcript.js');
            const box = document.createElement('div');
            document.querySelector('#transcript').append(box);
            new TranscriptView(box).apply(events);
            box.querySelectorAll('details').forEach((d) => { d.open = true; });
        }""",
        EVENTS,
    )
    await scan(page, "tool cards of every kind", problems)
    await page.click("#stop")
    await expect(page.locator("#t-state")).to_have_text("stopped")
    await scan(page, "an exited thread", problems)

    await page.fill("#prompt", "/")  # the slash-command menu
    await expect(page.locator("#slash-menu")).to_be_visible()
    await scan(page, "slash-command menu", problems)
    await page.fill("#prompt", "")

    await page.emulate_media(color_scheme="dark")
    await scan(page, "dark mode", problems)
    await page.set_viewport_size({"width": 390, "height": 844})
    await scan(page, "390 px", problems)
    await page.click("#toggle-threads")
    await expect(page.locator("#sidebar")).to_be_visible()
    await scan(page, "390 px, thread list open", problems)
    await page.emulate_media(color_scheme="light")
    await scan(page, "390 px, light", problems)
    assert not problems, "\n".join(problems)
    web.assert_clean()
