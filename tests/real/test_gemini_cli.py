"""The real Gemini CLI in ACP mode through a real daemon, fully offline (issue #17).

``@google/gemini-cli`` (the version in npm-pins.txt) runs under node with ``--acp``
against the loopback fake Gemini API of fake_gemini.py (``GEMINI_API_KEY`` and
``GOOGLE_GEMINI_BASE_URL``); the prompt's marker word picks the model's reply.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_until
from fake_gemini import MODEL, FakeGemini, all_texts
from realagents import PINS, Real, node_script, serving, world
from scenarios import *  # noqa: F403 -- the scenarios every real CLI goes through
from scenarios import Agent

pytestmark = pytest.mark.timeout(150)

GEMINI = "@google/gemini-cli"
FAKE_KEY = "fake-gemini-key-0123456789"
# $HOME/.gemini/settings.json: no usage statistics (they would leave the machine).
SETTINGS = {"privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False}}


@pytest.fixture
def fake_gemini() -> Iterator[FakeGemini]:
    fake = FakeGemini()
    with serving(fake, lambda p: p[0] == "POST" and fake.is_model_path(p[1])):
        yield fake


@pytest.fixture
async def real(fake_gemini: FakeGemini, tmp_path: Path, daemon_factory: Callable[..., Any]) -> AsyncIterator[Real]:
    async with world(fake_gemini, tmp_path, daemon_factory) as w:
        w.base_env = {
            "HOME": str(w.home),
            "GEMINI_API_KEY": FAKE_KEY,
            "GOOGLE_GEMINI_BASE_URL": fake_gemini.url,
            "GEMINI_MODEL": MODEL,
        }
        (w.home / ".gemini").mkdir()
        (w.home / ".gemini" / "settings.json").write_text(json.dumps(SETTINGS))
        yield w


def check_permission(req: dict[str, Any], path: Path) -> None:
    # Gemini CLI sends the command as the tool call's title, and no rawInput.
    assert req["data"]["title"] == f"touch {path}", req
    assert req["raw"]["params"]["toolCall"]["kind"] == "execute", req
    assert {"allow_once", "reject_once"} <= {o["kind"] for o in req["data"]["options"]}, req


async def next_minute(r: Real) -> None:
    """Gemini CLI 0.61.0 names a session's file by the minute it (re)started recording
    and the session's short id: a session/load in the same wall-clock minute as the
    session began writes a fresh record into that same file, which empties it, and the
    load fails with "Invalid session identifier" (-32603). Loaded in a later minute, the
    session comes back whole; so the restart waits for the minute to turn."""
    [chats] = list((r.home / ".gemini" / "tmp").glob("*/chats"))
    started = {p.name.rsplit("-", 1)[0] for p in chats.glob("session-*.json*")}
    await wait_until(
        lambda: time.strftime("session-%Y-%m-%dT%H-%M", time.gmtime()) not in started,
        timeout=65,
        what="the next minute",
    )


@pytest.fixture
def agent() -> Agent:
    return AGENT


AGENT = Agent(
    "gemini",
    "acp",
    lambda: node_script(GEMINI, "bundle/gemini.js"),
    lambda r: {"args": ["--acp"], "auth_method": "gemini-api-key", "env": r.env()},
    all_texts,
    FakeGemini.chat_requests,
    check_permission,
    version=PINS[GEMINI],
    before_restart=next_minute,
    # Gemini CLI answers the older `models`, with the fake's model as the current one, which
    # its list does not hold: the bridge offers it first, and a switch is session/set_model.
    model_option=True,
)
