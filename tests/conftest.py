"""Shared test helpers: a real daemon in a subprocess, real HTTP and WebSocket clients,
and a check that no agent process outlives its test."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from tests.support.cgroups import left_by
from tests.support.redis_server import MISSING as REDIS_MISSING
from tests.support.redis_server import REDIS_SERVER, RedisServer

ROOT = Path(__file__).resolve().parent.parent
FAKE_AGENT = ROOT / "tests" / "agents" / "fake_agent.py"
PYTHON = os.path.realpath(sys.executable)
TOKEN = "test-token-0123456789abcdef"
DIALECTS = ("stream-json", "awp-jsonl")
STEP_TIMEOUT = 15.0


def alive(pid: int) -> bool:
    """Running (a zombie is dead: it only waits to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def processes_mentioning(marker: str) -> list[tuple[int, str]]:
    """Live processes whose command line contains ``marker`` (zombies included)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if marker in cmd:
            found.append((int(pid), f"{state} {cmd}"))
    return found


def processes_with_environ(marker: bytes, mentioning: str = "") -> list[tuple[int, str]]:
    """Live processes whose command line contains ``mentioning`` and whose environment
    contains ``marker``."""
    found = []
    for pid, desc in processes_mentioning(mentioning):
        try:
            if marker in Path(f"/proc/{pid}/environ").read_bytes():
                found.append((pid, desc))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


async def wait_until(predicate: Callable[[], bool], timeout: float = STEP_TIMEOUT, what: str = "condition") -> None:
    """Poll a cheap condition (process table, files) until true; fail after ``timeout``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def fake_grants(env: dict[str, str]) -> str:
    """A fake's profile line for its sandbox: fakes run confined, as agents do in production,
    and what their environment names for their log and state is theirs to write. The log
    is made here: a confined agent makes nothing new directly in the test's temp dir, which
    holds the data dir (docs/security.md §6)."""
    log = env.get("FAKE_AGENT_LOG")
    if log and os.path.isabs(log) and not os.path.exists(log):
        Path(log).touch()
    return f"sandbox_extra_write = {json.dumps([v for v in env.values() if os.path.isabs(v)])}"


def profile_toml(
    name: str, dialect: str, env: dict[str, str], extra_args: list[str] | None = None, **fields: Any
) -> str:
    args = ["-I", str(FAKE_AGENT), "--dialect", dialect, *(extra_args or [])]
    if dialect == "awp-jsonl":
        # The AWP host always passes --model (AWP_AGENT_DEFAULT_MODEL); the strict fake, like the
        # reference adapter, refuses to start without one (model_required).
        fields = {"model": "fake-model", **fields}
    # What a fake takes (~14 MiB resident, its sandbox included), so that the memory budget
    # (issue #36) does not count each starting fake at the default for real CLIs (768 MiB).
    fields = {"memory_estimate_mb": 32, **fields}
    lines = [
        f"[agents.{name}]",
        f'protocol = "{dialect}"',
        f"executable = {json.dumps(PYTHON)}",
        f"args = {json.dumps(args)}",
        "env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }",
        fake_grants(env),
    ]
    for k, v in fields.items():
        lines.append(f"{k} = {json.dumps(v)}")
    return "\n".join(lines) + "\n"


async def bridge_cli(
    *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None, timeout: float = STEP_TIMEOUT
) -> tuple[int, str, str]:
    """The real ``agent-bridge ARGS`` (``python -m bridge``), with none of this process's
    ``AGENT_BRIDGE_*`` variables but ``env``'s, fed ``stdin``: (exit status, stdout,
    stderr). Killed if it outlasts ``timeout``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_BRIDGE_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bridge",
        *args,
        stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**clean, **(env or {})},
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def daemon_sandbox(tmp: Path, config: str) -> str:
    """The ``[sandbox]`` a test daemon runs its agents in, unless its config has its own:
    confined (the default, as in production), with the test scripts readable and the
    daemon's temp dir (the data dir in it stays out of reach) writable."""
    if "[sandbox]" in config:
        return ""
    return f"\n[sandbox]\nextra_read = [{json.dumps(str(ROOT / 'tests'))}]\nextra_write = [{json.dumps(str(tmp))}]\n"


class Daemon:
    """A real ``python -m bridge serve`` on port 0."""

    def __init__(
        self,
        tmp: Path,
        config: str,
        token: str | None = TOKEN,
        extra_env: dict[str, str] | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.tmp = tmp
        self.data_dir = tmp / "data"
        self.config_path = tmp / "config.toml"
        self.config_path.write_text(config + daemon_sandbox(tmp, config))
        self.token = token
        self.extra_env = extra_env or {}
        self.extra_args = extra_args or []
        self.proc: asyncio.subprocess.Process | None = None
        self.url = ""
        self.first_line = ""
        self.stderr_path = tmp / "daemon.stderr"
        self.clients: list[Client] = []

    async def start(self) -> None:
        argv = [
            sys.executable,
            "-m",
            "bridge",
            "serve",
            "--port",
            "0",
            "--config",
            str(self.config_path),
            "--data-dir",
            str(self.data_dir),
            "--log-format",
            "json",
        ]
        if self.token:
            argv += ["--token", self.token]
        argv += self.extra_args
        env = {**{k: v for k, v in os.environ.items() if k != "AGENT_BRIDGE_TOKEN"}, **self.extra_env}
        with self.stderr_path.open("ab") as err:
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=err, env=env, cwd=str(self.tmp)
            )
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), STEP_TIMEOUT)
        except TimeoutError:
            self.proc.kill()
            raise AssertionError(f"daemon did not start: {self.stderr_path.read_text()}") from None
        self.first_line = line.decode().rstrip("\n")
        assert self.first_line.startswith("agent-bridge listening on http://"), (
            self.first_line,
            self.stderr_path.read_text(),
        )
        self.url = self.first_line.removeprefix("agent-bridge listening on ")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://", 1)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers=self.headers, timeout=STEP_TIMEOUT)

    async def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        rc = await asyncio.wait_for(self.proc.wait(), 30)
        return rc

    def stderr(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""

    async def ws(self, thread_id: str, *, after: int | None = None, mode: str = "events") -> Client:
        q = f"?mode={mode}" + (f"&after={after}" if after is not None else "")
        conn = await websockets.connect(
            f"{self.ws_url}/v1/threads/{thread_id}/ws{q}",
            additional_headers=self.headers,
            max_size=None,
            open_timeout=STEP_TIMEOUT,
        )
        client = Client(conn)
        self.clients.append(client)  # closed at teardown, even if the daemon died
        return client


class Client:
    """A WebSocket client that keeps every frame it has seen."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.frames: list[dict[str, Any]] = []
        self.texts: list[str] = []
        self._cursor = 0

    async def send(self, **frame: Any) -> None:
        await self.conn.send(json.dumps(frame))

    async def _recv(self, timeout: float) -> dict[str, Any]:
        text = await asyncio.wait_for(self.conn.recv(), timeout)
        self.texts.append(text)
        frame = json.loads(text)
        self.frames.append(frame)
        return frame

    async def next(self, pred: Callable[[dict[str, Any]], bool], timeout: float = STEP_TIMEOUT) -> dict[str, Any]:
        """The next frame (after the last one matched) satisfying ``pred``."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            while self._cursor < len(self.frames):
                frame = self.frames[self._cursor]
                self._cursor += 1
                if pred(frame):
                    return frame
            left = end - loop.time()
            try:
                if left <= 0:
                    raise TimeoutError
                await self._recv(left)
            except TimeoutError:
                seen = [(f.get("seq"), f.get("kind")) for f in self.frames]
                raise AssertionError(f"no matching frame within {timeout}s; saw {seen}") from None

    async def kind(self, kind: str, timeout: float = STEP_TIMEOUT, **data: Any) -> dict[str, Any]:
        return await self.next(
            lambda f: f.get("kind") == kind and all(f.get("data", {}).get(k) == v for k, v in data.items()), timeout
        )

    async def prompt(self, text: str, **extra: Any) -> dict[str, Any]:
        await self.send(op="prompt", text=text, **extra)
        return await self.next(
            lambda f: f.get("kind") in ("client.accepted", "client.rejected") and f["data"].get("op") == "prompt"
        )

    async def turn(self, text: str) -> dict[str, Any]:
        """Send a prompt and wait for its turn.ended, which comes after the answer (docs/api.md
        §5.4 "the answer first", on a replica that forwards the prompt too)."""
        acc = await self.prompt(text)
        assert acc["kind"] == "client.accepted", acc
        return await self.kind("turn.ended", turn_id=acc["data"]["turn_id"])

    async def upto(self, seq: int, timeout: float = STEP_TIMEOUT) -> None:
        """Wait until the frame with ``seq`` has arrived (it may already have)."""
        if any(f.get("seq") == seq for f in self.frames):
            return
        await self.next(lambda f: f.get("seq") == seq, timeout)

    def seen(self, kind: str, **data: Any) -> list[dict[str, Any]]:
        """Every frame received so far of ``kind`` whose data matches ``data``."""
        return [
            f
            for f in self.frames
            if f.get("kind") == kind and all(f.get("data", {}).get(k) == v for k, v in data.items())
        ]

    def seqs(self) -> list[int]:
        return [f["seq"] for f in self.frames if f.get("seq") is not None]

    async def close(self) -> None:
        await self.conn.close()


_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # In CI a skipped test is a missing install step (scripts/test's), not a pass.
    if os.environ.get("CI") and _skipped and exitstatus == 0:
        print(f"\nCI: {len(_skipped)} test(s) skipped, which CI does not allow: {_skipped}")
        session.exitstatus = 1


@pytest.fixture
def agent_env(tmp_path: Path) -> dict[str, str]:
    state = tmp_path / "agent-state"
    state.mkdir()
    # Made here: a confined agent may write what it is granted, but not make new entries
    # in the test's temp dir itself (it holds the data dir: docs/security.md).
    (tmp_path / "agent.log").touch()
    return {"FAKE_AGENT_LOG": str(tmp_path / "agent.log"), "FAKE_AGENT_STATE": str(state)}


def agent_log(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "agent.log"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def base_config(tmp_path: Path, agent_env: dict[str, str], *, server: str = "") -> str:
    cfg = "[server]\nstop_grace_s = 2\n" + server + "\n"
    for dialect in DIALECTS:
        cfg += profile_toml(dialect, dialect, agent_env) + "\n"
    return cfg


@pytest.fixture
async def daemon_factory(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    started: list[Daemon] = []

    async def make(config: str, **kw: Any) -> Daemon:
        d = Daemon(tmp_path, config, **kw)
        await d.start()
        started.append(d)
        return d

    yield make
    for d in started:
        for c in d.clients:
            if d.proc is not None and d.proc.returncode is not None:
                # The daemon is gone (e.g. SIGKILLed by the test): there is no close handshake
                # to wait for, and a client with unread frames would wait out its close timeout.
                c.conn.transport.abort()
            else:
                await asyncio.wait_for(c.close(), STEP_TIMEOUT)
        if d.proc is not None and d.proc.returncode is None:
            await d.stop()
    # No agent (nor anything it spawned) outlives the test.
    await wait_until(lambda: not _own_agents(tmp_path), what="agents to exit")
    leftovers = _own_agents(tmp_path)
    assert not leftovers, f"agent processes outlived the test: {leftovers}"
    # Nor any agent's memory cgroup (process/cgroup.py) of a daemon that stopped cleanly.
    cgroups = [p for d in started if d.proc is not None and d.proc.returncode == 0 for p in left_by(d.proc.pid)]
    assert not cgroups, f"agents' cgroups outlived the test: {cgroups}"


def _own_agents(tmp_path: Path) -> list[tuple[int, str]]:
    # Agents of this test carry its FAKE_AGENT_LOG path in their environment; what they
    # spawn ("spawnchild") carries it on its command line.
    marker = str(tmp_path / "agent.log")
    return processes_mentioning(marker) + processes_with_environ(marker.encode(), str(FAKE_AGENT))


@pytest.fixture
async def daemon(daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str]) -> Daemon:
    return await daemon_factory(base_config(tmp_path, agent_env))


@pytest.fixture(params=DIALECTS)
def dialect(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def new_thread(d: Daemon, agent: str, **body: Any) -> dict[str, Any]:
    async with d.http() as http:
        r = await http.post("/v1/threads", json={"agent": agent, **body})
        assert r.status_code == 201, r.text
        return dict(r.json())


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port, for this test only (tests/bus)."""
    if REDIS_SERVER is None:
        pytest.skip(REDIS_MISSING)
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


# ---------------------------------------------------------------- a real PostgreSQL server


@pytest.fixture(scope="session")
def postgres() -> Any:
    """One real PostgreSQL server per test process (tests/support/postgres.py), started on
    first use and stopped at the end; skipped, with the reason, where PostgreSQL is not
    installed (CI=true turns that skip into a failure: scripts/test installs it)."""
    from tests.support import postgres as pg

    reason = pg.missing_reason()
    if reason:
        pytest.skip(reason)
    with pg.running() as server:
        yield server


@pytest.fixture
def own_postgres() -> Any:
    """A PostgreSQL server of this test's own, for a test that stops it (``.stop()``) and
    starts it again (``.start_server()``) to stand for a database outage."""
    from tests.support import postgres as pg

    reason = pg.missing_reason()
    if reason:
        pytest.skip(reason)
    with pg.running() as server:
        yield server


@pytest.fixture
def pg_url(postgres: Any, request: pytest.FixtureRequest) -> str:
    """A fresh, empty database on the test server for this test alone."""
    import re
    import uuid

    name = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:40] + "_" + uuid.uuid4().hex[:8]
    return str(postgres.create_database(name))


# ---------------------------------------------------------------- both stores (tests/store)
# Every store-level test runs against both stores: ``store_url`` is a SQLite file in the
# test's tmp dir or a fresh database on the test PostgreSQL server.

STORE_KINDS = ("sqlite", "postgresql")


@pytest.fixture(params=STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_url(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if store_kind == "sqlite":
        return f"sqlite:///{tmp_path / 'bridge.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def daemon_store(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A daemon's store of each kind: SQLite in its data dir (``tmp_path/data``), else the
    suite's PostgreSQL."""
    if store_kind == "sqlite":
        return f"sqlite:///{tmp_path / 'data' / 'bridge.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def opened(store_url: str) -> Any:
    """``async with opened(replica_id="a") as store``: a store on the test's database,
    opened, and closed afterwards; two of them are two replicas on one database."""
    from support.stores import opened_at

    def make(replica_id: str = "local") -> Any:
        return opened_at(store_url, replica_id)

    return make
