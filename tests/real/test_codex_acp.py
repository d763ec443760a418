"""Codex through codex-acp (ACP) and a real daemon, fully offline (issue #17).

``@zed-industries/codex-acp`` (the version in npm-pins.txt) is one native binary that
embeds Codex itself (its requests say ``codex_cli_rs/0.137.0``); it talks to the loopback
fake OpenAI Responses API of fake_openai.py through a custom model provider given with
``-c`` overrides, so the base URL is on the command line where the launch rules see it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI, all_texts
from realagents import PINS, Real, fake_openai, native_binary, world
from scenarios import *  # noqa: F403 -- the scenarios every real CLI goes through
from scenarios import Agent

pytestmark = pytest.mark.timeout(150)
__all__ = ["fake_openai"]  # fixtures the scenarios use

CODEX_ACP = "@zed-industries/codex-acp"
FAKE_KEY = "sk-fake-codex-0123456789"
# A model Codex has metadata for (with an unknown one it adds a warning to the reply).
MODEL = "gpt-5.4-mini"


def codex_args(base_url: str) -> list[str]:
    provider = f'{{ name = "fake", base_url = "{base_url}", env_key = "OPENAI_API_KEY", wire_api = "responses" }}'
    return [
        *("-c", f"model_providers.fake={provider}"),
        *("-c", 'model_provider="fake"'),
        *("-c", f'model="{MODEL}"'),
        *("-c", 'approval_policy="untrusted"'),  # every command but a few read-only ones asks
    ]


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
    # The docs' preset talks to OpenAI itself; the fake's provider overrides come after it.
    preset_args=lambda r: codex_args(f"{r.fake.url}/v1"),
    model_option=True,
    usage_update=True,
)


@pytest.fixture
def agent() -> Agent:
    return AGENT
