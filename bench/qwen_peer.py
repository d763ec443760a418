"""agent-bridge running Qwen Code in ACP mode, side by side with Qwen Code's own daemon
``qwen serve``, both against the same loopback fake model (docs/benchmarks.md).

    python -m bench.qwen_peer              # the full run (several minutes)
    python -m bench.qwen_peer --quick      # a smoke run; numbers are not meaningful

The bridge runs ``node cli-entry.js --acp`` (an ``acp`` profile, as the real-agent tests
do) one process per thread; ``qwen serve`` runs its own ``cli.js --acp`` children. Both get
the same HOME settings (usage statistics, telemetry and the memory sub-agent off), the
same key and the same ``OPENAI_BASE_URL``: ``bench/fake_model.py`` on 127.0.0.1, in a
process of its own. At the end the fake must have been asked for nothing but chat
completions and its model list: nothing else left the bench's processes for the model.

Every figure is a median over ``--runs`` runs; the peers alternate which goes first, run
by run. Only the ratios (bridge ÷ qwen serve) are meant to be compared.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from bench.run import HOST, Bridge, bounded, cpu_s, fmt, median, rss_kib
from bench.sseclient import SSEClient
from bench.wsclient import WSClient

QWEN = "@qwen-code/qwen-code"
STEP_TIMEOUT = 180.0
FIRST_TRIES = 5  # short turns per run for row 1  # a real Node agent on two busy cores: seconds to start
FAKE_KEY = "sk-fake-bench-0123456789"
MODEL = "gpt-fake-bench"
SETTINGS = {
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "memory": {"enableManagedAutoMemory": False},
    "security": {"auth": {"selectedType": "openai"}},
}
# What the fake model may be asked for.
ALLOWED = {("POST", "/v1/chat/completions"), ("GET", "/v1/models")}

DELTA = b'"kind":"message.delta"'
B_EMPTY = b'"data":{"text":"",'  # the usage-only chunk that ends a reply
TURN_ENDED = b'"kind":"turn.ended"'
Q_CHUNK = b'"sessionUpdate":"agent_message_chunk"'
Q_EMPTY = b'{"text":"","type":"text"}'
Q_TURN = b"event: turn_complete"


@dataclass(frozen=True)
class Params:
    runs: int
    deltas: int  # text deltas of the streamed turn (rows 2-5)
    sessions: int  # idle sessions for the RSS row


FULL = Params(runs=3, deltas=5000, sessions=8)
QUICK = Params(runs=1, deltas=200, sessions=2)


def npm_cache() -> Path:
    env = os.environ.get("AGENT_BRIDGE_NPM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "agent-bridge" / "npm"


def qwen_script(name: str) -> Path:
    return npm_cache() / "node_modules" / QWEN / name


def qwen_version() -> str | None:
    try:
        meta = json.loads((npm_cache() / "node_modules" / QWEN / "package.json").read_text())
    except (OSError, ValueError):
        return None
    v = meta.get("version")
    return v if isinstance(v, str) else None


def node() -> str:
    found = shutil.which("node")
    if found is None:
        raise SystemExit("node is not on PATH")
    return os.path.realpath(found)


def tree(pid: int) -> list[int]:
    """``pid`` and every live descendant of it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def memory_kib(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in KiB summed over ``pid`` and its descendants."""
    rss = pss = 0
    for p in tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
    return rss, pss


def describe(pids: list[int]) -> str:
    """What those processes are (program and script), with their RSS: ``3× node cli.js
    (612 MiB)``."""
    kinds: dict[str, list[int]] = {}
    for p in pids:
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            script = next((a for a in argv[1:] if a.endswith(b".js")), b"")
            name = f"{Path(argv[0].decode()).name} {Path(script.decode()).name}".strip()
            kinds.setdefault(name, []).append(rss_kib(p))
    parts = [f"{len(v)}× {k} ({sum(v) / 1024:.0f} MiB)" for k, v in sorted(kinds.items())]
    return ", ".join(parts) or "none"


def cpu_or_zero(pid: int) -> float:
    """User + system CPU seconds of one process (0 once it is gone)."""
    try:
        return cpu_s(pid)
    except OSError:
        return 0.0


def write_home(home: Path) -> None:
    (home / ".qwen").mkdir(parents=True, exist_ok=True)
    (home / ".qwen" / "settings.json").write_text(json.dumps(SETTINGS))


async def wait_line(proc: asyncio.subprocess.Process, prefix: str, what: str, log: Path) -> str:
    assert proc.stdout is not None
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), STEP_TIMEOUT)).decode()
        if not line:
            raise RuntimeError(f"{what} exited before it listened; see {log}")
        if line.startswith(prefix):
            return line.strip()


async def drain(proc: asyncio.subprocess.Process) -> None:
    assert proc.stdout is not None
    while await proc.stdout.read(65536):
        pass


async def terminate(proc: asyncio.subprocess.Process | None, grace: float) -> None:
    """SIGTERM to the process we started, SIGKILL after ``grace``; then its process group
    (it was started as a group leader) so that no child outlives it."""
    if proc is None:
        return
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


# ---------------------------------------------------------------------- the fake model


class FakeModel:
    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.proc: asyncio.subprocess.Process | None = None
        self.url = ""
        self._drain: asyncio.Task[None] | None = None

    async def start(self) -> None:
        err = (self.dir / "fake-model.stderr").open("ab")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.fake_model", stdout=asyncio.subprocess.PIPE, stderr=err, start_new_session=True
        )
        err.close()
        line = await wait_line(self.proc, "fake-model listening on ", "the fake model", self.dir / "fake-model.stderr")
        self.url = line.rsplit(" ", 1)[1]
        self._drain = asyncio.create_task(drain(self.proc))

    async def log(self) -> list[tuple[str, str, float]]:
        async with httpx.AsyncClient(timeout=30) as http:
            return [(m, p, t) for m, p, t in (await http.get(f"{self.url}/_fake/log")).json()]

    async def requests(self) -> set[tuple[str, str]]:
        return {(m, p) for m, p, _ in await self.log()}

    async def asked_at(self, since: float) -> float:
        """When the first chat request after ``since`` (``time.time()``) arrived."""
        return min(t for m, p, t in await self.log() if p == "/v1/chat/completions" and t >= since)

    async def stop(self) -> None:
        await terminate(self.proc, 5)
        if self._drain is not None:
            self._drain.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._drain

    def env(self, home: Path) -> dict[str, str]:
        return {
            "HOME": str(home),
            "OPENAI_API_KEY": FAKE_KEY,
            "OPENAI_BASE_URL": f"{self.url}/v1",
            "OPENAI_MODEL": MODEL,
        }


# ---------------------------------------------------------------------- the peers


class Turn(Protocol):
    """One live client of one session/thread, as the measurements drive it."""

    async def prompt(self, text: str) -> None: ...
    async def first_delta(self) -> None: ...
    async def to_end(self) -> int: ...  # text deltas seen until the turn ended
    async def close(self) -> None: ...


class Peer(Protocol):
    name: str
    has_lean_replay: bool

    async def start(self) -> float: ...  # seconds from spawn to ready
    async def stop(self) -> None: ...
    async def new_session(self) -> str: ...
    async def live(self, sid: str) -> Turn: ...
    # Events and bytes replayed to a new client; ``lean``: without what only some clients want
    # (the bridge's raw agent lines), where the peer can leave it out.
    async def replay(self, sid: str, lean: bool) -> tuple[int, int]: ...
    async def history(self, sid: str) -> int: ...  # items of the compacted history
    @property
    def pid(self) -> int: ...


class BridgeTurn:
    def __init__(self, ws: WSClient) -> None:
        self.ws = ws
        self.deltas = 0

    async def prompt(self, text: str) -> None:
        self.deltas = 0
        await self.ws.send_text(json.dumps({"op": "prompt", "text": text}))

    async def first_delta(self) -> None:
        while True:
            batch = await self.ws.recv_batch()
            for i, f in enumerate(batch):
                if DELTA in f and B_EMPTY not in f:
                    self.deltas += 1
                    self.ws.unread(batch[i + 1 :])
                    return

    async def to_end(self) -> int:
        while True:
            batch = await self.ws.recv_batch()
            for i, f in enumerate(batch):
                if DELTA in f and B_EMPTY not in f:
                    self.deltas += 1
                elif TURN_ENDED in f:
                    self.ws.unread(batch[i + 1 :])
                    return self.deltas

    async def close(self) -> None:
        await self.ws.close()


class BridgePeer:
    """``python -m bridge serve`` with one ``acp`` profile: Qwen Code under node."""

    name = "bridge"
    has_lean_replay = True  # omit_raw=1

    def __init__(self, workdir: Path, fake: FakeModel) -> None:
        self.b = Bridge(workdir)
        self.home, self.work = workdir / "home", workdir / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        write_home(self.home)
        env = fake.env(self.home)
        entry = [str(qwen_script("cli-entry.js")), "--acp", "--approval-mode", "default"]
        # What qwen serve runs for its own ACP child: cli.js itself (no cli-entry.js wrapper
        # process) and QWEN_CODE_NO_RELAUNCH (no second cli.js with a bigger heap); the
        # heap limit given up front, as docs/agents.md's qwen-acp-lean preset does.
        direct = ["--expose-gc", "--max-old-space-size=4096", str(qwen_script("cli.js")), "--acp"]
        direct.extend(["--approval-mode", "default"])
        self.b.config.write_text(
            "[server]\nmax_conversations = 512\nidle_timeout_s = 3600\nstop_grace_s = 3\n\n"
            + self.profile("qwen", entry, env)
            + self.profile("qwen-direct", direct, {**env, "QWEN_CODE_NO_RELAUNCH": "true"})
        )
        self.agent = "qwen"  # the profile new sessions use
        self.http: httpx.AsyncClient | None = None

    @staticmethod
    def profile(name: str, args: list[str], env: dict[str, str]) -> str:
        table = ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())
        return (
            f'[agents.{name}]\nprotocol = "acp"\nexecutable = {json.dumps(node())}\n'
            f'args = {json.dumps(args)}\nauth_method = "openai"\nenv = {{ {table} }}\n\n'
        )

    @property
    def pid(self) -> int:
        return self.b.pid

    async def start(self) -> float:
        t0 = time.perf_counter()
        await self.b.start()
        self.http = self.b.http()
        (await self.http.get("/healthz")).raise_for_status()  # it listens once it printed so
        return time.perf_counter() - t0

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.aclose()
            self.http = None
        await self.b.stop()

    async def stop_thread(self, sid: str) -> None:
        assert self.http is not None
        (await self.http.post(f"/v1/threads/{sid}/stop")).raise_for_status()

    async def new_session(self) -> str:
        assert self.http is not None
        r = await self.http.post("/v1/threads", json={"agent": self.agent, "cwd": str(self.work)})
        r.raise_for_status()
        return str(r.json()["id"])

    async def _last_seq(self, sid: str) -> int:
        assert self.http is not None
        return await self.b.last_seq(self.http, sid)

    async def live(self, sid: str) -> BridgeTurn:
        return BridgeTurn(await self.b.ws(sid, after=await self._last_seq(sid)))

    async def replay(self, sid: str, lean: bool) -> tuple[int, int]:
        last = await self._last_seq(sid)
        query = "after=0&omit_raw=1" if lean else "after=0"
        ws = await WSClient.connect(HOST, self.b.port, f"/v1/threads/{sid}/ws?{query}", self.b.headers)
        got = size = 0
        while got < last:
            batch = await ws.recv_batch()
            got += len(batch)
            size += sum(map(len, batch))
        await ws.close()
        return got, size

    async def history(self, sid: str) -> int:
        assert self.http is not None
        r = await self.http.get(f"/v1/threads/{sid}/history")
        r.raise_for_status()
        return len(r.json()["items"])


class QwenTurn:
    def __init__(self, http: httpx.AsyncClient, sid: str, sse: SSEClient, last_ids: dict[str, int]) -> None:
        self.http, self.sid, self.sse = http, sid, sse
        self.deltas = 0
        self.last_ids = last_ids  # the peer's newest event id per session, kept up to date

    async def prompt(self, text: str) -> None:
        self.deltas = 0
        r = await self.http.post(f"/session/{self.sid}/prompt", json={"prompt": [{"type": "text", "text": text}]})
        r.raise_for_status()

    @staticmethod
    def is_delta(ev: bytes) -> bool:
        return Q_CHUNK in ev and Q_EMPTY not in ev

    async def first_delta(self) -> None:
        while True:
            batch = await self.sse.recv_batch()
            for i, ev in enumerate(batch):
                if self.is_delta(ev):
                    self.deltas += 1
                    self.sse.unread(batch[i + 1 :])
                    return

    async def to_end(self) -> int:
        while True:
            batch = await self.sse.recv_batch()
            for i, ev in enumerate(batch):
                if self.is_delta(ev):
                    self.deltas += 1
                elif Q_TURN in ev:
                    self.last_ids[self.sid] = int(ev.split(b"\n", 1)[0].split(b":", 1)[1])
                    self.sse.unread(batch[i + 1 :])
                    return self.deltas

    async def close(self) -> None:
        await self.sse.close()


class QwenServePeer:
    """``qwen serve`` (the pinned Qwen Code, in-process fast path of cli-entry.js), on
    127.0.0.1 port 0, API only (``--no-web``), with one workspace."""

    name = "qwen serve"
    has_lean_replay = False

    def __init__(self, workdir: Path, fake: FakeModel) -> None:
        self.dir = workdir
        self.home, self.work = workdir / "home", workdir / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        write_home(self.home)
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **fake.env(self.home)}
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0
        self.http: httpx.AsyncClient | None = None
        self._drain: asyncio.Task[None] | None = None
        self.last_id: dict[str, int] = {}  # the newest event id seen per session

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self) -> float:
        err_path = self.dir / "qwen-serve.stderr"
        err = err_path.open("ab")
        t0 = time.perf_counter()
        self.proc = await asyncio.create_subprocess_exec(
            node(),
            str(qwen_script("cli-entry.js")),
            "serve",
            "--port",
            "0",
            "--hostname",
            HOST,
            "--no-web",
            "--workspace",
            str(self.work),
            # Its ACP child's initialize times out after 10 s by default: too short for a
            # Node agent starting on two cores shared with other jobs.
            "--initialize-timeout-ms",
            str(int(STEP_TIMEOUT * 1000)),
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            cwd=str(self.work),
            env=self.env,
            start_new_session=True,
        )
        err.close()
        line = await wait_line(self.proc, "qwen serve listening on http://", "qwen serve", err_path)
        self.port = int(line.split()[4].rsplit(":", 1)[1])
        self._drain = asyncio.create_task(drain(self.proc))
        self.http = httpx.AsyncClient(base_url=f"http://{HOST}:{self.port}", timeout=STEP_TIMEOUT)
        (await self.http.get("/health")).raise_for_status()  # it listens once it printed so
        return time.perf_counter() - t0

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.aclose()
            self.http = None
        await terminate(self.proc, 15)
        if self._drain is not None:
            self._drain.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._drain

    async def new_session(self) -> str:
        assert self.http is not None
        # "thread": a session of its own (the default, "single", attaches every caller to
        # the workspace's one session).
        r = await self.http.post("/session", json={"cwd": str(self.work), "sessionScope": "thread"})
        r.raise_for_status()
        assert r.json()["attached"] is False, r.json()
        sid = str(r.json()["sessionId"])
        self.last_id[sid] = 0
        return sid

    async def _sse(self, sid: str, last_event_id: int | None) -> SSEClient:
        headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
        return await SSEClient.connect(HOST, self.port, f"/session/{sid}/events", headers)

    async def live(self, sid: str) -> QwenTurn:
        assert self.http is not None
        return QwenTurn(self.http, sid, await self._sse(sid, self.last_id[sid]), self.last_id)

    async def replay(self, sid: str, lean: bool) -> tuple[int, int]:
        """Events replayed from the session's ring (``Last-Event-ID: 0``) up to the newest."""
        sse = await self._sse(sid, 0)
        last, got, size = self.last_id[sid], 0, 0
        while True:
            batch = await sse.recv_batch()
            for ev in batch:
                size += len(ev) + 2
                if ev.startswith(b"id: "):
                    got += 1
                    if int(ev.split(b"\n", 1)[0][4:]) >= last:
                        await sse.close()
                        return got, size

    async def history(self, sid: str) -> int:
        assert self.http is not None
        r = await self.http.get(f"/session/{sid}/transcript")
        r.raise_for_status()
        return len(r.json()["events"])


# ---------------------------------------------------------------------- measurements


class Bench:
    def __init__(self, params: Params, peers: list[Peer], fake: FakeModel, log: Callable[[str], None]) -> None:
        self.p = params
        self.peers = peers
        self.fake = fake
        self.log = log
        self.samples: dict[str, dict[str, list[float]]] = {}
        self.counts: dict[str, dict[str, Any]] = {}

    def add(self, metric: str, peer: str, value: float) -> None:
        self.samples.setdefault(metric, {}).setdefault(peer, []).append(value)

    def note(self, metric: str, peer: str, value: Any) -> None:
        self.counts.setdefault(metric, {})[peer] = value

    async def turn(self, peer: Peer) -> str:
        """Rows 1-4 on a fresh session of ``peer``; returns the session (its last turn
        streamed ``deltas`` deltas)."""
        name = peer.name
        sid = await peer.new_session()
        t = await peer.live(sid)
        await t.prompt("hi")  # starts the agent (bridge) / the session's first model call
        await asyncio.wait_for(t.to_end(), STEP_TIMEOUT)

        await self.first_event(name, t)
        await self.stream(peer, t)
        await t.close()

        for metric, lean in (("replay", False), ("replay_lean", True)):
            if lean and not peer.has_lean_replay:  # one form only: compared with its one replay
                self.add(f"{metric}_ms", name, self.samples["replay_ms"][name][-1])
                self.add(f"{metric}_rate", name, self.samples["replay_rate"][name][-1])
                continue
            t0 = time.perf_counter()
            events, size = await asyncio.wait_for(peer.replay(sid, lean), STEP_TIMEOUT)
            dt = time.perf_counter() - t0
            self.add(f"{metric}_ms", name, dt * 1000)
            self.add(f"{metric}_rate", name, events / dt)
            self.note(f"{metric}_ms", name, f"{events} events, {size / events:.0f} bytes each on the wire")

        for metric in ("history_cold", "history_warm"):
            t0 = time.perf_counter()
            items = await asyncio.wait_for(peer.history(sid), STEP_TIMEOUT)
            self.add(metric, name, (time.perf_counter() - t0) * 1000)
            self.note(metric, name, f"{items} items")
        return sid

    async def first_event(self, name: str, t: Turn) -> None:
        """Row 1, split at the moment the fake model was asked (wall clock, both processes
        on this machine): the way in (client → daemon → agent → model request) and the way
        out (model's first chunk → agent → daemon → client). The median of FIRST_TRIES
        short turns per run: one is at the mercy of whatever else the machine runs."""
        total, way_in, way_out = [], [], []
        for _ in range(FIRST_TRIES):
            w0, t0 = time.time(), time.perf_counter()
            await t.prompt("DELTAS 5")
            await asyncio.wait_for(t.first_delta(), STEP_TIMEOUT)
            total.append((time.perf_counter() - t0) * 1000)
            w1 = time.time()
            assert await asyncio.wait_for(t.to_end(), STEP_TIMEOUT) == 5
            asked = await self.fake.asked_at(w0)
            way_in.append((asked - w0) * 1000)
            way_out.append((w1 - asked) * 1000)
        for metric, values in (("first_event", total), ("first_in", way_in), ("first_out", way_out)):
            self.add(metric, name, statistics.median(values))

    async def stream(self, peer: Peer, t: Turn) -> None:
        """Row 2: the turn of ``deltas`` deltas; the CPU the daemon itself and its agent
        processes spent on it."""
        name, n = peer.name, self.p.deltas
        procs = tree(peer.pid)
        cpu0 = {p: cpu_or_zero(p) for p in procs}
        t0 = time.perf_counter()
        await t.prompt(f"DELTAS {n}")
        await asyncio.wait_for(t.first_delta(), STEP_TIMEOUT)
        t1 = time.perf_counter()
        got = await asyncio.wait_for(t.to_end(), STEP_TIMEOUT)
        t2 = time.perf_counter()
        assert got == n, f"{name}: {got} of {n} deltas"
        self.add("stream_rate", name, (n - 1) / (t2 - t1))
        self.add("stream_turn", name, (t2 - t0) * 1000)
        spent = {p: cpu_or_zero(p) - cpu0.get(p, 0.0) for p in tree(peer.pid)}
        own = spent.pop(peer.pid)
        self.add("cpu_daemon", name, own / n * 1000)
        self.add("cpu_agent", name, sum(spent.values()) / n * 1000)

    async def restart(self, peer: Peer, sid: str) -> None:
        await peer.stop()
        ready = await asyncio.wait_for(peer.start(), STEP_TIMEOUT)
        self.add("restart_ready", peer.name, ready * 1000)
        t0 = time.perf_counter()
        items = await asyncio.wait_for(peer.history(sid), STEP_TIMEOUT)
        self.add("history_restart", peer.name, (time.perf_counter() - t0) * 1000)
        self.note("history_restart", peer.name, f"{items} items")

    async def idle_rss(self, peer: Peer, suffix: str = "") -> None:
        """Row 6, right after a restart (no agent of the bridge runs; qwen serve has its
        preheated ACP child): the daemon's process tree before and after N warm sessions."""
        rss0, pss0 = memory_kib(peer.pid)
        before = set(tree(peer.pid))
        own0 = rss_kib(peer.pid)

        sids: list[str] = []

        async def warm() -> None:
            sids.append(sid := await peer.new_session())
            t = await peer.live(sid)
            await t.prompt("hi")
            await asyncio.wait_for(t.to_end(), STEP_TIMEOUT)
            await t.close()

        await bounded(4, [warm() for _ in range(self.p.sessions)])
        rss1, pss1 = memory_kib(peer.pid)
        n = self.p.sessions
        self.add(f"rss_session{suffix}", peer.name, (rss1 - rss0) / n / 1024)
        self.add(f"pss_session{suffix}", peer.name, (pss1 - pss0) / n / 1024)
        own = (rss_kib(peer.pid) - own0) / n / 1024
        new = [p for p in tree(peer.pid) if p not in before]
        self.note(f"rss_session{suffix}", peer.name, f"the daemon's own {own:.2f} MiB; new: {describe(new)}")
        if isinstance(peer, BridgePeer) and not suffix:
            # What [server] idle_timeout_s does to a session no client watches (600 s by
            # default; done here at once with POST …/stop, the same stop): its agent ends,
            # and the next prompt resumes the session (ACP session/load).
            await bounded(4, [peer.stop_thread(sid) for sid in sids])
            rss2, _ = memory_kib(peer.pid)
            self.add("rss_session_stopped", peer.name, (rss2 - rss0) / n / 1024)
            self.note("rss_session_stopped", peer.name, f"left: {describe(list(tree(peer.pid)))}")

    async def run(self) -> None:
        for p in self.peers:
            self.add("start_ready", p.name, await asyncio.wait_for(p.start(), STEP_TIMEOUT) * 1000)
        for r in range(self.p.runs):
            order = self.peers[r % 2 :] + self.peers[: r % 2]
            sids: dict[str, str] = {}
            for p in order:
                self.log(f"qwen-peer: run {r + 1}, {p.name}")
                sids[p.name] = await self.turn(p)
            for p in order:
                await self.restart(p, sids[p.name])
        for p in self.peers:
            self.log(f"qwen-peer: idle sessions, {p.name}")
            await self.idle_rss(p)
            if isinstance(p, BridgePeer):
                p.agent = "qwen-direct"
                await self.idle_rss(p, "_direct")
            else:  # one way to run it: compared with its one measurement
                for key in ("rss_session", "pss_session"):
                    self.add(f"{key}_direct", p.name, self.samples[key][p.name][-1])
                # (its sessions stay in its one ACP child: there is nothing to stop)
                self.add("rss_session_stopped", p.name, self.samples["rss_session"][p.name][-1])


# metric, label, unit, higher is better
ROWS: list[tuple[str, str, str, bool]] = [
    ("first_event", "1. prompt to first streamed text delta", "ms", False),
    ("first_in", "1a. of which: prompt to the model's request", "ms", False),
    ("first_out", "1b. of which: the model's request to the first delta", "ms", False),
    ("stream_rate", "2. streamed deltas/s to one client", "deltas/s", True),
    ("stream_turn", "2. the whole turn: prompt to turn end", "ms", False),
    ("cpu_daemon", "2. daemon CPU per 1000 deltas (its own process)", "s", False),
    ("cpu_agent", "2. agent CPU per 1000 deltas (the daemon's descendants)", "s", False),
    ("replay_rate", "3. replay of the finished thread to a new client", "events/s", True),
    ("replay_ms", "3. replay of the finished thread to a new client", "ms", False),
    ("replay_lean_rate", "3. the same, bridge with omit_raw=1", "events/s", True),
    ("replay_lean_ms", "3. the same, bridge with omit_raw=1", "ms", False),
    ("history_cold", "4. history of the finished turn, first call", "ms", False),
    ("history_warm", "4. history of the finished turn, second call", "ms", False),
    ("start_ready", "5. daemon first start: spawn to health answered", "ms", False),
    ("restart_ready", "5. daemon restart: spawn to health answered", "ms", False),
    ("history_restart", "5. history after the restart, first call", "ms", False),
    ("rss_session", "6. RSS per idle session (daemon + agents)", "MiB", False),
    ("pss_session", "6. PSS per idle session (daemon + agents)", "MiB", False),
    ("rss_session_direct", "6. the same, bridge running cli.js as qwen serve does", "MiB", False),
    ("pss_session_direct", "6. PSS, bridge running cli.js as qwen serve does", "MiB", False),
    ("rss_session_stopped", "6. RSS per idle session after the bridge's idle stop (qwen serve: row 6)", "MiB", False),
]


def table(samples: dict[str, dict[str, list[float]]], counts: dict[str, dict[str, Any]]) -> tuple[str, list[Any]]:
    out = [
        "| measure | unit | bridge | qwen serve | bridge ÷ qwen serve | bridge is |",
        "|---|---|---:|---:|---:|---|",
    ]
    rows = []
    for key, label, unit, higher in ROWS:
        if key not in samples:
            continue
        b, q = median(samples[key].get("bridge", [])), median(samples[key].get("qwen serve", []))
        ratio = b / q if b is not None and q else None
        ahead = None if ratio is None else (ratio >= 1 if higher else ratio <= 1)
        rows.append(
            {
                "metric": key,
                "label": label,
                "unit": unit,
                "higher_is_better": higher,
                "bridge": b,
                "qwen_serve": q,
                "bridge_over_qwen_serve": ratio,
                "bridge_ahead": ahead,
                "samples": samples[key],
                "counts": counts.get(key, {}),
            }
        )
        verdict = "" if ahead is None else ("ahead" if ahead else "**behind**")
        r = f"{ratio:.2f}×" if ratio is not None else "—"
        out.append(f"| {label} | {unit} | {fmt(b)} | {fmt(q)} | {r} | {verdict} |")
    return "\n".join(out), rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.qwen_peer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="smoke run: one run, small counts")
    ap.add_argument("--runs", type=int, help="runs per measurement (median reported)")
    ap.add_argument("--json", metavar="FILE", help="also write every sample and the table as JSON")
    ap.add_argument("--workdir", help="keep daemon data and logs here (default: a temp dir, removed)")
    args = ap.parse_args(argv)
    params = QUICK if args.quick else FULL
    if args.runs:
        params = Params(**{**asdict(params), "runs": args.runs})
    version = qwen_version()
    if version is None or not qwen_script("cli-entry.js").is_file():
        ap.error(f"{QWEN} is not installed under {npm_cache()} (.ci/run installs it; see tests/real/npm-pins.txt)")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    with contextlib.ExitStack() as stack:
        if args.workdir:
            workdir = Path(args.workdir).resolve()
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agent-bridge-qwen-peer-")))
        t0 = time.perf_counter()
        load = os.getloadavg()
        bench, requests = asyncio.run(run(params, workdir, log))
        elapsed = time.perf_counter() - t0
    head = {"qwen_code": version, "params": asdict(params), "elapsed_s": elapsed, "loadavg_at_start": load}
    report(bench, head, "quick" if args.quick else "full", requests, args.json)
    return 0


