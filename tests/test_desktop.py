"""Desktop shells (issue #23), the parts that cross no socket: the discovery file read as
untrusted input, written atomically and private, withdrawn only by its own daemon; the
parent watch and the stdio quieting (a real child process and a real pipe, no daemon);
``POST /v1/login-codes``, ``GET /v1/daemon`` and the Unix-socket Host rule in-process;
``status`` on files that are not a running daemon's."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bridge import __version__, cli, discovery
from bridge.api.app import create_app
from bridge.config import load_settings
from bridge.process import parent
from bridge.process.parent import ParentWatch, quiet_broken_stdio

pytestmark = pytest.mark.timeout(30)
TOKEN = "t" * 32


def record(**over: Any) -> dict[str, Any]:
    base = {
        "url": "http://127.0.0.1:1",
        "uds": None,
        "pid": 1,
        "version": "0",
        "started_at": "2026-12-01T00:00:00.000Z",
        "token_file": None,
        "data_dir": "/d",
        "auth": True,
    }
    return {**base, **over}


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"{", "not JSON"),
        (b"[1]", "not a JSON object"),
        (json.dumps(record(pid=True)).encode(), "'pid'"),
        (json.dumps(record(pid="12")).encode(), "'pid'"),
        (json.dumps(record(auth=1)).encode(), "'auth'"),
        (json.dumps({k: v for k, v in record().items() if k != "version"}).encode(), "'version'"),
        (json.dumps(record(pid=0)).encode(), "bad pid"),
        (json.dumps(record(uds="/s")).encode(), "exactly one of url and uds"),
        (json.dumps(record(url=None)).encode(), "exactly one of url and uds"),
        (b" " * (discovery.MAX_BYTES + 1), "too large"),
        (b'{"a":' * 10000, "not JSON"),  # too deep: refused, not a crash
    ],
)
def test_a_discovery_file_that_is_not_a_record_is_malformed_never_a_crash(raw: bytes, problem: str) -> None:
    got = discovery.parse(raw)
    assert isinstance(got, str) and problem in got


def test_a_record_round_trips_and_is_written_private_whatever_the_umask(tmp_path: Path) -> None:
    rec = discovery.Record(**record(pid=os.getpid(), data_dir=str(tmp_path)))
    old = os.umask(0o000)
    try:
        discovery.publish(tmp_path, rec)
        discovery.publish(tmp_path, rec)  # replaces it
    finally:
        os.umask(old)
    path = tmp_path / "daemon.json"
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    assert discovery.read(tmp_path) == rec
    assert sorted(p.name for p in tmp_path.iterdir()) == ["daemon.json"]


def test_only_the_daemon_it_names_withdraws_the_file(tmp_path: Path) -> None:
    discovery.publish(tmp_path, discovery.Record(**record(pid=os.getpid() + 1)))
    discovery.withdraw(tmp_path, os.getpid())  # a successor's file: kept
    assert (tmp_path / "daemon.json").exists()
    discovery.publish(tmp_path, discovery.Record(**record(pid=os.getpid())))
    discovery.withdraw(tmp_path, os.getpid())
    assert not (tmp_path / "daemon.json").exists()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_look_tells_absent_malformed_and_stale_apart(tmp_path: Path) -> None:
    assert discovery.look(tmp_path).state == "not_running"
    (tmp_path / "daemon.json").write_text("{}")
    found = discovery.look(tmp_path)
    assert found.state == "malformed" and found.record is None and "'url'" in found.detail
    pid = dead_pid()
    discovery.publish(tmp_path, discovery.Record(**record(pid=pid)))
    found = discovery.look(tmp_path)
    assert found.state == "stale" and found.record is not None and found.record.pid == pid
    assert (tmp_path / "daemon.json").exists()  # readers never delete it


def test_a_live_pid_with_nothing_at_its_address_is_unresponsive(tmp_path: Path) -> None:
    # our own pid is alive; port 1 on loopback refuses connections
    discovery.publish(tmp_path, discovery.Record(**record(pid=os.getpid())))
    found = discovery.look(tmp_path, timeout=2)
    assert found.state == "unresponsive" and "does not answer" in found.detail


def test_status_says_why_a_data_dir_has_no_running_daemon(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "daemon.json").write_text('{"pid": "nope"}')
    assert cli.main(["status", "--data-dir", str(tmp_path)]) == cli.NOT_RUNNING
    assert capsys.readouterr().out.startswith("malformed: ")
    discovery.publish(tmp_path, discovery.Record(**record(pid=dead_pid())))
    assert cli.main(["status", "--data-dir", str(tmp_path), "--json"]) == cli.NOT_RUNNING
    out = json.loads(capsys.readouterr().out)
    assert out["state"] == "stale" and out["running"] is False and out["url"] == "http://127.0.0.1:1"


# --------------------------------------------------------------------------- the parent watch


async def watch_until_exit(monkeypatch: pytest.MonkeyPatch | None = None) -> None:
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(60)")
    fired = asyncio.Event()
    watch = ParentWatch(child.pid, fired.set)
    watch.start()
    try:
        await asyncio.sleep(0)
        assert not fired.is_set()
        child.kill()
        await asyncio.wait_for(fired.wait(), 5)
    finally:
        watch.close()
        if child.returncode is None:
            child.kill()
        await child.wait()


async def test_the_parent_watch_fires_when_the_parent_exits() -> None:
    await watch_until_exit()


async def test_without_pidfds_the_parent_watch_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(pid: int, flags: int = 0) -> int:
        raise PermissionError("no pidfds in this sandbox")

    monkeypatch.setattr(os, "pidfd_open", refused)
    monkeypatch.setattr(parent, "POLL_S", 0.05)
    await watch_until_exit()


async def test_a_parent_already_gone_fires_at_once() -> None:
    fired = asyncio.Event()
    ParentWatch(dead_pid(), fired.set).start()
    await asyncio.wait_for(fired.wait(), 5)


def test_a_stream_whose_reader_is_gone_is_pointed_at_dev_null_and_one_with_a_reader_is_not() -> None:
    r, w = os.pipe()
    r2, w2 = os.pipe()
    try:
        os.close(r)
        assert quiet_broken_stdio((w, w2)) == [w]
        os.write(w, b"goes nowhere, raises nothing\n")
        assert os.path.samestat(os.fstat(w), os.stat(os.devnull))
        os.write(w2, b"kept")
        assert os.read(r2, 10) == b"kept"
    finally:
        for fd in (w, r2, w2):
            os.close(fd)


# --------------------------------------------------------------------------- the routes


@pytest.fixture
async def app_client(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    settings = load_settings(data_dir=str(tmp_path), token=TOKEN, port=8765, discover_path=False)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765") as c:
            yield c, app


async def test_login_codes_are_minted_for_the_token_only_and_each_signs_in_once(
    app_client: tuple[httpx.AsyncClient, Any],
) -> None:
    client, _ = app_client
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    r = await client.post("/v1/login-codes", headers=bearer)
    assert r.status_code == 201 and r.headers["cache-control"] == "no-store"
    body = r.json()
    assert set(body) == {"code", "expires_in_s"} and body["expires_in_s"] == 600
    signed_in = await client.post("/v1/session", json={"code": body["code"]})
    assert signed_in.status_code == 204
    assert (await client.post("/v1/session", json={"code": body["code"]})).status_code == 401
    # A browser session may not mint the codes that would outlive it.
    cookie = signed_in.headers["set-cookie"].split(";", 1)[0]
    r = await client.post("/v1/login-codes", headers={"Cookie": cookie})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert (await client.get("/v1/threads", headers={"Cookie": cookie})).status_code == 200  # the cookie works
    r = await client.post("/v1/login-codes", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401


async def test_get_daemon_names_this_process_for_an_authenticated_caller(
    app_client: tuple[httpx.AsyncClient, Any],
) -> None:
    client, app = app_client
    assert (await client.get("/v1/daemon")).status_code == 401
    r = await client.get("/v1/daemon", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200
    info = r.json()
    assert info["pid"] == os.getpid() and info["version"] == __version__
    assert info["started_at"] == app.context.running.started_at and info["uptime_s"] >= 0
    assert info["data_dir"] == str(app.context.settings.data_dir)
    assert (info["live_agents"], info["loaded_threads"], info["subscribers"]) == (0, 0, 0)


async def test_on_a_unix_socket_any_loopback_host_passes_and_others_do_not(tmp_path: Path) -> None:
    settings = load_settings(data_dir=str(tmp_path), token=TOKEN, discover_path=False)
    app = create_app(settings, bound_port=0, unix_socket=True)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            for host, status in [("localhost", 200), ("localhost:8765", 200), ("[::1]", 200), ("evil.example", 421)]:
                r = await c.get("/healthz", headers={"Host": host})
                assert r.status_code == status, (host, r.text)
            r = await c.post(
                "/v1/threads",
                json={},
                headers={"Authorization": f"Bearer {TOKEN}", "Origin": "http://evil.example"},
            )
            assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"


def test_a_unix_socket_counts_as_local_for_no_auth_and_compression(tmp_path: Path) -> None:
    from bridge.errors import ConfigError

    settings = load_settings(data_dir=str(tmp_path), host="0.0.0.0", no_auth=True, discover_path=False)
    with pytest.raises(ConfigError):
        create_app(settings)
    assert create_app(settings, unix_socket=True).context.token is None
    assert cli.ws_compression(settings) is True and cli.ws_compression(settings, unix_socket=True) is False
