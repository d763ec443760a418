"""``python -m bench.code_ab --base DIR``: the transcript's write path of two checkouts of
agent-bridge in the same run (docs/benchmarks.md "The caps on what the store holds").

``DIR`` is another checkout (``git worktree add DIR <commit>``); this one is the other side.
Each side is a daemon started from its own tree, with the default store (SQLite, writer
process); runs alternate between them: ``bench.writer_ab``'s flood in raw and in events mode
(lines/s, the daemon's CPU per line and the writer process's), then sequential echo turns in
both modes (p50, p99). Medians over the runs; the load average is printed with them.
Options: ``--runs`` (5), ``--lines`` (50000), ``--turns`` (500), ``--json FILE``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

import httpx

from bench import run
from bench.writer_ab import ROWS, echo, flood

SIDES = ("base", "this")


async def start_in(bridge: run.Bridge, tree: Path) -> None:
    """Start ``bridge`` from ``tree``: ``python -m bridge`` imports the package of its
    working directory (bench.run starts it in ``run.ROOT``)."""
    saved = run.ROOT
    run.ROOT = tree
    try:
        await bridge.start()
    finally:
        run.ROOT = saved


async def measure(
    base: Path, runs: int, lines: int, turns: int, workdir: Path
) -> dict[str, dict[str, list[list[float]]]]:
    trees = {"base": base, "this": run.ROOT}
    bridges = {s: run.Bridge(workdir / s, env={"PYTHONPATH": str(trees[s])}) for s in SIDES}
    samples: dict[str, dict[str, list[list[float]]]] = {s: {k: [] for k, _ in ROWS} for s in SIDES}
    https: dict[str, httpx.AsyncClient] = {}
    try:
        for s, b in bridges.items():
            await start_in(b, trees[s])
            https[s] = b.http()
        tids = {
            s: {k: await b.new_thread(https[s], "flood" if k.startswith("flood") else "echo") for k, _ in ROWS}
            for s, b in bridges.items()
        }
        for r in range(runs):
            for s in SIDES if r % 2 == 0 else SIDES[::-1]:
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


def report(samples: dict[str, dict[str, list[list[float]]]]) -> str:
    out = []
    for key, labels in ROWS:
        for s in SIDES:
            rows = samples[s][key]
            med = [statistics.median(v[i] for v in rows) for i in range(len(labels))] if rows else []
            out.append(f"{key:13s} {s:5s} " + "  ".join(f"{lab}={x:,.2f}" for lab, x in zip(labels, med, strict=True)))
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.code_ab", description=__doc__)
    ap.add_argument("--base", type=Path, required=True, help="the other checkout's root")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--lines", type=int, default=50000)
    ap.add_argument("--turns", type=int, default=500)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="code-ab-") as tmp:
        samples = asyncio.run(measure(args.base.resolve(), args.runs, args.lines, args.turns, Path(tmp)))
    end = os.getloadavg()
    print(f"medians of {args.runs} runs; load average {start[0]:.2f} at the start, {end[0]:.2f} at the end")
    print(report(samples))
    if args.json:
        Path(args.json).write_text(json.dumps({"load": [start, end], "samples": samples}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
