"""`python -m bench.search --quick` (issue #38 item 4): it measures appends with the index
and without, builds a store, and prints a line per query with its hits. Structure only:
timing is never asserted (the figures are in docs/benchmarks.md "Search")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(120)
def test_search_bench_prints_the_append_ratio_and_every_query(tmp_path: Path) -> None:
    out = tmp_path / "search.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.search", "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("append (CPU µs/event, indexed / plain = ratio): chat ")
    assert lines[1].startswith("store: 20 threads, 4000 events, built in ")
    queries = [line.split(":")[0] for line in lines if line.startswith("query ")]
    assert queries == ["query rare", "query common", "query phrase", "query two_words", "query common_one_owner"]
    report = json.loads(out.read_text())
    assert report["append"]["chat_ratio"] > 0 and report["append"]["flood_ratio"] > 0
    assert report["query"]["common"]["hits"] == 20 and report["query"]["common_one_owner"]["hits"] > 0
    assert report["store"]["events"] == 4000
