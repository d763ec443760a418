"""The model picker in the thread's header (issue #38 item 7, docs/api.md §4.4, §4.5;
web/models.js): the profile's models with its default marked and the thread's own chosen;
picking another switches the thread (PATCH {"model"}), and the next turn's agent runs on it
— a stream-json agent restarted with --model, an ACP agent's own model option, whose names
the picker shows once the agent reported them; an agent that cannot switch is refused and
the reason shown, the picker back on the thread's model. Real chromium, real daemon."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from conftest import agent_log, profile_toml
from playwright.async_api import Browser, Page, expect
from test_acp_e2e import acp_profile
from test_page_a11y import scan
from test_page_e2e import Session, api_thread, browser, send, session_on, transcript

__all__ = ["browser"]  # a fixture, used by name

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module")
async def web(browser: Browser, tmp_path: Path, agent_env: dict[str, str]) -> AsyncIterator[Session]:
    cfg = "[server]\nstop_grace_s = 1\n"
    cfg += profile_toml("picky", "stream-json", agent_env, model="fast", models=["fast", "deep"]) + "\n"
    cfg += acp_profile("chooser", agent_env, "--config-options", models=["fast"]) + "\n"
    cfg += acp_profile("fixed", agent_env, model="x", models=["x", "y"]) + "\n"
    async with session_on(browser, tmp_path, cfg) as s:
        yield s


async def options(page: Page) -> list[str]:
    return list(await page.locator("#t-model option").all_text_contents())


async def test_a_stream_json_thread_switches_model_and_its_next_turn_runs_on_it(web: Session, tmp_path: Path) -> None:
    tid = await api_thread(web, "picky")
    page = await web.page(thread=tid)
    picker = page.locator("#t-model")
    await expect(picker).to_be_visible()
    await expect(picker).to_have_value("fast")
    assert await options(page) == ["fast (profile default)", "deep"]
    await page.set_viewport_size({"width": 390, "height": 844})  # a phone: nothing wider
    assert await page.evaluate("document.documentElement.scrollWidth") <= 390
    await expect(picker).to_be_in_viewport()
    await page.set_viewport_size({"width": 1280, "height": 800})
    await send(page, "one")
    await expect(page.locator(".turn-end")).to_have_count(1)

    await picker.select_option("deep")  # by keyboard or mouse alike: a change of the select
    await expect(page.locator("#t-meta")).to_contain_text("deep")
    await expect(picker).to_have_value("deep")
    await expect(page.locator("#t-model-error")).to_have_text("")
    await send(page, "two")
    await expect(page.locator(".turn-end")).to_have_count(2)
    starts = [e["argv"] for e in agent_log(tmp_path) if e.get("event") == "start"]
    assert len(starts) == 2 and "--model=deep" in starts[1] and "--model=fast" in starts[0], starts
    models = [e["data"].get("model") for e in await transcript(web, tid) if e["kind"] == "session.started"]
    assert models[-1] == "deep", models
    web.assert_clean()


async def test_an_acp_thread_offers_its_agents_models_and_switches_its_option(web: Session) -> None:
    tid = await api_thread(web, "chooser")
    page = await web.page(thread=tid)
    await send(page, "whatconfig")
    await expect(page.locator(".msg.assistant .body").last).to_have_text("config: model=fast mode=default")
    picker = page.locator("#t-model")
    await expect(picker.locator("option")).to_have_text(["Fast", "Deep"])  # the agent's names
    await expect(picker).to_have_value("fast")  # what the agent says it runs
    await picker.select_option("deep")
    await expect(picker).to_have_value("deep")
    await send(page, "whatconfig")
    await expect(page.locator(".msg.assistant .body").last).to_have_text("config: model=deep mode=default")
    await expect(page.locator("#t-model-error")).to_have_text("")
    web.assert_clean()


async def test_an_agent_that_cannot_switch_says_why_and_the_picker_goes_back(web: Session) -> None:
    tid = await api_thread(web, "fixed")
    page = await web.page(thread=tid)
    picker = page.locator("#t-model")
    await expect(picker).to_have_value("x")
    await picker.select_option("y")
    await expect(page.locator("#t-model-error")).to_contain_text("Model not changed: ")
    await expect(page.locator("#t-model-error")).to_contain_text("no model")
    await expect(picker).to_have_value("x")
    await expect(picker).to_be_enabled()
    problems: list[str] = []
    await scan(page, "the model picker and its refusal", problems)  # axe-core, as test_page_a11y
    assert not problems, problems
    web.errors = [e for e in web.errors if "400" not in e]  # chromium logs the refusal
    web.assert_clean()
