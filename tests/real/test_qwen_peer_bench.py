"""`python -m bench.qwen_peer --quick` runs end to end: the bridge running the pinned Qwen
Code over ACP and that Qwen Code's own daemon `qwen serve`, both against the bench's
loopback fake model (issue #22), and prints its table of ratios. Structure only: timing is
never asserted (performance claims live in docs/benchmarks.md, as ratios of one run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import processes_mentioning, processes_with_environ
from realagents import node_script

from bench.qwen_peer import QWEN, ROWS

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.mark.timeout(330)
def test_quick_qwen_peer_bench_runs_both_peers_and_prints_every_row(tmp_path: Path) -> None:
    node_script(QWEN, "cli-entry.js")  # the pinned CLI is installed (CI fails, else skips)
    out, work = tmp_path / "peer.json", tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.qwen_peer", "--quick", "--json", str(out), "--workdir", str(work)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=320,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"agent-bridge vs qwen serve ({QWEN}@"), lines[:3]
    # The bench fails when Qwen Code asked the fake for anything but the model.
    assert "the fake model was asked for: POST /v1/chat/completions" in lines[2], lines[:3]
    header = "| measure | unit | bridge | qwen serve | bridge ÷ qwen serve | bridge is |"
    table = [line for line in lines[lines.index(header) + 2 :] if line.startswith("| ")]
    assert len(table) == len(ROWS), table

    rows = {r["metric"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == [key for key, *_ in ROWS]
    for key, row in rows.items():
        assert row["bridge"] is not None and row["qwen_serve"] is not None, row
        if "_session" in key:  # memory: each bridge thread adds an agent process; qwen serve's
            # sessions live in its ACP child, whose garbage collector may give back more
            assert row["bridge"] > 0, row
        else:
            assert row["bridge"] > 0 and row["qwen_serve"] > 0, row
            assert row["bridge_over_qwen_serve"] == pytest.approx(row["bridge"] / row["qwen_serve"])
            assert row["bridge_ahead"] in (True, False), row
    # Every daemon, agent and fake the bench started is gone.
    assert processes_mentioning(str(work)) == []
    assert processes_with_environ(f"HOME={work}/".encode()) == []
