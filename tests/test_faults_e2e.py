"""Faults, each through a real daemon (issue #3): nothing a client saw is lost, every turn
ends exactly once, and no process is left behind."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

from conftest import DIALECTS, STEP_TIMEOUT, agent_log, alive, base_config, new_thread, profile_toml, wait_until


async def transcript(d: Any, thread_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    async with d.http() as http:
        while True:
            page = (
                await http.get(f"/v1/threads/{thread_id}/events", params={"after": len(events), "limit": 1000})
            ).json()
            if not page["events"]:
                return events
            events += page["events"]


async def saw_the_transcript(d: Any, c: Any, thread_id: str) -> list[dict[str, Any]]:
    """The daemon is ready again, and the client was sent every seq once, in order: exactly
    the stored transcript (returned)."""
    async with d.http() as http:
        # A writer process just started again answers its first ping once its handshake is
        # done: readiness is waited for (within the step's deadline), not raced.
        async with asyncio.timeout(STEP_TIMEOUT):
            while True:
                if (await http.get("/readyz")).status_code == 200:
                    break
                await asyncio.sleep(0.05)  # the next probe
        last = (await http.get(f"/v1/threads/{thread_id}")).json()["last_seq"]
    await c.upto(last)
    assert c.seqs() == list(range(1, last + 1))
    stored = await transcript(d, thread_id)
    assert [(e["seq"], e["kind"]) for e in stored] == [(f["seq"], f["kind"]) for f in c.frames if f.get("seq")]
    return stored


async def test_agent_exiting_before_its_first_line_ends_the_turn_with_error(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    cfg = "[server]\nstop_grace_s = 1\n" + "\n".join(
        profile_toml(d, d, agent_env, extra_args=["--exit-at-start"]) for d in DIALECTS
    )
    d = await daemon_factory(cfg)
    for dialect in DIALECTS:
        thread = await new_thread(d, dialect)
        c = await d.ws(thread["id"])
        end = await c.turn("hello")
        assert end["data"]["status"] == "error"
        exited = c.seen("process.exited")[0]
        assert exited["data"]["code"] == 5 and exited["data"]["reason"] == "crashed"
        assert any("refusing to start" in f["data"]["text"] for f in c.seen("diagnostic"))
        assert len(c.seen("turn.ended")) == 1
        await c.close()


async def test_agent_exit_while_a_client_replays_loses_nothing(daemon: Any) -> None:
    thread = await new_thread(daemon, "stream-json")
    a = await daemon.ws(thread["id"])
    await a.turn("flood 3000")
    await a.prompt("crash")
    # A second client replays thousands of events while the agent dies.
    b = await daemon.ws(thread["id"], after=0)
    await a.kind("process.exited")
    async with daemon.http() as http:
        last = (await http.get(f"/v1/threads/{thread['id']}")).json()["last_seq"]
    await a.upto(last)
    await b.upto(last)
    assert b.seqs() == list(range(1, last + 1))
    stored = await transcript(daemon, thread["id"])
    assert [e["seq"] for e in stored] == list(range(1, last + 1))
    texts = [t for t, f in zip(b.texts, b.frames, strict=True) if f.get("seq")]
    assert [f["seq"] for f in a.frames if f.get("seq")] == b.seqs()
    assert len(texts) == last
    await a.close()
    await b.close()


async def test_agent_ignoring_sigterm_is_killed(daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]) -> None:
    env = {**agent_env, "FAKE_IGNORE_SIGTERM": "1", "FAKE_IGNORE_EOF": "1"}
    d = await daemon_factory("[server]\nstop_grace_s = 0.5\n" + profile_toml("stubborn", "stream-json", env))
    thread = await new_thread(d, "stubborn")
    c = await d.ws(thread["id"])
    await c.turn("hello")
    started = time.monotonic()
    async with d.http() as http:
        r = await http.post(f"/v1/threads/{thread['id']}/stop")
    took = time.monotonic() - started
    assert r.status_code == 202
    assert r.json()["last_exit"] == {"code": None, "signal": signal.SIGKILL, "reason": "stopped"}
    # close stdin → 0.5 s → SIGTERM (ignored) → 0.5 s → SIGKILL
    assert 0.9 < took < 5, took
    await c.close()


async def test_hung_agent_turn_is_cancelled_by_interrupt_timeout(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(base_config(tmp_path, agent_env, server="interrupt_timeout_s = 1\n"))
    thread = await new_thread(d, "stream-json")
    c = await d.ws(thread["id"])
    acc = await c.prompt("hang")
    await c.kind("message.delta")
    await c.send(op="interrupt")
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"], timeout=10)
    assert end["data"]["status"] == "cancelled" and end["data"]["reason"] == "interrupted"
    assert end["data"]["exit"]["reason"] == "interrupt_timeout" and "error" not in end["data"]
    assert c.seen("notice", code="interrupt_timeout")
    assert c.seen("process.exited", reason="interrupt_timeout")
    assert len(c.seen("turn.ended")) == 1
    end = await c.turn("recall")  # the thread resumes
    assert end["data"]["status"] == "success"
    await c.close()


async def test_locked_store_pauses_the_agent_and_loses_nothing(daemon: Any, tmp_path: Path) -> None:
    thread = await new_thread(daemon, "stream-json")
    c = await daemon.ws(thread["id"])
    await c.turn("hello")
    before = c.seqs()[-1]
    db = sqlite3.connect(daemon.data_dir / "bridge.db", isolation_level=None, timeout=10)
    try:
        db.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
        # Accepted while the store still looked healthy: its answer waits for the commit.
        await c.send(op="prompt", text="flood 500")
        notice = await c.next(
            lambda f: f.get("kind") == "notice" and f["data"].get("code") == "store_unavailable", timeout=20
        )
        assert notice["seq"] is None
        async with daemon.http() as http:
            assert (await http.get("/readyz")).status_code == 503
            r = await http.post(f"/v1/threads/{thread['id']}/messages", json={"text": "refused"})
            assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
        # Nothing beyond what was committed before the lock reached the client.
        assert all(f["seq"] <= before + 1 for f in c.frames if f.get("seq"))
    finally:
        db.execute("ROLLBACK")
        db.close()
    await c.next(lambda f: f.get("kind") == "notice" and f["data"].get("code") == "store_recovered", timeout=20)
    acc = (
        c.seen("client.accepted", op="prompt")[-1]
        if c.seen("client.accepted", op="prompt")[1:]
        else await c.next(lambda f: f.get("kind") == "client.accepted" and f["data"]["op"] == "prompt")
    )
    await c.kind("turn.ended", turn_id=acc["data"]["turn_id"], timeout=20)
    await saw_the_transcript(daemon, c, thread["id"])
    await c.close()


async def test_sigkill_mid_stream_keeps_every_seen_event_and_resumes(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    cfg = base_config(tmp_path, agent_env)
    d1 = await daemon_factory(cfg)
    thread = await new_thread(d1, "stream-json")
    c = await d1.ws(thread["id"])
    await c.turn("remember kiwi")
    native = c.seen("session.started")[0]["data"]["native_session_id"]
    acc = await c.prompt("flood 100000")
    await c.next(lambda f: f.get("kind") == "message.delta" and f["data"]["text"] == "2000 ")
    await d1.stop(signal.SIGKILL)
    seen = [f for f in c.frames if f.get("seq")]
    # The agent died with the daemon (parent-death signal), before any restart.
    agent = [e["pid"] for e in agent_log(tmp_path) if e["event"] == "start"][-1]
    await wait_until(lambda: not alive(agent), what="the agent to die with the daemon")
    d2 = await daemon_factory(cfg)
    stored = await transcript(d2, thread["id"])
    by_seq = {e["seq"]: e for e in stored}
    for f in seen:  # durable before visible
        assert by_seq[f["seq"]]["kind"] == f["kind"] and by_seq[f["seq"]]["data"] == f["data"]
    assert [e["seq"] for e in stored] == list(range(1, len(stored) + 1))
    ended = [e for e in stored if e["kind"] == "turn.ended" and e["data"].get("turn_id") == acc["data"]["turn_id"]]
    tail = [e for e in stored if e["seq"] > seen[-1]["seq"]]
    assert any(e["kind"] == "turn.ended" and e["data"]["status"] == "error" for e in tail)
    assert len(ended) + sum(1 for e in tail if e["kind"] == "turn.ended" and e["data"].get("turn_id") is None) == 1
    c2 = await d2.ws(thread["id"], after=stored[-1]["seq"])
    await c2.turn("recall")
    assert "remember kiwi" in [f for f in c2.seen("message") if f["source"] == "agent"][-1]["data"]["text"]
    starts = [e for e in agent_log(tmp_path) if e["event"] == "start"]
    assert f"--resume={native}" in starts[-1]["argv"]
    await c2.close()


async def test_agent_dies_with_the_daemon_and_restart_reaps_its_group(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    # The agent ignores stdin EOF: only the parent-death signal can end it.
    cfg = base_config(tmp_path, {**agent_env, "FAKE_IGNORE_EOF": "1"})
    d1 = await daemon_factory(cfg)
    thread = await new_thread(d1, "stream-json")
    c = await d1.ws(thread["id"])
    await c.prompt("spawnchild")
    await c.next(lambda f: f.get("kind") == "message.delta" and f["data"]["text"].startswith("child"))
    child = next(e["pid"] for e in agent_log(tmp_path) if e["event"] == "child")
    agent = next(e["pid"] for e in agent_log(tmp_path) if e["event"] == "start")
    await d1.stop(signal.SIGKILL)
    # The agent dies with the daemon (parent-death signal); its own child survives it,
    # orphaned but still in the agent's process group.
    await wait_until(lambda: not alive(agent), what="the agent to die with the daemon")
    assert alive(child)
    await daemon_factory(cfg)  # recovery kills what is left of the recorded group
    await wait_until(lambda: not alive(child), what="the orphan to be reaped")
