"""One command that measures agent-bridge against websocketd and the bare pipe, in the same
run, and prints a table of ratios (docs/benchmarks.md).

    python -m bench              # the full run (a few minutes)
    python -m bench --quick      # a smoke run (seconds); numbers are not meaningful

Every figure is the median over ``--runs`` runs, and the peers are interleaved run by run
(pipe, websocketd, bridge, rotated), so that load from anything else on the machine falls
on all of them alike. Only the ratios are meant to be compared across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import resource
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from bench.wsclient import Closed, WSClient

ROOT = Path(__file__).resolve().parent.parent
AGENTS = Path(__file__).resolve().parent / "agents"
FLOOD = AGENTS / "flood_agent.py"
ECHO = AGENTS / "echo_agent.py"
# The launch rules want an absolute, non-symlink executable.
PYTHON = os.path.realpath(sys.executable)
TOKEN = secrets.token_hex(16)  # a fresh token per bench run
HOST = "127.0.0.1"
STEP_TIMEOUT = 120.0
SECTION_TIMEOUT = 900.0  # a hang fails the run instead of stalling it

RESULT_MARK = b'"type":"result"'
TURN_END_MARK = b'"kind":"turn.ended"'
AGENT_MARK = b'"source":"agent"'

T = TypeVar("T")


@dataclass(frozen=True)
class Params:
    runs: int
    lines: int  # flood lines per throughput run
    line_bytes: int
    turns: int  # sequential echo turns per latency run
    threads: int  # concurrent threads
    thread_turns: int  # turns per concurrent thread
    replay_events: int
    cold_runs: int


FULL = Params(
    runs=5, lines=50_000, line_bytes=200, turns=1000, threads=100, thread_turns=20, replay_events=100_000, cold_runs=3
)
QUICK = Params(
    runs=1, lines=3_000, line_bytes=200, turns=50, threads=5, thread_turns=3, replay_events=3_000, cold_runs=1
)


# ---------------------------------------------------------------------- helpers


def user_line(text: str) -> str:
    """A stream-json user message, as the bridge itself would write it."""
    return json.dumps(
        {"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": text}]}},
        separators=(",", ":"),
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of the process itself (its children excluded), and of the
    bridge's store writer process if it has one (part of the daemon, not an agent)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    writer = store_writer(pid)
    return own + (cpu_s(writer) if writer is not None else 0.0)


def store_writer(pid: int) -> int | None:
    """The child of ``pid`` running ``bridge.store.writer`` (``[store] writer = "process"``)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            with contextlib.suppress(FileNotFoundError):
                if b"bridge.store.writer" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return int(child)
    return None


def pct(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s)) - 1))]


async def event_turns(ws: WSClient, n: int) -> list[float]:
    """Events mode: a warm-up prompt, then ``n`` prompts one after another, each timed from
    sending it to its ``turn.ended`` (seconds)."""
    await ws.send_text(json.dumps({"op": "prompt", "text": "warm up"}))
    await until(ws, TURN_END_MARK)
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        await ws.send_text(json.dumps({"op": "prompt", "text": f"turn {i}"}))
        await until(ws, TURN_END_MARK)
        times.append(time.perf_counter() - t0)
    return times


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


async def bounded(limit: int, coros: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    sem = asyncio.Semaphore(limit)

    async def one(c: Coroutine[Any, Any, T]) -> T:
        async with sem:
            return await c

    return list(await asyncio.gather(*(one(c) for c in coros)))


async def until(ws: WSClient, mark: bytes) -> int:
    """Read frames until one contains ``mark``; return how many frames arrived."""
    n = 0
    while True:
        batch = await ws.recv_batch()
        for i, frame in enumerate(batch):
            if mark in frame:
                ws.unread(batch[i + 1 :])
                return n + i + 1
        n += len(batch)


async def until_lines(ws: WSClient, mark: bytes) -> int:
    """Read frames until one contains ``mark``; return how many lines arrived (a frame of a
    ``coalesce=1`` client holds several, newline-separated)."""
    n = 0
    while True:
        batch = await ws.recv_batch()
        for i, frame in enumerate(batch):
            n += frame.count(b"\n") + 1
            if mark in frame:
                ws.unread(batch[i + 1 :])
                return n


class ServerExited(Exception):
    """The server process ended before it accepted a connection."""


async def connect_retry(
    port: int, path: str, headers: dict[str, str], deadline: float, proc: asyncio.subprocess.Process | None = None
) -> WSClient:
    """Connect as soon as the server accepts (start-up measurement): retry refused connects,
    and give up at once when ``proc`` (the server) has exited."""
    while True:
        try:
            return await WSClient.connect(HOST, port, path, headers)
        except (ConnectionError, OSError, Closed):
            if proc is not None and proc.returncode is not None:
                raise ServerExited(f"exit status {proc.returncode}") from None
            if time.perf_counter() > deadline:
                raise
            await asyncio.sleep(0.002)


def raise_nofile(want: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))