def report(bench: Bench, head: dict[str, Any], kind: str, requests: set[tuple[str, str]], path: str | None) -> None:
    """The table on stdout (and every sample in the JSON file ``path``)."""
    text, rows = table(bench.samples, bench.counts)
    load = " ".join(f"{x:.2f}" for x in head["loadavg_at_start"])
    print(
        f"agent-bridge vs qwen serve ({QWEN}@{head['qwen_code']}): {os.cpu_count()} CPUs, "
        f"medians of {bench.p.runs} runs ({kind}), {head['elapsed_s']:.0f}s"
    )
    print(f"params: {json.dumps(head['params'])}; load average at start: {load}")
    print(f"the fake model was asked for: {', '.join(f'{m} {p}' for m, p in sorted(requests))}")
    print()
    print(text)
    print()
    for key, *_ in ROWS:
        for peer, what in bench.counts.get(key, {}).items():
            print(f"* {key}, {peer}: {what}")
    if path:
        Path(path).write_text(json.dumps({**head, "rows": rows}, indent=2) + "\n")


async def run(params: Params, workdir: Path, log: Callable[[str], None]) -> tuple[Bench, set[tuple[str, str]]]:
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGINT):  # stop every daemon and agent on the way out
        asyncio.get_running_loop().add_signal_handler(sig, task.cancel)
    fake = FakeModel(workdir)
    await fake.start()
    peers: list[Peer] = []
    try:
        peers = [BridgePeer(workdir / "bridge", fake), QwenServePeer(workdir / "qwen-serve", fake)]
        bench = Bench(params, peers, fake, log)
        await bench.run()
        requests = await fake.requests()
    finally:
        stops: list[Awaitable[None]] = [p.stop() for p in peers]
        await asyncio.gather(*stops, return_exceptions=True)
        await fake.stop()
    if unexpected := requests - ALLOWED:
        raise RuntimeError(f"Qwen Code asked the fake model for more than the model: {sorted(unexpected)}")
    return bench, requests


if __name__ == "__main__":
    sys.exit(main())
