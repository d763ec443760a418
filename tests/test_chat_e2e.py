"""End to end through a real daemon, real agents and real WebSocket clients (issue #2)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from conftest import Daemon, agent_log, base_config, new_thread, wait_until


def stdin_lines(tmp_path: Path) -> list[str]:
    return [e["line"] for e in agent_log(tmp_path) if e["event"] == "stdin"]


def children(pid: int) -> list[int]:
    """The daemon's child processes, but for its store's writer process (its own helper,
    bridge/store/writer.py: not an agent)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out += [int(x) for x in text if not _store_writer(int(x))]
    return out


def _store_writer(pid: int) -> bool:
    try:
        return b"bridge.store.writer" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


async def test_two_turn_chat_streams_deltas_and_ends_each_turn_once(daemon: Daemon, dialect: str) -> None:
    thread = await new_thread(daemon, dialect)
    assert thread["state"] == "idle" and thread["protocol"] == dialect
    c = await daemon.ws(thread["id"])
    for text in ("hello there", "second turn"):
        acc = await c.prompt(text)
        assert acc["kind"] == "client.accepted" and acc["seq"] is None
        turn_id = acc["data"]["turn_id"]
        await c.kind("turn.started", turn_id=turn_id)
        delta = await c.kind("message.delta")
        assert delta["source"] == "agent" and delta["raw"] is not None
        msg = await c.kind("message", role="assistant")
        assert msg["data"]["text"] == f"echo: {text}"
        end = await c.kind("turn.ended", turn_id=turn_id)
        assert end["data"]["status"] == "success"
    ended = [f for f in c.frames if f.get("kind") == "turn.ended"]
    assert len(ended) == 2
    seqs = c.seqs()
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    kinds = [f["kind"] for f in c.frames if f["seq"] is not None]
    assert kinds[0] == "process.started" and "session.started" in kinds
    await c.close()
    async with daemon.http() as http:
        t = (await http.get(f"/v1/threads/{thread['id']}")).json()
    assert t["state"] == "running" and t["turn_active"] is False
    assert t["native_session_id"].startswith("fake-") and t["last_seq"] == seqs[-1]
    # The prompt the agent got is exactly what the transcript says the bridge wrote.
    written = [f["raw"] for f in c.frames if f.get("kind") == "message" and f["source"] == "client"]
    assert len(written) == 2 and written[0]["message"]["content"][0]["text"] == "hello there"


async def test_daemon_restart_resumes_the_native_session(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str], dialect: str
) -> None:
    cfg = base_config(tmp_path, agent_env)
    d1 = await daemon_factory(cfg)
    thread = await new_thread(d1, dialect)
    c = await d1.ws(thread["id"])
    await c.turn("remember the word banana")
    started = c.seen("session.started")[0]
    native = started["data"]["native_session_id"]
    last = c.seqs()[-1]
    await c.close()
    assert await d1.stop() == 0

    d2 = await daemon_factory(cfg)
    async with d2.http() as http:
        t = (await http.get(f"/v1/threads/{thread['id']}")).json()
    assert t["native_session_id"] == native and t["state"] == "exited"
    assert t["last_exit"]["reason"] == "daemon_shutdown"
    c2 = await d2.ws(thread["id"], after=last)
    end = await c2.turn("recall")
    assert end["data"]["status"] == "success"
    reply = [f for f in c2.seen("message", role="assistant") if f["source"] == "agent"][-1]
    assert "remember the word banana" in reply["data"]["text"]
    # Sequence numbers continue across the restart with no gap and no duplicate.
    assert c2.seqs() == list(range(last + 1, last + 1 + len(c2.seqs())))
    starts = [e for e in agent_log(tmp_path) if e["event"] == "start"]
    assert len(starts) == 2
    # stream-json: --resume=ID, one argument; awp-jsonl: --resume ID, two (its contract).
    resume = [f"--resume={native}"] if dialect == "stream-json" else ["--resume", native]
    argv = starts[1]["argv"]
    assert any(argv[i : i + len(resume)] == resume for i in range(len(argv)))
    assert not any(a.startswith("--resume") for a in starts[0]["argv"])
    await c2.close()


async def test_reconnect_with_after_gets_exactly_the_missed_events(daemon: Daemon, dialect: str) -> None:
    thread = await new_thread(daemon, dialect)
    a = await daemon.ws(thread["id"])
    await a.turn("one")
    seen = a.seqs()[-1]
    await a.close()
    b = await daemon.ws(thread["id"])
    await b.turn("two")
    await b.turn("three")
    total = b.seqs()[-1]
    a2 = await daemon.ws(thread["id"], after=seen)
    await a2.upto(total)
    assert a2.seqs() == list(range(seen + 1, total + 1))
    assert [f["seq"] for f in b.frames if f.get("seq")] == list(range(1, total + 1))
    await a2.close()
    await b.close()