# ---------------------------------------------------------------------- peers


class Bridge:
    """``python -m bridge serve`` in a subprocess, with the bench agents as stream-json profiles."""

    def __init__(self, workdir: Path, env: dict[str, str] | None = None) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.env = env  # added to the bench's own environment (bench/replicas.py: the store)
        self.data = workdir / "data"
        self.config = workdir / "config.toml"
        profiles = ""
        for name, script in (("flood", FLOOD), ("echo", ECHO)):
            profiles += (
                f'[agents.{name}]\nprotocol = "stream-json"\nexecutable = {json.dumps(PYTHON)}\n'
                f"args = {json.dumps(['-I', str(script)])}\n\n"
            )
        self.config.write_text(
            "[server]\nmax_conversations = 512\nidle_timeout_s = 3600\n"
            "stop_grace_s = 1\nmax_pending_prompts = 64\n\n" + profiles
        )
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0
        self._drain: asyncio.Task[None] | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKEN}"}

    async def start(self, port: int = 0) -> None:
        err = (self.dir / "daemon.stderr").open("ab")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bridge",
            "serve",
            "--port",
            str(port),
            "--config",
            str(self.config),
            "--data-dir",
            str(self.data),
            "--token",
            TOKEN,
            "--log-format",
            "json",
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            cwd=str(ROOT),
            env=None if self.env is None else {**os.environ, **self.env},
        )
        err.close()
        if port:
            self.port = port
        else:
            assert self.proc.stdout is not None
            line = (await asyncio.wait_for(self.proc.stdout.readline(), 30)).decode()
            if not line.startswith("agent-bridge listening on http://"):
                raise RuntimeError(f"daemon did not start: {line!r}; see {self.dir / 'daemon.stderr'}")
            self.port = int(line.rsplit(":", 1)[1])
        self._drain = asyncio.create_task(self._drain_stdout())

    async def _drain_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while await self.proc.stdout.read(65536):
            pass

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=f"http://{HOST}:{self.port}", headers=self.headers, timeout=STEP_TIMEOUT)

    async def new_thread(self, http: httpx.AsyncClient, agent: str) -> str:
        r = await http.post("/v1/threads", json={"agent": agent})
        r.raise_for_status()
        return str(r.json()["id"])

    async def last_seq(self, http: httpx.AsyncClient, thread_id: str) -> int:
        r = await http.get(f"/v1/threads/{thread_id}")
        r.raise_for_status()
        return int(r.json()["last_seq"])

    async def ws(self, thread_id: str, *, mode: str = "events", after: int | None = None, query: str = "") -> WSClient:
        q = f"?mode={mode}" + (f"&after={after}" if after is not None else "") + query
        return await WSClient.connect(HOST, self.port, f"/v1/threads/{thread_id}/ws{q}", self.headers)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self._drain is not None:
            self._drain.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._drain


