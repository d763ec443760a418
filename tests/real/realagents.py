"""Fixtures and helpers for the real-agent suite (issue #9).

Not a ``conftest.py`` on purpose: the other test modules import helpers with ``from
conftest import ...``, and a second ``conftest.py`` would replace ``tests/conftest.py`` in
``sys.modules`` for every module collected after this folder. Test modules here import
the fixtures they use from this module.

Where the CLIs come from: ``scripts/test`` installs the versions pinned in ``npm-pins.txt``
with ``npm install --prefix "$AGENT_BRIDGE_NPM_CACHE"`` (default
``~/.cache/agent-bridge/npm``). A missing or mismatched CLI fails the suite when ``CI`` is
set and skips it otherwise, with the reason.

Debugging: with ``AGENT_BRIDGE_REAL_DUMP=FILE`` every test appends each WebSocket client's
frames (one JSON array a line) to FILE at its end, pass or fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import re
import shutil
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from conftest import STEP_TIMEOUT, Daemon, processes_with_environ, wait_until
from fake_anthropic import FakeAnthropic
from fake_openai import FakeOpenAI
from fakeserver import FakeServer

HERE = Path(__file__).resolve().parent
PINS = dict(
    line.strip().rsplit("@", 1)
    for line in (HERE / "npm-pins.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
)
CLAUDE_CODE = "@anthropic-ai/claude-code"
CLAUDE_AGENT_ACP = "@agentclientprotocol/claude-agent-acp"
# Real agents are Node/Bun programs: seconds to start on two busy cores.
AGENT_TIMEOUT = 45.0
# What the fake may be asked for: the pre-connect probe, model round trips, token counts.
EXPECTED_PATHS = {("HEAD", "/"), ("GET", "/"), ("POST", "/v1/messages"), ("POST", "/v1/messages/count_tokens")}
FAKE_KEY = "sk-ant-fake-0123456789"


def npm_cache() -> Path:
    env = os.environ.get("AGENT_BRIDGE_NPM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "agent-bridge" / "npm"


def _installed_version(package: str) -> str | None:
    try:
        meta = json.loads((npm_cache() / "node_modules" / package / "package.json").read_text())
    except (OSError, ValueError):
        return None
    version = meta.get("version")
    return version if isinstance(version, str) else None


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (scripts/test installs it)", pytrace=False)
    pytest.skip(
        f"{reason}; run scripts/test, or npm install --prefix {npm_cache()} the versions in tests/real/npm-pins.txt"
    )


def _check_pinned(package: str) -> None:
    found = _installed_version(package)
    if found != PINS[package]:
        _unavailable(f"{package}@{PINS[package]} is not installed in {npm_cache()} (found {found})")


def _native_suffix() -> str:
    machine = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower(), platform.machine().lower()
    )
    return f"linux-{machine}"


def claude_executable() -> str:
    """The Claude Code binary: the native executable of the platform package (a regular
    file; ``node_modules/.bin/claude`` is a symlink, which the launch rules refuse)."""
    _check_pinned(CLAUDE_CODE)
    base = npm_cache() / "node_modules" / "@anthropic-ai"
    for candidate in (base / f"claude-code-{_native_suffix()}" / "claude", base / "claude-code" / "bin" / "claude.exe"):
        if (
            candidate.is_file()
            and not candidate.is_symlink()
            and os.access(candidate, os.X_OK)
            and candidate.stat().st_size > 1_000_000
        ):  # not the postinstall placeholder
            return str(candidate)
    _unavailable(f"no native Claude Code binary under {base}")
    raise AssertionError("unreachable")


def acp_command() -> tuple[str, list[str]]:
    """claude-agent-acp: node (its real path) running the package's dist/index.js."""
    _check_pinned(CLAUDE_AGENT_ACP)
    node = shutil.which("node")
    if node is None:
        _unavailable("node is not on PATH")
        raise AssertionError("unreachable")
    script = npm_cache() / "node_modules" / CLAUDE_AGENT_ACP / "dist" / "index.js"
    if not script.is_file():
        _unavailable(f"{script} is missing")
    return os.path.realpath(node), [str(script)]


def toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def profile(name: str, **fields: Any) -> str:
    return f"[agents.{name}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in fields.items()) + "\n"


F = TypeVar("F", bound=FakeServer)


