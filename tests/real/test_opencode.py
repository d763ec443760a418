"""The real OpenCode (``opencode acp``) through a real daemon, fully offline (issue #17).

``opencode-ai`` (the version in npm-pins.txt) is a native binary; its provider is an
OpenAI-compatible one (``@ai-sdk/openai-compatible``, bundled) pointed at the loopback fake
chat-completions API of fake_openai.py by inline config (``OPENCODE_CONFIG_CONTENT``), and
its model catalogue fetch is off (``OPENCODE_DISABLE_MODELS_FETCH``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from fake_openai import MODEL, FakeOpenAI, all_texts
from realagents import PINS, Real, fake_openai, free_port, native_binary, world
from scenarios import *  # noqa: F403 -- the scenarios every real CLI goes through
from scenarios import Agent

pytestmark = pytest.mark.timeout(150)
__all__ = ["fake_openai"]  # fixtures the scenarios use

OPENCODE = "opencode-ai"
FAKE_KEY = "sk-fake-opencode-0123456789"


def opencode_config(base_url: str) -> str:
    return json.dumps(
        {
            "provider": {
                "fake": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Fake",
                    "options": {"baseURL": base_url, "apiKey": "{env:OPENAI_API_KEY}"},
                    "models": {MODEL: {"name": "Fake model"}},
                }
            },
            "model": f"fake/{MODEL}",
            "permission": {"bash": "ask", "edit": "ask"},
            "share": "disabled",
            "autoupdate": False,
        }
    )


@pytest.fixture
async def real(fake_openai: FakeOpenAI, tmp_path: Path, daemon_factory: Callable[..., Any]) -> AsyncIterator[Real]:
    async with world(fake_openai, tmp_path, daemon_factory) as w:
        w.base_env = {
            "HOME": str(w.home),
            "OPENAI_API_KEY": FAKE_KEY,
            "OPENCODE_CONFIG_CONTENT": opencode_config(f"{fake_openai.url}/v1"),
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
        }
        seed_plugin_sdk(w.home)
        yield w


def seed_plugin_sdk(home: Path) -> None:
    """At every start OpenCode installs its plugin SDK (``@opencode-ai/plugin``) into each
    config directory with npm, in the background, from the npm registry, unless the
    directory has a ``node_modules`` and a ``package-lock.json`` that lists it (1.18.33:
    ``Npm.install``). Offline that install fails (harmlessly), but where the registry is
    reachable it is traffic beyond the fake, so the test's config dir says it is there."""
    config = home / ".config" / "opencode"
    (config / "node_modules").mkdir(parents=True)
    lock = {"packages": {"": {"dependencies": {"@opencode-ai/plugin": PINS[OPENCODE]}}}}
    (config / "package-lock.json").write_text(json.dumps(lock))


def chat_requests(fake: FakeOpenAI) -> list[Any]:
    """The agent's turns; not the title generator's request (which offers no tools)."""
    return [r for r in fake.model_requests() if r.body.get("tools")]


def check_permission(req: dict[str, Any], path: Path) -> None:
    assert req["data"]["input"]["command"] == f"touch {path}", req
    assert {"allow_once", "reject_once"} <= {o["kind"] for o in req["data"]["options"]}, req


AGENT = Agent(
    "opencode",
    "acp",
    lambda: (native_binary(OPENCODE, "bin/opencode.exe", platform_package=False), []),
    lambda r: {"args": ["acp"], "env": r.env()},
    all_texts,
    chat_requests,
    check_permission,
    version=PINS[OPENCODE],
    traced=lambda r: traced_on_a_port_of_ours(),
    model_option=True,  # no usage_update: its prompt answer's usage only
)


def traced_on_a_port_of_ours() -> tuple[set[tuple[str, int]], dict[str, Any]]:
    """`opencode acp` serves its own HTTP API on loopback and talks to it: on a port we
    choose, so the strace check knows that peer."""
    port = free_port()
    return {("127.0.0.1", port)}, {"args": ["acp", "--port", str(port)]}


@pytest.fixture
def agent() -> Agent:
    return AGENT