async def test_agent_crash_mid_turn_ends_the_turn_with_error_and_the_thread_recovers(
    daemon: Daemon, dialect: str
) -> None:
    thread = await new_thread(daemon, dialect)
    c = await daemon.ws(thread["id"])
    await c.turn("hello")
    end = await c.turn("crash now")
    assert end["data"]["status"] == "error" and "crashed" in end["data"]["error"]
    exited = (c.seen("process.exited") or [await c.kind("process.exited")])[0]
    assert exited["data"]["code"] == 3 and exited["data"]["reason"] == "crashed"
    diag = [f for f in c.frames if f.get("kind") == "diagnostic" and f["data"]["stream"] == "stderr"]
    assert any("crashing on purpose" in f["data"]["text"] for f in diag)
    assert sum(1 for f in c.frames if f.get("kind") == "turn.ended") == 2
    # The next prompt starts the agent again, resuming its session.
    end = await c.turn("recall")
    assert end["data"]["status"] == "success"
    assert daemon.proc is not None
    await c.close()


async def test_garbage_lines_become_diagnostics_and_the_turn_continues(daemon: Daemon, dialect: str) -> None:
    thread = await new_thread(daemon, dialect)
    c = await daemon.ws(thread["id"])
    end = await c.turn("garbage please")
    assert end["data"]["status"] == "success"
    diags = [f["data"]["text"] for f in c.frames if f.get("kind") == "diagnostic"]
    assert any("not JSON" in t for t in diags) and sum("not a JSON object" in t for t in diags) == 2
    await c.close()


async def test_oversized_line_ends_the_agent_with_line_too_long(daemon: Daemon, dialect: str) -> None:
    thread = await new_thread(daemon, dialect)
    c = await daemon.ws(thread["id"])
    acc = await c.prompt("huge")
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    assert end["data"]["status"] == "error" and "line_too_long" in end["data"]["error"]
    exited = (c.seen("process.exited") or [await c.kind("process.exited")])[0]
    assert exited["data"]["reason"] == "line_too_long"
    async with daemon.http() as http:
        t = (await http.get(f"/v1/threads/{thread['id']}")).json()
    assert t["state"] == "exited" and t["last_exit"]["reason"] == "line_too_long"
    # A valid 1 MiB line is fine.
    end = await c.turn("big")
    assert end["data"]["status"] == "success"
    await c.close()


async def test_two_clients_see_the_same_events_in_the_same_order(daemon: Daemon, dialect: str) -> None:
    thread = await new_thread(daemon, dialect)
    a = await daemon.ws(thread["id"])
    b = await daemon.ws(thread["id"])
    await a.turn("from a")
    await b.turn("from b")
    last = max(a.seqs()[-1], b.seqs()[-1])
    await a.upto(last)
    await b.upto(last)
    strip = lambda c: [t for t, f in zip(c.texts, c.frames, strict=True) if f.get("seq") is not None]  # noqa: E731
    assert strip(a) == strip(b)
    await a.close()
    await b.close()


async def test_interrupt_cancels_the_active_turn(daemon: Daemon, dialect: str) -> None:
    thread = await new_thread(daemon, dialect)
    c = await daemon.ws(thread["id"])
    acc = await c.prompt("slow")
    await c.kind("message.delta")
    await c.send(op="interrupt")
    await c.send(op="interrupt")  # idempotent
    end = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"])
    assert end["data"]["status"] == "cancelled"
    # The second interrupt may be answered after the end the first one caused.
    while len(c.seen("client.accepted", op="interrupt")) + len(c.seen("client.rejected")) < 2:
        await c.next(lambda f: f.get("kind") in ("client.accepted", "client.rejected"))
    assert len(c.seen("client.accepted", op="interrupt")) == 2
    assert not c.seen("client.rejected")
    if dialect == "stream-json":
        # One interrupt reached the agent; the process lives on.
        interrupts = [x for x in stdin_lines(daemon.tmp) if '"interrupt"' in x]
        assert len(interrupts) == 1 and not c.seen("process.exited")
    else:
        # awp-jsonl has no interrupt message: the bridge stops the process.
        assert c.seen("process.exited", reason="interrupted")
    end = await c.turn("after interrupt")
    assert end["data"]["status"] == "success"
    await c.close()


async def test_client_id_makes_a_prompt_idempotent(daemon: Daemon, dialect: str) -> None:
    thread = await new_thread(daemon, dialect)
    c = await daemon.ws(thread["id"])
    first = await c.prompt("only once", client_id="c-1")
    await c.kind("turn.ended", turn_id=first["data"]["turn_id"])
    again = await c.prompt("only once", client_id="c-1")
    assert again["kind"] == "client.accepted" and again["data"]["duplicate"] is True
    assert again["data"]["seq"] == first["data"]["seq"]
    async with daemon.http() as http:
        r = await http.post(f"/v1/threads/{thread['id']}/messages", json={"text": "only once", "client_id": "c-1"})
    assert r.status_code == 200 and r.json()["seq"] == first["data"]["seq"]
    assert sum("only once" in x for x in stdin_lines(daemon.tmp)) == 1
    await c.close()