@contextmanager
def serving(fake: F, allowed: Callable[[tuple[str, str]], bool]) -> Iterator[F]:
    """``fake`` running; at the end, the agent asked it for nothing but ``allowed``
    (method, path) pairs: no telemetry, no feature flags, no catalogue, …"""
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()
    unexpected = {p for p in fake.paths() if not allowed(p)}
    assert not unexpected, f"the agent asked the fake for unexpected paths: {unexpected}"


@pytest.fixture
def fake_api() -> Iterator[FakeAnthropic]:
    with serving(FakeAnthropic(), EXPECTED_PATHS.__contains__) as fake:
        yield fake


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    """The OpenAI fake: model requests only (chat completions or Responses)."""
    with serving(FakeOpenAI(), lambda p: p[0] == "POST" and p[1] in FakeOpenAI.model_paths) as fake:
        yield fake


def agent_env(fake: FakeAnthropic, home: Path) -> dict[str, str]:
    """The profile ``env`` for Claude Code and claude-agent-acp, fully offline."""
    return {
        "HOME": str(home),  # fresh state, no login (and the marker of this test's processes)
        "ANTHROPIC_BASE_URL": fake.url,
        "ANTHROPIC_API_KEY": FAKE_KEY,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_MAX_RETRIES": "1",
        # The fake implements no beta of the Messages API. Without this, newer CLIs ask for
        # the server-side auto-mode check, take the fake's plain answer as a gateway that
        # refused it, and say so to the user in the middle of the reply.
        "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS": "1",
    }


@dataclass
class Real:
    """One test's world: the fake API, a fresh HOME, the work dir, daemons to start."""

    fake: Any  # a fakeserver.FakeServer
    home: Path
    work: Path
    tmp: Path
    make_daemon: Callable[..., Any]
    daemons: list[Daemon]
    base_env: dict[str, str] = field(default_factory=dict)

    def env(self, **extra: str) -> dict[str, str]:
        return {**self.base_env, **extra}

    def config(self, *profiles: str, server: str = "") -> str:
        return "[server]\nstop_grace_s = 3\ninterrupt_timeout_s = 15\n" + server + "\n" + "".join(profiles)

    async def daemon(self, config: str) -> Daemon:
        d: Daemon = await self.make_daemon(config)
        self.daemons.append(d)
        return d

    def own_processes(self) -> list[tuple[int, str]]:
        """Live processes started for this test: they all carry its HOME."""
        return processes_with_environ(f"HOME={self.home}\0".encode())


@asynccontextmanager
async def world(fake: Any, tmp_path: Path, daemon_factory: Callable[..., Any]) -> AsyncIterator[Real]:
    """A :class:`Real` around ``fake``; at the end every daemon stops cleanly and no agent
    process (nor anything it spawned) lives on."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    w = Real(fake, home, work, tmp_path, daemon_factory, [])
    yield w
    if os.environ.get("AGENT_BRIDGE_REAL_DUMP"):
        with open(os.environ["AGENT_BRIDGE_REAL_DUMP"], "a") as fh:  # noqa: ASYNC230 (a debugging aid)
            for d in w.daemons:
                for c in d.clients:
                    fh.write(json.dumps(c.frames) + "\n")
    for d in w.daemons:
        for c in d.clients:
            await asyncio.wait_for(c.close(), STEP_TIMEOUT)
        if d.proc is not None and d.proc.returncode is None:
            assert await d.stop() == 0
    await wait_until(lambda: not w.own_processes(), timeout=STEP_TIMEOUT, what="agent processes to exit")


@pytest.fixture
async def real(fake_api: FakeAnthropic, tmp_path: Path, daemon_factory: Callable[..., Any]) -> AsyncIterator[Real]:
    async with world(fake_api, tmp_path, daemon_factory) as w:
        w.base_env = agent_env(fake_api, w.home)
        yield w


def node_script(package: str, script: str) -> tuple[str, list[str]]:
    """node (its real path) and the pinned package's ``script`` as its first argument."""
    _check_pinned(package)
    node = shutil.which("node")
    if node is None:
        _unavailable("node is not on PATH")
        raise AssertionError("unreachable")
    path = npm_cache() / "node_modules" / package / script
    if not path.is_file():
        _unavailable(f"{path} is missing")
    return os.path.realpath(node), [str(path)]