class Websocketd:
    """websocketd relaying one bench agent: one agent process per WebSocket connection."""

    def __init__(self, script: Path, workdir: Path) -> None:
        self.script = script
        self.dir = workdir
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0

    async def start(self) -> float:
        """Start it; returns the seconds from spawn to the first accepted WebSocket. The port
        is picked free just before the spawn; should another process take it meanwhile,
        websocketd exits and is started again on another (at most three times)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(3):
            self.port = free_port()
            err = (self.dir / f"websocketd-{self.script.stem}.stderr").open("ab")
            t0 = time.perf_counter()
            self.proc = await asyncio.create_subprocess_exec(
                shutil.which("websocketd") or "websocketd",
                f"--port={self.port}",
                f"--address={HOST}",
                "--loglevel=error",
                PYTHON,
                "-I",
                str(self.script),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=err,
            )
            err.close()
            try:
                ws = await connect_retry(self.port, "/", {}, t0 + 30, self.proc)
            except ServerExited:
                if attempt == 2:
                    raise
                continue
            elapsed = time.perf_counter() - t0
            await ws.close()
            return elapsed
        raise AssertionError("unreachable")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def ws(self) -> WSClient:
        return await WSClient.connect(HOST, self.port, "/")

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


class PipeAgent:
    """The physical limit: the agent's own pipes, read and written directly."""

    def __init__(self, script: Path) -> None:
        self.proc = subprocess.Popen([PYTHON, "-I", str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin = self.proc.stdin
        self.stdout = self.proc.stdout

    def send(self, text: str) -> None:
        self.stdin.write((user_line(text) + "\n").encode())
        self.stdin.flush()

    def until_result(self) -> int:
        n = 0
        for line in self.stdout:
            n += 1
            if RESULT_MARK in line:
                return n
        raise RuntimeError("agent exited")

    def close(self) -> None:
        self.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------------- measurements


class Bench:
    def __init__(self, params: Params, workdir: Path, *, peers: bool, log: Callable[[str], None]) -> None:
        self.p = params
        self.dir = workdir
        self.peers = peers  # websocketd available and wanted
        self.log = log
        self.samples: dict[str, dict[str, list[float]]] = {}
        self.bridge = Bridge(workdir / "bridge")
        self.wsd_flood = Websocketd(FLOOD, workdir / "websocketd")
        self.wsd_echo = Websocketd(ECHO, workdir / "websocketd")

    def add(self, metric: str, peer: str, value: float) -> None:
        self.samples.setdefault(metric, {}).setdefault(peer, []).append(value)

    async def interleave(self, runs: int, jobs: dict[str, Callable[[], Awaitable[None]]]) -> None:
        names = [n for n in jobs if self.peers or not n.startswith("websocketd")]
        for r in range(runs):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                await jobs[name]()

    # -- 1 & 2: single-thread throughput ------------------------------------------------

    async def throughput(self, http: httpx.AsyncClient) -> None:
        """Rows 1 and 2: ``stream_event`` deltas and ``assistant`` messages of the same size,
        raw and events mode; and raw mode with ``coalesce=1`` (stream_event lines)."""
        n, size = self.p.lines, self.p.line_bytes
        threads = {name: await self.bridge.new_thread(http, "flood") for name in ("raw", "events", "coalesce")}
        cpu_line: list[float] = []  # the last flood's relay CPU per line, µs (timed_flood)

        def pipe_run(prompt: str) -> float:
            agent = PipeAgent(FLOOD)
            agent.send("flood 1")
            agent.until_result()
            t0 = time.perf_counter()
            agent.send(prompt)
            lines = agent.until_result()
            dt = time.perf_counter() - t0
            agent.close()
            assert lines == n + 2, lines
            return n / dt

        async def timed_flood(ws: WSClient, warm_up: str, flood: str, mark: bytes, pid: int) -> tuple[int, float]:
            """A warm-up turn (it starts the agent), then the flood: lines up to ``mark``
            (a coalesced frame holds several) and the seconds from sending it. The relay's
            own CPU over the flood (process ``pid``, its agent left out: cpu_s counts the
            process itself, and the bridge's store writer) goes in ``cpu_line``."""
            await ws.send_text(warm_up)
            await until(ws, mark)
            c0 = cpu_s(pid)
            t0 = time.perf_counter()
            await ws.send_text(flood)
            lines = await until_lines(ws, mark)
            dt = time.perf_counter() - t0
            cpu_line.append((cpu_s(pid) - c0) / n * 1e6)
            await ws.close()
            return lines, dt

        def shape_jobs(shape: str) -> dict[str, Callable[[], Awaitable[None]]]:
            prompt = f"flood {n} {size}" + (" assistant" if shape == "assistant" else "")
            suffix = "_asst" if shape == "assistant" else ""

            async def pipe() -> None:
                self.add("tput_raw" + suffix, "pipe", pipe_run(prompt))

            async def websocketd() -> None:
                ws = await self.wsd_flood.ws()
                lines, dt = await timed_flood(
                    ws, user_line("flood 1"), user_line(prompt), RESULT_MARK, self.wsd_flood.pid
                )
                assert lines == n + 2, lines
                self.add("tput_raw" + suffix, "websocketd", n / dt)
                self.add("cpu_line_raw" + suffix, "websocketd", cpu_line.pop())

            async def bridge_raw(metric: str = "tput_raw" + suffix, thread: str = "raw", q: str = "") -> None:
                tid = threads[thread]
                ws = await self.bridge.ws(tid, mode="raw", after=await self.bridge.last_seq(http, tid), query=q)
                lines, dt = await timed_flood(ws, user_line("flood 1"), user_line(prompt), RESULT_MARK, self.bridge.pid)
                assert lines == n + 2, lines
                self.add(metric, "bridge", n / dt)
                self.add(metric.replace("tput_", "cpu_line_"), "bridge", cpu_line.pop())

            async def bridge_events() -> None:
                tid = threads["events"]
                ws = await self.bridge.ws(tid, after=await self.bridge.last_seq(http, tid))
                lines, dt = await timed_flood(
                    ws,
                    json.dumps({"op": "prompt", "text": "flood 1"}),
                    json.dumps({"op": "prompt", "text": prompt}),
                    TURN_END_MARK,
                    self.bridge.pid,
                )
                assert lines >= n, lines
                self.add("tput_events" + suffix, "bridge", n / dt)
                self.add("cpu_line_events" + suffix, "bridge", cpu_line.pop())

            jobs = {"pipe": pipe, "websocketd": websocketd, "bridge": bridge_raw, "bridge_events": bridge_events}
            if shape == "stream_event":
                jobs["bridge_coalesce"] = lambda: bridge_raw("tput_raw_coalesce", "coalesce", "&coalesce=1")
            return {f"{name}{suffix}": job for name, job in jobs.items()}

        await self.interleave(self.p.runs, {**shape_jobs("stream_event"), **shape_jobs("assistant")})
        # Events mode and coalescing are compared with the same websocketd and pipe runs
        # (websocketd has no coalescing: one line per frame).
        for metric, of in (
            ("tput_events", "tput_raw"),
            ("tput_events_asst", "tput_raw_asst"),
            ("tput_raw_coalesce", "tput_raw"),
            ("cpu_line_events", "cpu_line_raw"),
            ("cpu_line_events_asst", "cpu_line_raw_asst"),
            ("cpu_line_raw_coalesce", "cpu_line_raw"),
        ):
            for peer in ("websocketd", "pipe"):
                if peer in self.samples.get(of, {}):
                    self.samples[metric][peer] = self.samples[of][peer]

    # -- 3: sequential round trips ------------------------------------------------------

    async def latency(self, http: httpx.AsyncClient) -> None:
        turns = self.p.turns
        raw_thread = await self.bridge.new_thread(http, "echo")
        ev_thread = await self.bridge.new_thread(http, "echo")

        def record(metric: str, peer: str, times: list[float]) -> None:
            self.add(f"{metric}_p50", peer, pct(times, 50) * 1000)
            self.add(f"{metric}_p99", peer, pct(times, 99) * 1000)

        async def pipe() -> None:
            agent = PipeAgent(ECHO)
            agent.send("warm up")
            agent.until_result()
            times = []
            for i in range(turns):
                t0 = time.perf_counter()
                agent.send(f"turn {i}")
                agent.until_result()
                times.append(time.perf_counter() - t0)
            agent.close()
            record("lat_raw", "pipe", times)
            record("lat_events", "pipe", times)

        async def lines_over(ws: WSClient, peer: str, metric: str) -> None:
            await ws.send_text(user_line("warm up"))
            await until(ws, RESULT_MARK)
            times = []
            for i in range(turns):
                t0 = time.perf_counter()
                await ws.send_text(user_line(f"turn {i}"))
                await until(ws, RESULT_MARK)
                times.append(time.perf_counter() - t0)
            await ws.close()
            record(metric, peer, times)

        async def websocketd() -> None:
            times_ws = await self.wsd_echo.ws()
            await lines_over(times_ws, "websocketd", "lat_raw")
            for q in ("p50", "p99"):
                self.add(f"lat_events_{q}", "websocketd", self.samples[f"lat_raw_{q}"]["websocketd"][-1])

        async def bridge_raw() -> None:
            ws = await self.bridge.ws(raw_thread, mode="raw", after=await self.bridge.last_seq(http, raw_thread))
            await lines_over(ws, "bridge", "lat_raw")

        async def bridge_events() -> None:
            ws = await self.bridge.ws(ev_thread, after=await self.bridge.last_seq(http, ev_thread))
            times = await event_turns(ws, turns)
            await ws.close()
            record("lat_events", "bridge", times)

        await self.interleave(
            self.p.runs, {"pipe": pipe, "websocketd": websocketd, "bridge": bridge_raw, "bridge_events": bridge_events}
        )

    # -- 4: many concurrent threads -----------------------------------------------------

    async def concurrency(self) -> None:
        n, turns = self.p.threads, self.p.thread_turns
        raise_nofile(max(4096, n * 16 + 256))

        async def drive(
            conns: list[WSClient], send: Callable[[WSClient, int], Awaitable[None]], mark: bytes, pid: int
        ) -> tuple[float, float, int, float]:
            lat: list[float] = []
            frames = [0]

            async def one(ws: WSClient) -> None:
                for i in range(turns):
                    t0 = time.perf_counter()
                    await send(ws, i)
                    while True:
                        batch = await ws.recv_batch()
                        end = next((k for k, f in enumerate(batch) if mark in f), None)
                        if end is not None:
                            ws.unread(batch[end + 1 :])
                            batch = batch[: end + 1]
                        frames[0] += sum(1 for f in batch if not f.startswith(b'{"seq":null'))
                        if end is not None:
                            break
                    lat.append(time.perf_counter() - t0)

            c0 = cpu_s(pid)
            t0 = time.perf_counter()
            await asyncio.gather(*(one(ws) for ws in conns))
            dt = time.perf_counter() - t0
            return dt, cpu_s(pid) - c0, frames[0], pct(lat, 99) * 1000

        def record(peer: str, rss0: int, rss1: int, dt: float, cpu: float, events: int, p99: float) -> None:
            self.add("conc_turns_s", peer, n * turns / dt)
            self.add("conc_events_s", peer, events / dt)
            self.add("conc_p99", peer, p99)
            self.add("conc_rss_thread", peer, (rss1 - rss0) / n / 1024)
            self.add("conc_cpu_1k_events", peer, cpu / events * 1000)
            self.add("conc_cpu_1k_turns", peer, cpu / (n * turns) * 1000)

        async def bridge() -> None:
            b = Bridge(self.dir / "bridge-conc")
            await b.start()
            try:
                async with b.http() as http:
                    rss0 = rss_kib(b.pid)
                    ids = await bounded(20, [b.new_thread(http, "echo") for _ in range(n)])
                    conns = await bounded(20, [b.ws(t) for t in ids])

                    async def prompt(ws: WSClient, i: int) -> None:
                        await ws.send_text(json.dumps({"op": "prompt", "text": f"turn {i}"}))

                    async def warm(ws: WSClient) -> None:
                        await prompt(ws, -1)
                        await until(ws, TURN_END_MARK)

                    await bounded(20, [warm(ws) for ws in conns])  # every agent started, then idle
                    rss1 = rss_kib(b.pid)
                    dt, cpu, events, p99 = await drive(conns, prompt, TURN_END_MARK, b.pid)
                    record("bridge", rss0, rss1, dt, cpu, events, p99)
                    await asyncio.gather(*(ws.close() for ws in conns))
            finally:
                await b.stop()

        async def websocketd() -> None:
            w = Websocketd(ECHO, self.dir / "websocketd")
            await w.start()
            try:
                rss0 = rss_kib(w.pid)
                conns = await bounded(20, [w.ws() for _ in range(n)])

                async def prompt(ws: WSClient, i: int) -> None:
                    await ws.send_text(user_line(f"turn {i}"))

                async def warm(ws: WSClient) -> None:
                    await prompt(ws, -1)
                    await until(ws, RESULT_MARK)

                await bounded(20, [warm(ws) for ws in conns])
                rss1 = rss_kib(w.pid)
                dt, cpu, events, p99 = await drive(conns, prompt, RESULT_MARK, w.pid)
                record("websocketd", rss0, rss1, dt, cpu, events, p99)
                await asyncio.gather(*(ws.close() for ws in conns))
            finally:
                await w.stop()

        await self.interleave(max(1, min(self.p.runs, 3)), {"websocketd": websocketd, "bridge": bridge})

    # -- 5: replay ----------------------------------------------------------------------

    async def replay(self, http: httpx.AsyncClient) -> None:
        tid = await self.bridge.new_thread(http, "flood")
        ws = await self.bridge.ws(tid)
        await ws.send_text(json.dumps({"op": "prompt", "text": f"flood {self.p.replay_events} {self.p.line_bytes}"}))
        await until(ws, TURN_END_MARK)
        await ws.close()
        last = await self.bridge.last_seq(http, tid)

        async def bridge() -> None:
            t0 = time.perf_counter()
            ws = await self.bridge.ws(tid, after=0)
            got = 0
            while got < last:
                got += len(await ws.recv_batch())
            dt = time.perf_counter() - t0
            await ws.close()
            self.add("replay", "bridge", last / dt)

        await self.interleave(self.p.runs, {"bridge": bridge})

    # -- 6: cold start ------------------------------------------------------------------

    async def cold_start(self) -> None:
        prep = Bridge(self.dir / "bridge-cold")
        await prep.start()
        async with prep.http() as http:
            tid = await prep.new_thread(http, "echo")
        await prep.stop()
        seen = [1]  # process.exited events of earlier runs; start after them

        async def last_seq(b: Bridge) -> int:
            async with b.http() as http:
                return await b.last_seq(http, tid)

        async def bridge() -> None:
            b = Bridge(self.dir / "bridge-cold")
            port = free_port()
            t0 = time.perf_counter()
            await b.start(port)
            try:
                # ``after`` far ahead of the transcript: nothing is replayed before the first frame.
                ws = await connect_retry(
                    port, f"/v1/threads/{tid}/ws?after={seen[0] + 10_000}", b.headers, t0 + 30, b.proc
                )
                self.add("cold_serve", "bridge", (time.perf_counter() - t0) * 1000)
                await ws.close()
                ws = await b.ws(tid, after=await last_seq(b))
                t1 = time.perf_counter()
                await ws.send_text(json.dumps({"op": "prompt", "text": "hello"}))
                await until(ws, AGENT_MARK)
                self.add("cold_prompt", "bridge", (time.perf_counter() - t1) * 1000)
                await until(ws, TURN_END_MARK)
                await ws.close()
                seen[0] = await last_seq(b)
            finally:
                await b.stop()

        async def websocketd() -> None:
            w = Websocketd(ECHO, self.dir / "websocketd")
            self.add("cold_serve", "websocketd", await w.start() * 1000)
            try:
                t1 = time.perf_counter()
                ws = await w.ws()  # websocketd spawns the agent per connection
                await ws.send_text(user_line("hello"))
                await ws.recv_batch()
                self.add("cold_prompt", "websocketd", (time.perf_counter() - t1) * 1000)
                await ws.close()
            finally:
                await w.stop()

        async def pipe() -> None:
            t1 = time.perf_counter()
            agent = PipeAgent(ECHO)
            agent.send("hello")
            agent.stdout.readline()
            self.add("cold_prompt", "pipe", (time.perf_counter() - t1) * 1000)
            agent.close()

        await self.interleave(self.p.cold_runs, {"pipe": pipe, "websocketd": websocketd, "bridge": bridge})

    # ----------------------------------------------------------------------------------

    async def run(self, sections: set[str]) -> None:
        try:
            if self.peers:
                await self.wsd_flood.start()
                await self.wsd_echo.start()
            await self.bridge.start()
            async with self.bridge.http() as http:
                jobs: tuple[tuple[str, Callable[[], Awaitable[None]]], ...] = (
                    ("throughput", lambda: self.throughput(http)),
                    ("latency", lambda: self.latency(http)),
                    ("replay", lambda: self.replay(http)),
                )
                for name, job in jobs:
                    if name in sections:
                        self.log(f"bench: {name}")
                        t = time.perf_counter()
                        await asyncio.wait_for(job(), SECTION_TIMEOUT)
                        self.log(f"bench: {name} done in {time.perf_counter() - t:.1f}s")
        finally:
            await self.bridge.stop()
            await self.wsd_flood.stop()
            await self.wsd_echo.stop()
        for name, job2 in (("concurrency", self.concurrency), ("cold", self.cold_start)):
            if name in sections:
                self.log(f"bench: {name}")
                t = time.perf_counter()
                await asyncio.wait_for(job2(), SECTION_TIMEOUT)
                self.log(f"bench: {name} done in {time.perf_counter() - t:.1f}s")


# ---------------------------------------------------------------------- the table

# metric, label, unit, higher is better, goal (ratio to websocketd, or absolute), goal text.
# The goals are issue #22's (docs/benchmarks.md "Goals").
ROWS: list[tuple[str, str, str, bool, tuple[str, float] | None]] = [
    ("tput_raw", "1. throughput, raw mode", "lines/s", True, ("ws", 1.0)),
    ("tput_events", "2. throughput, events mode + transcript", "lines/s", True, ("ws", 0.7)),
    ("tput_raw_asst", "1b. throughput, raw mode, assistant lines", "lines/s", True, ("ws", 1.0)),
    ("tput_events_asst", "2b. throughput, events mode + transcript, assistant lines", "lines/s", True, ("ws", 0.7)),
    ("tput_raw_coalesce", "1c. throughput, raw mode, coalesce=1 (websocketd: no coalescing)", "lines/s", True, None),
    ("cpu_line_raw", "1. daemon CPU per streamed line, raw mode", "µs", False, ("ws", 3.0)),
    ("cpu_line_events", "2. daemon CPU per streamed line, events mode + transcript", "µs", False, None),
    ("cpu_line_raw_asst", "1b. daemon CPU per streamed line, raw mode, assistant lines", "µs", False, None),
    ("cpu_line_events_asst", "2b. daemon CPU per streamed line, events + transcript, assistant", "µs", False, None),
    ("cpu_line_raw_coalesce", "1c. daemon CPU per streamed line, raw mode, coalesce=1", "µs", False, None),
    ("lat_raw_p50", "3. round trip p50, raw mode", "ms", False, ("ws", 1.5)),
    ("lat_raw_p99", "3. round trip p99, raw mode", "ms", False, ("ws", 2.0)),
    ("lat_events_p50", "3. round trip p50, events mode", "ms", False, ("ws", 1.5)),
    ("lat_events_p99", "3. round trip p99, events mode", "ms", False, ("ws", 2.0)),
    ("conc_turns_s", "4. concurrent threads: turns/s", "turns/s", True, None),
    ("conc_events_s", "4. concurrent threads: frames/s", "frames/s", True, None),
    ("conc_p99", "4. concurrent threads: round trip p99", "ms", False, None),
    ("conc_rss_thread", "4. daemon RSS per idle thread", "MiB", False, ("abs", 1.0)),
    ("conc_cpu_1k_events", "4. daemon CPU per 1000 frames", "s", False, None),
    ("conc_cpu_1k_turns", "4. daemon CPU per 1000 turns", "s", False, ("ws", 3.0)),
    ("replay", "5. replay after=0", "events/s", True, ("abs", 300_000.0)),
    ("cold_serve", "6. cold start: spawn to first WebSocket", "ms", False, None),
    ("cold_prompt", "6. cold start: prompt to first agent event", "ms", False, None),
]


def fmt(v: float | None) -> str:
    if v is None:
        return "—"
    if v >= 1000:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def table(samples: dict[str, dict[str, list[float]]]) -> tuple[str, list[dict[str, Any]]]:
    out = [
        "| measure | unit | bridge | websocketd | pipe | bridge ÷ websocketd | bridge ÷ pipe | goal | met |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    rows = []
    for key, label, unit, higher, goal in ROWS:
        if key not in samples:
            continue
        m = {peer: median(v) for peer, v in samples[key].items()}
        b, w, p = m.get("bridge"), m.get("websocketd"), m.get("pipe")
        rw = b / w if b is not None and w else None
        rp = b / p if b is not None and p else None
        goal_text, met = "", None
        if goal is not None:
            kind, x = goal
            if kind == "ws":
                goal_text = f"{'≥' if higher else '≤'} {x:g}× websocketd"
                met = None if rw is None else (rw >= x if higher else rw <= x)
            else:
                goal_text = f"{'≥' if higher else '≤'} {fmt(x)} {unit}"
                met = None if b is None else (b >= x if higher else b <= x)
        rows.append(
            {
                "metric": key,
                "label": label,
                "unit": unit,
                "bridge": b,
                "websocketd": w,
                "pipe": p,
                "bridge_over_websocketd": rw,
                "bridge_over_pipe": rp,
                "goal": goal_text,
                "met": met,
                "samples": samples[key],
            }
        )
        mark = "" if met is None else ("yes" if met else "**no**")
        ratio_w = f"{rw:.2f}×" if rw is not None else "—"
        ratio_p = f"{rp:.3f}×" if rp is not None else "—"
        out.append(
            f"| {label} | {unit} | {fmt(b)} | {fmt(w)} | {fmt(p)} | {ratio_w} | {ratio_p} | {goal_text} | {mark} |"
        )
    return "\n".join(out), rows


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    wsd = None
    if exe := shutil.which("websocketd"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            wsd = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout.strip() or None
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "websocketd": wsd,
        "loadavg_at_start": os.getloadavg(),
    }


SECTIONS = ("throughput", "latency", "concurrency", "replay", "cold")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="smoke run: one run, small counts")
    ap.add_argument("--runs", type=int, help="runs per measurement (median reported)")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    ap.add_argument("--no-websocketd", action="store_true", help="bridge and pipe only (no peer ratios)")
    ap.add_argument("--json", metavar="FILE", help="also write every sample and the table as JSON")
    ap.add_argument("--workdir", help="keep daemon data and logs here (default: a temp dir, removed)")
    args = ap.parse_args(argv)
    params = QUICK if args.quick else FULL
    if args.runs:
        params = Params(**{**asdict(params), "runs": args.runs, "cold_runs": args.runs})
    sections = {s.strip() for s in args.only.split(",") if s.strip()}
    if unknown := sections - set(SECTIONS):
        ap.error(f"unknown sections: {', '.join(sorted(unknown))}")
    peers = not args.no_websocketd
    if peers and shutil.which("websocketd") is None:
        ap.error("websocketd is not on PATH (apt-get install websocketd), or pass --no-websocketd")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    info = machine()
    with contextlib.ExitStack() as stack:
        if args.workdir:
            workdir = Path(args.workdir).resolve()
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agent-bridge-bench-")))
        bench = Bench(params, workdir, peers=peers, log=log)
        t0 = time.perf_counter()
        asyncio.run(bench.run(sections))
        elapsed = time.perf_counter() - t0
    text, rows = table(bench.samples)
    print(
        f"agent-bridge bench: {info['nproc']} CPUs ({info['cpu']}), Python {info['python']}, "
        f"{info['websocketd'] or 'no websocketd'}; medians of {params.runs} runs "
        f"({'quick' if args.quick else 'full'}), {elapsed:.0f}s"
    )
    print(
        f"params: {json.dumps(asdict(params))}; load average at start: "
        f"{' '.join(f'{x:.2f}' for x in info['loadavg_at_start'])}"
    )
    print()
    print(text)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"machine": info, "params": asdict(params), "elapsed_s": elapsed, "rows": rows}, indent=2) + "\n"
        )
    return 0
