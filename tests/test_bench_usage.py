"""`python -m bench.usage --quick` (issue #38 item 5): it fills a store, asks every grouping
and prints what each found and took. Structure only: timing is never asserted (the figures
are in docs/benchmarks.md "Usage")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(120)
def test_usage_bench_asks_every_grouping(tmp_path: Path) -> None:
    out = tmp_path / "usage.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.usage", "--quick", "--queries", "1", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["turns"] == 200
    assert [report[k]["turns"] for k in ("thread", "agent", "user", "day", "thread one owner")] == [200] * 4 + [20]
    assert report["record"]["one turn end (us)"] > 0
