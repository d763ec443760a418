"""The data dir (issue #15 items 1 and 6), through real daemons: one daemon per data dir (a
second is refused naming the holder's pid and touches nothing of the first; a dead
daemon's lock is taken over), and everything the daemon creates there is private to its
user whatever the umask, while agents keep the umask the daemon was started with."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import sys
from pathlib import Path
from typing import Any

from conftest import STEP_TIMEOUT, agent_log, alive, base_config, new_thread, wait_until

from bridge.datadir import LOCK_NAME, holder_pid


async def second_serve(d: Any) -> tuple[int, str, str]:
    """Another ``serve`` on ``d``'s data dir and config (port 0): (rc, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if k != "AGENT_BRIDGE_TOKEN"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bridge",
        "serve",
        "--port",
        "0",
        "--config",
        str(d.config_path),
        "--data-dir",
        str(d.data_dir),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**env, "AGENT_BRIDGE_TOKEN": "another-token-0123456789"},
        cwd=str(d.tmp),
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), STEP_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError("the second daemon did not refuse to start") from None
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_a_second_daemon_on_the_same_data_dir_is_refused_and_touches_nothing(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d1 = await daemon_factory(base_config(tmp_path, agent_env))
    assert d1.proc is not None
    busy = await new_thread(d1, "stream-json")
    c = await d1.ws(busy["id"])
    await c.prompt("spawnchild")
    await c.next(lambda f: f.get("kind") == "message.delta" and f["data"]["text"].startswith("child"))
    agent = next(e["pid"] for e in agent_log(tmp_path) if e["event"] == "start")
    child = next(e["pid"] for e in agent_log(tmp_path) if e["event"] == "child")

    rc, out, err = await second_serve(d1)
    assert rc == 2, (rc, out, err)
    assert "listening" not in out
    assert f"pid {d1.proc.pid}" in err and str(d1.data_dir) in err, err
    # The first daemon's agent and its child were not reaped, and it still serves.
    assert alive(agent) and alive(child)
    other = await new_thread(d1, "stream-json")
    c2 = await d1.ws(other["id"])
    end = await c2.turn("still here")
    assert end["data"]["status"] == "success", end
    async with d1.http() as http:
        assert (await http.get("/readyz")).json() == {"status": "ok", "store": "ok", "bus": "none"}
    assert holder_pid(d1.data_dir) == d1.proc.pid


async def test_a_dead_daemons_lock_is_taken_over(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    cfg = base_config(tmp_path, agent_env)
    d1 = await daemon_factory(cfg)
    assert d1.proc is not None
    dead = d1.proc.pid
    assert holder_pid(d1.data_dir) == dead
    await d1.stop(signal.SIGKILL)
    assert (d1.data_dir / LOCK_NAME).exists()  # the file stays; its flock died with the daemon
    d2 = await daemon_factory(cfg)
    assert d2.proc is not None and holder_pid(d2.data_dir) == d2.proc.pid != dead
    thread = await new_thread(d2, "stream-json")
    c = await d2.ws(thread["id"])
    assert (await c.turn("hello"))["data"]["status"] == "success"


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def umask_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    raise AssertionError("no Umask line")


async def test_files_the_daemon_creates_are_private_under_umask_022(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)  # left wide by an older version: tightened at start
    os.chmod(data, 0o755)
    old = os.umask(0o022)
    try:
        d = await daemon_factory(base_config(tmp_path, agent_env), token=None)  # token file generated
    finally:
        os.umask(old)
    d.token = (data / "token").read_text().strip()
    thread = await new_thread(d, "stream-json")  # no cwd: a workspace in the data dir
    c = await d.ws(thread["id"])
    assert (await c.turn("hello"))["data"]["status"] == "success"
    workspace = Path(thread["cwd"])
    assert workspace.parent == data / "workspaces"
    await wait_until(lambda: (data / "bridge.db-wal").exists(), what="the WAL file")
    modes = {
        p.name: mode(p)
        for p in (
            data,
            data / "workspaces",
            workspace,
            data / "bridge.db",
            data / "bridge.db-wal",
            data / "bridge.db-shm",
            data / "token",
            data / LOCK_NAME,
        )
    }
    assert modes == {
        "data": 0o700,
        "workspaces": 0o700,
        workspace.name: 0o700,
        "bridge.db": 0o600,
        "bridge.db-wal": 0o600,
        "bridge.db-shm": 0o600,
        "token": 0o600,
        LOCK_NAME: 0o600,
    }, {k: oct(v) for k, v in modes.items()}
    for p in data.rglob("*"):  # nothing else in there is open to other users either
        if not p.is_symlink() and not str(p).startswith(str(data / "demo-agent")):
            assert mode(p) & 0o077 == 0, (p, oct(mode(p)))
    # The agent runs with the umask the daemon was started with, not the daemon's own.
    agent = next(e["pid"] for e in agent_log(tmp_path) if e["event"] == "start")
    assert umask_of(agent) == 0o022
    assert d.proc is not None and umask_of(d.proc.pid) == 0o077
