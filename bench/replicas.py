"""Scale-out on one machine: aggregate turns/s and frames/s of one replica against two
replicas sharing one real PostgreSQL store and Redis bus, and of one replica on PostgreSQL
against the embedded SQLite store, measured in the same run (docs/benchmarks.md
"Replicas").

    .venv/bin/python -m bench.replicas            # the full run (a few minutes)
    .venv/bin/python -m bench.replicas --quick    # a smoke run (seconds); numbers not meaningful

The bench starts its own PostgreSQL (``initdb`` in a temp dir, a free port) and redis-server
(a free port) with the test suite's helpers (tests/support), never a system service; each
configuration gets a fresh database. The workload is the concurrent-threads one of
``python -m bench``: N threads, each with its own echo agent and WebSocket in events mode,
one warm-up turn each, then T turns each, all at once. With two replicas each creates and
drives half of the threads, its clients connected to it (the thread's owner). The
configurations are interleaved run by run and the median reported; only the ratios mean
anything, and on a 2-core machine the agents, PostgreSQL and this client share the cores
with the daemons, so two replicas cannot be twice one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.run import (
    TURN_END_MARK,
    Bridge,
    bounded,
    cpu_s,
    fmt,
    machine,
    median,
    pct,
    raise_nofile,
)
from bench.wsclient import WSClient

CONFIGS = ("sqlite_1", "pg_1", "pg_2")
LABELS = {"sqlite_1": "SQLite ×1", "pg_1": "PostgreSQL ×1", "pg_2": "PostgreSQL ×2"}
SECTION_TIMEOUT = 900.0


@dataclass(frozen=True)
class Params:
    runs: int
    threads: int  # in all, split evenly over the replicas
    turns: int  # per thread


FULL = Params(runs=3, threads=100, turns=20)
QUICK = Params(runs=1, threads=4, turns=3)
CROSS_TURNS = {False: 200, True: 5}  # turns of the cross-replica latency run (full, quick)
SEQ = re.compile(rb'^\{"seq":(\d+),')


@dataclass
class Services:
    """The shared PostgreSQL server and Redis the replicas use."""

    pg: Any  # tests.support.postgres.Postgres
    redis_url: str
    databases: int = 0

    @property
    def postmaster(self) -> int:
        return int((self.pg.data / "postmaster.pid").read_text().split()[0])

    def fresh_database(self) -> str:
        self.databases += 1
        return str(self.pg.create_database(f"bench_{self.databases}"))


@contextlib.contextmanager
def services(workdir: Path) -> Iterator[Services]:
    """A PostgreSQL server and a redis-server of the bench's own, stopped afterwards."""
    from tests.support import postgres
    from tests.support.redis_server import RedisServer

    reason = postgres.missing_reason()
    if reason:
        raise SystemExit(f"bench.replicas: {reason}")
    redis = RedisServer(workdir / "redis")
    redis.start()
    try:
        with postgres.running() as pg:
            yield Services(pg, redis.url)
    finally:
        redis.stop()


