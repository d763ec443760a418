"""Finding threads and driving the page from the keyboard (issue #21 item 4): search and
state filter of the thread list, the shortcut list behind "?", j/k between threads, and
the agent's slash commands in a menu of the message box. Real chromium, real daemon."""

from __future__ import annotations

import re

import pytest
from playwright.async_api import expect
from test_page_e2e import Session, api_thread, browser, send, web

__all__ = ["browser", "web"]  # fixtures, used by name

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_search_and_filter_the_threads_and_move_between_them_by_key(web: Session) -> None:
    a = await api_thread(web, "stream-json", title="alpha report")
    b = await api_thread(web, "awp-jsonl", title="beta")
    c = await api_thread(web, "demo", title="gamma notes")
    page = await web.page()
    items = page.locator(".thread-item")
    await expect(items).to_have_count(3)
    # By title words, by agent, by folder (the demo's fresh workspace is under the data dir).
    await page.fill("#thread-search", "report alpha")
    await expect(items).to_have_count(1)
    await expect(items.first).to_have_attribute("data-thread-id", a)
    await expect(page.locator("#thread-count")).to_have_text("1 of 3 threads")
    await page.fill("#thread-search", "awp-jsonl")
    await expect(items).to_have_count(1)
    await expect(items.first).to_have_attribute("data-thread-id", b)
    await page.fill("#thread-search", "workspaces")
    await expect(items).to_have_text([re.compile("alpha"), re.compile("beta"), re.compile("gamma")][::-1])
    await page.fill("#thread-search", "nothing like this")
    await expect(page.locator("#thread-list .empty-list")).to_have_text("No thread matches.")
    await page.fill("#thread-search", "")
    # By state: one thread ready (its agent running), the others not started.
    async with web.d.http() as http:
        assert (await http.post(f"/v1/threads/{c}/messages", json={"text": "hello"})).status_code == 202
    await page.select_option("#thread-state", "ready")
    await expect(items).to_have_count(1)
    await expect(items.first).to_have_attribute("data-thread-id", c)
    await page.select_option("#thread-state", "new")
    await expect(items).to_have_count(2)
    await page.select_option("#thread-state", "")
    await expect(items).to_have_count(3)

    # Keys act outside fields only: "/" searches, j/k walk the list, "i" goes to the box.
    await page.locator("#thread-state").press("Escape")
    await page.locator("body").click(position={"x": 700, "y": 400})
    await page.keyboard.press("/")
    await expect(page.locator("#thread-search")).to_be_focused()
    await page.keyboard.type("j")  # typed into the field, not a shortcut
    await expect(page.locator("#thread-search")).to_have_value("j")
    await page.fill("#thread-search", "")
    await page.locator("#thread-search").blur()
    order = await items.evaluate_all("bs => bs.map(b => b.dataset.threadId)")
    await page.keyboard.press("j")
    await expect(page.locator("#t-title")).to_have_text("gamma notes")
    assert order[0] == c
    await page.keyboard.press("j")
    await expect(page).to_have_url(re.compile(f"#t={order[1]}$"))
    await page.keyboard.press("k")
    await expect(page).to_have_url(re.compile(f"#t={order[0]}$"))
    await page.keyboard.press("i")
    await expect(page.locator("#prompt")).to_be_focused()
    await page.locator("#prompt").blur()

    await page.keyboard.press("?")
    dialog = page.locator("#keys-dialog")
    await expect(dialog).to_be_visible()
    await expect(page.locator("#keys-close")).to_be_focused()
    await expect(dialog.locator("tr")).to_have_count(9)
    await expect(dialog).to_contain_text("New thread")
    await page.keyboard.press("Escape")
    await expect(dialog).to_be_hidden()
    await page.keyboard.press("n")
    await expect(page.locator("#new-dialog")).to_be_visible()
    await expect(page.locator("#new-agent")).to_be_focused()
    web.assert_clean()


