"""The bundled web page in a real browser (issue #7): Debian's chromium driven by
Playwright, against a real daemon, with the demo agent and the scripted fake agent.

One browser per module; each test gets its own daemon and browser context. Every wait is
on a condition (Playwright's expect / wait_for_*), never a sleep."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import struct
import tempfile
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import DIALECTS, STEP_TIMEOUT, TOKEN, Daemon, _own_agents, agent_log, profile_toml, wait_until
from playwright.async_api import Browser, BrowserContext, Page, WebSocketRoute, async_playwright, expect
from test_acp_e2e import acp_profile

from bridge.sessions.samples import SAMPLES

pytestmark = pytest.mark.asyncio(loop_scope="module")

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("AGENT_BRIDGE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
WAIT_MS = STEP_TIMEOUT * 1000
# "count N" streams one number every 30 ms: this many outlasts any test, which interrupts it.
ENDLESS = 100_000
expect.set_options(timeout=WAIT_MS)


# --------------------------------------------------------------------------- fixtures


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (Debian package chromium; scripts/test installs it)")
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        await b.close()


def config(agent_env: dict[str, str]) -> str:
    cfg = "[server]\nstop_grace_s = 1\n"
    for dialect in DIALECTS:
        cfg += profile_toml(dialect, dialect, agent_env) + "\n"
    cfg += profile_toml("asker", "stream-json", agent_env, permission_prompts=True)
    cfg += acp_profile("acp", agent_env)
    cfg += acp_profile("textonly", agent_env, "--text-only")
    return cfg


class Session:
    """A daemon, and browser contexts logged in to it; everything a page requested."""

    def __init__(self, daemon: Daemon, browser: Browser) -> None:
        self.d = daemon
        self.browser = browser
        self.contexts: list[BrowserContext] = []
        self.urls: list[str] = []
        self.errors: list[str] = []
        self._code: str | None = None

    async def login_code(self) -> str:
        if self._code is None:
            assert self.d.proc is not None and self.d.proc.stdout is not None
            line = (await asyncio.wait_for(self.d.proc.stdout.readline(), STEP_TIMEOUT)).decode().strip()
            prefix = f"open {self.d.url}/#login="
            assert line.startswith(prefix), line
            self._code = line.removeprefix(prefix)
        return self._code

    async def context(self, **options: Any) -> BrowserContext:
        ctx = await self.browser.new_context(**options)
        self.contexts.append(ctx)
        return ctx

    def watch(self, page: Page) -> Page:
        page.on("request", lambda r: self.urls.append(r.url))
        page.on("websocket", lambda ws: self.urls.append(ws.url))
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        return page

    async def page(self, ctx: BrowserContext | None = None, *, thread: str | None = None, **options: Any) -> Page:
        """A page of a new context, logged in with the one-time link (the first time) or
        the token form; showing ``thread`` if given."""
        ctx = ctx or await self.context(**options)
        page = self.watch(await ctx.new_page())
        first = self._code is None
        code = await self.login_code()
        if first:
            await page.goto(f"{self.d.url}/#login={code}")
        else:
            await page.goto(f"{self.d.url}/")
            await expect(page.locator("#login")).to_be_visible()
            await page.fill("#token", TOKEN)
            await page.click("#login-form button[type=submit]")
        await expect(page.locator("#app")).to_be_visible()
        if thread:
            await page.evaluate("id => { location.hash = 't=' + id; }", thread)
            await expect(page.locator("#thread")).to_be_visible()
            await expect(page.locator("#conn")).to_have_attribute("data-state", re.compile("live|polling"))
        return page

    async def tab(self, ctx: BrowserContext, thread: str) -> Page:
        """Another tab of a logged-in context (the cookie is shared), on ``thread``."""
        page = self.watch(await ctx.new_page())
        await page.goto(f"{self.d.url}/#t={thread}")
        await expect(page.locator("#thread")).to_be_visible()
        await expect(page.locator("#conn")).to_have_attribute("data-state", "live")
        return page

    def assert_clean(self) -> None:
        foreign = [u for u in self.urls if not (u.startswith(self.d.url + "/") or u.startswith(self.d.ws_url + "/"))]
        assert not foreign, f"the page talked to another origin: {foreign}"
        assert not self.errors, f"errors in the page: {self.errors}"


@contextlib.asynccontextmanager
async def session_on(browser: Browser, tmp_path: Path, cfg: str) -> AsyncIterator[Session]:
    """A daemon with ``cfg`` and the browser on it; afterwards every page closed, the daemon
    stopped and its agents gone."""
    d = Daemon(tmp_path, cfg)
    await d.start()
    s = Session(d, browser)
    try:
        yield s
    finally:
        for ctx in s.contexts:
            await ctx.close()
        await d.stop()
        await wait_until(lambda: not _own_agents(tmp_path), what="agents to exit")


@pytest_asyncio.fixture(loop_scope="module")
async def web(browser: Browser, tmp_path: Path, agent_env: dict[str, str]) -> AsyncIterator[Session]:
    async with session_on(browser, tmp_path, config(agent_env)) as s:
        yield s


async def api_thread(s: Session, agent: str, **body: Any) -> str:
    async with s.d.http() as http:
        r = await http.post("/v1/threads", json={"agent": agent, **body})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


async def transcript(s: Session, tid: str) -> list[dict[str, Any]]:
    """The whole transcript, page by page."""
    events: list[dict[str, Any]] = []
    async with s.d.http() as http:
        while True:
            r = await http.get(
                f"/v1/threads/{tid}/events", params={"after": events[-1]["seq"] if events else 0, "limit": 1000}
            )
            page = list(r.json()["events"])
            events += page
            if len(page) < 1000:
                return events


async def send(page: Page, text: str) -> None:
    await page.fill("#prompt", text)
    await page.press("#prompt", "Enter")


def numbers(text: str) -> list[int]:
    return [int(x) for x in text.split()]


async def streamed_numbers(page: Page) -> list[int]:
    return numbers(await page.locator(".msg.assistant .body").last.inner_text())


async def wait_numbers(page: Page, at_least: int) -> None:
    await page.wait_for_function(
        """n => { const b = [...document.querySelectorAll('.msg.assistant .body')].pop();
                  return b && b.innerText.trim().split(/\\s+/).length >= n; }""",
        arg=at_least,
        timeout=WAIT_MS,
    )


# --------------------------------------------------------------------------- tests


async def test_a_full_chat_turn_with_the_demo_agent(web: Session, tmp_path: Path) -> None:
    work = tmp_path / "project"
    work.mkdir()
    (work / "notes.md").write_text("# Notes\nremember the **milk**\n")
    page = await web.page(viewport={"width": 1280, "height": 800})
    # The one-time code is gone from the address bar once used.
    assert "login" not in page.url
    await page.click("#new-thread")
    await expect(page.locator("#new-dialog")).to_be_visible()
    await page.select_option("#new-agent", "demo")
    await page.fill("#new-cwd", str(work))
    await page.fill("#new-title", "Demo chat")
    await page.click("#new-create")
    await expect(page.locator("#thread")).to_be_visible()
    await expect(page.locator("#t-title")).to_have_text("Demo chat")
    await expect(page.locator("#t-meta")).to_contain_text(str(work))
    item = page.locator(".thread-item", has_text="Demo chat")
    await expect(item).to_contain_text("demo")
    await expect(page.locator("#conn")).to_have_attribute("data-state", "live")

    await send(page, "hello")
    await expect(page.locator(".msg.user .body").first).to_have_text("hello")
    await expect(page).to_have_title("Demo chat — agent-bridge")
    await expect(page.locator(".msg.assistant").first).to_contain_text("Hello to you too")
    await expect(page.locator(".turn-end")).to_have_count(1)
    await expect(page.locator(".turn-end").first).to_contain_text(re.compile(r"Done · \d+ in · \d+ out"))

    await send(page, "list files")
    card = page.locator(".tool").first
    await expect(card.locator(".tool-name")).to_have_text("ListFiles")
    await expect(card.locator(".tool-status")).to_have_text("done")
    await expect(card.locator(".tool-input")).to_contain_text('"path": "."')
    await expect(card.locator(".tool-output")).to_contain_text("notes.md")
    await expect(page.locator(".turn-end")).to_have_count(2)

    await send(page, "read notes.md")
    await expect(page.locator(".tool")).to_have_count(2)
    await expect(page.locator(".tool").nth(1).locator(".tool-output")).to_contain_text("remember the **milk**")
    await expect(page.locator(".turn-end")).to_have_count(3)
    # How the turn ended is said once, at its end; the status line under the conversation
    # has nothing to add about a ready thread.
    await expect(page.locator(".turn-end").last).to_contain_text(re.compile(r"^Done · "))
    await expect(page.locator("#turn-status-text")).to_have_text("")
    await expect(page.locator("#interrupt")).to_be_disabled()
    # Diagnostics (the process start) are in their own panel, not in the conversation.
    await expect(page.locator("#diagnostics .diag-process-started")).to_have_count(1)
    await expect(page.locator("#transcript")).not_to_contain_text("process started")

    # The list follows the thread live: its turn is over (the change stream says so).
    await expect(item.locator(".badge")).to_have_text("ready")
    shot = tmp_path / "main.png"
    await page.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000
    web.assert_clean()


async def test_the_demo_agent_tour_shows_every_feature_for_the_readme_screenshot(web: Session, tmp_path: Path) -> None:
    """README's screenshot: the demo agent's "tour" — a thought, an edit asked for and shown
    as a diff, a shell command with its exit status, a sub-agent in the Tasks panel, a code
    block. ``UPDATE_SCREENSHOT=1`` writes it to docs/screenshot.png, from a project at
    /tmp/hello-project so no test directory shows in the picture."""
    update = os.environ.get("UPDATE_SCREENSHOT") == "1"
    if update:
        work = Path("/tmp/hello-project")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
    else:  # a name of the same kind (no test directory in it), never shared with another run
        work = Path(tempfile.mkdtemp(prefix="hello-project-"))
    try:
        await tour_screenshot(web, work, tmp_path, update)
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def tour_screenshot(web: Session, work: Path, tmp_path: Path, update: bool) -> None:
    for name, text in SAMPLES.items():
        (work / name).write_text(text)
    page = await web.page(viewport={"width": 1280, "height": 800})
    await page.click("#new-thread")
    await page.select_option("#new-agent", "demo")
    await page.fill("#new-cwd", str(work))
    await page.fill("#new-title", "Hello project")
    await page.click("#new-create")
    await expect(page.locator("#conn")).to_have_attribute("data-state", "live")

    await send(page, "tour")
    dialog = page.locator("#perm-dialog")
    await expect(dialog).to_be_visible()
    await expect(dialog.locator("#perm-tool")).to_have_text("Edit")
    await page.click("#perm-allow")
    await expect(page.locator(".turn-end")).to_have_count(1, timeout=60_000)

    await expect(page.locator(".msg.thought")).to_have_count(1)
    await page.locator(".msg.thought summary").click()  # open: the thought's text shows
    await expect(page.locator(".msg.thought")).to_contain_text("A tour: show each kind of output once.")
    edit = page.locator(".tool", has=page.locator(".tool-name", has_text=re.compile("^Edit$")))
    await edit.locator("summary").first.click()
    await expect(edit.locator(".diff")).to_contain_text("Hi there")
    bash = page.locator(".tool", has=page.locator(".tool-name", has_text=re.compile("^Bash$")))
    await expect(bash.locator(".tool-exit")).to_have_text("exit 0")
    await expect(page.locator(".task")).to_contain_text("Survey the workspace")
    await expect(page.locator(".task .badge")).to_have_text("completed")
    await expect(page.locator(".code-copy")).to_have_count(1)
    assert "Hi there" in (work / "hello.py").read_text()
    # As tall as the whole tour needs, so the picture holds all of it, from the prompt on.
    more = await page.locator("#transcript").evaluate("t => t.scrollHeight - t.clientHeight")
    await page.set_viewport_size({"width": 1280, "height": min(800 + max(more, 0) + 16, 2000)})
    await page.locator("#transcript").evaluate("t => { t.scrollTop = 0; }")
    await expect(page.locator("body")).not_to_contain_text(str(tmp_path))
    await expect(page.locator("body")).not_to_contain_text("pytest")
    shot = tmp_path / "tour.png"
    await page.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000
    if update:
        shutil.copy(shot, ROOT / "docs" / "screenshot.png")
    web.assert_clean()


async def test_a_reload_mid_stream_rebuilds_the_exact_transcript(web: Session) -> None:
    tid = await api_thread(web, "stream-json", title="counting")
    page = await web.page(thread=tid)
    # The test needs the stream still going after the reload: "count 400" ends after 12 s,
    # which a reload on a loaded machine could outlast (the wait for 30 more numbers then
    # timed out on a finished turn). This count ends only when the test interrupts it.
    await send(page, f"count {ENDLESS}")
    await wait_numbers(page, 30)
    await page.reload()
    await expect(page.locator("#thread")).to_be_visible()
    await expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    before = len(await streamed_numbers(page))
    await wait_numbers(page, before + 30)  # still streaming, live, after the reload
    got = await streamed_numbers(page)
    assert got == list(range(len(got))), "a gap or a duplicate after the reload"
    await page.click("#interrupt")
    await expect(page.locator(".turn-end")).to_have_text(re.compile("Interrupted"))
    final = await streamed_numbers(page)
    events = await transcript(web, tid)
    deltas = "".join(e["data"]["text"] for e in events if e["kind"] == "message.delta")
    assert final == numbers(deltas) == list(range(len(final)))
    await expect(page.locator(".msg.assistant")).to_have_count(1)
    await expect(page.locator(".msg.user")).to_have_count(1)
    web.assert_clean()


async def test_a_dropped_connection_resumes_where_it_left_off(web: Session) -> None:
    tid = await api_thread(web, "stream-json")
    ctx = await web.context()
    routes: list[WebSocketRoute] = []

    def proxy(ws: WebSocketRoute) -> None:
        ws.connect_to_server()  # pass frames through; closed by the test below
        routes.append(ws)

    await ctx.route_web_socket(re.compile(r"/ws\?after=\d+$"), proxy)
    page = await web.page(ctx, thread=tid)
    await send(page, f"count {ENDLESS}")
    await wait_numbers(page, 20)
    await routes[-1].close(code=4000, reason="network lost")
    await expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    await wait_until(lambda: len(routes) >= 2, what="the page to reconnect")
    assert re.search(r"after=([1-9]\d*)$", routes[-1].url), routes[-1].url  # not from 0
    seen = len(await streamed_numbers(page))
    await wait_numbers(page, seen + 20)
    got = await streamed_numbers(page)
    assert got == list(range(len(got)))
    await page.keyboard.press("Escape")
    await expect(page.locator(".turn-end")).to_have_text(re.compile("Interrupted"))


async def test_the_permission_dialog_shows_in_every_tab_and_closes_everywhere(web: Session) -> None:
    tid = await api_thread(web, "asker")
    a = await web.page(thread=tid)
    b = await web.tab(a.context, tid)
    await send(a, "ask")
    for page in (a, b):
        dialog = page.locator("#perm-dialog")
        await expect(dialog).to_be_visible()
        await expect(dialog.locator("#perm-tool")).to_have_text("Bash")
        await expect(dialog.locator("#perm-input")).to_contain_text('"command": "touch x"')
        await expect(page).to_have_title("(1) ask — agent-bridge")  # seen from another tab too
        # Focus is in the dialog, on the safe choice.
        await expect(page.locator("#perm-deny")).to_be_focused()
    # A tab reloaded meanwhile shows the request again (it is pending in the transcript).
    await b.reload()
    await expect(b.locator("#perm-dialog")).to_be_visible()
    await expect(b.locator("#perm-tool")).to_have_text("Bash")
    await b.click("#perm-allow")
    for page in (a, b):
        await expect(page.locator("#perm-dialog")).to_be_hidden()
        await expect(page.locator(".msg.assistant .body").last).to_have_text("permission: allow")
        await expect(page.locator(".note.perm")).to_contain_text("Permission allowed")
        assert "(by rest)" not in (await page.locator(".note.perm").first.text_content() or "")
    # Escape closes the dialog without answering; the banner brings it back.
    await send(a, "ask")
    await expect(a.locator("#perm-dialog")).to_be_visible()
    await a.keyboard.press("Escape")
    await expect(a.locator("#perm-dialog")).to_be_hidden()
    await expect(a.locator("#perm-banner")).to_be_visible()
    await a.click("#perm-review")
    await expect(a.locator("#perm-dialog")).to_be_visible()
    await a.keyboard.press("Enter")  # on the focused Deny button
    await expect(b.locator("#perm-dialog")).to_be_hidden()
    await expect(b.locator(".msg.assistant .body").last).to_have_text("permission: deny")
    await expect(a.locator("#perm-banner")).to_be_hidden()
    # After a reload, requests that were answered stay answered.
    await a.reload()
    await expect(a.locator(".turn-end")).to_have_count(2)
    await expect(a.locator(".note.perm")).to_have_count(2)
    await expect(a.locator("#perm-dialog")).to_be_hidden()
    await expect(a.locator("#perm-banner")).to_be_hidden()
    web.assert_clean()


async def test_an_acp_permission_offers_the_agents_own_options(web: Session) -> None:
    tid = await api_thread(web, "acp")
    page = await web.page(thread=tid)
    await send(page, "ask rm -rf build")
    dialog = page.locator("#perm-dialog")
    await expect(dialog).to_be_visible()
    await expect(dialog.locator("#perm-input")).to_contain_text("rm -rf build")
    buttons = dialog.locator("#perm-actions button")
    await expect(buttons).to_have_text(["Reject", "Allow", "Always"])
    await expect(dialog.locator("#perm-message")).to_be_hidden()  # an ACP answer carries no message
    await expect(buttons.first).to_be_focused()
    await buttons.nth(2).click()
    await expect(dialog).to_be_hidden()
    await expect(page.locator(".msg.assistant .body").last).to_have_text("permission: allow_always")
    await expect(page.locator(".tool .tool-status").last).to_have_text("done")
    web.assert_clean()


async def test_interrupt_with_the_button_and_with_escape(web: Session) -> None:
    tid = await api_thread(web, "stream-json")
    page = await web.page(thread=tid)
    await send(page, "count 1000")
    await wait_numbers(page, 5)
    await expect(page.locator("#interrupt")).to_be_enabled()
    await page.click("#interrupt")
    await expect(page.locator(".turn-end").nth(0)).to_have_attribute("data-status", "cancelled")
    await expect(page.locator("#interrupt")).to_be_disabled()
    await page.locator("#prompt").press("ArrowUp")  # the last prompt comes back
    await expect(page.locator("#prompt")).to_have_value("count 1000")
    await page.locator("#prompt").press("Enter")
    await expect(page.locator(".msg.assistant")).to_have_count(2)
    await expect(page.locator("#interrupt")).to_be_enabled()
    await page.locator("#transcript").focus()
    await page.keyboard.press("Escape")
    await expect(page.locator(".turn-end").nth(1)).to_have_attribute("data-status", "cancelled")
    # It reads as what happened, not as the agent's internal account of it (issue #17 item 5).
    for i in range(2):
        await expect(page.locator(".turn-end").nth(i)).to_have_text(re.compile(r"^Interrupted( · [^·]+)*$"))
    await expect(page.locator("#transcript")).not_to_contain_text("ede_diagnostic")
    await expect(page.locator("#turn-status-text")).to_have_text("")  # said once, at the turn's end
    await expect(page.locator(".msg.user")).to_have_count(2)
    events = await transcript(web, tid)
    ends = [e for e in events if e["kind"] == "turn.ended"]
    assert [(e["data"]["status"], e["data"]["reason"], "error" in e["data"]) for e in ends] == [
        ("cancelled", "interrupted", False)
    ] * 2
    assert all("[ede_diagnostic]" in e["raw"]["errors"][0] for e in ends)  # kept in the raw line
    said = [e["data"]["text"] for e in events if e["kind"] == "diagnostic" and e["source"] == "agent"]
    assert len(said) == 2 and all(t.startswith("[ede_diagnostic] ") for t in said)


async def test_agent_html_and_script_links_render_inert(web: Session) -> None:
    tid = await api_thread(web, "stream-json")
    page = await web.page(thread=tid)
    dialogs: list[str] = []
    page.on("dialog", lambda d: dialogs.append(d.message))
    payload = (
        '<img src=x onerror="window.xssFired=1"> <script>window.xssFired=2</script> '
        "[click me](javascript:window.xssFired=3) [data](data:text/html,<b>x</b>) "
        '<iframe src="javascript:alert(1)"></iframe> **bold** `code` [docs](https://example.com/x)'
    )
    await send(page, payload)
    reply = page.locator(".msg.assistant .body").last
    await expect(page.locator(".turn-end")).to_have_count(1)
    await expect(reply).to_contain_text('<img src=x onerror="window.xssFired=1">')
    await expect(reply).to_contain_text("<script>window.xssFired=2</script>")
    assert await page.evaluate("window.xssFired") is None
    assert await page.locator("#transcript img, #transcript script, #transcript iframe").count() == 0
    # The javascript: and data: links are plain text; the https one is a safe link.
    inert = reply.locator(".md-inert-link")
    await expect(inert).to_have_count(2)
    await expect(inert.first).to_have_text("click me")
    links = reply.locator("a")
    await expect(links).to_have_count(1)
    assert await links.get_attribute("href") == "https://example.com/x"
    assert await links.get_attribute("rel") == "noopener noreferrer"
    assert await links.get_attribute("target") == "_blank"
    await expect(reply.locator("strong")).to_have_text("bold")
    await expect(reply.locator("code")).to_have_text("code")
    hrefs = await page.eval_on_selector_all("a[href]", "as => as.map(a => a.href)")
    assert not [h for h in hrefs if h.lower().startswith(("javascript:", "data:"))]
    # The user's own message is plain text too.
    await expect(page.locator(".msg.user .body")).to_have_text(payload)
    assert dialogs == []
    web.assert_clean()


async def test_the_task_panel_follows_a_workflow_live(web: Session, agent_env: dict[str, str]) -> None:
    tid = await api_thread(web, "stream-json")
    page = await web.page(thread=tid)
    await send(page, "workflow")
    task = page.locator('#tasks .task[data-task-id="wf1"]')
    await expect(task).to_have_attribute("data-status", "running")
    await expect(task.locator(".task-name")).to_have_text("Review the change")
    await expect(task.locator(".task-kind")).to_contain_text("local_workflow")
    await expect(task.locator(".phase-title")).to_have_text("Gather")
    await expect(task.locator(".step")).to_have_count(1)
    await expect(task.locator(".step").first).to_have_attribute("data-state", "start")
    Path(agent_env["FAKE_AGENT_STATE"], "go").touch()  # let the workflow go on
    await expect(task).to_have_attribute("data-status", "completed")
    await expect(task.locator(".phase .step")).to_have_count(2)
    await expect(task.locator(".step").nth(0)).to_have_attribute("data-state", "done")
    await expect(task.locator(".step").nth(1)).to_contain_text("child-2")
    await expect(task.locator(".task-summary")).to_have_text("Reviewed 2 files")
    await expect(task.locator(".task-usage")).to_contain_text("30 tokens · 3 tool uses")
    await expect(page.locator("#task-count")).to_have_text("(0 running / 1)")
    web.assert_clean()


async def test_long_polling_takes_over_when_websockets_cannot_connect(web: Session) -> None:
    tid = await api_thread(web, "stream-json")
    ctx = await web.context()
    refused: list[str] = []

    async def refuse(ws: WebSocketRoute) -> None:
        refused.append(ws.url)
        await ws.close(code=4000, reason="blocked by the test")

    await ctx.route_web_socket(re.compile(r"/ws\?"), refuse)
    page = await web.page(ctx)
    await page.evaluate("id => { location.hash = 't=' + id; }", tid)
    await expect(page.locator("#conn")).to_have_attribute("data-state", "polling")
    await expect(page.locator("#conn")).to_contain_text("long-polling")
    assert len(refused) >= 3
    await send(page, "hello over polling")
    await expect(page.locator(".msg.assistant .body")).to_have_text("echo: hello over polling")
    await expect(page.locator(".turn-end")).to_have_count(1)
    await send(page, "count 50")
    await expect(page.locator(".turn-end")).to_have_count(2)
    assert await streamed_numbers(page) == list(range(50))
    web.assert_clean()


async def test_a_phone_sized_screen_with_the_keyboard_alone(web: Session) -> None:
    page = await web.page(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    # Nothing wider than the screen.
    assert await page.evaluate("document.documentElement.scrollWidth") <= 390
    # Keyboard only: Tab to "Threads", open the panel, Tab to "New thread", Enter.
    for _ in range(6):
        await page.keyboard.press("Tab")
        if await page.evaluate("document.activeElement.id") == "toggle-threads":
            break
    await page.keyboard.press("Enter")
    await expect(page.locator("#sidebar")).to_be_visible()
    await expect(page.locator("#new-thread")).to_be_focused()
    await page.keyboard.press("Escape")  # closes the slide-over, back on its button
    await expect(page.locator("#sidebar")).to_be_hidden()
    await expect(page.locator("#toggle-threads")).to_be_focused()
    await page.keyboard.press("Enter")
    await expect(page.locator("#new-thread")).to_be_focused()
    await page.keyboard.press("Enter")
    await expect(page.locator("#new-agent")).to_be_focused()
    await page.keyboard.press("Tab")  # model
    await page.keyboard.press("Tab")  # cwd
    await page.keyboard.press("Tab")  # title
    await page.keyboard.type("On the phone")
    await page.keyboard.press("Enter")
    await expect(page.locator("#t-title")).to_have_text("On the phone")
    await expect(page.locator("#prompt")).to_be_focused()
    await expect(page.locator("#sidebar")).to_be_hidden()
    await page.keyboard.type("hello from a phone")
    await page.keyboard.press("Enter")
    await expect(page.locator(".msg.assistant")).to_contain_text("echo: hello from a phone")
    for sel in ("#prompt", "#send", ".msg.assistant"):
        box = await page.locator(sel).first.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, (sel, box)
    assert await page.evaluate("document.documentElement.scrollWidth") <= 390
    web.assert_clean()


async def test_threads_are_listed_newest_first_and_can_be_renamed_stopped_resumed_and_deleted(web: Session) -> None:
    old = await api_thread(web, "stream-json", title="older")
    new = await api_thread(web, "awp-jsonl", title="newer")
    page = await web.page()
    items = page.locator(".thread-item")
    await expect(items).to_have_count(2)
    await expect(items.nth(0)).to_contain_text("newer")
    await expect(items.nth(0)).to_contain_text("awp-jsonl")
    await expect(items.nth(1)).to_contain_text("older")
    await items.nth(1).click()
    await expect(page.locator("#t-title")).to_have_text("older")
    assert page.url.endswith(f"#t={old}")
    await send(page, "hi")
    await expect(page.locator(".turn-end")).to_have_count(1)
    # Activity moves it to the top.
    await expect(items.nth(0)).to_contain_text("older")
    await expect(page.locator("#t-state")).to_have_text("ready")
    await expect(page.locator("#resume")).to_be_hidden()  # only the action that applies

    await page.click("#rename")
    await expect(page.locator("#rename-input")).to_be_focused()
    await page.fill("#rename-input", "renamed <b>safely</b>")
    await page.keyboard.press("Enter")
    await expect(page.locator("#t-title")).to_have_text("renamed <b>safely</b>")
    await expect(items.nth(0).locator(".t-title")).to_have_text("renamed <b>safely</b>")

    await page.click("#stop")
    await expect(page.locator("#t-state")).to_have_text("stopped")
    await expect(page.locator("#turn-status-text")).to_contain_text("your next message starts the agent again")
    await expect(page.locator("#diagnostics .diag-process-exited")).to_contain_text("stopped")
    await expect(page.locator("#stop")).to_be_hidden()
    await expect(page.locator("#resume")).to_be_enabled()
    await page.click("#resume")
    await expect(page.locator("#t-state")).to_have_text(re.compile("starting…|ready"))
    await send(page, "recall")  # the resumed agent has the conversation
    await expect(page.locator(".msg.assistant .body").last).to_have_text("history: hi")

    await page.click("#delete")
    await expect(page.locator("#confirm-dialog")).to_be_visible()
    await expect(page.locator("#confirm-no")).to_be_focused()
    await page.click("#confirm-yes")
    await expect(page.locator("#empty")).to_have_text("That thread was deleted.")
    await expect(items).to_have_count(1)
    await expect(items.nth(0)).to_contain_text("newer")
    async with web.d.http() as http:
        assert (await http.get(f"/v1/threads/{old}")).status_code == 404
        assert (await http.get(f"/v1/threads/{new}")).status_code == 200
    web.assert_clean()


MARKDOWN = """# Title
Some *emphasis*, **strong**, ~~gone~~ and `inline <code>`.

