"""A grandchild that leaves its agent's process group and session with ``setsid()`` is
still found and stopped (issue #15 item 10), through real daemons: on a thread stop, on
the daemon's SIGTERM, when the agent exits by itself, and — recorded in
``<data-dir>/agents.json`` — by the next daemon after a SIGKILL."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

from conftest import agent_log, alive, base_config, new_thread, wait_until

from bridge.process.subreaper import RECORD_NAME


def gone(pid: int) -> bool:
    """Not running and reaped (no zombie left either)."""
    return not Path(f"/proc/{pid}").exists()


def dead(pid: int) -> bool:
    return not alive(pid)


def pgid_sid(pid: int) -> tuple[int, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[2]), int(fields[3])


async def setsid_grandchild(d: Any, tmp_path: Path, prompt: str = "spawnsetsid") -> tuple[str, int, int, Any]:
    """A thread whose agent started a setsid() grandchild: (thread id, agent pid, grandchild pid, client)."""
    thread = await new_thread(d, "stream-json")
    c = await d.ws(thread["id"])
    await c.prompt(prompt)
    await c.next(lambda f: f.get("kind") == "message.delta" and f["data"]["text"].startswith("setsid child"))
    agent = next(e["pid"] for e in agent_log(tmp_path) if e["event"] == "start")
    child = next(e["pid"] for e in agent_log(tmp_path) if e["event"] == "setsid_child")
    if not dead(child):
        # It really left: its own group and session, not the agent's.
        assert pgid_sid(child) == (child, child)
    return thread["id"], agent, child, c


async def test_thread_stop_stops_a_setsid_grandchild(daemon: Any, tmp_path: Path) -> None:
    tid, agent, child, c = await setsid_grandchild(daemon, tmp_path)
    assert not dead(child)
    async with daemon.http() as http:
        r = await http.post(f"/v1/threads/{tid}/stop")
        assert r.status_code == 202, r.text
    await c.kind("process.exited")
    await wait_until(lambda: gone(agent) and gone(child), what="the agent and its setsid grandchild to be gone")


async def test_daemon_sigterm_stops_a_setsid_grandchild(daemon: Any, tmp_path: Path) -> None:
    _tid, agent, child, _c = await setsid_grandchild(daemon, tmp_path)
    assert await daemon.stop(signal.SIGTERM) == 0
    await wait_until(lambda: dead(agent) and dead(child), what="the agent and its setsid grandchild to die")


async def test_an_agent_that_exits_leaves_no_setsid_grandchild(daemon: Any, tmp_path: Path) -> None:
    _tid, agent, child, c = await setsid_grandchild(daemon, tmp_path, "spawnsetsid exit")
    await c.kind("process.exited")
    # Orphaned, it was reparented to the daemon (a subreaper), which kills and reaps it.
    await wait_until(lambda: gone(agent) and gone(child), what="the orphaned setsid grandchild to be gone")


async def test_after_sigkill_the_next_daemon_kills_a_recorded_setsid_grandchild(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    cfg = base_config(tmp_path, agent_env)
    d1 = await daemon_factory(cfg)
    _tid, agent, child, _c = await setsid_grandchild(d1, tmp_path)
    record = d1.data_dir / RECORD_NAME

    def recorded() -> bool:
        try:
            procs = json.loads(record.read_text())["processes"]
        except (FileNotFoundError, ValueError):
            return False
        return any(p["pid"] == child and not p["group"] for p in procs)

    await wait_until(recorded, what="the grandchild to be recorded in agents.json")
    assert stat_mode(record) == 0o600
    await d1.stop(signal.SIGKILL)
    await wait_until(lambda: dead(agent), what="the agent to die with the daemon")
    assert not dead(child)  # neither the parent-death signal nor the group kill reaches it
    await daemon_factory(cfg)  # the next daemon kills it, after taking the data dir lock
    await wait_until(lambda: dead(child), what="the recorded grandchild to be killed")
    assert not record.exists() or not recorded()


def stat_mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o777


def test_the_record_is_only_trusted_with_matching_start_times(tmp_path: Path) -> None:
    import subprocess
    import sys

    from bridge.process.reaper import start_time
    from bridge.process.subreaper import reap_recorded

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        started = start_time(proc.pid)
        assert started is not None
        record = tmp_path / RECORD_NAME
        # A recycled pid (another start time) is never touched, as a group or alone.
        record.write_text(
            json.dumps(
                {
                    "processes": [
                        {"pid": proc.pid, "start": started + 1, "group": False},
                        {"pid": proc.pid, "start": started + 1, "group": True},
                    ]
                }
            )
        )
        assert reap_recorded(tmp_path) == []
        assert proc.poll() is None and not record.exists()
        record.write_text(json.dumps({"processes": [{"pid": proc.pid, "start": started, "group": False}]}))
        assert reap_recorded(tmp_path) == [proc.pid]
        assert proc.wait(10) == -signal.SIGKILL
        record.write_text("not json")  # an unreadable record is dropped, never fatal
        assert reap_recorded(tmp_path) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
