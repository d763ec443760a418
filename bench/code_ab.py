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
from collections.abc import Sequence
from pathlib import Path

from bench import run
from bench.writer_ab import Samples, alternate, run_and_report

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


async def measure(base: Path, runs: int, lines: int, turns: int, workdir: Path) -> Samples:
    trees = {"base": base, "this": run.ROOT}
    bridges = {s: run.Bridge(workdir / s, env={"PYTHONPATH": str(trees[s])}) for s in SIDES}
    return await alternate(bridges, runs, lines, turns, start=lambda side, b: start_in(b, trees[side]))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.code_ab", description=__doc__)
    ap.add_argument("--base", type=Path, required=True, help="the other checkout's root")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--lines", type=int, default=50000)
    ap.add_argument("--turns", type=int, default=500)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    base = args.base.resolve()
    return run_and_report(
        args.runs, "code-ab-", lambda tmp: measure(base, args.runs, args.lines, args.turns, tmp), args.json
    )


if __name__ == "__main__":
    raise SystemExit(main())
