"""The scenarios every real agent CLI goes through (issue #17), written once: a streamed
chat turn, a tool call that asks permission (allowed, then denied), an interrupt during a
slow reply, a daemon stop → start → resumed turn whose model request carries the first
turn's text, the documented preset, and no traffic beyond the loopback fake. Each
``test_<cli>.py`` imports the ``test_*`` functions below and provides two fixtures:
``real`` (a :class:`~realagents.Real` around its fake) and ``agent`` (an :class:`Agent`
describing its CLI).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import new_thread, wait_until
from fakeserver import CHAT_CHUNKS, CHAT_TEXT
from realagents import (
    AGENT_TIMEOUT,
    Real,
    agent_text,
    assert_gapless,
    assert_only_peer_is,
    doc_preset,
    profile,
    strace_wrapped,
)

from bridge.tested_agents import cli_version

# What a test module gets with ``from scenarios import *``: the tests.
__all__ = [
    "test_a_tool_call_asks_permission_allowed_then_denied",
    "test_chat_turn_streams_text",
    "test_interrupt_during_a_slow_streamed_reply",
    "test_no_traffic_leaves_the_machine",
    "test_stop_start_resume_carries_the_first_turn_to_the_model",
    "test_the_agents_model_option_and_usage_are_the_threads",
    "test_the_documented_preset_runs",
]


@dataclass
class Agent:
    name: str  # the profile's (and the docs' preset's) name
    protocol: str
    command: Callable[[], tuple[str, list[str]]]  # the pinned CLI: executable, args
    fields: Callable[[Real], dict[str, Any]]  # the rest of the profile: args after the command, env, …
    texts: Callable[[Any], list[str]]  # every message text of a model request body
    chat_requests: Callable[[Any], list[Any]]  # the fake's logged model requests of the agent's turns
    check_permission: Callable[[dict[str, Any], Path], None]  # the permission.requested of WRITE path
    version: str = ""  # ACP: the agentInfo.version the agent reports
    resume_on_argv: bool = False  # stream-json: the restart passes --resume=ID
    deny_ends: str = "success"  # the turn status after a denied tool call
    # Awaited between the first daemon's stop and the second's start (a CLI's quirk).
    before_restart: Callable[[Real], Awaitable[None]] | None = None
    preset_drop: tuple[str, ...] = ()  # fields of the docs' preset the offline run leaves out
    preset_args: Callable[[Real], list[str]] | None = None  # added after the preset's args
    # Under strace: the agent's own loopback servers, and profile fields to override.
    traced: Callable[[Real], tuple[set[tuple[str, int]], dict[str, Any]]] | None = None
    # ACP 2026: the agent reports configOptions with a `model` option; it sends usage_update.
    model_option: bool = False
    usage_update: bool = False

    def profile(self, r: Real, command: tuple[str, list[str]] | None = None, **over: Any) -> str:
        """The profile; ``over`` replaces fields (``args``: those after the command's)."""
        exe, args = command or self.command()
        fields = {**self.fields(r), **over}
        fields["args"] = [*args, *fields.get("args", [])]
        return profile(self.name, protocol=self.protocol, executable=exe, **fields)


async def turn(c: Any, text: str) -> dict[str, Any]:
    acc = await c.prompt(text)
    assert acc["kind"] == "client.accepted", acc
    end: dict[str, Any] = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"], timeout=AGENT_TIMEOUT)
    return end


async def test_chat_turn_streams_text(real: Real, agent: Agent) -> None:
    r, a = real, agent
    # `agent-bridge agents` reads the pinned CLI's version from its package: a tested one.
    version = cli_version(*a.command())
    assert version is not None and version.tested, version
    d = await r.daemon(r.config(a.profile(r)))
    thread = await new_thread(d, a.name, cwd=str(r.work))
    c = await d.ws(thread["id"], after=0)
    end = await turn(c, "CHAT hello there")
    assert end["data"]["status"] == "success", end
    assert agent_text(c) == CHAT_TEXT
    # Streamed: one delta per chunk of the fake's reply (ACP agents may add empty ones).
    assert [f["data"]["text"] for f in c.seen("message.delta", channel="text") if f["data"]["text"]] == CHAT_CHUNKS
    assert c.seen("session.started")[0]["data"]["native_session_id"]
    async with d.http() as http:
        t = (await http.get(f"/v1/threads/{thread['id']}")).json()
    if a.version:
        assert t["agent_info"]["info"]["version"] == a.version, t["agent_info"]
    [req] = a.chat_requests(r.fake)
    assert "CHAT hello there" in a.texts(req.body)[-1]
    assert all(r.env().get(k, "") not in txt for txt in c.texts for k in r.env() if "KEY" in k)
    assert_gapless(c)


async def test_a_tool_call_asks_permission_allowed_then_denied(real: Real, agent: Agent) -> None:
    r, a = real, agent
    d = await r.daemon(r.config(a.profile(r)))
    thread = await new_thread(d, a.name, cwd=str(r.work))
    c = await d.ws(thread["id"], after=0)
    allowed, denied = r.work / "allowed.txt", r.work / "denied.txt"

    acc = await c.prompt(f"WRITE {allowed}")
    req = await c.kind("permission.requested", timeout=AGENT_TIMEOUT)
    a.check_permission(req, allowed)
    await c.send(op="permission", request_id=req["data"]["request_id"], decision="allow")
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"], timeout=AGENT_TIMEOUT)
    assert end["data"]["status"] == "success", end
    assert allowed.exists()
    assert agent_text(c).startswith("Tool said")

    acc = await c.prompt(f"WRITE {denied}")
    req = await c.kind("permission.requested", timeout=AGENT_TIMEOUT)
    await c.send(op="permission", request_id=req["data"]["request_id"], decision="deny")
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"], timeout=AGENT_TIMEOUT)
    assert end["data"]["status"] == a.deny_ends, end
    assert not denied.exists()
    assert [f["data"]["decision"] for f in c.seen("permission.resolved")] == ["allow", "deny"]
    assert_gapless(c)


async def test_the_agents_model_option_and_usage_are_the_threads(real: Real, agent: Agent) -> None:
    """ACP's session config options and usage as the thread keeps them (docs/api.md §4.3,
    §4.21, §6.3): the agent's ``model`` option in ``agent_info.config_options``, set over
    REST with the agent's answer; its ``usage_update`` as the turn's ``context``. A profile
    whose agent reports none has none, and is refused a switch."""
    r, a = real, agent
    d = await r.daemon(r.config(a.profile(r)))
    thread = await new_thread(d, a.name, cwd=str(r.work))
    c = await d.ws(thread["id"], after=0)
    end = await turn(c, "CHAT hello there")
    assert end["data"]["status"] == "success", end
    usage = end["data"].get("usage") or {}
    if a.usage_update:
        assert 0 < usage["context"]["used"] <= usage["context"]["size"], usage
        assert c.seen("usage")
    else:
        assert "context" not in usage and not c.seen("usage"), usage
    async with d.http() as http:
        t = (await http.get(f"/v1/threads/{thread['id']}")).json()
        options = (t["agent_info"] or {}).get("config_options") or []
        models = [o for o in options if o.get("category") == "model"]
        if not a.model_option:
            assert not models, options
            r2 = await http.post(f"/v1/threads/{thread['id']}/config", json={"config_id": "model", "value": "x"})
            assert r2.status_code == 400 and r2.json()["error"]["code"] == "config_not_supported", r2.text
            return
        [model] = models
        values = [o["value"] for o in model["options"] if "value" in o]
        other = next((v for v in values if v != model["currentValue"]), model["currentValue"])
        r2 = await http.post(f"/v1/threads/{thread['id']}/config", json={"config_id": model["id"], "value": other})
        assert r2.status_code == 200, r2.text
        [now] = [o for o in r2.json()["config_options"] if o["id"] == model["id"]]
        assert now["currentValue"] == other
        t = (await http.get(f"/v1/threads/{thread['id']}")).json()
    assert [o["currentValue"] for o in t["agent_info"]["config_options"] if o["id"] == model["id"]] == [other]


async def test_interrupt_during_a_slow_streamed_reply(real: Real, agent: Agent) -> None:
    r, a = real, agent
    d = await r.daemon(r.config(a.profile(r)))
    thread = await new_thread(d, a.name, cwd=str(r.work))
    c = await d.ws(thread["id"], after=0)
    acc = await c.prompt("SLOW please")
    await c.next(lambda f: f.get("kind") == "message.delta" and f["data"]["text"] == "tick 2 ", timeout=AGENT_TIMEOUT)
    await c.send(op="interrupt")
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"], timeout=AGENT_TIMEOUT)
    assert end["data"]["status"] == "cancelled", end
    # The end reads as what happened, not as the agent's account of it (issue #17 item 5).
    assert end["source"] == "agent" and end["data"]["reason"] == "interrupted", end
    assert "error" not in end["data"], end
    if a.protocol == "stream-json":  # every line the CLI printed has its normalized kind
        assert not c.seen("agent.other"), c.seen("agent.other")
    slow = a.chat_requests(r.fake)[0]
    await wait_until(lambda: slow.stream == "aborted", what="the slow stream to be dropped")
    assert not c.seen("process.exited")  # interrupted, not killed
    mark = c.seqs()[-1]
    end = await turn(c, "CHAT again")
    assert end["data"]["status"] == "success", end
    assert agent_text(c, since=mark) == CHAT_TEXT
    assert len(c.seen("process.started")) == 1
    assert_gapless(c)


async def test_stop_start_resume_carries_the_first_turn_to_the_model(real: Real, agent: Agent) -> None:
    r, a = real, agent
    cfg = r.config(a.profile(r))
    d1 = await r.daemon(cfg)
    thread = await new_thread(d1, a.name, cwd=str(r.work))
    c1 = await d1.ws(thread["id"])
    end = await turn(c1, "CHAT remember the word PINEAPPLE")
    assert end["data"]["status"] == "success", end
    native = c1.seen("session.started")[0]["data"]["native_session_id"]
    assert await d1.stop() == 0
    if a.before_restart is not None:
        await a.before_restart(r)

    d2 = await r.daemon(cfg)
    c2 = await d2.ws(thread["id"], after=0)
    end = await turn(c2, "CHAT which word?")
    assert end["data"]["status"] == "success", end
    assert c2.seen("session.started")[-1]["data"]["native_session_id"] == native
    if a.resume_on_argv:
        assert [f["data"]["resume"] for f in c2.seen("process.started")] == [None, native]
    # One user message each: a replayed history did not enter the transcript again.
    assert [f["data"]["text"] for f in c2.seen("message", role="user")] == [
        "CHAT remember the word PINEAPPLE",
        "CHAT which word?",
    ]
    # The resumed turn's model request (the last one asking "which word?"; a CLI may make
    # requests of its own around it) carries the first turn.
    asked = [q for q in a.chat_requests(r.fake) if "which word?" in (a.texts(q.body) or [""])[-1]]
    assert asked, [(a.texts(q.body) or [""])[-1][:200] for q in a.chat_requests(r.fake)]
    texts = a.texts(asked[-1].body)
    assert any("remember the word PINEAPPLE" in t for t in texts), texts
    assert any(CHAT_TEXT in t for t in texts), texts
    assert_gapless(c2)


async def test_the_documented_preset_runs(real: Real, agent: Agent) -> None:
    """docs/agents.md's preset, with only the command's paths and the fake's key and base
    URL swapped in (``agent.preset_args`` after the preset's; ``agent.preset_drop``, e.g.
    a remote opt-in, left out)."""
    r, a = real, agent
    preset = doc_preset(a.name)
    exe, args = a.command()
    if args:  # node + script: the docs show the same script of the same package
        assert preset["args"][0].endswith(args[0].split("node_modules", 1)[1]), preset
        preset["args"] = [*args, *preset["args"][1:]]
    else:
        assert preset["executable"].endswith(exe.split("node_modules", 1)[1]), preset
    preset["executable"] = exe
    preset["args"] = [*preset.get("args", []), *(a.preset_args(r) if a.preset_args else [])]
    preset["env"] = {**preset["env"], **r.env()}
    for k in a.preset_drop:
        preset.pop(k, None)
    d = await r.daemon(r.config(profile(a.name, **preset)))
    c = await d.ws((await new_thread(d, a.name, cwd=str(r.work)))["id"])
    end = await turn(c, "CHAT hi")
    assert end["data"]["status"] == "success", end
    # Streamed (message.delta), or whole (a stream-json preset without partial messages).
    assert agent_text(c) or [f["data"]["text"] for f in c.seen("message", role="assistant")] == [CHAT_TEXT]
    assert agent_text(c) in ("", CHAT_TEXT)


async def test_no_traffic_leaves_the_machine(real: Real, agent: Agent) -> None:
    """Under ``strace -f``: the CLI and all it spawns talk to the fake only (and to the
    agent's own loopback servers, ``agent.traced``)."""
    r, a = real, agent
    own, over = a.traced(r) if a.traced else (set(), {})
    log = r.tmp / "strace.log"
    exe, args = a.command()
    d = await r.daemon(r.config(a.profile(r, strace_wrapped(exe, args, log), **over)))
    c = await d.ws((await new_thread(d, a.name, cwd=str(r.work)))["id"])
    assert (await turn(c, "CHAT hello"))["data"]["status"] == "success"
    assert_only_peer_is(r.fake, log, own)
