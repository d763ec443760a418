"""The installable page and its Web Push control (issue #39 item 2) in a real browser
(Debian's chromium driven by Playwright) against a real daemon and the loopback push
service (tests/support/push_service.py).

Headless Chromium has no push service it can reach offline (its pushManager.subscribe
asks Google's), so the page's subscribe is given the subscription of a browser the test
made — its endpoint on the loopback service — by replacing PushManager's two methods before
the page loads: everything from the button to the store and on to the decrypted push is
real. The service worker's handlers are exercised with a real push event (Chromium's
DevTools ServiceWorker.deliverPushMessage) and by calling its click handler in the worker
(a click on a notification cannot be made headless)."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import STEP_TIMEOUT, TOKEN, Daemon, profile_toml, wait_until
from playwright.async_api import Browser, BrowserContext, Page, Worker, expect
from support.push_service import PushService
from test_page_users_e2e import browser  # noqa: F401 -- the module's browser fixture

pytestmark = pytest.mark.asyncio(loop_scope="module")


def config(agent_env: dict[str, str]) -> str:
    return (
        "[server]\nstop_grace_s = 1\n"
        + profile_toml("asker", "stream-json", agent_env, permission_prompts=True)
        + "\n[push]\nallow_private_endpoints = true\n"
    )


FAKE_PUSH = """
(sub) => {
  const fake = {
    endpoint: sub.endpoint,
    expirationTime: null,
    toJSON: () => sub,
    unsubscribe: async () => { window.__pushSub = null; return true; },
  };
  PushManager.prototype.subscribe = async function (options) {
    window.__subscribeKey = Array.from(new Uint8Array(options.applicationServerKey));
    window.__pushSub = fake;
    return fake;
  };
  PushManager.prototype.getSubscription = async function () { return window.__pushSub || null; };
}
"""


async def signed_in(d: Daemon, ctx: BrowserContext, errors: list[str]) -> Page:
    page = await ctx.new_page()
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on(
        "console",
        lambda m: errors.append(m.text) if m.type == "error" and "Failed to load resource" not in m.text else None,
    )
    await page.goto(f"{d.url}/")
    await page.fill("#token", TOKEN)
    await page.click("#login-form button[type=submit]")
    await expect(page.locator("#app")).to_be_visible()
    return page


async def worker_of(ctx: BrowserContext, page: Page) -> Worker:
    scope = await page.evaluate("navigator.serviceWorker.ready.then(r => r.scope)")
    assert scope == page.url.split("#")[0].rsplit("/", 1)[0] + "/"
    await wait_until(lambda: bool(ctx.service_workers), what="the service worker")
    return ctx.service_workers[0]


def png_size(raw: bytes) -> tuple[int, int]:
    assert raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR"
    width, height = struct.unpack(">II", raw[16:24])
    return width, height


async def test_the_page_is_installable_and_its_worker_registers(
    browser: Browser,  # noqa: F811
    tmp_path: Path,
    agent_env: dict[str, str],
) -> None:
    d = Daemon(tmp_path, config(agent_env))
    await d.start()
    try:
        async with httpx.AsyncClient(base_url=d.url, timeout=STEP_TIMEOUT) as http:
            r = await http.get("/assets/manifest.webmanifest")
            assert r.status_code == 200 and r.headers["content-type"] == "application/manifest+json"
            manifest = r.json()
            assert manifest["start_url"] == "/" and manifest["scope"] == "/" and manifest["display"] == "standalone"
            sizes = {}
            for icon in manifest["icons"]:
                got = await http.get(icon["src"])
                assert got.status_code == 200 and got.headers["content-type"] == icon["type"], icon
                if icon["type"] == "image/png":
                    sizes[icon["sizes"]] = png_size(got.content)
                    assert len(got.content) < 64 * 1024
            assert sizes == {"192x192": (192, 192), "512x512": (512, 512)}
            sw = await http.get("/sw.js")
            assert sw.status_code == 200 and sw.headers["content-type"].startswith("text/javascript")
            assert "worker-src 'self'" in sw.headers["content-security-policy"]
            assert "manifest-src 'self'" in sw.headers["content-security-policy"]
        errors: list[str] = []
        ctx = await browser.new_context()
        try:
            page = await signed_in(d, ctx, errors)
            link = await page.evaluate("document.querySelector('link[rel=manifest]').href")
            assert link == f"{d.url}/assets/manifest.webmanifest"
            await worker_of(ctx, page)
            await expect(page.locator("#push")).to_be_visible()
            await expect(page.locator("#push")).to_have_attribute("aria-pressed", "false")
            assert errors == []
        finally:
            await ctx.close()
    finally:
        await d.stop()


async def test_the_push_button_subscribes_this_browser_and_its_pushes_arrive(
    browser: Browser,  # noqa: F811
    tmp_path: Path,
    agent_env: dict[str, str],
) -> None:
    d = Daemon(tmp_path, config(agent_env))
    await d.start()
    errors: list[str] = []
    with PushService() as service:
        phone = service.browser("page")
        ctx = await browser.new_context()
        try:
            await ctx.grant_permissions(["notifications"], origin=d.url)
            await ctx.add_init_script(f"({FAKE_PUSH})({json.dumps(phone.subscription())})")
            page = await signed_in(d, ctx, errors)
            await expect(page.locator("#push")).to_be_visible()
            await page.click("#push")
            await expect(page.locator("#push")).to_have_attribute("aria-pressed", "true")
            async with d.http() as http:
                listed = (await http.get("/v1/me/push-subscriptions")).json()
                assert [s["origin"] for s in listed["subscriptions"]] == [service.origin]
                # The page subscribed with the daemon's VAPID key.
                key = bytes(await page.evaluate("window.__subscribeKey"))
                assert key == base64.urlsafe_b64decode(listed["vapid_public_key"] + "=")
                # No page has the thread open: its turn's end is pushed to this browser.
                r = await http.post("/v1/threads", json={"agent": "asker", "title": "From the page"})
                tid = r.json()["id"]
                r = await http.post(f"/v1/threads/{tid}/messages", json={"text": "hello"})
                assert r.status_code in (200, 202), r.text
                await wait_until(lambda: len(service.to(phone)) == 1, what="the push")
                assert service.errors == []
                payload = service.to(phone)[0].payload
                assert payload is not None and payload["thread_id"] == tid and payload["kind"] == "turn_ended"
                await page.click("#push")
                await expect(page.locator("#push")).to_have_attribute("aria-pressed", "false")
                assert (await http.get("/v1/me/push-subscriptions")).json()["subscriptions"] == []
            assert errors == []
        finally:
            await ctx.close()
            await d.stop()


async def deliver_push(ctx: BrowserContext, page: Page, origin: str, payload: dict[str, Any]) -> None:
    """A real push event in the page's worker: Chromium's DevTools ServiceWorker domain."""
    cdp = await ctx.new_cdp_session(page)
    registrations: list[str] = []
    cdp.on(
        "ServiceWorker.workerRegistrationUpdated",
        lambda e: registrations.extend(r["registrationId"] for r in e["registrations"] if not r["isDeleted"]),
    )
    await cdp.send("ServiceWorker.enable")
    await wait_until(lambda: bool(registrations), what="the worker's registration")
    await cdp.send(
        "ServiceWorker.deliverPushMessage",
        {"origin": origin + "/", "registrationId": registrations[0], "data": json.dumps(payload)},
    )


async def test_the_worker_shows_a_push_and_answers_the_permission_from_its_notification(
    browser: Browser,  # noqa: F811
    tmp_path: Path,
    agent_env: dict[str, str],
) -> None:
    d = Daemon(tmp_path, config(agent_env))
    await d.start()
    errors: list[str] = []
    ctx = await browser.new_context()
    try:
        await ctx.grant_permissions(["notifications"], origin=d.url)
        page = await signed_in(d, ctx, errors)
        worker = await worker_of(ctx, page)
        async with d.http() as http:
            tid = (await http.post("/v1/threads", json={"agent": "asker", "title": "Deploy"})).json()["id"]
            await http.post(f"/v1/threads/{tid}/messages", json={"text": "ask"})
            pending: list[Any] = []

            async def asked() -> bool:
                pending[:] = (await http.get(f"/v1/threads/{tid}/permissions")).json()["permissions"]
                return bool(pending)

            while not await asked():
                await page.wait_for_timeout(50)
            rid = pending[0]["request_id"]
            payload = {
                "v": 1,
                "thread_id": tid,
                "kind": "permission",
                "title": "Deploy",
                "line": "Permission waiting: Bash",
                "request_id": rid,
            }
            await deliver_push(ctx, page, d.url, payload)
            shown = await worker.evaluate(
                """async () => {
                  for (let i = 0; i < 200; i++) {
                    const ns = await self.registration.getNotifications();
                    if (ns.length) return ns.map(n => ({title: n.title, body: n.body, tag: n.tag, data: n.data,
                                                        actions: (n.actions || []).map(a => a.action)}));
                    await new Promise(r => setTimeout(r, 25));
                  }
                  return [];
                }"""
            )
            assert shown == [
                {
                    "title": "Deploy",
                    "body": "Permission waiting: Bash",
                    "tag": f"perm-{tid}",
                    "data": {"thread_id": tid, "kind": "permission", "request_id": rid},
                    "actions": ["allow", "deny"],
                }
            ]
            # Allow from the notification: the worker's fetch carries the page's cookie.
            outcome = await worker.evaluate(
                "async () => { const [n] = await self.registration.getNotifications(); "
                "return self.agentBridge.clicked(n, 'allow'); }"
            )
            assert outcome == "answered"
            assert (await http.get(f"/v1/threads/{tid}/permissions")).json()["permissions"] == []
            # A click on the body opens the thread in the open page.
            await deliver_push(ctx, page, d.url, {**payload, "kind": "turn_ended", "line": "Turn ended"})
            opened = await worker.evaluate(
                """async () => {
                  for (let i = 0; i < 200; i++) {
                    const [n] = await self.registration.getNotifications();
                    if (n) return self.agentBridge.clicked(n, '');
                    await new Promise(r => setTimeout(r, 25));
                  }
                  return 'none';
                }"""
            )
            assert opened == "opened"
            await expect(page.locator("#thread")).to_be_visible()
            assert f"t={tid}" in page.url
        assert errors == []
    finally:
        await ctx.close()
        await d.stop()


async def test_the_page_works_without_a_service_worker(
    browser: Browser,  # noqa: F811
    tmp_path: Path,
    agent_env: dict[str, str],
) -> None:
    d = Daemon(tmp_path, config(agent_env))
    await d.start()
    errors: list[str] = []
    ctx = await browser.new_context(service_workers="block")
    try:
        page = await signed_in(d, ctx, errors)
        await expect(page.locator("#push")).to_be_hidden()
        async with d.http() as http:
            tid = (await http.post("/v1/threads", json={"agent": "asker", "title": "No worker"})).json()["id"]
        await page.evaluate("id => { location.hash = 't=' + id; }", tid)
        await page.fill("#prompt", "hello")
        await page.press("#prompt", "Enter")
        await expect(page.locator("#thread")).to_contain_text("hello")
        assert ctx.service_workers == [] and errors == []
    finally:
        await ctx.close()
        await d.stop()
