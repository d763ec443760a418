"""The real Qwen Code CLI, in stream-json and in ACP mode, through a real daemon, fully
offline (issue #17).

``@qwen-code/qwen-code`` (the version in npm-pins.txt) runs under node against the
loopback fake OpenAI chat-completions API of fake_openai.py (``--auth-type openai``); the
prompt's marker word picks the model's reply (fakeserver.MARKERS). Each test runs once
per mode: ``qwen`` (stream-json) and ``qwen-acp`` (ACP).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import new_thread
from fake_openai import MODEL, FakeOpenAI, all_texts
from fakeserver import CHAT_TEXT
from realagents import PINS, Real, agent_text, assert_gapless, doc_preset, fake_openai, node_script, profile, world
from scenarios import *  # noqa: F403 -- the scenarios every real CLI goes through
from scenarios import Agent
from scenarios import turn as scenarios_turn

pytestmark = pytest.mark.timeout(150)
__all__ = ["fake_openai"]  # fixtures the scenarios use

QWEN = "@qwen-code/qwen-code"
FAKE_KEY = "sk-fake-qwen-0123456789"
MODES = ["qwen", "qwen-acp"]
# Every tool call that changes something asks (the CLI's default mode is "auto", where a
# model-based classifier decides first).
APPROVAL = ["--approval-mode", "default"]
QUIET_FLAGS = ["--output-format", "stream-json", "--input-format", "stream-json"]
# $HOME/.qwen/settings.json: usage statistics are on by default (they would leave the
# machine), and after each turn a background "managed memory" sub-agent makes a model
# request of its own; both off, as docs/agents.md says.
SETTINGS = {"privacy": {"usageStatisticsEnabled": False}, "memory": {"enableManagedAutoMemory": False}}


def qwen_env(fake: FakeOpenAI, home: Path) -> dict[str, str]:
    return {
        "HOME": str(home),
        "OPENAI_API_KEY": FAKE_KEY,
        "OPENAI_BASE_URL": f"{fake.url}/v1",
        "OPENAI_MODEL": MODEL,
    }


@pytest.fixture
async def real(fake_openai: FakeOpenAI, tmp_path: Path, daemon_factory: Callable[..., Any]) -> AsyncIterator[Real]:
    async with world(fake_openai, tmp_path, daemon_factory) as w:
        w.base_env = qwen_env(fake_openai, w.home)
        (w.home / ".qwen").mkdir()
        (w.home / ".qwen" / "settings.json").write_text(json.dumps(SETTINGS))
        yield w


def check_permission(req: dict[str, Any], path: Path) -> None:
    # The tool's name: can_use_tool's tool_name (stream-json), the request's _meta.toolName (ACP).
    assert req["data"]["tool"] == "run_shell_command", req
    assert req["data"]["input"]["command"] == f"touch {path}", req
    if req["raw"].get("jsonrpc"):  # ACP: the title is the human label
        assert req["data"]["title"] == f"touch {path} (Create a file)", req
        assert req["raw"]["params"]["toolCall"]["_meta"]["toolName"] == "run_shell_command", req


def command() -> tuple[str, list[str]]:
    return node_script(QWEN, "cli-entry.js")


STREAM_JSON = Agent(
    "qwen",
    "stream-json",
    command,
    lambda r: {
        "args": ["--auth-type", "openai", "--include-partial-messages", *APPROVAL],
        "env": r.env(),
        "model": MODEL,
        "permission_prompts": True,
    },
    all_texts,
    FakeOpenAI.model_requests,
    check_permission,
    resume_on_argv=True,
    # The docs' model and remote opt-in are for the real service; OPENAI_MODEL names the fake's.
    preset_drop=("remote_api_opt_in", "model"),
    # Under strace the bridge cannot tell which CLI runs: the profile states its flags.
    traced=lambda r: (set(), {"protocol_flags": QUIET_FLAGS, "permission_prompts": False}),
)
ACP = Agent(
    "qwen-acp",
    "acp",
    command,
    lambda r: {"args": ["--acp", *APPROVAL], "auth_method": "openai", "env": r.env()},
    all_texts,
    FakeOpenAI.model_requests,
    check_permission,
    version=PINS[QWEN],
    preset_drop=("remote_api_opt_in",),
    model_option=True,
    usage_update=True,
)


@pytest.fixture(params=[STREAM_JSON, ACP], ids=MODES)
def agent(request: pytest.FixtureRequest) -> Agent:
    a: Agent = request.param
    return a


async def test_the_profile_found_on_path_works_as_it_is(real: Real) -> None:
    # No [agents.qwen]: the daemon finds `qwen` on PATH (npm's symlink to cli-entry.js) and
    # runs the resolved script with no --verbose; key, endpoint and model come from the
    # CLI's own files in HOME ($HOME/.qwen/.env, settings.json), as for a user's install.
    node, [script] = node_script(QWEN, "cli-entry.js")
    bindir = real.tmp / "bin"
    bindir.mkdir()
    (bindir / "qwen").symlink_to(script)
    qwen_dir = real.home / ".qwen"
    (qwen_dir / ".env").write_text("".join(f"{k}={v}\n" for k, v in real.env().items() if k != "HOME"))
    (qwen_dir / "settings.json").write_text(json.dumps({**SETTINGS, "security": {"auth": {"selectedType": "openai"}}}))
    path = os.pathsep.join([str(bindir), os.path.dirname(node), "/usr/bin", "/bin"])
    # The script's `#!/usr/bin/env node` finds node on this PATH: the sandbox grants that
    # node's directory, even outside the system (nvm, scripts/test's ~/.cache/agent-bridge/node).
    d = await real.make_daemon(real.config(), extra_env={"PATH": path, "HOME": str(real.home)})
    real.daemons.append(d)
    async with d.http() as http:
        agents = {a["name"]: a for a in (await http.get("/v1/agents")).json()}
    assert agents["qwen"]["protocol"] == "stream-json" and agents["qwen"]["available"], agents
    thread = await new_thread(d, "qwen", cwd=str(real.work))
    c = await d.ws(thread["id"], after=0)
    end = await scenarios_turn(c, "CHAT hello")
    assert end["data"]["status"] == "success", end
    assert [f["data"]["text"] for f in c.seen("message", role="assistant")] == [CHAT_TEXT]
    assert_gapless(c)


async def test_the_one_process_acp_preset_streams_and_resumes(real: Real) -> None:
    """docs/agents.md's ``qwen-acp-lean``: ``cli.js`` run directly, with the wrapper's and
    the relaunch's Node flags given up front, is one process a thread (``cli-entry.js``
    makes three), streams a turn, and resumes it after a daemon restart (session/load)."""
    r = real
    preset = doc_preset("qwen-acp-lean")
    node, [script] = node_script(QWEN, "cli.js")
    at = next(i for i, a in enumerate(preset["args"]) if a.endswith("/cli.js"))
    assert preset["args"][at].endswith(script.split("node_modules", 1)[1]), preset
    preset["args"][at] = script
    preset["executable"] = node
    preset["env"] = {**preset["env"], **r.env()}
    del preset["remote_api_opt_in"]
    cfg = r.config(profile("qwen-acp-lean", **preset))
    d1 = await r.daemon(cfg)
    thread = await new_thread(d1, "qwen-acp-lean", cwd=str(r.work))
    c1 = await d1.ws(thread["id"])
    end = await scenarios_turn(c1, "CHAT remember the word PINEAPPLE")
    assert end["data"]["status"] == "success", end
    assert agent_text(c1) == CHAT_TEXT
    # (Qwen Code also runs a short-lived `ps` of its parent now and then.)
    agents = [desc for _, desc in r.own_processes() if "@qwen-code/qwen-code/" in desc]
    assert len(agents) == 1 and "/cli.js --acp" in agents[0], agents
    native = c1.seen("session.started")[0]["data"]["native_session_id"]
    assert await d1.stop() == 0

    d2 = await r.daemon(cfg)
    c2 = await d2.ws(thread["id"], after=0)
    end = await scenarios_turn(c2, "CHAT which word?")
    assert end["data"]["status"] == "success", end
    assert c2.seen("session.started")[-1]["data"]["native_session_id"] == native
    asked = [q for q in FakeOpenAI.model_requests(r.fake) if "which word?" in (all_texts(q.body) or [""])[-1]]
    assert asked and any("remember the word PINEAPPLE" in t for t in all_texts(asked[-1].body)), asked
    assert_gapless(c2)