- one
- two
  - nested
1. first
2. second

> quoted **text**

| a | b |
|---|---|
| 1 | <i>2</i> |

```python
print("<b>hi</b>")
```
See https://example.org/path, [mail](mailto:me@example.org) and [rel](/v1/threads).
"""


async def test_markdown_renders_to_the_expected_structure(web: Session) -> None:
    page = await web.page()
    shape = await page.evaluate(
        """async (text) => {
            const ALLOWED = ['h3', 'p', 'em', 'strong', 'del', 'code', 'ul', 'ol', 'li', 'blockquote', 'div',
                             'table', 'thead', 'tbody', 'tr', 'th', 'td', 'pre', 'a', 'span', 'br'];
            const { renderMarkdown } = await import('/assets/markdown.js');
            const box = document.createElement('div');
            box.append(renderMarkdown(text));
            const q = (s) => [...box.querySelectorAll(s)];
            return {
              h: q('h3').map(e => e.textContent),
              em: q('em').map(e => e.textContent), strong: q('strong').map(e => e.textContent),
              del: q('del').map(e => e.textContent), code: q('p code').map(e => e.textContent),
              ul: q('ul > li').length, nested: q('ul ul > li').map(e => e.textContent),
              ol: q('ol > li').map(e => e.textContent), quote: q('blockquote strong').map(e => e.textContent),
              cells: q('td').map(e => e.textContent), pre: q('pre code').map(e => [e.className, e.textContent]),
              hl: q('pre code span').map(e => [e.className, e.textContent]),
              links: q('a').map(e => [e.textContent, e.getAttribute('href')]),
              inert: q('.md-inert-link').map(e => e.textContent),
              elements: q('*').map(e => e.tagName.toLowerCase()).filter(t => !ALLOWED.includes(t)),
            };
        }""",
        MARKDOWN,
    )
    assert shape["h"] == ["Title"]
    assert shape["em"] == ["emphasis"] and shape["strong"] == ["strong", "text"] and shape["del"] == ["gone"]
    assert shape["code"] == ["inline <code>"]
    assert shape["nested"] == ["nested"] and shape["ol"] == ["first", "second"]
    assert shape["quote"] == ["text"]
    assert shape["cells"] == ["1", "<i>2</i>"]
    assert shape["pre"] == [["language-python", 'print("<b>hi</b>")']]
    assert shape["hl"] == [["hl-string", '"<b>hi</b>"']]
    assert shape["links"] == [
        ["https://example.org/path", "https://example.org/path"],
        ["mail", "mailto:me@example.org"],
    ]
    assert shape["inert"] == ["rel"]
    assert shape["elements"] == []  # no <b>, <i> or anything else from the text
    # A reply still streaming (an unclosed fence) renders what it has, as code.
    partial = await page.evaluate(
        """async () => { const { renderMarkdown } = await import('/assets/markdown.js');
            const box = document.createElement('div'); box.append(renderMarkdown('x\\n```js\\nlet a = 1'));
            return box.querySelector('pre code').textContent; }"""
    )
    assert partial == "let a = 1"
    colours = await page.evaluate(
        """async () => { const { renderMarkdown } = await import('/assets/markdown.js');
            const box = document.createElement('div');
            const src = "```js\\n// <b>c</b>\\nconst x = 42; let s = '<img src=x onerror=alert(1)>';\\n```";
            box.append(renderMarkdown(src));
            return { spans: [...box.querySelectorAll('span')].map(e => [e.className, e.textContent]),
                     text: box.querySelector('code').textContent, img: box.querySelectorAll('img').length }; }"""
    )
    assert colours["spans"] == [
        ["hl-comment", "// <b>c</b>"],
        ["hl-keyword", "const"],
        ["hl-number", "42"],
        ["hl-keyword", "let"],
        ["hl-string", "'<img src=x onerror=alert(1)>'"],
    ]
    assert colours["text"] == "// <b>c</b>\nconst x = 42; let s = '<img src=x onerror=alert(1)>';"
    assert colours["img"] == 0
    web.assert_clean()


async def test_a_spent_link_and_a_wrong_token_are_refused_and_sign_out_works(web: Session) -> None:
    page = await web.page()  # spends the link
    await page.click("#logout")
    await expect(page.locator("#login")).to_be_visible()
    await expect(page.locator("#token")).to_be_focused()
    # The spent link again, in a fresh context.
    other = web.watch(await (await web.context()).new_page())
    await other.goto(f"{web.d.url}/#login={await web.login_code()}")
    await expect(other.locator("#login-error")).to_contain_text("already used or has expired")
    assert "login=" not in other.url
    await other.fill("#token", "not-the-token")
    await other.press("#token", "Enter")
    await expect(other.locator("#login-error")).to_have_text("That token is not right.")
    await other.fill("#token", TOKEN)
    await other.press("#token", "Enter")
    await expect(other.locator("#app")).to_be_visible()
    # The 401s above are the expected answers to the refused attempts.
    web.errors = [e for e in web.errors if "401" not in e]
    web.assert_clean()


def ev(seq: int, kind: str, source: str = "agent", **data: Any) -> dict[str, Any]:
    return {"seq": seq, "ts": "2026-11-30T00:00:00.000Z", "source": source, "kind": kind, "data": data, "raw": None}


async def test_the_conversation_view_folds_streams_thoughts_tools_and_plans(web: Session) -> None:
    """The event → view mapping for shapes the scripted agents do not produce (thinking,
    ACP tool-call patches, plans), fed straight to the page's TranscriptView."""
    page = await web.page()
    events = [
        ev(1, "message", "client", role="user", text="why?", turn_id="t1"),
        ev(2, "turn.started", "bridge", turn_id="t1"),
        ev(3, "message.delta", text="Let me ", channel="thought"),
        ev(4, "message.delta", text="think", channel="thought"),
        ev(5, "message.delta", text="Because ", channel="text"),  # thinking ends, text starts
        ev(6, "message", role="assistant", text="Let me think.", channel="thought", message_id="m1"),
        ev(7, "message.delta", text="**reasons**", channel="text"),
        ev(8, "message", role="assistant", text="Because **reasons**.", message_id="m1"),
        ev(9, "tool.call", tool_call_id="c1", name="edit", input={"path": "a.txt"}, title="Edit a.txt"),
        ev(10, "tool.call", tool_call_id="c1", update=True, status="in_progress"),
        ev(11, "tool.result", tool_call_id="c1", output=[{"type": "text", "text": "edited"}], is_error=False),
        ev(
            12,
            "plan",
            entries=[{"content": "step one", "status": "completed"}, {"content": "step <two>", "status": "pending"}],
        ),
        ev(13, "tool.call", tool_call_id="c2", name="bash", input={"command": "false"}),
        ev(14, "tool.result", tool_call_id="c2", output="exit 1", is_error=True),
        ev(
            15,
            "turn.ended",
            "bridge",
            turn_id="t1",
            status="error",
            error="agent_exited",
            usage={"input_tokens": 1200, "output_tokens": 34},
        ),
    ]
    view = await page.evaluate(
        """async (events) => {
            const { TranscriptView } = await import('/assets/transcript.js');
            const box = document.createElement('div');
            document.body.append(box);
            const v = new TranscriptView(box);
            v.apply(events.slice(0, 5));   // in two batches, as a stream delivers them
            v.apply(events.slice(5));
            v.render();
            const q = (s) => [...box.querySelectorAll(s)];
            return {
              order: q(':scope > *').map(e => e.className.split(' ').slice(0, 2).join(' ')),
              thought: q('details.thought').map(e => [e.open, e.querySelector('summary').textContent,
                                                       e.querySelector('.body').textContent]),
              text: q('.msg.assistant .body').map(e => e.textContent),
              strong: q('.msg.assistant strong').map(e => e.textContent),
              tools: q('.tool').map(e => [e.querySelector('.tool-name').textContent,
                                           e.querySelector('.tool-title').textContent,
                                           e.querySelector('.tool-status').textContent,
                                           e.querySelector('.tool-output').textContent,
                                           e.classList.contains('error')]),
              plan: q('.plan li').map(e => [e.className, e.textContent]),
              end: q('.turn-end').map(e => e.textContent),
              streaming: q('.streaming').length,
            };
        }""",
        events,
    )
    assert view["order"] == [
        "msg user",
        "msg thought",
        "msg assistant",
        "tool",
        "plan",
        "tool error",
        "turn-end turn-error",
    ]
    assert view["thought"] == [[False, "Thought", "Let me think."]]  # one block, collapsed, final text
    assert view["text"] == ["Because reasons."] and view["strong"] == ["reasons"]
    assert view["tools"] == [["edit", "Edit a.txt", "done", "edited", False], ["bash", "", "error", "exit 1", True]]
    assert view["plan"] == [["plan-completed", "step one"], ["plan-pending", "step <two>"]]
    assert view["end"] == ["Turn failed · 1,200 in · 34 out tokens · agent_exited"]
    assert view["streaming"] == 0
    web.assert_clean()


