"""The page shows a prompt that waits for memory (issue #36 item 5): while the host's
agents fill the budget and none is idle, the prompt is refused 503 ``memory_budget``; the
page says it waits, sends it again with the same client_id when the daemon says, and it
runs once there is room. Real chromium, real daemon, the fake agent holding memory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from conftest import profile_toml
from playwright.async_api import Browser, expect
from test_memory_e2e import post_prompt, rss_at_least
from test_page_e2e import Session, browser, send, session_on

__all__ = ["browser"]  # a fixture, used by name

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module")
async def tight(browser: Browser, tmp_path: Path, agent_env: dict[str, str]) -> AsyncIterator[Session]:
    cfg = "[server]\nstop_grace_s = 1\n[capacity]\nmemory_budget_mb = 100\n"
    cfg += profile_toml("mem", "stream-json", agent_env, memory_estimate_mb=40)
    async with session_on(browser, tmp_path, cfg) as s:
        yield s


async def test_a_prompt_waiting_for_memory_is_shown_and_sent_again(tight: Session) -> None:
    d = tight.d
    async with d.http() as http:
        a = (await http.post("/v1/threads", json={"agent": "mem"})).json()["id"]
        b = (await http.post("/v1/threads", json={"agent": "mem"})).json()["id"]
    hog = await d.ws(a)
    await hog.turn("alloc 60")
    await hog.close()
    assert (await post_prompt(d, a, "slow", "hog-2")).status_code == 202  # busy: not evictable
    await rss_at_least(d, 60)
    page = await tight.page(thread=b)
    await send(page, "hello from the page")
    error = page.locator("#send-error")
    await expect(error).to_contain_text("Waiting for memory")
    async with d.http() as http:
        await http.post(f"/v1/threads/{a}/interrupt")  # A is idle now: evicted at the next try
    await expect(page.locator(".msg.assistant").last).to_contain_text("echo: hello from the page")
    await expect(error).to_have_text("")
    tight.errors = [e for e in tight.errors if "503" not in e]  # the refusals are expected
    tight.assert_clean()
