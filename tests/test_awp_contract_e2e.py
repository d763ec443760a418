"""The AWP Agent CLI contract through a real daemon, with the fake awp-jsonl agent as strict
as the AWP reference adapter (tests/agents/fake_agent.py): argv exactly as the contract
states, resume after a restart, a start-up failure shown as one, shutdown then an ordinary
exit (issue #17 item 6). What crosses no process boundary is tests/sessions/test_awp_contract.py;
the 4 MiB line cap and malformed lines through a daemon are in tests/test_chat_e2e.py (both
dialects)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import FAKE_AGENT, agent_log, new_thread, profile_toml, wait_until

SERVER = "[server]\nstop_grace_s = 2\n\n"


def starts(tmp_path: Path) -> list[dict[str, Any]]:
    return [e for e in agent_log(tmp_path) if e["event"] == "start"]


def stdin_by_process(tmp_path: Path) -> list[list[dict[str, Any]]]:
    """The lines each agent process read, in order, one list per start."""
    out: list[list[dict[str, Any]]] = []
    for e in agent_log(tmp_path):
        if e["event"] == "start":
            out.append([])
        elif e["event"] == "stdin":
            out[-1].append(json.loads(e["line"]))
    return out


async def test_an_awp_jsonl_thread_resumes_after_a_daemon_restart_with_the_contract_argv(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    cfg = SERVER + profile_toml("awp", "awp-jsonl", agent_env)
    d1 = await daemon_factory(cfg)
    thread = await new_thread(d1, "awp")
    c = await d1.ws(thread["id"])
    assert (await c.turn("remember the word kiwi"))["data"]["status"] == "success"
    native = c.seen("session.started")[0]["data"]["native_session_id"]
    last = c.seqs()[-1]
    await c.close()
    assert await d1.stop() == 0

    d2 = await daemon_factory(cfg)
    c2 = await d2.ws(thread["id"], after=last)
    end = await c2.turn("recall")
    assert end["data"]["status"] == "success", end
    reply = [f for f in c2.seen("message", role="assistant") if f["source"] == "agent"][-1]
    assert "remember the word kiwi" in reply["data"]["text"]
    # argv after the fake's own prefix: exactly the contract's, --resume and the id as two.
    prefix = [str(FAKE_AGENT), "--dialect", "awp-jsonl"]
    first, second = starts(tmp_path)
    assert first["argv"] == [*prefix, "--model", "fake-model"]
    assert second["argv"] == [*prefix, "--model", "fake-model", "--resume", native]
    assert not any(e["event"] == "startup_error" for e in agent_log(tmp_path))
    # The first line each process got is the user's prompt, and nothing the agent said
    # came before it in the transcript.
    for lines in stdin_by_process(tmp_path):
        assert lines[0]["type"] == "user"
    prompt = next(f for f in c2.frames if f.get("kind") == "message" and f["source"] == "client")
    first_agent = next(f for f in c2.frames if f.get("source") == "agent")
    assert prompt["seq"] < first_agent["seq"]
    await c2.close()


async def test_an_argument_the_agent_refuses_is_shown_as_its_failed_start(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    cfg = SERVER + profile_toml("bogus", "awp-jsonl", agent_env, extra_args=["--bogus"])
    # The reference adapter's answer to the one-argument form: "=" is not in the characters
    # it lets through, so its public reason is the generic one.
    cfg += profile_toml("joined", "awp-jsonl", agent_env, extra_args=["--resume=abc"])
    d = await daemon_factory(cfg)
    for agent, reason in (("bogus", "unsupported_argument:--bogus"), ("joined", "provider_request_failed")):
        thread = await new_thread(d, agent)
        c = await d.ws(thread["id"])
        end = await c.turn("hello")
        assert end["data"]["status"] == "error" and end["data"]["error"] == reason, end
        assert end["data"]["error_code"] == "startup_error"
        notice = await c.kind("notice", code="startup_error")
        assert notice["data"]["error"] == reason and reason in notice["data"]["text"]
        exited = await c.kind("process.exited")
        assert exited["data"] == {
            "pid": exited["data"]["pid"],
            "code": 1,
            "signal": None,
            "reason": "startup_error",
            "error": reason,
        }
        async with d.http() as http:
            t = (await http.get(f"/v1/threads/{thread['id']}")).json()
        assert t["state"] == "exited" and t["last_exit"] == {
            "code": 1,
            "signal": None,
            "reason": "startup_error",
            "error": reason,
        }
        assert len(c.seen("turn.ended")) == 1
        await c.close()
    # It failed before reading any input, as the reference does.
    assert [lines for lines in stdin_by_process(tmp_path)] == [[], []]


async def test_stop_sends_shutdown_and_waits_for_the_agent_to_exit_by_itself(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    # The agent takes 0.5 s to exit after the shutdown line (well within stop_grace_s = 2):
    # the bridge must wait for it rather than signal it.
    env = {**agent_env, "FAKE_SHUTDOWN_DELAY_S": "0.5"}
    d = await daemon_factory(SERVER + profile_toml("awp", "awp-jsonl", env))
    thread = await new_thread(d, "awp")
    c = await d.ws(thread["id"])
    await c.turn("hello")
    async with d.http() as http:
        assert (await http.post(f"/v1/threads/{thread['id']}/stop")).status_code == 202
    exited = await c.kind("process.exited")
    assert (exited["data"]["code"], exited["data"]["signal"], exited["data"]["reason"]) == (0, None, "stopped")
    await wait_until(lambda: any(e["event"] == "exit" for e in agent_log(tmp_path)), what="the agent's own exit")
    (lines,) = stdin_by_process(tmp_path)
    assert lines[-1] == {"type": "shutdown"}
    events = [e["event"] for e in agent_log(tmp_path)]
    assert events.index("shutdown") < events.index("exit")
    await c.close()
