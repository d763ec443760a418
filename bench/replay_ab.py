"""``python -m bench.replay_ab OTHER_TREE``: replay ``after=0`` from this tree's daemon
against one of another checkout of agent-bridge (e.g. a ``git worktree`` at main's commit),
in the same run (docs/benchmarks.md "Replay from stored envelopes").

Both daemons run at once, each with one thread of ``--events`` flood events (200-byte
``stream_event`` lines); replays alternate between them, the order reversed every round so
that load from elsewhere falls on both alike. Per replay: events/s, the daemon's CPU per
event (utime + stime from /proc, all its threads) and that of its event loop thread alone
(the rest is the store's reader thread), the client's CPU per event. Medians over
``--runs``, with the load average, and the database's bytes per event after the daemons
stop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import bench.run as br

TICK = os.sysconf("SC_CLK_TCK")


def _cpu(path: str) -> float:
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def _fill(bridge: br.Bridge, events: int) -> tuple[str, int]:
    async with bridge.http() as http:
        tid = await bridge.new_thread(http, "flood")
        ws = await bridge.ws(tid)
        await ws.send_text(json.dumps({"op": "prompt", "text": f"flood {events} 200"}))
        await br.until(ws, br.TURN_END_MARK)
        await ws.close()
        return tid, await bridge.last_seq(http, tid)


async def _replay(bridge: br.Bridge, tid: str, last: int) -> tuple[float, float, float, float]:
    pid = bridge.pid
    d0, m0 = _cpu(f"/proc/{pid}/stat"), _cpu(f"/proc/{pid}/task/{pid}/stat")
    c0, t0 = time.process_time(), time.perf_counter()
    ws = await bridge.ws(tid, after=0)
    got = 0
    while got < last:
        got += len(await ws.recv_batch())
    dt = time.perf_counter() - t0
    d1, m1, c1 = _cpu(f"/proc/{pid}/stat"), _cpu(f"/proc/{pid}/task/{pid}/stat"), time.process_time()
    await ws.close()
    return last / dt, (d1 - d0) / last * 1e6, (m1 - m0) / last * 1e6, (c1 - c0) / last * 1e6


async def run(trees: dict[str, Path], events: int, runs: int, workdir: Path) -> None:
    bridges: dict[str, br.Bridge] = {}
    this = br.ROOT
    try:
        for name, root in trees.items():
            br.ROOT = root  # the daemon runs `python -m bridge` from its tree
            bridges[name] = br.Bridge(workdir / name)
            await bridges[name].start()
        br.ROOT = this
        filled = {name: await _fill(b, events) for name, b in bridges.items()}
        _report(await _alternate(bridges, filled, runs), {name: last for name, (_, last) in filled.items()})
    finally:
        br.ROOT = this
        for b in bridges.values():
            await b.stop()
    for name, b in bridges.items():
        size = sum(p.stat().st_size for p in b.data.glob("bridge.db*"))
        print(f"{name}: {size / filled[name][1]:.0f} bytes per event on disk")


async def _alternate(
    bridges: dict[str, br.Bridge], filled: dict[str, tuple[str, int]], runs: int
) -> dict[str, list[tuple[float, float, float, float]]]:
    """``runs`` replays of each, alternated, the order reversed every round."""
    samples: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in bridges}
    for r in range(runs):
        for name in list(bridges) if r % 2 == 0 else list(reversed(bridges)):
            samples[name].append(await _replay(bridges[name], *filled[name]))
    return samples


def _report(samples: dict[str, list[tuple[float, float, float, float]]], events: dict[str, int]) -> None:
    load = os.getloadavg()
    for name, got in samples.items():
        rate, dcpu, mcpu, ccpu = (statistics.median(col) for col in zip(*got, strict=True))
        print(
            f"{name}: {events[name]} events, replay {rate:,.0f} events/s "
            f"({', '.join(f'{s[0] / 1000:.0f}k' for s in got)}); daemon CPU {dcpu:.2f} µs/event "
            f"(event loop thread {mcpu:.2f}), client CPU {ccpu:.2f} µs/event"
        )
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.replay_ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("other", type=Path, help="another agent-bridge checkout (its daemon is 'other')")
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="replay-ab-") as tmp:
        asyncio.run(run({"other": args.other.resolve(), "this": br.ROOT}, args.events, args.runs, Path(tmp)))


if __name__ == "__main__":
    main()
