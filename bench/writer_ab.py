"""``python -m bench.writer_ab``: SQLite's writer thread against its writer process, in the
same run (docs/benchmarks.md "The writer process").

Two daemons of the same code side by side, ``[store] writer = "thread"`` and ``"process"``
(``AGENT_BRIDGE_STORE_WRITER``), runs alternated between them: a ``flood N 200`` in raw and
in events mode (lines/s; the daemon's own CPU per line, and the writer process's), then
sequential echo turns in both modes (p50, p99). Medians over the runs; the load average is
printed with them. Options: ``--runs`` (7), ``--lines`` (50000), ``--turns`` (1000),
``--json FILE`` (every sample).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.run import RESULT_MARK, TURN_END_MARK, Bridge, store_writer, until, user_line

MODES = ("thread", "process")


def own_cpu_s(pid: int) -> float:
    """User + system CPU seconds of this one process (bench.run.cpu_s adds the writer's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def prompt(mode: str, text: str) -> str:
    return user_line(text) if mode == "raw" else json.dumps({"op": "prompt", "text": text})


async def flood(b: Bridge, http: httpx.AsyncClient, tid: str, mode: str, lines: int) -> list[float]:
    """[lines/s, daemon CPU µs per line, writer process CPU µs per line]"""
    ws = await b.ws(tid, mode=mode, after=await b.last_seq(http, tid))
    mark = RESULT_MARK if mode == "raw" else TURN_END_MARK
    await ws.send_text(prompt(mode, "flood 1"))
    await until(ws, mark)
    wp = store_writer(b.pid)
    c0, w0 = own_cpu_s(b.pid), own_cpu_s(wp) if wp else 0.0
    t0 = time.perf_counter()
    await ws.send_text(prompt(mode, f"flood {lines} 200"))
    await until(ws, mark)
    dt = time.perf_counter() - t0
    c1, w1 = own_cpu_s(b.pid), own_cpu_s(wp) if wp else 0.0
    await ws.close()
    return [lines / dt, (c1 - c0) / lines * 1e6, (w1 - w0) / lines * 1e6]


async def echo(b: Bridge, http: httpx.AsyncClient, tid: str, mode: str, turns: int) -> list[float]:
    """[p50 ms, p99 ms]"""
    ws = await b.ws(tid, mode=mode, after=await b.last_seq(http, tid))
    mark = RESULT_MARK if mode == "raw" else TURN_END_MARK
    await ws.send_text(prompt(mode, "warm up"))
    await until(ws, mark)
    times = []
    for i in range(turns):
        t0 = time.perf_counter()
        await ws.send_text(prompt(mode, f"turn {i}"))
        await until(ws, mark)
        times.append(time.perf_counter() - t0)
    await ws.close()
    times.sort()
    return [times[len(times) // 2] * 1000, times[min(len(times) - 1, int(len(times) * 0.99))] * 1000]


ROWS = (
    ("flood_raw", ("lines/s", "daemon CPU µs/line", "writer CPU µs/line")),
    ("flood_events", ("lines/s", "daemon CPU µs/line", "writer CPU µs/line")),
    ("echo_raw", ("p50 ms", "p99 ms")),
    ("echo_events", ("p50 ms", "p99 ms")),
)


Samples = dict[str, dict[str, list[list[float]]]]  # side → row → one list of figures per run


async def _start(_side: str, bridge: Bridge) -> None:
    await bridge.start()


async def alternate(
    bridges: dict[str, Bridge],
    runs: int,
    lines: int,
    turns: int,
    start: Callable[[str, Bridge], Awaitable[None]] = _start,
) -> Samples:
    """Every row on every side (``start`` starts a side's daemon), the sides' order
    alternating run by run so that neither always goes first on a warmer machine."""
    sides = list(bridges)
    samples: Samples = {s: {k: [] for k, _ in ROWS} for s in sides}
    https: dict[str, httpx.AsyncClient] = {}
    try:
        for s, b in bridges.items():
            await start(s, b)
            https[s] = b.http()
        tids = {
            s: {k: await b.new_thread(https[s], "flood" if k.startswith("flood") else "echo") for k, _ in ROWS}
            for s, b in bridges.items()
        }
        for r in range(runs):
            for s in sides if r % 2 == 0 else sides[::-1]:
                b, h, t, out = bridges[s], https[s], tids[s], samples[s]
                out["flood_raw"].append(await flood(b, h, t["flood_raw"], "raw", lines))
                out["flood_events"].append(await flood(b, h, t["flood_events"], "events", lines))
                out["echo_raw"].append(await echo(b, h, t["echo_raw"], "raw", turns))
                out["echo_events"].append(await echo(b, h, t["echo_events"], "events", turns))
    finally:
        for h in https.values():
            await h.aclose()
        for b in bridges.values():
            await b.stop()
    return samples


async def measure(runs: int, lines: int, turns: int, workdir: Path) -> Samples:
    bridges = {m: Bridge(workdir / m, env={"AGENT_BRIDGE_STORE_WRITER": m}) for m in MODES}
    return await alternate(bridges, runs, lines, turns)


def report(samples: Samples) -> str:
    """Each row's medians, a line per side."""
    out = []
    width = max(len(s) for s in samples)
    for key, labels in ROWS:
        for side, rows_of in samples.items():
            rows = rows_of[key]
            med = [statistics.median(v[i] for v in rows) for i in range(len(labels))] if rows else []
            figures = "  ".join(f"{lab}={x:,.2f}" for lab, x in zip(labels, med, strict=True))
            out.append(f"{key:13s} {side:{width}s} {figures}")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.writer_ab", description=__doc__)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--lines", type=int, default=50000)
    ap.add_argument("--turns", type=int, default=1000)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    return run_and_report(
        args.runs, "writer-ab-", lambda tmp: measure(args.runs, args.lines, args.turns, tmp), args.json
    )


def run_and_report(
    runs: int, prefix: str, measure_in: Callable[[Path], Coroutine[Any, Any, Samples]], json_file: str | None
) -> int:
    """Measure in a temporary work dir, print the medians with the load average around
    them, and write every sample to ``json_file`` when one is given."""
    start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        samples = asyncio.run(measure_in(Path(tmp)))
    end = os.getloadavg()
    print(f"medians of {runs} runs; load average {start[0]:.2f} at the start, {end[0]:.2f} at the end")
    print(report(samples))
    if json_file:
        Path(json_file).write_text(json.dumps({"load": [start, end], "samples": samples}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