async def test_the_agents_slash_commands_in_a_menu(web: Session) -> None:
    tid = await api_thread(web, "stream-json")
    page = await web.page(thread=tid)
    await send(page, "hi")  # the agent lists its commands when it starts (system/init)
    await expect(page.locator(".msg.assistant .body").last).to_have_text("echo: hi")
    menu = page.locator("#slash-menu")
    await page.fill("#prompt", "/")
    await expect(menu).to_be_visible()
    await expect(menu.locator(".slash-name")).to_have_text(
        ["/clear", "/compact", "/context", "/review", "/security-review"]
    )
    await page.locator("#prompt").press_sequentially("co")
    await expect(menu.locator(".slash-name")).to_have_text(["/compact", "/context"])
    await page.keyboard.press("ArrowDown")
    await expect(menu.locator('[aria-selected="true"]')).to_have_text("/context")
    await page.keyboard.press("Enter")  # completes, does not send
    await expect(page.locator("#prompt")).to_have_value("/context ")
    await expect(menu).to_be_hidden()
    await expect(page.locator(".msg.user")).to_have_count(1)
    # A match inside the name, Escape closes, and the menu never eats a normal Enter.
    await page.fill("#prompt", "")
    await page.locator("#prompt").press_sequentially("/review")
    await expect(menu.locator(".slash-name")).to_have_text(["/review", "/security-review"])
    await page.keyboard.press("Escape")
    await expect(menu).to_be_hidden()
    await expect(page.locator("#interrupt")).to_be_disabled()
    await page.fill("#prompt", "no command here")
    await expect(menu).to_be_hidden()

    # ACP agents advertise theirs in an available_commands_update (read from the raw line).
    got = await page.evaluate(
        """async () => {
            const { advertised } = await import('/assets/commands.js');
            const raw = {jsonrpc: '2.0', method: 'session/update', params: {sessionId: 's', update: {
              sessionUpdate: 'available_commands_update',
              availableCommands: [{name: 'plan', description: 'Make a plan', input: null},
                                  {name: '<img src=x>', description: 'bad name'}, 7]}}};
            return [advertised({kind: 'agent.other', data: {session_update: 'available_commands_update'}, raw}),
                    advertised({kind: 'agent.other', data: {session_update: 'plan'}, raw}),
                    advertised({kind: 'session.started', data: {}, raw: {slash_commands: ['a', '/b']}})];
        }"""
    )
    assert got == [
        [{"name": "plan", "description": "Make a plan"}],
        None,
        [{"name": "a", "description": ""}, {"name": "b", "description": ""}],
    ]
    web.assert_clean()


NOTIFICATIONS = """
window.shown = [];
const Real = window.Notification;
window.Notification = class extends Real {
  constructor(title, options) { super(title, options); window.shown.push([title, options.body, options.tag]); }
};
Object.defineProperty(window.Notification, 'permission', { get: () => Real.permission });
window.Notification.requestPermission = (...a) => Real.requestPermission(...a);
Object.defineProperty(document, 'hidden', { get: () => window.pretendHidden === true });
"""


async def test_background_notifications_are_opt_in_and_the_title_counts_waiting_requests(web: Session) -> None:
    asker = await api_thread(web, "asker", title="asks")
    other = await api_thread(web, "stream-json", title="works")
    ctx = await web.context(permissions=["notifications"])
    await ctx.add_init_script(NOTIFICATIONS)
    page = await web.page(ctx, thread=other)
    button = page.locator("#notify")
    await expect(button).to_have_text("Notify me")
    await expect(button).to_have_attribute("aria-pressed", "false")
    # Off: nothing is shown, even in the background.
    await page.evaluate("window.pretendHidden = true")
    async with web.d.http() as http:
        assert (await http.post(f"/v1/threads/{other}/messages", json={"text": "one"})).status_code == 202
    await expect(page.locator(".turn-end")).to_have_count(1)
    await page.evaluate("window.pretendHidden = false")
    await button.click()
    await expect(button).to_have_text("Notifications on")
    await expect(button).to_have_attribute("aria-pressed", "true")
    # Visible tab: no notification either.
    await send(page, "two")
    await expect(page.locator(".turn-end")).to_have_count(2)
    # Hidden: a turn that ends here, and a permission that waits in another thread.
    await page.evaluate("window.pretendHidden = true")
    async with web.d.http() as http:
        assert (await http.post(f"/v1/threads/{other}/messages", json={"text": "three"})).status_code == 202
        await page.wait_for_function("() => window.shown.length >= 1")
        assert (await http.post(f"/v1/threads/{asker}/messages", json={"text": "ask"})).status_code == 202
        await page.wait_for_function("() => window.shown.length >= 2")
        # The tab's title counts the request waiting in the other thread.
        await expect(page).to_have_title("(1) works — agent-bridge")
        shown = await page.evaluate("window.shown")
        assert shown == [
            [
                "Turn ended — works",
                f"stream-json · {(await http.get(f'/v1/threads/{other}')).json()['cwd']}",
                f"turn-{other}",
            ],
            ["Permission waiting — asks", "The agent (asker) asks to use a tool.", f"perm-{asker}"],
        ]
        (req,) = (await http.get(f"/v1/threads/{asker}/permissions")).json()["permissions"]
        r = await http.post(f"/v1/threads/{asker}/permissions/{req['request_id']}", json={"decision": "deny"})
        assert r.status_code == 200
    await expect(page).to_have_title("works — agent-bridge")
    # Off again: remembered across a reload.
    await page.evaluate("window.pretendHidden = false")
    await page.reload()
    await expect(page.locator("#notify")).to_have_text("Notifications on")
    await page.click("#notify")
    await expect(page.locator("#notify")).to_have_text("Notify me")
    web.assert_clean()
