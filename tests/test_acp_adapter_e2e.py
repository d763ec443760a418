"""``agent-bridge acp`` end to end (issue #19): the official SDK spawns the relay as an ACP
agent over stdio, the relay talks to a real daemon's gateway; the daemon restarts under
it and the relay reconnects with ``session/load`` from where the editor was."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from pathlib import Path
from typing import Any

import acp
import pytest
from acp import text_block
from acp.stdio import spawn_agent_process
from conftest import STEP_TIMEOUT, agent_log, base_config, wait_until
from support.acp_client import Recorder, Validator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prompts_sent(tmp_path: Path, text: str) -> int:
    lines = [json.loads(e["line"]) for e in agent_log(tmp_path) if e["event"] == "stdin"]
    return sum(1 for m in lines if m.get("type") == "user" and text in json.dumps(m.get("message")))


async def test_the_stdio_relay_chats_survives_a_daemon_restart_and_exits_on_eof(
    daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    port = free_port()
    d = await daemon_factory(base_config(tmp_path, agent_env), extra_args=["--port", str(port)])
    rec, validator = Recorder(), Validator()
    err = (tmp_path / "relay.stderr").open("wb")
    argv = ["-m", "bridge", "acp", "--url", d.url, "--agent", "stream-json"]
    env = {"AGENT_BRIDGE_TOKEN": str(d.token)}
    async with spawn_agent_process(
        rec, sys.executable, *argv, env=env, transport_kwargs={"stderr": err.fileno()}, observers=[validator]
    ) as (conn, proc):
        init = await asyncio.wait_for(conn.initialize(protocol_version=1), STEP_TIMEOUT)
        assert init.agent_info.name == "agent-bridge"
        sid = (await asyncio.wait_for(conn.new_session(cwd=str(tmp_path)), STEP_TIMEOUT)).session_id
        resp = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block("one")]), STEP_TIMEOUT)
        assert resp.stop_reason == "end_turn" and rec.text(sid) == "echo: one"

        # A turn that never ends, then the daemon goes away under it: the prompt the relay
        # sends again on the new connection is not run twice, and it is answered.
        hang = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text_block("hang")]))
        await wait_until(lambda: prompts_sent(tmp_path, "hang") == 1, what="the prompt at the agent")
        await d.stop()
        await d.start()
        assert d.url.endswith(f":{port}")
        with pytest.raises(acp.RequestError) as ended:
            await asyncio.wait_for(hang, 60)
        assert ended.value.data["status"] == "error"
        assert prompts_sent(tmp_path, "hang") == 1

        resp = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block("recall")]), STEP_TIMEOUT)
        assert resp.stop_reason == "end_turn"
        texts = rec.text(sid)
        assert texts.startswith("echo: one") and texts.count("echo: one") == 1  # nothing replayed twice
        assert "one" in texts.removeprefix("echo: one")  # the agent's own session resumed
        assert not rec.of(sid, "user_message_chunk")  # the relay's replay skipped what the editor had
        assert not validator.problems, validator.problems
        proc.stdin.close()  # the editor goes away: the relay exits 0
        assert await asyncio.wait_for(proc.wait(), STEP_TIMEOUT) == 0
    err.close()
    assert "reconnecting" in (tmp_path / "relay.stderr").read_text()


async def test_the_relay_says_why_when_the_daemon_refuses_it(daemon: Any, tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bridge",
        "acp",
        "--url",
        daemon.url,
        "--token",
        "wrong",
        stdin=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), STEP_TIMEOUT)
    assert proc.returncode == 1 and b"refused" in err and b"401" in err
    assert b"Authorization: Bearer" in err, err  # the daemon's words on how to authenticate


async def test_with_no_url_the_relay_finds_the_local_daemon_and_its_token_file(
    daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    d = await daemon_factory(base_config(tmp_path, agent_env), token=None)  # the daemon makes its token file
    assert (d.data_dir / "token").exists()
    rec = Recorder()
    argv = ["-m", "bridge", "acp", "--data-dir", str(d.data_dir), "--agent", "demo"]
    async with spawn_agent_process(rec, sys.executable, *argv, env={}) as (conn, _proc):
        await asyncio.wait_for(conn.initialize(protocol_version=1), STEP_TIMEOUT)
        sid = (await asyncio.wait_for(conn.new_session(cwd=str(tmp_path)), STEP_TIMEOUT)).session_id
        resp = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block("hello")]), STEP_TIMEOUT)
        assert resp.stop_reason == "end_turn" and rec.text(sid)
        listed = await asyncio.wait_for(conn.list_sessions(), STEP_TIMEOUT)
        assert [x.session_id for x in listed.sessions] == [sid]


async def test_stdin_closing_while_the_daemon_is_away_ends_the_relay_at_once(
    daemon_factory: Any, tmp_path: Path, agent_env: Any
) -> None:
    d = await daemon_factory(base_config(tmp_path, agent_env))
    err = tmp_path / "relay.stderr"
    with err.open("wb") as f:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bridge", "acp", "--url", d.url,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=f,
            env={"AGENT_BRIDGE_TOKEN": str(d.token), "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n')
    answer = json.loads(await asyncio.wait_for(proc.stdout.readline(), STEP_TIMEOUT))
    assert answer["id"] == 1 and answer["result"]["protocolVersion"] == 1
    await d.stop()
    await wait_until(lambda: b"reconnecting" in err.read_bytes(), what="the relay to notice")
    proc.stdin.close()
    assert await asyncio.wait_for(proc.wait(), STEP_TIMEOUT) == 0