def self_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def children_cpu(parents: set[int]) -> dict[int, float]:
    """CPU seconds of every live process whose parent is in ``parents``, by pid: the
    daemons' agents, the PostgreSQL server's backends."""
    out: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) in parents:
            out[int(stat.parent.name)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU spent between two :func:`children_cpu` readings (a process born meanwhile counts
    from zero; one that ended meanwhile is not counted)."""
    return sum(v - before.get(pid, 0.0) for pid, v in after.items())


@dataclass
class Measured:
    """One configuration run: wall seconds and CPU seconds of each party."""

    wall: float
    daemons: float
    client: float
    agents: float
    postgres: float | None  # None: no PostgreSQL in this configuration
    frames: int
    latencies: list[float]


class Bench:
    def __init__(self, params: Params, workdir: Path, svc: Services, log: Any) -> None:
        self.p = params
        self.dir = workdir
        self.svc = svc
        self.log = log
        self.samples: dict[str, dict[str, list[float]]] = {}
        self.runs = 0

    def add(self, metric: str, config: str, value: float) -> None:
        self.samples.setdefault(metric, {}).setdefault(config, []).append(value)

    def replicas_for(self, config: str) -> list[Bridge]:
        self.runs += 1
        base = self.dir / f"{config}-{self.runs}"
        if config == "sqlite_1":
            return [Bridge(base / "a")]
        env = {"AGENT_BRIDGE_STORE_URL": self.svc.fresh_database(), "AGENT_BRIDGE_BUS_URL": self.svc.redis_url}
        count = 2 if config == "pg_2" else 1
        return [Bridge(base / rid, {**env, "AGENT_BRIDGE_REPLICA_ID": rid}) for rid in ("a", "b")[:count]]

    async def one(self, config: str) -> None:
        """One run of ``config``: start its replicas, warm every thread up, drive them all."""
        replicas = self.replicas_for(config)
        conns: list[WSClient] = []
        try:
            for b in replicas:
                await b.start()
            # Thread i is made on replica i mod n, and its client talks to that replica.
            conns = await bounded(20, [open_thread(replicas[i % len(replicas)]) for i in range(self.p.threads)])
            await bounded(20, [turn(ws, -1) for ws in conns])  # every agent started, then idle
            self.record(config, await self.measure(replicas, conns, pg=config != "sqlite_1"))
        finally:
            await asyncio.gather(*(ws.close() for ws in conns), return_exceptions=True)
            for b in replicas:
                await b.stop()

    async def measure(self, replicas: list[Bridge], conns: list[WSClient], *, pg: bool) -> Measured:
        """Every thread's T turns at once, and the CPU each party spent meanwhile."""
        daemons, postmaster = {b.pid for b in replicas}, {self.svc.postmaster} if pg else set()
        cpu0 = [cpu_s(b.pid) for b in replicas]
        agents0, pg0 = children_cpu(daemons), children_cpu(postmaster)
        me0, t0 = self_cpu_s(), time.perf_counter()
        results = await asyncio.gather(*(self.drive(ws) for ws in conns))
        return Measured(
            wall=time.perf_counter() - t0,
            daemons=sum(cpu_s(b.pid) - c for b, c in zip(replicas, cpu0, strict=True)),
            client=self_cpu_s() - me0,
            agents=spent(agents0, children_cpu(daemons)),
            postgres=spent(pg0, children_cpu(postmaster)) if pg else None,
            frames=sum(n for n, _ in results),
            latencies=[x for _, times in results for x in times],
        )

    def record(self, config: str, m: Measured) -> None:
        turns, dt = self.p.threads * self.p.turns, m.wall
        self.add("turns_s", config, turns / dt)
        self.add("frames_s", config, m.frames / dt)
        self.add("p99", config, pct(m.latencies, 99) * 1000)
        self.add("daemon_cores", config, m.daemons / dt)
        self.add("daemon_cpu_1k_turns", config, m.daemons / turns * 1000)
        self.add("client_cores", config, m.client / dt)
        self.add("agent_cores", config, m.agents / dt)
        if m.postgres is not None:
            self.add("pg_cores", config, m.postgres / dt)
        self.add("all_cores", config, (m.daemons + m.client + m.agents + (m.postgres or 0.0)) / dt)

    async def drive(self, ws: WSClient) -> tuple[int, list[float]]:
        """T turns on one thread: (transcript frames received, round trip of each turn)."""
        frames, times = 0, []
        for i in range(self.p.turns):
            t0 = time.perf_counter()
            frames += await turn(ws, i)
            times.append(time.perf_counter() - t0)
        return frames, times

    async def cross(self, turns: int) -> None:
        """Cross-replica latency: one thread run by replica a, three clients — two on a,
        one on b — and for every event, when it reached each, measured from the first of
        a's two clients to hold it. b's delay is the owner's commit → announcement → b's
        read of the store → b's send; the spread between a's two clients is the
        same-replica baseline (this client's own reading of three sockets is in both)."""
        replicas = self.replicas_for("pg_2")
        conns: list[WSClient] = []
        try:
            for b in replicas:
                await b.start()
            a, b = replicas
            async with a.http() as http:
                tid = await a.new_thread(http, "echo")
            conns = [await a.ws(tid), await a.ws(tid), await b.ws(tid)]
            owner, same, other = conns
            await turn(owner, -1)
            for ws in (same, other):
                await arrivals(ws)  # the warm-up turn's frames
            for i in range(turns):
                await owner.send_text(json.dumps({"op": "prompt", "text": f"turn {i}"}))
                at_a, at_same, at_b = await asyncio.gather(arrivals(owner), arrivals(same), arrivals(other))
                for seq, t in at_a.items():
                    if seq not in at_same or seq not in at_b:
                        continue
                    # From the first of the owner's two clients to hold the event: the
                    # spread between those two is the same-replica baseline.
                    first = min(t, at_same[seq])
                    self.add("cross_same_ms", "pg_2", (max(t, at_same[seq]) - first) * 1000)
                    self.add("cross_other_ms", "pg_2", (at_b[seq] - first) * 1000)
        finally:
            await asyncio.gather(*(ws.close() for ws in conns), return_exceptions=True)
            for b in replicas:
                await b.stop()

    async def run(self) -> None:
        raise_nofile(max(4096, self.p.threads * 16 + 256))
        for r in range(self.p.runs):
            order = CONFIGS[r % len(CONFIGS) :] + CONFIGS[: r % len(CONFIGS)]
            for config in order:
                self.log(f"bench.replicas: run {r + 1}/{self.p.runs}: {config}")
                await asyncio.wait_for(self.one(config), SECTION_TIMEOUT)


async def arrivals(ws: WSClient) -> dict[int, float]:
    """Every transcript frame up to the next ``turn.ended``: when each seq arrived."""
    out: dict[int, float] = {}
    while True:
        batch = await ws.recv_batch()
        now = time.perf_counter()
        for k, f in enumerate(batch):
            m = SEQ.match(f)
            if m:
                out[int(m.group(1))] = now
            if TURN_END_MARK in f:
                ws.unread(batch[k + 1 :])
                return out


async def open_thread(b: Bridge) -> WSClient:
    """A new echo thread on ``b`` and a WebSocket to it there."""
    async with b.http() as http:
        tid = await b.new_thread(http, "echo")
    return await b.ws(tid)


async def turn(ws: WSClient, i: int) -> int:
    """A prompt and every frame up to its ``turn.ended``: the transcript frames received
    (the answers to the client's own frames, which have no seq, are not counted)."""
    await ws.send_text(json.dumps({"op": "prompt", "text": f"turn {i}"}))
    n = 0
    while True:
        batch = await ws.recv_batch()
        end = next((k for k, f in enumerate(batch) if TURN_END_MARK in f), None)
        if end is not None:
            ws.unread(batch[end + 1 :])
            batch = batch[: end + 1]
        n += sum(1 for f in batch if not f.startswith(b'{"seq":null'))
        if end is not None:
            return n


# metric, label, unit, higher is better
ROWS: list[tuple[str, str, str, bool]] = [
    ("turns_s", "concurrent threads: turns/s", "turns/s", True),
    ("frames_s", "concurrent threads: frames/s", "frames/s", True),
    ("p99", "concurrent threads: round trip p99", "ms", False),
    ("daemon_cores", "daemons' CPU ÷ wall time (cores busy)", "cores", False),
    ("daemon_cpu_1k_turns", "daemons' CPU per 1000 turns", "s", False),
    ("client_cores", "bench client's CPU ÷ wall time", "cores", False),
    ("agent_cores", "agents' CPU ÷ wall time", "cores", False),
    ("pg_cores", "PostgreSQL's CPU ÷ wall time", "cores", False),
    ("all_cores", "all of these ÷ wall time (nproc in the header)", "cores", False),
]


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def table(samples: dict[str, dict[str, list[float]]]) -> tuple[str, list[dict[str, Any]]]:
    out = [
        "| measure | unit | SQLite ×1 | PostgreSQL ×1 | PostgreSQL ×2 | ×2 ÷ ×1 | PostgreSQL ÷ SQLite |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    rows = []
    for key, label, unit, higher in ROWS:
        if key not in samples:
            continue
        m = {config: median(v) for config, v in samples[key].items()}
        s1, p1, p2 = m.get("sqlite_1"), m.get("pg_1"), m.get("pg_2")
        two_over_one, pg_over_sqlite = ratio(p2, p1), ratio(p1, s1)
        rows.append(
            {
                "metric": key,
                "label": label,
                "unit": unit,
                "higher_is_better": higher,
                "sqlite_1": s1,
                "pg_1": p1,
                "pg_2": p2,
                "pg_2_over_pg_1": two_over_one,
                "pg_over_sqlite": pg_over_sqlite,
                "samples": samples[key],
            }
        )
        r21 = f"{two_over_one:.2f}×" if two_over_one is not None else "—"
        rps = f"{pg_over_sqlite:.2f}×" if pg_over_sqlite is not None else "—"
        out.append(f"| {label} | {unit} | {fmt(s1)} | {fmt(p1)} | {fmt(p2)} | {r21} | {rps} |")
    return "\n".join(out), rows


def cross_table(samples: dict[str, dict[str, list[float]]]) -> tuple[str, dict[str, Any]]:
    """Delay of each event behind its arrival at a client of the owner, in ms."""
    same = samples.get("cross_same_ms", {}).get("pg_2", [])
    other = samples.get("cross_other_ms", {}).get("pg_2", [])
    if not same or not other:
        return "", {}
    stats = {q: (pct(same, q), pct(other, q)) for q in (50, 99)}
    lines = [
        "| delay behind a client of the owner | unit | same replica | other replica | other ÷ same |",
        "|---|---|---:|---:|---:|",
    ]
    for q, (s, o) in stats.items():
        r = f"{o / s:.1f}×" if s > 0 else "—"
        lines.append(f"| p{q} ({len(other)} events) | ms | {s:.2f} | {o:.2f} | {r} |")
    return "\n".join(lines), {f"p{q}": {"same_ms": s, "other_ms": o} for q, (s, o) in stats.items()}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.replicas", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="smoke run: one run, small counts")
    ap.add_argument("--runs", type=int, help="runs per configuration (median reported)")
    ap.add_argument("--threads", type=int, help="threads in all (split over the replicas)")
    ap.add_argument("--turns", type=int, help="turns per thread")
    ap.add_argument("--json", metavar="FILE", help="also write every sample and the table as JSON")
    ap.add_argument("--workdir", help="keep daemon data and logs here (default: a temp dir, removed)")
    args = ap.parse_args(argv)
    params = QUICK if args.quick else FULL
    override = {k: v for k, v in (("runs", args.runs), ("threads", args.threads), ("turns", args.turns)) if v}
    params = Params(**{**asdict(params), **override})

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    info = machine()
    with contextlib.ExitStack() as stack:
        if args.workdir:
            workdir = Path(args.workdir).resolve()
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agent-bridge-bench-replicas-")))
        svc = stack.enter_context(services(workdir))
        bench = Bench(params, workdir, svc, log)
        t0 = time.perf_counter()
        asyncio.run(bench.run())
        log("bench.replicas: cross-replica latency")
        asyncio.run(asyncio.wait_for(bench.cross(CROSS_TURNS[args.quick]), SECTION_TIMEOUT))
        elapsed = time.perf_counter() - t0
    text, rows = table(bench.samples)
    print(
        f"agent-bridge bench.replicas: {info['nproc']} CPUs ({info['cpu']}), Python {info['python']}; "
        f"medians of {params.runs} runs ({'quick' if args.quick else 'full'}), {elapsed:.0f}s"
    )
    print(
        f"params: {json.dumps(asdict(params))}; load average at start: "
        f"{' '.join(f'{x:.2f}' for x in info['loadavg_at_start'])}"
    )
    print()
    print(text)
    cross_text, cross = cross_table(bench.samples)
    print()
    print(cross_text)
    if args.json:
        out = {"machine": info, "params": asdict(params), "elapsed_s": elapsed, "rows": rows, "cross_replica": cross}
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