async def test_diagnostics_sit_in_their_own_collapsed_panel(web: Session) -> None:
    tid = await api_thread(web, "stream-json")
    page = await web.page(thread=tid)
    panel = page.locator("#diag-panel")
    assert await panel.get_attribute("open") is None  # collapsed until asked for
    await send(page, "stderr")
    await expect(page.locator(".turn-end")).to_have_count(1)
    await send(page, "garbage")
    await expect(page.locator(".turn-end")).to_have_count(2)
    await send(page, "crash")
    await expect(page.locator(".turn-end")).to_have_count(3)
    await expect(page.locator(".turn-end").nth(2)).to_have_attribute("data-status", "error")
    await page.click("#toggle-side")  # the side panel, closed while the thread has no tasks
    await page.click("#diag-panel summary")
    diags = page.locator("#diagnostics .diag-text")
    for text in (
        "stderr: diagnostic line 0",
        "stderr: diagnostic line 2",
        "protocol:",
        "this is not json",
        "process exited: crashed (code 3)",
    ):
        await expect(diags.filter(has_text=text).first).to_be_visible()
    await expect(page.locator("#diag-count")).to_have_text(re.compile(r"\(\d+\)"))
    # None of it is in the conversation.
    await expect(page.locator("#transcript")).not_to_contain_text("diagnostic line")
    await expect(page.locator("#transcript")).not_to_contain_text("this is not json")
    web.assert_clean()


