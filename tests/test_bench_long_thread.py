"""`python -m bench.long_thread` on a small scale (issue #36 item 4): it builds its threads
through the store, runs every operation on each size and prints a row per operation with
its ratios, and the echo turns idle and while the large history is read. Structure only:
timing is never asserted (the figures are in docs/benchmarks.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OPERATIONS = [
    "list (GET /v1/threads)",
    "thread (GET /v1/threads/{id})",
    "history, first page (no limit: 1000 items)",
    "history, first page (limit=100)",
    "history, first page (limit=10)",
    "replay from the end (WebSocket after=last-100)",
    "history, whole walk by pages of 1000 (total)",
    "history, whole walk by pages of 1000 (a page)",
    "turn on the thread (its append)",
]


@pytest.mark.timeout(240)
def test_long_thread_bench_prints_a_row_per_operation_with_its_ratios() -> None:
    argv = ["--events", "3000", "--page", "1200", "--samples", "2", "--echo", "20"]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.long_thread", *argv], cwd=ROOT, capture_output=True, text=True, timeout=200
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("built 100 + 1200 + 3000 events in ")
    rows = {line[:50].strip(): line[50:].split() for line in lines if line[:50].strip() in OPERATIONS}
    assert list(rows) == OPERATIONS
    for small, page, large, by_small, by_page in rows.values():
        assert float(small) > 0 and float(page) > 0 and float(large) > 0
        assert float(by_small) == pytest.approx(float(large) / float(small), rel=0.05, abs=0.02)
        assert float(by_page) == pytest.approx(float(large) / float(page), rel=0.05, abs=0.02)
    echo = [line for line in lines if line.startswith("  idle") or line.startswith("  while 2 clients")]
    assert len(echo) == 2 and all(len(line.split("/")) == 3 for line in echo)
