"""Desktop shells (issue #23), through real daemons, real processes and real sockets: the
discovery file (written private, removed on a clean stop, stale after a SIGKILL), the
``status`` and ``login-link`` commands, sidecar mode (``--parent-pid``), the Unix socket
listener (``--uds``: REST, WebSocket and SSE), and examples/desktop_client.py, the
reference client, doing the whole start-up sequence, alone and two at a time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from conftest import (
    FAKE_AGENT,
    ROOT,
    STEP_TIMEOUT,
    Daemon,
    base_config,
    bridge_cli,
    new_thread,
    processes_mentioning,
    processes_with_environ,
    wait_until,
)

from bridge.process.parent import alive

EXAMPLE = ROOT / "examples" / "desktop_client.py"


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AGENT_BRIDGE_")}


async def run_cli(*args: str, timeout: float = STEP_TIMEOUT) -> tuple[int, str, str]:
    return await bridge_cli(*args, timeout=timeout)


async def status_json(data_dir: Path) -> tuple[int, dict[str, Any]]:
    rc, out, _ = await run_cli("status", "--data-dir", str(data_dir), "--json")
    return rc, json.loads(out)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def own_agents(tmp_path: Path) -> list[tuple[int, str]]:
    marker = str(tmp_path / "agent.log")
    return processes_mentioning(marker) + processes_with_environ(marker.encode(), str(FAKE_AGENT))


def serve_processes(data_dir: Path) -> list[int]:
    """Live ``bridge serve`` processes for this data dir."""
    return [pid for pid, desc in processes_mentioning(str(data_dir)) if " serve " in desc and not desc.startswith("Z")]


# --------------------------------------------------------------------------- daemon.json


async def test_daemon_json_names_the_daemon_privately_and_goes_away_on_a_clean_stop(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    old = os.umask(0o022)
    try:
        d = await daemon_factory(base_config(tmp_path, agent_env), token=None)
    finally:
        os.umask(old)
    path = d.data_dir / "daemon.json"
    assert mode(path) == 0o600
    record = json.loads(path.read_text())
    assert set(record) == {"url", "uds", "pid", "version", "started_at", "token_file", "data_dir", "auth"}
    assert record["url"] == d.url and record["uds"] is None and record["pid"] == d.proc.pid
    assert record["data_dir"] == str(d.data_dir) and record["auth"] is True
    token = Path(record["token_file"]).read_text().strip()
    assert record["token_file"] == str(d.data_dir / "token") and token not in path.read_text()
    assert not list(d.data_dir.glob(".daemon.json*"))  # no temporary file left behind
    assert await d.stop() == 0
    assert not path.exists()


async def test_a_token_given_by_flag_is_not_pointed_at_and_no_auth_says_so(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(base_config(tmp_path, agent_env))  # --token
    record = json.loads((d.data_dir / "daemon.json").read_text())
    assert record["token_file"] is None and record["auth"] is True
    assert d.token not in (d.data_dir / "daemon.json").read_text()


async def test_a_daemon_killed_with_sigkill_leaves_a_stale_file_that_status_and_the_example_recognise(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(base_config(tmp_path, agent_env), token=None)
    dead = d.proc.pid
    await d.stop(signal.SIGKILL)
    assert json.loads((d.data_dir / "daemon.json").read_text())["pid"] == dead
    rc, st = await status_json(d.data_dir)
    assert rc == 3 and st["state"] == "stale" and st["running"] is False and st["pid"] == dead, st
    rc, out, _ = await run_cli("status", "--data-dir", str(d.data_dir))
    assert rc == 3 and out.startswith("stale:") and str(dead) in out
    rc, _, err = await run_cli("login-link", "--data-dir", str(d.data_dir))
    assert rc == 3 and "stale" in err

    result = await run_example(tmp_path, d.data_dir, "--config", str(d.config_path), "--agent", "stream-json")
    assert result["stale_found"] is True and result["spawned"] is True and result["pid"] != dead
    assert result["status"] == "success" and result["reply"] == "echo: hello"
    # The example exited, and the daemon it started followed it, cleanly: no file left.
    await wait_until(lambda: not alive(result["pid"]), what="the example's daemon to follow it")
    await wait_until(lambda: not (d.data_dir / "daemon.json").exists(), what="daemon.json to go")


# --------------------------------------------------------------------------- status, login-link


async def test_status_reports_a_running_daemon_and_its_live_agents(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(base_config(tmp_path, agent_env), token=None)
    thread = await new_thread_with_token(d, "stream-json")
    token = (d.data_dir / "token").read_text().strip()
    async with httpx.AsyncClient(base_url=d.url, headers={"Authorization": f"Bearer {token}"}) as http:
        r = await http.post(f"/v1/threads/{thread}/resume")
        assert r.status_code == 202, r.text
    rc, st = await status_json(d.data_dir)
    assert rc == 0 and st["state"] == "running" and st["running"] is True, st
    assert st["pid"] == d.proc.pid and st["url"] == d.url and st["live_agents"] == 1
    assert st["loaded_threads"] == 1 and st["uptime_s"] >= 0 and st["version"]
    rc, out, _ = await run_cli("status", "--data-dir", str(d.data_dir))
    assert rc == 0 and out.startswith(f"running: pid {d.proc.pid}, {d.url}") and "1 live agent" in out


async def new_thread_with_token(d: Daemon, agent: str) -> str:
    token = (d.data_dir / "token").read_text().strip()
    async with httpx.AsyncClient(base_url=d.url, headers={"Authorization": f"Bearer {token}"}) as http:
        r = await http.post("/v1/threads", json={"agent": agent})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


async def test_login_link_prints_a_fresh_single_use_link_for_the_running_daemon(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(base_config(tmp_path, agent_env), token=None)
    links = []
    for _ in range(2):
        rc, out, err = await run_cli("login-link", "--data-dir", str(d.data_dir))
        assert rc == 0, err
        links.append(out.strip())
    assert links[0] != links[1]
    for link in links:
        assert link.startswith(f"{d.url}/#login=")
        code = link.split("#login=", 1)[1]
        async with httpx.AsyncClient(base_url=d.url) as http:
            first = await http.post("/v1/session", json={"code": code})
            again = await http.post("/v1/session", json={"code": code})
        assert first.status_code == 204 and "agent_bridge_session=" in first.headers["set-cookie"]
        assert again.status_code == 401


async def test_login_link_uses_the_environment_token_of_a_daemon_given_one(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(base_config(tmp_path, agent_env))  # --token: no token file
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bridge",
        "login-link",
        "--data-dir",
        str(d.data_dir),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**clean_env(), "AGENT_BRIDGE_TOKEN": d.token},
    )
    out, err = await asyncio.wait_for(proc.communicate(), STEP_TIMEOUT)
    assert proc.returncode == 0, err
    assert out.decode().startswith(f"{d.url}/#login=")
    # Without it, the daemon refuses: said clearly, exit 2.
    rc, _, err2 = await run_cli("login-link", "--data-dir", str(d.data_dir))
    assert rc == 2 and "refused the token from AGENT_BRIDGE_TOKEN" in err2, err2
    # status still sees it run, and says why it can tell no more.
    rc, st = await status_json(d.data_dir)
    assert rc == 0 and st["state"] == "running" and st["live_agents"] is None and "refused" in st["detail"], st


async def test_status_and_login_link_with_no_daemon_exit_3(tmp_path: Path) -> None:
    rc, st = await status_json(tmp_path / "nothing")
    assert rc == 3 and st == {
        "state": "not_running",
        "running": False,
        "data_dir": str(tmp_path / "nothing"),
        "throttled": False,
        "retry_after_s": None,
        "uptime_s": None,
        "live_agents": None,
        "loaded_threads": None,
        "subscribers": None,
        "detail": f"no daemon.json in {tmp_path / 'nothing'}",
    }
    rc, _, err = await run_cli("login-link", "--data-dir", str(tmp_path / "nothing"))
    assert rc == 3 and "no daemon serves" in err


# --------------------------------------------------------------------------- sidecar mode


async def test_serve_follows_its_parent_when_it_is_killed_and_stops_cleanly(
    tmp_path: Path, agent_env: dict[str, str]
) -> None:
    shell = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(300)")
    d = Daemon(tmp_path, base_config(tmp_path, agent_env), extra_args=["--parent-pid", str(shell.pid)])
    try:
        await d.start()
        thread = await new_thread(d, "stream-json")
        c = await d.ws(thread["id"])
        assert (await c.turn("hello"))["data"]["status"] == "success"
        await c.prompt("hang")  # a turn in progress when the shell dies
        await wait_until(lambda: bool(own_agents(tmp_path)), what="the agent")
        loop = asyncio.get_running_loop()
        shell.kill()
        await shell.wait()
        killed_at = loop.time()
        rc = await asyncio.wait_for(d.proc.wait(), 10)
        assert rc == 0, d.stderr()
        # A few seconds: at most 2 s for clients to take their 1001, then the agent's stop
        # grace (2 s here); the rest is slack for a loaded machine.
        assert loop.time() - killed_at < 8.0
        assert not own_agents(tmp_path)
        assert not (d.data_dir / "daemon.json").exists()
        assert '"daemon.parent_exited"' in d.stderr() and '"daemon.stopped"' in d.stderr()
    finally:
        with contextlib.suppress(ProcessLookupError):
            shell.kill()
        if d.proc is not None and d.proc.returncode is None:
            d.proc.kill()
        await shell.wait()
        for client in d.clients:
            client.conn.transport.abort()
    # Flushed: a new daemon on the same data dir has the whole transcript, the agent's
    # exit and the end of the turn it interrupted included.
    d2 = Daemon(tmp_path, base_config(tmp_path, agent_env))
    await d2.start()
    try:
        async with d2.http() as http:
            r = await http.get(f"/v1/threads/{thread['id']}/events", params={"after": 0, "limit": 1000})
        kinds = [(e["kind"], e["data"].get("status") or e["data"].get("reason")) for e in r.json()["events"]]
        # the turn in progress ended as a daemon shutdown ends one (docs/api.md §6.8)
        assert kinds[-2:] == [("process.exited", "daemon_shutdown"), ("turn.ended", "error")], kinds
        assert ("turn.ended", "success") in kinds, kinds
    finally:
        assert await d2.stop() == 0


async def test_serve_refuses_a_parent_pid_that_is_not_running(tmp_path: Path) -> None:
    gone = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await gone.wait()
    rc, out, err = await run_cli(
        "serve", "--port", "0", "--data-dir", str(tmp_path / "d"), "--parent-pid", str(gone.pid)
    )
    assert rc == 2 and f"--parent-pid {gone.pid} is not a running process" in err and not out


async def test_a_shell_killed_with_sigkill_takes_its_daemon_and_agents_with_it(
    tmp_path: Path, agent_env: dict[str, str]
) -> None:
    # The example is the shell: it spawned the daemon with pipes on its stdout; SIGKILL
    # leaves those pipes without a reader, and the daemon still shuts down cleanly.
    cfg = tmp_path / "config.toml"
    cfg.write_text(base_config(tmp_path, agent_env))
    data = tmp_path / "data"
    shell, result = await start_example(tmp_path, data, "--config", str(cfg), "--agent", "stream-json", "--hold")
    try:
        assert result["spawned"] is True and result["status"] == "success"
        assert own_agents(tmp_path)  # the thread's agent is still running
        loop = asyncio.get_running_loop()
        shell.kill()
        await shell.wait()
        killed_at = loop.time()
        await wait_until(lambda: not alive(result["pid"]), timeout=10, what="the daemon to follow its shell")
        assert loop.time() - killed_at < 8.0
        await wait_until(lambda: not own_agents(tmp_path), what="no agent left")
        log = (tmp_path / "daemon.log").read_text()
        assert "daemon.parent_exited" in log and "daemon.stopped" in log, log
        assert not (data / "daemon.json").exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            shell.kill()
        await shell.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(result["pid"], signal.SIGKILL)


# --------------------------------------------------------------------------- the example


async def start_example(tmp_path: Path, data_dir: Path, *args: str) -> tuple[Any, dict[str, Any]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLE),
        "--data-dir",
        str(data_dir),
        "--daemon-log",
        str(tmp_path / "daemon.log"),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=clean_env(),
        cwd=str(tmp_path),
    )
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert line, f"the example printed nothing (rc {await proc.wait()})"
    return proc, json.loads(line)


async def run_example(tmp_path: Path, data_dir: Path, *args: str) -> dict[str, Any]:
    proc, result = await start_example(tmp_path, data_dir, *args)
    assert await asyncio.wait_for(proc.wait(), STEP_TIMEOUT) == 0
    return result


async def test_two_shells_racing_for_one_data_dir_get_one_daemon_and_both_talk_to_it(
    tmp_path: Path, agent_env: dict[str, str]
) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(base_config(tmp_path, agent_env))
    data = tmp_path / "data"
    args = ("--config", str(cfg), "--agent", "stream-json", "--hold")
    shells = await asyncio.gather(start_example(tmp_path, data, *args), start_example(tmp_path, data, *args))
    procs = [p for p, _ in shells]
    try:
        results = [r for _, r in shells]
        assert results[0]["pid"] == results[1]["pid"], results
        assert sorted(r["spawned"] for r in results) == [False, True], results
        assert all(r["status"] == "success" and r["reply"] == "echo: hello" for r in results)
        assert results[0]["thread"] != results[1]["thread"]
        # Exactly one daemon, the other one (if it got that far) refused the data dir.
        await wait_until(lambda: serve_processes(data) == [results[0]["pid"]], what="exactly one daemon")
        owner = next(p for p, r in shells if r["spawned"])
        other = next(p for p, r in shells if not r["spawned"])
        # The one that did not start it leaves: the daemon stays for its owner.
        assert other.stdin is not None
        other.stdin.close()
        assert await asyncio.wait_for(other.wait(), STEP_TIMEOUT) == 0
        rc, st = await status_json(data)
        assert rc == 0 and st["pid"] == results[0]["pid"]
        # The owner leaves: the daemon follows, cleanly.
        assert owner.stdin is not None
        owner.stdin.close()
        assert await asyncio.wait_for(owner.wait(), STEP_TIMEOUT) == 0
        await wait_until(lambda: not alive(results[0]["pid"]), timeout=10, what="the daemon to follow its owner")
        await wait_until(lambda: not own_agents(tmp_path), what="no agent left")
        assert (await status_json(data))[0] == 3
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            await p.wait()


# --------------------------------------------------------------------------- --uds


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # A Unix socket's path is at most 107 bytes; pytest's tmp_path can be longer.
    d = Path(tempfile.mkdtemp(prefix="ab-", dir="/tmp"))
    yield d
    for p in sorted(d.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() and not p.is_symlink() else p.unlink()
    d.rmdir()


async def start_uds(tmp_path: Path, config: str, sock: Path) -> tuple[Any, str]:
    cfg = tmp_path / "config.toml"
    cfg.write_text(config)
    err = (tmp_path / "uds.stderr").open("ab")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bridge",
        "serve",
        "--uds",
        str(sock),
        "--config",
        str(cfg),
        "--data-dir",
        str(tmp_path / "data"),
        "--log-format",
        "json",
        stdout=asyncio.subprocess.PIPE,
        stderr=err,
        env=clean_env(),
    )
    err.close()
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), STEP_TIMEOUT)).decode()
    return proc, line


async def test_the_unix_socket_serves_rest_websocket_and_sse_with_the_token_rules_of_tcp(
    tmp_path: Path, agent_env: dict[str, str], short_dir: Path
) -> None:
    sock = short_dir / "bridge.sock"
    # A dead daemon's socket file is replaced.
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(sock))
    dead.close()
    proc, line = await start_uds(tmp_path, base_config(tmp_path, agent_env), sock)
    try:
        assert line == f"agent-bridge listening on unix:{sock}\n", (line, (tmp_path / "uds.stderr").read_text())
        assert stat.S_ISSOCK(os.lstat(sock).st_mode) and mode(sock) == 0o600
        record = json.loads((tmp_path / "data" / "daemon.json").read_text())
        assert record["uds"] == str(sock) and record["url"] is None
        token = Path(record["token_file"]).read_text().strip()
        auth = {"Authorization": f"Bearer {token}"}
        transport = httpx.AsyncHTTPTransport(uds=str(sock))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=STEP_TIMEOUT) as http:
            assert (await http.get("/healthz")).json() == {"status": "ok"}
            # Token rules unchanged; Host must still be a loopback name (any port, or none).
            assert (await http.get("/v1/agents")).status_code == 401
            assert (await http.get("/v1/agents", headers={**auth, "Host": "evil.example"})).status_code == 421
            assert (await http.get("/v1/agents", headers={**auth, "Host": "127.0.0.1:9"})).status_code == 200
            r = await http.post("/v1/threads", json={"agent": "stream-json"}, headers=auth)
            assert r.status_code == 201, r.text
            tid = r.json()["id"]
            async with websockets.unix_connect(
                str(sock), f"ws://localhost/v1/threads/{tid}/ws", additional_headers=auth, open_timeout=STEP_TIMEOUT
            ) as ws:
                await ws.send(json.dumps({"op": "prompt", "text": "over the socket"}))
                while (frame := json.loads(await asyncio.wait_for(ws.recv(), STEP_TIMEOUT)))["kind"] != "turn.ended":
                    pass
                assert frame["data"]["status"] == "success"
            async with http.stream("GET", f"/v1/threads/{tid}/events/stream", headers=auth) as sse:
                assert sse.status_code == 200
                seen = ""
                async with asyncio.timeout(STEP_TIMEOUT):
                    async for chunk in sse.aiter_text():
                        seen += chunk
                        if "echo: over the socket" in seen and "turn.ended" in seen:
                            break
        rc, st = await status_json(tmp_path / "data")
        assert rc == 0 and st["uds"] == str(sock) and st["loaded_threads"] == 1, st
        # The reference client finds it and talks over the socket too.
        result = await run_example(tmp_path, tmp_path / "data", "--agent", "stream-json")
        assert result["uds"] == str(sock) and result["spawned"] is False and result["status"] == "success"
        rc, _, err = await run_cli("login-link", "--data-dir", str(tmp_path / "data"))
        assert rc == 2 and "Unix socket" in err
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    assert not sock.exists() and not (tmp_path / "data" / "daemon.json").exists()
    await wait_until(lambda: not own_agents(tmp_path), what="no agent left")


async def test_the_unix_socket_refuses_a_live_socket_a_non_socket_and_tcp_flags(
    tmp_path: Path, short_dir: Path
) -> None:
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(short_dir / "live.sock"))
    live.listen(1)
    try:
        rc, out, err = await run_cli("serve", "--uds", str(short_dir / "live.sock"), "--data-dir", str(tmp_path / "a"))
        assert rc == 2 and "in use by another process" in err and not out
    finally:
        live.close()
    (short_dir / "file").write_text("keep me")
    rc, _, err = await run_cli("serve", "--uds", str(short_dir / "file"), "--data-dir", str(tmp_path / "b"))
    assert rc == 2 and "is not a socket" in err and (short_dir / "file").read_text() == "keep me"
    rc, _, err = await run_cli("serve", "--uds", str(short_dir / "x.sock"), "--port", "0", "--data-dir", str(tmp_path))
    assert rc == 2 and "--uds" in err
    rc, _, err = await run_cli("serve", "--uds", "/tmp/" + "x" * 120, "--data-dir", str(tmp_path / "c"))
    assert rc == 2 and "longer than 107 bytes" in err