def tiny_png() -> bytes:
    """A valid 1×1 PNG, so the chip's thumbnail decodes."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 6, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(b"\0\xff\x80\x00\xff"))
        + chunk(b"IEND", b"")
    )


def prompts_received(tmp_path: Path) -> list[list[dict[str, Any]]]:
    """The content of every user message the stream-json fake agent read on stdin."""
    out = []
    for e in agent_log(tmp_path):
        if e["event"] == "stdin":
            msg = json.loads(e["line"])
            if msg.get("type") == "user":
                out.append(msg["message"]["content"])
    return out


def posts(s: Session, suffix: str) -> int:
    return len([u for u in s.urls if u.endswith(suffix)])


async def test_attachments_reach_the_agent_as_image_and_document_blocks(web: Session, tmp_path: Path) -> None:
    tid = await api_thread(web, "stream-json")
    page = await web.page(thread=tid)
    png, txt = tmp_path / "pixel.png", tmp_path / "notes.txt"
    png.write_bytes(tiny_png())
    txt.write_text("line one\nline <two>\n")
    extra, bad = tmp_path / "extra.txt", tmp_path / "archive.zip"
    extra.write_text("x")
    bad.write_bytes(b"PK\x03\x04")
    big = tmp_path / "big.txt"
    big.write_bytes(b"a" * (6 * 1024 * 1024 + 512 * 1024))  # 8.7 MiB once base64: over the limit

    async with page.expect_file_chooser() as chooser:
        await page.click("#attach")
    await (await chooser.value).set_files([png, txt, extra])
    chips = page.locator("#attachments .att-chip")
    await expect(chips).to_have_count(3)
    await expect(chips.nth(0)).to_contain_text("pixel.png")
    await expect(chips.nth(0).locator(".att-size")).to_have_text(f"{png.stat().st_size} B")
    await expect(chips.nth(1)).to_contain_text("notes.txt")
    await expect(chips.nth(0).locator("img")).to_have_js_property("naturalWidth", 1)  # a thumbnail
    # Removed with its button (keyboard-reachable, labelled), the focus stays on the chips.
    remove = page.get_by_role("button", name="Remove extra.txt")
    await remove.focus()
    await page.keyboard.press("Enter")
    await expect(chips).to_have_count(2)
    await expect(page.locator("#attach")).to_have_text("Attach (2)")
    # Types the API refuses and files over the frame limit are refused here, before sending.
    async with page.expect_file_chooser() as chooser:
        await page.click("#attach")
    await (await chooser.value).set_files([bad, big])
    await expect(page.locator("#send-error")).to_contain_text("archive.zip: this type of file cannot be sent")
    await expect(page.locator("#send-error")).to_contain_text("big.txt (6.5 MB): too large")
    await expect(chips).to_have_count(2)
    assert posts(web, "/messages") == 0

    await send(page, "look at these")
    await expect(page.locator(".msg.assistant .body")).to_have_text("echo: look at these [image,document]")
    await expect(chips).to_have_count(0)
    await expect(page.locator("#attachments")).to_be_hidden()
    shown = page.locator(".msg.user .att-chip")
    await expect(shown).to_have_text(["Image · image/png", "Document · text/plain"])
    received = prompts_received(tmp_path)
    assert received[-1] == [
        {"type": "text", "text": "look at these"},
        {
            "type": "image",
            "source": {
                "type": "base64",
                "media_type": "image/png",
                "data": base64.b64encode(png.read_bytes()).decode(),
            },
        },
        {
            "type": "document",
            "source": {
                "type": "base64",
                "media_type": "text/plain",
                "data": base64.b64encode(txt.read_bytes()).decode(),
            },
        },
    ]

    # A pasted image and a dropped file; a message of attachments alone has no text block.
    await page.evaluate(
        """async (b64) => {
        const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
        const paste = new DataTransfer();
        paste.items.add(new File([bytes], 'image.png', { type: 'image/png' }));
        document.querySelector('#prompt').dispatchEvent(
            new ClipboardEvent('paste', { clipboardData: paste, bubbles: true, cancelable: true }));
        const drop = new DataTransfer();
        drop.items.add(new File(['dropped text'], 'dropped.txt', { type: 'text/plain' }));
        document.querySelector('#composer').dispatchEvent(
            new DragEvent('drop', { dataTransfer: drop, bubbles: true, cancelable: true }));
    }""",
        base64.b64encode(png.read_bytes()).decode(),
    )
    await expect(chips).to_have_count(2)
    await expect(chips).to_have_text([re.compile("image.png"), re.compile("dropped.txt")])
    await page.click("#send")
    await expect(page.locator(".turn-end")).to_have_count(2)
    await expect(page.locator(".msg.assistant .body").last).to_have_text("echo:  [image,document]")
    blocks = prompts_received(tmp_path)[-1]
    assert [b["type"] for b in blocks] == ["image", "document"]
    assert base64.b64decode(blocks[1]["source"]["data"]) == b"dropped text"
    assert posts(web, "/messages") == 2
    web.assert_clean()


async def test_an_agent_that_cannot_take_images_refuses_them_visibly(web: Session, tmp_path: Path) -> None:
    tid = await api_thread(web, "textonly")
    page = await web.page(thread=tid)
    await send(page, "hello")  # the handshake: now the daemon knows what the agent takes
    await expect(page.locator(".turn-end")).to_have_count(1)
    png = tmp_path / "pixel.png"
    png.write_bytes(tiny_png())
    async with page.expect_file_chooser() as chooser:
        await page.click("#attach")
    await (await chooser.value).set_files(png)
    await expect(page.locator("#attachments .att-chip")).to_have_count(1)
    await send(page, "what is this")
    error = page.locator("#send-error")
    await expect(error).to_contain_text("Not sent: this agent cannot take these attachments")
    await expect(error).to_contain_text("image")
    # Nothing is lost: the text and the attachment are back, to edit or remove.
    await expect(page.locator("#prompt")).to_have_value("what is this")
    await expect(page.locator("#attachments .att-chip")).to_have_count(1)
    await expect(page.locator(".msg.user")).to_have_count(1)
    assert not any("image" in e.get("line", "") for e in agent_log(tmp_path) if e["event"] == "stdin")
    # The 400 is the expected answer.
    web.errors = [e for e in web.errors if "400" not in e]
    web.assert_clean()


async def test_a_denial_can_carry_a_message_to_the_agent(web: Session, tmp_path: Path) -> None:
    tid = await api_thread(web, "asker")
    page = await web.page(thread=tid)
    await send(page, "ask")
    dialog = page.locator("#perm-dialog")
    await expect(dialog).to_be_visible()
    await expect(page.locator("#perm-deny")).to_be_focused()
    box = page.get_by_label("Message to the agent if you deny")
    await box.fill("not in this repo — use <tmp> instead")
    # Closed and reopened, the draft is still there.
    await page.keyboard.press("Escape")
    await page.click("#perm-review")
    await expect(box).to_have_value("not in this repo — use <tmp> instead")
    await page.click("#perm-deny")
    await expect(dialog).to_be_hidden()
    await expect(page.locator(".msg.assistant .body").last).to_have_text("permission: deny")
    answers = [e["answer"] for e in agent_log(tmp_path) if e["event"] == "permission_answer"]
    assert answers == [{"behavior": "deny", "message": "not in this repo — use <tmp> instead"}]
    # The next request starts with an empty box; Allow never carries a message.
    await send(page, "ask")
    await expect(dialog).to_be_visible()
    await expect(box).to_have_value("")
    await box.fill("ignored")
    await page.click("#perm-allow")
    await expect(page.locator(".msg.assistant .body").last).to_have_text("permission: allow")
    answers = [e["answer"] for e in agent_log(tmp_path) if e["event"] == "permission_answer"]
    assert answers[1]["behavior"] == "allow" and "message" not in answers[1]
    web.assert_clean()


async def test_a_code_block_in_a_reply_has_a_copy_button(web: Session) -> None:
    tid = await api_thread(web, "stream-json")
    ctx = await web.context()
    await ctx.grant_permissions(["clipboard-read", "clipboard-write"], origin=web.d.url)
    page = await web.page(ctx, thread=tid)
    code = 'let s = "<b>x</b>";\n  if (a < b) { go(); }'
    await send(page, f"here:\n```js\n{code}\n```\nand `inline`")
    reply = page.locator(".msg.assistant").last
    await expect(page.locator(".turn-end")).to_have_count(1)
    button = reply.locator(".code-copy")
    await expect(button).to_have_count(1)  # the block, not the inline code
    await expect(button).to_have_attribute("title", "Copy the js code")
    await expect(reply.locator("pre code")).to_have_text(code)
    await button.focus()
    await page.keyboard.press("Enter")
    await expect(button).to_have_text("Copied")
    assert await page.evaluate("navigator.clipboard.readText()") == code
    await expect(button).to_have_text("Copy")  # back after a moment
    web.assert_clean()


async def test_the_new_thread_dialog_resumes_a_session_the_agent_already_has(web: Session, tmp_path: Path) -> None:
    work = tmp_path / "elsewhere"
    work.mkdir()
    # A session the ACP agent keeps for this directory, made by another of its clients.
    first = await api_thread(web, "acp", cwd=str(work))
    c = await web.d.ws(first)
    assert (await c.turn("remember the word KIWI"))["data"]["status"] == "success"
    native = c.seen("session.started")[0]["data"]["native_session_id"]
    await c.close()
    async with web.d.http() as http:
        assert (await http.post(f"/v1/threads/{first}/stop")).status_code == 202

    page = await web.page(viewport={"width": 1280, "height": 800})
    await page.click("#new-thread")
    await page.select_option("#new-agent", "demo")
    await expect(page.locator("#new-session-status")).to_contain_text("Enter a working directory")
    await page.fill("#new-cwd", str(work))
    await page.press("#new-cwd", "Tab")  # a change of directory asks again
    await expect(page.locator("#new-session-status")).to_contain_text("knows no session store")
    await expect(page.locator("#new-session")).to_be_disabled()
    await page.select_option("#new-agent", "acp")
    option = page.locator("#new-session option", has_text="remember the word KIWI")
    await expect(option).to_have_count(1)
    await expect(page.locator("#new-session-status")).to_have_text("1 session found")
    await page.select_option("#new-session", native)
    await page.click("#new-create")
    await expect(page.locator("#thread")).to_be_visible()
    await expect(page.locator("#t-title")).to_have_text("remember the word KIWI")  # the session's title
    await expect(page.locator("#conn")).to_have_attribute("data-state", "live")
    await send(page, "and again")
    await expect(page.locator(".msg.assistant").first).to_contain_text("echo: and again")
    tid = page.url.split("#t=")[1]
    async with web.d.http() as http:
        assert (await http.get(f"/v1/threads/{tid}")).json()["native_session_id"] == native
    started = [e for e in await transcript(web, tid) if e["kind"] == "process.started"]
    assert [e["data"]["resume"] for e in started] == [native]
    web.assert_clean()