def native_binary(package: str, binary: str, platform_package: bool = True) -> str:
    """A native executable of the pinned ``package``: in its platform package
    (``<package>-linux-x64/<binary>``), or in the package itself; a regular file, as the
    launch rules want."""
    _check_pinned(package)
    path = npm_cache() / "node_modules" / (f"{package}-{_native_suffix()}" if platform_package else package) / binary
    if not (path.is_file() and not path.is_symlink() and os.access(path, os.X_OK)):
        _unavailable(f"no native {binary} at {path}")
    return str(path)


def assert_gapless(c: Any) -> None:
    """Client ``c`` (connected with ``after=0``) saw the whole transcript: seq 1, 2, … with
    no gap and no repeat."""
    seqs = c.seqs()
    assert seqs == list(range(1, len(seqs) + 1)), seqs


def agent_text(c: Any, since: int = 0) -> str:
    """The agent's streamed text seen by client ``c`` after seq ``since``."""
    return "".join(
        f["data"]["text"] for f in c.seen("message.delta") if f["seq"] > since and f["data"].get("channel") == "text"
    )


async def write_allowed(c: Any, path: Path) -> dict[str, Any]:
    """A ``WRITE path`` turn whose one permission request client ``c`` allows; its
    successful ``turn.ended``."""
    acc = await c.prompt(f"WRITE {path}")
    req = await c.kind("permission.requested", timeout=AGENT_TIMEOUT)
    await c.send(op="permission", request_id=req["data"]["request_id"], decision="allow")
    end: dict[str, Any] = await c.kind("turn.ended", turn_id=acc["data"]["turn_id"], timeout=AGENT_TIMEOUT)
    assert end["data"]["status"] == "success", end
    return end


def root_sandbox() -> dict[str, str]:
    """As root, Claude Code refuses to bypass permissions unless IS_SANDBOX=1."""
    return {"IS_SANDBOX": "1"} if os.geteuid() == 0 else {}


DOCS_AGENTS = HERE.parent.parent / "docs" / "agents.md"


def doc_preset(name: str) -> dict[str, Any]:
    """The ``[agents.NAME]`` table of a preset in docs/agents.md, as the docs show it."""
    import tomllib

    for block in re.findall(r"```toml\n(.*?)```", DOCS_AGENTS.read_text(), flags=re.S):
        table = tomllib.loads(block).get("agents", {})
        if name in table:
            return dict(table[name])
    raise AssertionError(f"no [agents.{name}] preset in {DOCS_AGENTS}")


# ---------------------------------------------------------------- egress, seen by strace

TRACED = "trace=connect,sendto,sendmsg,sendmmsg"
_ADDR_RE = re.compile(
    r'sin_port=htons\((\d+)\), sin_addr=inet_addr\("([^"]+)"\)'
    r'|sin6_port=htons\((\d+)\),.*?inet_pton\(AF_INET6, "([^"]+)"'
)


def strace_wrapped(executable: str, args: list[str], log: Path) -> tuple[str, list[str]]:
    """The agent under ``strace -f``: every connect()/send*() of it and of everything it
    spawns (the CLI under claude-agent-acp, tool commands) is logged with its address."""
    strace = shutil.which("strace")
    if strace is None:
        _unavailable("strace is not installed")
        raise AssertionError("unreachable")
    log.touch()  # a confined agent writes what it is granted, and makes nothing new beside the data dir
    return os.path.realpath(strace), ["-f", "-qq", "-e", TRACED, "-o", str(log), executable, *args]


def assert_only_peer_is(fake: Any, log: Path, own: set[tuple[str, int]] | None = None) -> None:
    """The traced processes talked to the loopback fake, and to nothing else (but to
    ``own``: loopback servers of the agent itself)."""
    peers = network_peers(log)
    addr = ("127.0.0.1", int(fake.url.rsplit(":", 1)[1]))
    assert addr in peers, peers  # the trace saw the model traffic
    assert set(peers) - (own or set()) == {addr}, peers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def network_peers(log: Path) -> list[tuple[str, int]]:
    """Every IPv4/IPv6 (address, port) the traced processes connected or sent to."""
    peers = []
    for m in _ADDR_RE.finditer(log.read_text() if log.exists() else ""):
        port, addr = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        peers.append((addr, int(port)))
    return peers
