"""The real Qwen Code CLI, in stream-json and in ACP mode, through a real daemon, fully
offline (issue #17).

``@qwen-code/qwen-code`` (the version in npm-pins.txt) runs under node against the
loopback fake OpenAI chat-completions API of fake_openai.py (``--auth-type openai``); the
prompt's marker word picks the model's reply (fakeserver.MARKERS). Each test runs once
per mode: ``qwen`` (stream-json) and ``qwen-acp`` (ACP).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import new_thread, wait_until
from fake_openai import MODEL, FakeOpenAI, all_texts
from fakeserver import CHAT_TEXT
from realagents import (
    AGENT_TIMEOUT,
    PINS,
    Real,
    agent_text,
    assert_gapless,
    assert_only_peer_is,
    doc_preset,
    node_script,
    profile,
    strace_wrapped,
    world,
)

pytestmark = pytest.mark.timeout(150)

QWEN = "@qwen-code/qwen-code"
FAKE_KEY = "sk-fake-qwen-0123456789"
# What Qwen Code may ask the fake for: model round trips only.
EXPECTED_PATHS = {("POST", "/v1/chat/completions")}
MODES = ["qwen", "qwen-acp"]
# Every tool call that changes something asks (the CLI's default mode is "auto", where a
# model-based classifier decides first).
APPROVAL = ["--approval-mode", "default"]
# $HOME/.qwen/settings.json: usage statistics are on by default (they would leave the
# machine), and after each turn a background "managed memory" sub-agent makes a model
# request of its own; both off, as docs/agents.md says.
SETTINGS = {"privacy": {"usageStatisticsEnabled": False}, "memory": {"enableManagedAutoMemory": False}}


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    fake = FakeOpenAI()
    fake.start()
    yield fake
    fake.stop()
    unexpected = {p for p in fake.paths() if p not in EXPECTED_PATHS}
    assert not unexpected, f"the agent asked the fake for unexpected paths: {unexpected}"


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


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def qwen_profile(r: Real, mode: str, command: tuple[str, list[str]] | None = None) -> str:
    node, args = command or node_script(QWEN, "cli-entry.js")
    if mode == "qwen":
        fields: dict[str, Any] = {"permission_prompts": True}
        if command is not None:  # under strace: the bridge cannot tell the CLI, so say its flags
            fields = {"protocol_flags": ["--output-format", "stream-json", "--input-format", "stream-json"]}
        return profile(
            mode,
            protocol="stream-json",
            executable=node,
            args=[*args, "--auth-type", "openai", "--include-partial-messages", *APPROVAL],
            env=r.env(),
            model=MODEL,
            **fields,
        )
    return profile(
        mode, protocol="acp", executable=node, args=[*args, "--acp", *APPROVAL], auth_method="openai", env=r.env()
    )


async def turn(c: Any, text: str) -> dict[str, Any]:
    acc = await c.prompt(text)
    assert acc["kind"] == "client.accepted", acc
    end: dict[str, Any] = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"], timeout=AGENT_TIMEOUT)
    return end


async def test_chat_turn_streams_text(real: Real, mode: str) -> None:
    d = await real.daemon(real.config(qwen_profile(real, mode)))
    thread = await new_thread(d, mode, cwd=str(real.work))
    c = await d.ws(thread["id"], after=0)
    end = await turn(c, "CHAT hello there")
    assert end["data"]["status"] == "success", end
    assert agent_text(c) == CHAT_TEXT
    assert [f["data"]["text"] for f in c.seen("message.delta", channel="text") if f["data"]["text"]] == [
        "Hello ",
        "from ",
        "the ",
        "fake ",
        "model.",
    ]
    started = c.seen("session.started")[0]["data"]
    assert started["native_session_id"]
    async with d.http() as http:
        t = (await http.get(f"/v1/threads/{thread['id']}")).json()
    if mode == "qwen-acp":
        assert t["agent_info"]["info"]["version"] == PINS[QWEN]
    [req] = real.fake.model_requests()
    assert req.body["stream"] is True and req.body["model"] == MODEL
    assert "CHAT hello there" in all_texts(req.body)[-1]
    assert all(FAKE_KEY not in t for t in c.texts)
    assert_gapless(c)


async def test_a_shell_tool_asks_permission_allowed_then_denied(real: Real, mode: str) -> None:
    d = await real.daemon(real.config(qwen_profile(real, mode)))
    thread = await new_thread(d, mode, cwd=str(real.work))
    c = await d.ws(thread["id"], after=0)
    allowed, denied = real.work / "allowed.txt", real.work / "denied.txt"

    acc = await c.prompt(f"WRITE {allowed}")
    req = await c.kind("permission.requested", timeout=AGENT_TIMEOUT)
    if mode == "qwen":
        assert req["data"]["tool"] == "run_shell_command", req
        assert req["data"]["input"]["command"] == f"touch {allowed}", req
    else:  # the ACP request's title names the command; the tool's name is in its _meta
        assert req["data"]["title"] == f"touch {allowed} (Create a file)", req
        assert req["data"]["input"]["command"] == f"touch {allowed}", req
        assert req["raw"]["params"]["toolCall"]["_meta"]["toolName"] == "run_shell_command", req
    await c.send(op="permission", request_id=req["data"]["request_id"], decision="allow")
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"], timeout=AGENT_TIMEOUT)
    assert end["data"]["status"] == "success", end
    assert allowed.exists()
    assert agent_text(c).startswith("Tool said")

    acc = await c.prompt(f"WRITE {denied}")
    req = await c.kind("permission.requested", timeout=AGENT_TIMEOUT)
    await c.send(op="permission", request_id=req["data"]["request_id"], decision="deny")
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"], timeout=AGENT_TIMEOUT)
    assert not denied.exists()
    assert [f["data"]["decision"] for f in c.seen("permission.resolved")] == ["allow", "deny"]
    assert_gapless(c)


async def test_interrupt_during_a_slow_streamed_reply(real: Real, mode: str) -> None:
    d = await real.daemon(real.config(qwen_profile(real, mode)))
    thread = await new_thread(d, mode, cwd=str(real.work))
    c = await d.ws(thread["id"], after=0)
    acc = await c.prompt("SLOW please")
    await c.next(lambda f: f.get("kind") == "message.delta" and f["data"]["text"] == "tick 2 ", timeout=AGENT_TIMEOUT)
    await c.send(op="interrupt")
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"], timeout=AGENT_TIMEOUT)
    assert end["data"]["status"] == "cancelled", end
    slow = real.fake.model_requests()[0]
    await wait_until(lambda: slow.stream == "aborted", what="the slow stream to be dropped")
    assert not c.seen("process.exited")  # interrupted, not killed
    mark = c.seqs()[-1]
    end = await turn(c, "CHAT again")
    assert end["data"]["status"] == "success", end
    assert agent_text(c, since=mark) == CHAT_TEXT
    assert len(c.seen("process.started")) == 1
    assert_gapless(c)


async def test_stop_start_resume_carries_the_first_turn_to_the_model(real: Real, mode: str) -> None:
    cfg = real.config(qwen_profile(real, mode))
    d1 = await real.daemon(cfg)
    thread = await new_thread(d1, mode, cwd=str(real.work))
    c1 = await d1.ws(thread["id"])
    end = await turn(c1, "CHAT remember the word PINEAPPLE")
    assert end["data"]["status"] == "success", end
    native = c1.seen("session.started")[0]["data"]["native_session_id"]
    assert await d1.stop() == 0

    d2 = await real.daemon(cfg)
    c2 = await d2.ws(thread["id"], after=0)
    end = await turn(c2, "CHAT which word?")
    assert end["data"]["status"] == "success", end
    assert c2.seen("session.started")[-1]["data"]["native_session_id"] == native
    if mode == "qwen":
        assert [f["data"]["resume"] for f in c2.seen("process.started")] == [None, native]
    # One user message each: a replayed history did not enter the transcript again.
    assert [f["data"]["text"] for f in c2.seen("message", role="user")] == [
        "CHAT remember the word PINEAPPLE",
        "CHAT which word?",
    ]
    texts = all_texts(real.fake.model_requests()[-1].body)
    assert any("remember the word PINEAPPLE" in t for t in texts), texts
    assert CHAT_TEXT in texts
    assert "which word?" in texts[-1]
    assert_gapless(c2)


async def test_the_documented_preset_runs(real: Real, mode: str) -> None:
    # docs/agents.md's preset, with only the script's path and the fake's key/base URL swapped in.
    preset = doc_preset(mode)
    node, args = node_script(QWEN, "cli-entry.js")
    assert preset["args"][0].endswith(args[0].split("node_modules", 1)[1])
    preset.update(executable=node, args=[*args, *preset["args"][1:]])
    preset["env"] = {**preset["env"], **real.env()}
    preset.pop("remote_api_opt_in", None)
    preset.pop("model", None)  # OPENAI_MODEL names the fake's model
    d = await real.daemon(real.config(profile(mode, **preset)))
    c = await d.ws((await new_thread(d, mode, cwd=str(real.work)))["id"])
    end = await turn(c, "CHAT hi")
    assert end["data"]["status"] == "success", end
    assert [f["data"]["text"] for f in c.seen("message", role="assistant")] == [CHAT_TEXT]


async def test_no_traffic_leaves_the_machine(real: Real, mode: str) -> None:
    log = real.tmp / "strace.log"
    node, args = node_script(QWEN, "cli-entry.js")
    d = await real.daemon(real.config(qwen_profile(real, mode, strace_wrapped(node, args, log))))
    c = await d.ws((await new_thread(d, mode, cwd=str(real.work)))["id"])
    assert (await turn(c, "CHAT hello"))["data"]["status"] == "success"
    assert_only_peer_is(real.fake, log)
