"""The SQLite writer process through a real daemon: it never outlives the daemon (even a
SIGKILLed one), and its own death mid-stream costs a client nothing it saw and shows it
nothing that was not committed."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from conftest import base_config, new_thread, processes_mentioning, wait_until
from test_faults_e2e import saw_the_transcript


def writers(d: Any) -> list[int]:
    db = str(d.data_dir / "bridge.db")
    return [pid for pid, desc in processes_mentioning("bridge.store.writer") if db in desc and not desc.startswith("Z")]


async def test_the_writer_exits_when_the_daemon_is_sigkilled(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(base_config(tmp_path, agent_env))
    thread = await new_thread(d, "stream-json")
    c = await d.ws(thread["id"])
    await c.turn("hello")
    [pid] = writers(d)
    await d.stop(signal.SIGKILL)
    # End of file on its pipe: gone within a few seconds, with nobody to reap it but init.
    await wait_until(lambda: not writers(d), timeout=5, what="the writer to exit after its daemon")
    assert pid not in writers(d)


async def test_the_writer_exits_with_a_daemon_stopped_cleanly(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(base_config(tmp_path, agent_env))
    assert len(writers(d)) == 1
    assert await d.stop(signal.SIGTERM) == 0
    assert not writers(d)
    assert '"store.writer_stats"' in d.stderr()


async def test_the_writer_killed_mid_flood_loses_nothing_a_client_saw(daemon: Any) -> None:
    thread = await new_thread(daemon, "stream-json")
    c = await daemon.ws(thread["id"])
    await c.turn("hello")
    acc = await c.prompt("flood 3000")
    await c.next(lambda f: f.get("kind") == "message.delta" and f["data"]["text"] == "200 ")
    [pid] = writers(daemon)
    os.kill(pid, signal.SIGKILL)
    await c.kind("turn.ended", turn_id=acc["data"]["turn_id"], timeout=30)
    await wait_until(lambda: len(writers(daemon)) == 1 and pid not in writers(daemon), what="another writer")
    # Every seq once, in order; the transcript is exactly what the client was sent.
    stored = await saw_the_transcript(daemon, c, thread["id"])
    assert len([e for e in stored if e["kind"] == "message.delta" and e["data"]["text"].strip().isdigit()]) >= 3000
    assert '"store.writer_lost"' in daemon.stderr()
    await c.close()


async def test_the_writer_gets_no_secret_from_the_daemons_environment(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(base_config(tmp_path, agent_env), extra_env={"AGENT_BRIDGE_SECRET_PROBE": "s3cr3t"})
    [pid] = writers(d)
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    assert b"s3cr3t" not in environ and b"AGENT_BRIDGE" not in environ
    assert d.token is not None and d.token.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