async def test_raw_mode_relays_agent_lines_byte_exact(daemon: Daemon, dialect: str) -> None:
    thread = await new_thread(daemon, dialect)
    ev = await daemon.ws(thread["id"])
    raw = await daemon.ws(thread["id"], mode="raw")
    prompt = {"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": "raw hi"}]}}
    await raw.send(**prompt)
    result_type = "result"
    got = await raw.next(lambda f: f.get("type") == result_type)
    assert got["result"] == "echo: raw hi"
    agent_lines = [e["line"] for e in agent_log(daemon.tmp) if e["event"] == "stdin"]
    assert agent_lines and '"raw hi"' in agent_lines[-1]
    # Every raw frame is exactly the raw line of a relayed agent event.
    await ev.next(lambda f: f.get("raw", {}) and f["raw"].get("type") == "result")
    import json as _json

    relayed = [_json.dumps(f["raw"]) for f in ev.frames if f.get("source") == "agent" and f.get("raw")]
    assert [_json.dumps(_json.loads(t)) for t in raw.texts] == relayed[: len(raw.texts)]
    await raw.close()
    await ev.close()


async def test_stop_then_prompt_resumes_and_no_process_is_left(daemon: Daemon, dialect: str) -> None:
    thread = await new_thread(daemon, dialect)
    c = await daemon.ws(thread["id"])
    await c.turn("hello")
    assert daemon.proc is not None and len(children(daemon.proc.pid)) == 1
    async with daemon.http() as http:
        r = await http.post(f"/v1/threads/{thread['id']}/stop")
        assert r.status_code == 202 and r.json()["state"] == "exited"
        assert r.json()["last_exit"]["reason"] == "stopped"
    assert children(daemon.proc.pid) == []  # reaped: no zombie, no orphan
    end = await c.turn("recall")
    assert end["data"]["status"] == "success"
    reply = [f for f in c.frames if f.get("kind") == "message" and f["source"] == "agent"][-1]
    assert "hello" in reply["data"]["text"]
    await c.close()


async def test_sigkill_of_daemon_is_recovered_on_next_start(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    cfg = base_config(tmp_path, agent_env)
    d1 = await daemon_factory(cfg)
    thread = await new_thread(d1, "stream-json")
    c = await d1.ws(thread["id"])
    acc = await c.prompt("hang")
    await c.kind("message.delta")
    seen = c.seqs()[-1]
    await d1.stop(signal.SIGKILL)
    # The orphaned agent sees stdin EOF and exits on its own (issue #3 adds PDEATHSIG).
    d2 = await daemon_factory(cfg)
    c2 = await d2.ws(thread["id"], after=0)
    end = await c2.next(lambda f: f.get("kind") == "turn.ended" and f["seq"] > seen)
    assert end["data"]["status"] == "error"
    assert c2.seqs() == list(range(1, len(c2.seqs()) + 1))
    assert acc["data"]["turn_id"]
    await c2.close()


async def test_idle_agent_is_stopped_and_the_thread_stays_resumable(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(base_config(tmp_path, agent_env, server="idle_timeout_s = 0.5\n"))
    thread = await new_thread(d, "stream-json")
    c = await d.ws(thread["id"])
    await c.turn("hello")
    last = c.seqs()[-1]
    await c.close()  # no client, no turn: the agent is idle
    async with d.http() as http:
        page = (await http.get(f"/v1/threads/{thread['id']}/events", params={"after": last, "wait": 10})).json()
        assert [e["kind"] for e in page["events"]] == ["process.exited"]
        assert page["events"][0]["data"]["reason"] == "idle_timeout"
    c2 = await d.ws(thread["id"], after=last)
    await c2.turn("recall")
    reply = [f for f in c2.seen("message", role="assistant") if f["source"] == "agent"][-1]
    assert "hello" in reply["data"]["text"]
    await c2.close()


async def test_capacity_is_a_clear_503_and_nothing_is_spawned(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(base_config(tmp_path, agent_env, server="max_conversations = 1\n"))
    first = await new_thread(d, "stream-json")
    second = await new_thread(d, "stream-json")
    async with d.http() as http:
        assert (await http.post(f"/v1/threads/{first['id']}/messages", json={"text": "a"})).status_code == 202
        r = await http.post(f"/v1/threads/{second['id']}/messages", json={"text": "b"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "capacity"
        t = (await http.get(f"/v1/threads/{second['id']}")).json()
        assert t["state"] == "idle" and t["last_seq"] == 0
    # 202 means spawned, not yet that the agent has written its first log line
    await wait_until(lambda: any(e["event"] == "start" for e in agent_log(tmp_path)), what="the agent")
    assert len([e for e in agent_log(tmp_path) if e["event"] == "start"]) == 1
