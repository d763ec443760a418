"""Sessions started outside the bridge, with the real CLIs (issue #17 item 4), offline.

A session is made by running the CLI directly, as a user in a terminal would (``claude -p
… --output-format json``, ``qwen -p …``), with the same HOME and environment the profile
gives its agent; then a daemon lists it from the CLI's own session files
(``GET /v1/agents/{name}/sessions``), a thread adopts it (``native_session_id``), and the
thread's first turn resumes it: the model request of that turn carries the first
session's prompt. The direct Claude Code run is traced (strace): it talks to the
loopback fake and nothing else.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import new_thread
from fake_anthropic import MODEL, FakeAnthropic, block_texts
from fake_openai import FakeOpenAI, all_texts
from realagents import (
    AGENT_TIMEOUT,
    Real,
    agent_env,
    assert_gapless,
    assert_only_peer_is,
    claude_executable,
    fake_api,
    fake_openai,
    node_script,
    strace_wrapped,
    world,
)
from scenarios import turn
from test_claude_agent_acp import acp_profile
from test_claude_code import claude_profile
from test_qwen_code import ACP, QWEN, SETTINGS, STREAM_JSON, qwen_env

__all__ = ["fake_api", "fake_openai"]  # fixtures used below

pytestmark = pytest.mark.timeout(150)


@pytest.fixture
async def claude_world(
    fake_api: FakeAnthropic, tmp_path: Path, daemon_factory: Callable[..., Any]
) -> AsyncIterator[Real]:
    async with world(fake_api, tmp_path, daemon_factory) as w:
        w.base_env = agent_env(fake_api, w.home)
        yield w


@pytest.fixture
async def qwen_world(
    fake_openai: FakeOpenAI, tmp_path: Path, daemon_factory: Callable[..., Any]
) -> AsyncIterator[Real]:
    async with world(fake_openai, tmp_path, daemon_factory) as w:
        w.base_env = qwen_env(fake_openai, w.home)
        (w.home / ".qwen").mkdir()
        (w.home / ".qwen" / "settings.json").write_text(json.dumps(SETTINGS))
        yield w


async def run_directly(r: Real, argv: list[str]) -> dict[str, Any]:
    """The CLI run by hand in the work dir, outside any daemon; its last JSON output."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=r.work,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", **r.env()},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), AGENT_TIMEOUT)
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    result = json.loads(out)
    last: dict[str, Any] = result[-1] if isinstance(result, list) else result
    assert last["type"] == "result" and last["is_error"] is False, last
    return last


async def listed(r: Real, d: Any, agent: str) -> dict[str, Any]:
    async with d.http() as http:
        resp = await http.get(f"/v1/agents/{agent}/sessions", params={"cwd": str(r.work)})
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


async def test_a_claude_session_made_in_a_terminal_is_listed_adopted_and_resumed(claude_world: Real) -> None:
    r = claude_world
    log = r.tmp / "strace.log"
    exe, args = strace_wrapped(claude_executable(), ["-p", "CHAT remember the word PINEAPPLE"], log)
    first = await run_directly(r, [exe, *args, "--output-format", "json", "--model", MODEL])
    native = first["session_id"]
    assert_only_peer_is(r.fake, log)  # the direct run stayed on loopback too
    d = await r.daemon(r.config(claude_profile(r), acp_profile(r)))

    body = await listed(r, d, "claude")
    assert body["store"] == "claude-code" and body["reason"] is None, body
    [entry] = body["sessions"]
    assert entry == {
        "id": native,
        "title": "CHAT remember the word PINEAPPLE",
        "last_activity": entry["last_activity"],
        "source": "claude-code",
    }
    assert entry["last_activity"].endswith("Z")

    # claude-agent-acp keeps its sessions in the same store, and lists them over ACP.
    over_acp = await listed(r, d, "claude-acp")
    assert over_acp["store"] == "acp" and over_acp["reason"] is None, over_acp
    assert [(s["id"], s["source"]) for s in over_acp["sessions"]] == [(native, "acp")]
    assert "PINEAPPLE" in (over_acp["sessions"][0]["title"] or "")

    thread = await new_thread(d, "claude", cwd=str(r.work), native_session_id=native)
    assert thread["native_session_id"] == native
    c = await d.ws(thread["id"], after=0)
    end = await turn(c, "CHAT which word?")
    assert end["data"]["status"] == "success", end
    assert [f["data"]["resume"] for f in c.seen("process.started")] == [native]
    assert c.seen("session.started")[0]["data"]["native_session_id"] == native
    # The resumed turn's model request carries the terminal session's history.
    resumed = r.fake.model_requests()[-1]
    texts = [t for m in resumed.messages for t in block_texts(m["content"])]
    assert any("remember the word PINEAPPLE" in t for t in texts), texts
    assert "Hello from the fake model." in texts
    assert resumed.headers["x-claude-code-session-id"] == native
    assert_gapless(c)
    # The thread's turn went to the same session file: still one session, now newer.
    again = await listed(r, d, "claude")
    assert [s["id"] for s in again["sessions"]] == [native]
    assert again["sessions"][0]["last_activity"] >= entry["last_activity"]


async def test_a_qwen_session_made_in_a_terminal_is_listed_adopted_and_resumed(qwen_world: Real) -> None:
    r = qwen_world
    node, script = node_script(QWEN, "cli-entry.js")
    first = await run_directly(
        r, [node, *script, "--auth-type", "openai", "-p", "CHAT remember the word MANGO", "--output-format", "json"]
    )
    native = first["session_id"]
    d = await r.daemon(r.config(STREAM_JSON.profile(r), ACP.profile(r)))

    body = await listed(r, d, "qwen")
    assert body["store"] == "qwen-code" and body["reason"] is None, body
    assert [(s["id"], s["title"], s["source"]) for s in body["sessions"]] == [
        (native, "CHAT remember the word MANGO", "qwen-code")
    ]
    # Qwen Code in ACP mode lists the same session with session/list.
    over_acp = await listed(r, d, "qwen-acp")
    assert over_acp["store"] == "acp" and over_acp["reason"] is None, over_acp
    assert [(s["id"], s["source"]) for s in over_acp["sessions"]] == [(native, "acp")]
    assert "MANGO" in (over_acp["sessions"][0]["title"] or "")

    thread = await new_thread(d, "qwen", cwd=str(r.work), native_session_id=native)
    c = await d.ws(thread["id"], after=0)
    end = await turn(c, "CHAT which word?")
    assert end["data"]["status"] == "success", (end, c.seen("diagnostic"))
    assert [f["data"]["resume"] for f in c.seen("process.started")] == [native]
    texts = all_texts(r.fake.model_requests()[-1].body)
    assert any("remember the word MANGO" in t for t in texts), texts
    assert_gapless(c)
