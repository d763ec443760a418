"""Codex through codex-acp (ACP) and a real daemon, fully offline (issue #17).

``@zed-industries/codex-acp`` (the version in npm-pins.txt) is one native binary that
embeds Codex itself (its requests say ``codex_cli_rs/0.137.0``); it talks to the loopback
fake OpenAI Responses API of fake_openai.py through a custom model provider given with
``-c`` overrides, so the base URL is on the command line where the launch rules see it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import scenarios
from fake_openai import FakeOpenAI, all_texts
from realagents import PINS, Real, native_binary, world
from scenarios import Agent

pytestmark = pytest.mark.timeout(150)

CODEX_ACP = "@zed-industries/codex-acp"
FAKE_KEY = "sk-fake-codex-0123456789"
# A model Codex has metadata for (with an unknown one it adds a warning to the reply).
MODEL = "gpt-5.4-mini"
EXPECTED_PATHS = {("POST", "/v1/responses")}


def codex_args(base_url: str) -> list[str]:
    provider = f'{{ name = "fake", base_url = "{base_url}", env_key = "OPENAI_API_KEY", wire_api = "responses" }}'
    return [
        *("-c", f"model_providers.fake={provider}"),
        *("-c", 'model_provider="fake"'),
        *("-c", f'model="{MODEL}"'),
        *("-c", 'approval_policy="untrusted"'),  # every command but a few read-only ones asks
    ]


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    fake = FakeOpenAI()
    fake.start()
    yield fake
    fake.stop()
    unexpected = {p for p in fake.paths() if p not in EXPECTED_PATHS}
    assert not unexpected, f"the agent asked the fake for unexpected paths: {unexpected}"


@pytest.fixture
async def real(fake_openai: FakeOpenAI, tmp_path: Path, daemon_factory: Callable[..., Any]) -> AsyncIterator[Real]:
    async with world(fake_openai, tmp_path, daemon_factory) as w:
        w.base_env = {"HOME": str(w.home), "OPENAI_API_KEY": FAKE_KEY}
        yield w


def check_permission(req: dict[str, Any], path: Path) -> None:
    assert req["data"]["title"] == f"touch {path}", req
    assert req["data"]["input"]["command"] == ["/bin/bash", "-lc", f"touch {path}"], req


AGENT = Agent(
    "codex",
    "acp",
    lambda: (native_binary(CODEX_ACP, "bin/codex-acp"), []),
    lambda r: {"args": codex_args(f"{r.fake.url}/v1"), "env": r.env()},
    all_texts,
    FakeOpenAI.model_requests,
    check_permission,
    version=PINS[CODEX_ACP],
    deny_ends="cancelled",  # Codex's only way to refuse a command is "abort", which ends the turn
)


async def test_chat_turn_streams_text(real: Real) -> None:
    await scenarios.chat_turn_streams_text(real, AGENT)


async def test_a_shell_tool_asks_permission_allowed_then_denied(real: Real) -> None:
    await scenarios.tool_call_asks_permission(real, AGENT)


async def test_interrupt_during_a_slow_streamed_reply(real: Real) -> None:
    await scenarios.interrupt_during_a_slow_reply(real, AGENT)


async def test_stop_start_resume_carries_the_first_turn_to_the_model(real: Real) -> None:
    await scenarios.restart_resumes_with_the_first_turn(real, AGENT)


async def test_the_documented_preset_runs(real: Real) -> None:
    # The docs' preset talks to OpenAI itself; the fake's provider overrides come first.
    await scenarios.documented_preset_runs(real, AGENT, extra_args=codex_args(f"{real.fake.url}/v1"))


async def test_no_traffic_leaves_the_machine(real: Real) -> None:
    await scenarios.no_traffic_leaves_the_machine(real, AGENT)
