"""What keeping the compacted history at commit costs per event (sessions/history.py
``committed``), in-process: a stream of the shapes a turn commits, fed in batches as the
conversation commits them. Prints µs per event and the load average.

    python -m bench.history_commit [--events N] [--batch B] [--runs R]
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from bridge.protocols.events import Record
from bridge.sessions.history import Compactor, committed

TS = "2026-12-01T00:00:00.000Z"


def stream(n: int) -> list[Record]:
    """Turns of 50 deltas, a whole message, two status lines, a tool call and its result."""
    out: list[Record] = []
    turn = 0
    while len(out) < n:
        turn += 1
        shapes: list[tuple[str, str, dict[str, Any]]] = [
            ("client", "message", {"role": "user", "text": "go", "turn_id": f"t{turn}"})
        ]
        shapes += [("agent", "message.delta", {"text": "x" * 40, "channel": "text"})] * 50
        shapes += [
            ("agent", "message", {"role": "assistant", "text": "x" * 2000}),
            ("agent", "agent.status", {"status": "requesting"}),
            ("agent", "tool.call", {"tool_call_id": f"k{turn}", "name": "Bash", "input": {"command": "ls"}}),
            ("agent", "tool.result", {"tool_call_id": f"k{turn}", "output": "a", "is_error": False}),
            ("agent", "agent.status", {"status": "requesting"}),
            ("agent", "turn.ended", {"turn_id": f"t{turn}", "status": "success"}),
        ]
        for src, kind, data in shapes:
            out.append(Record(len(out) + 1, TS, src, kind, dict(data), None, False))
    return out[:n]


def run(records: list[Record], batch: int) -> float:
    comp: Compactor | None = Compactor()
    t0 = time.perf_counter()
    for i in range(0, len(records), batch):
        if comp is not None:
            comp = committed(comp, records[i : i + batch], 1 << 30)
    return (time.perf_counter() - t0) / len(records) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    records = stream(args.events)
    times = sorted(run(records, args.batch) for _ in range(args.runs))
    print(
        f"committed(): {times[len(times) // 2]:.3f} µs/event median of {args.runs} (min {times[0]:.3f}), "
        f"{args.events} events in batches of {args.batch}; load average {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
