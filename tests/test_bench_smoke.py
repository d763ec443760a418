"""`python -m bench --quick` runs end to end against the real daemon, websocketd and the bare
pipe, and prints its table of ratios (issue #8). Structure only: timing is never asserted
(performance claims live in bench/, as ratios measured in the same run)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import processes_mentioning

from bench.run import ROWS

ROOT = Path(__file__).resolve().parent.parent


def needs_websocketd() -> None:
    """bench and bench.floor measure against websocketd: without it those tests skip (and
    the commands say so in one line; CI=true turns the skip into a failure)."""
    if shutil.which("websocketd") is None:
        pytest.skip("websocketd is not installed (Debian package websocketd; scripts/test installs it)")


PEERLESS = {"replay"}
CPU_LINE_ROWS = {
    "cpu_line_raw",
    "cpu_line_events",
    "cpu_line_raw_asst",
    "cpu_line_events_asst",
    "cpu_line_raw_coalesce",
}
CPU_ROWS = {"conc_cpu_1k_events", "conc_cpu_1k_turns", *CPU_LINE_ROWS}  # websocketd has no transcript to replay
NO_PIPE = {
    *CPU_LINE_ROWS,  # the pipe relay is this process: its CPU would include the client's
    "conc_turns_s",
    "conc_events_s",
    "conc_p99",
    "conc_rss_thread",
    "conc_cpu_1k_events",
    "conc_cpu_1k_turns",
    "replay",
    "cold_serve",
}


@pytest.mark.timeout(180)
def test_quick_bench_prints_every_measure_with_its_ratios(tmp_path: Path) -> None:
    needs_websocketd()
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--json", str(out), "--workdir", str(tmp_path / "work")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("agent-bridge bench: "), lines[:3]
    header = "| measure | unit | bridge | websocketd | pipe | bridge ÷ websocketd | bridge ÷ pipe | goal | met |"
    assert header in lines
    table = [line for line in lines[lines.index(header) + 2 :] if line.startswith("| ")]
    assert len(table) == len(ROWS), table

    report = json.loads(out.read_text())
    rows = {r["metric"]: r for r in report["rows"]}
    assert list(rows) == [key for key, *_ in ROWS]
    for key, row in rows.items():
        # CPU time is read in clock ticks (10 ms): a quick run's few turns may cost the daemon
        # less than one tick.
        assert row["bridge"] is not None and (row["bridge"] >= 0 if key in CPU_ROWS else row["bridge"] > 0), row
        if key in PEERLESS:
            assert row["websocketd"] is None
        else:
            assert row["websocketd"] is not None and row["websocketd"] >= 0, row
            if row["websocketd"] > 0:
                assert row["bridge_over_websocketd"] == pytest.approx(row["bridge"] / row["websocketd"])
        if key not in NO_PIPE:
            assert row["pipe"] is not None and row["pipe"] > 0, row
            assert row["bridge_over_pipe"] == pytest.approx(row["bridge"] / row["pipe"])
        if row["goal"] and key in CPU_ROWS and not row["websocketd"]:
            assert row["met"] is None, row  # websocketd took less than one tick: no ratio, no verdict
        elif row["goal"]:
            assert row["met"] in (True, False), row
    assert report["machine"]["nproc"] >= 1 and report["machine"]["websocketd"]
    # The daemons the bench started (their command lines name the work dir) are gone.
    assert processes_mentioning(str(tmp_path / "work")) == []


@pytest.mark.timeout(180)
def test_quick_replicas_bench_prints_one_and_two_replicas_and_their_ratios(tmp_path: Path) -> None:
    """`python -m bench.replicas --quick`: SQLite ×1, PostgreSQL ×1 and ×2 (its own
    PostgreSQL and redis-server, started and stopped by the command), every row with both
    ratios; structure only, never timing."""
    from bench.replicas import ROWS as REPLICA_ROWS
    from tests.support import postgres
    from tests.support.redis_server import MISSING, REDIS_SERVER

    if reason := postgres.missing_reason():
        pytest.skip(reason)
    if REDIS_SERVER is None:
        pytest.skip(MISSING)
    out = tmp_path / "replicas.json"
    work = tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.replicas", "--quick", "--json", str(out), "--workdir", str(work)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("agent-bridge bench.replicas: "), lines[:3]
    header = "| measure | unit | SQLite ×1 | PostgreSQL ×1 | PostgreSQL ×2 | ×2 ÷ ×1 | PostgreSQL ÷ SQLite |"
    assert header in lines
    rest = lines[lines.index(header) + 2 :]
    table = rest[: rest.index("")]
    assert len(table) == len(REPLICA_ROWS) and all(line.startswith("| ") for line in table), table
    # The cross-replica latency table: the same events timed at a client of the owner, a
    # second client there, and a client of the other replica.
    cross_header = "| delay behind a client of the owner | unit | same replica | other replica | other ÷ same |"
    assert cross_header in lines
    cross = json.loads(out.read_text())["cross_replica"]
    assert set(cross) == {"p50", "p99"} and all(v["same_ms"] >= 0 for v in cross.values())
    assert all(math.isfinite(v["other_ms"]) for v in cross.values())  # b may read before a's second client
    rows = {r["metric"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == [key for key, *_ in REPLICA_ROWS]
    for key, row in rows.items():
        for config in ("sqlite_1", "pg_1", "pg_2"):
            if key == "pg_cores" and config == "sqlite_1":
                assert row[config] is None  # no PostgreSQL in that configuration
                continue
            # CPU is read in clock ticks (10 ms): a quick run may cost less than one.
            assert row[config] is not None and row[config] >= 0, (key, config, row)
        if row["pg_1"] and row["sqlite_1"]:
            assert row["pg_2_over_pg_1"] == pytest.approx(row["pg_2"] / row["pg_1"])
            assert row["pg_over_sqlite"] == pytest.approx(row["pg_1"] / row["sqlite_1"])
    assert rows["turns_s"]["pg_2"] > 0 and rows["frames_s"]["pg_2"] > 0
    # Two replicas wrote two data dirs, in the ×2 run and in the latency run; the daemons,
    # agents and redis-server are gone.
    assert len(list(work.glob("pg_2-*/*/data"))) == 4
    assert processes_mentioning(str(work)) == []


@pytest.mark.timeout(120)
def test_floor_bench_compares_websocketd_the_python_floor_and_the_bridge(tmp_path: Path) -> None:
    """`python -m bench.floor`: the three relays of one flood, with their ratios; structure
    only, never timing, and nothing left running."""
    needs_websocketd()
    out = tmp_path / "floor.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.floor", "--runs", "1", "--lines", "2000", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "×" in line]
    assert [r.split("|")[1].strip() for r in rows] == [
        "websocketd",
        "Python floor (read, split, frame, write)",
        "bridge, raw mode",
    ]
    samples = json.loads(out.read_text())
    assert all(len(v) == 1 and v[0][0] > 0 and v[0][1] >= 0 for v in samples.values()), samples  # (CPU: 10 ms ticks)
    assert "bridge ÷ floor" in proc.stdout
    assert processes_mentioning("bench.floor") == []


def test_floor_bench_without_websocketd_says_so_in_one_line(tmp_path: Path) -> None:
    """No websocketd on PATH: a usage error naming the package, not a traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.floor", "--runs", "1", "--lines", "10"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=50,
        env={**os.environ, "PATH": str(tmp_path)},
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1].endswith(
        "error: websocketd is not on PATH (Debian package websocketd: apt-get install websocketd)"
    ), proc.stderr


@pytest.mark.timeout(60)
def test_writer_rows_bench_prints_each_stage_now_and_before() -> None:
    """`python -m bench.writer_rows --quick`: the wire frame both ways and the envelopes,
    and the commit, each now against before; structure only, never timing."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.writer_rows", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r[0].strip() for r in rows[1:]] == [
        "frame out, marshal, a tuple a row",
        "frame out, marshal, columns",
        "frame in, marshal, a tuple a row",
        "frame in, marshal, columns",
        "envelopes, _insert_rows",
        "commit, INSERT_CHUNK rows a statement",
    ]
    for now, before, ratio in (r[1:] for r in rows[1:]):
        assert float(now) > 0 and float(before) > 0
        assert float(ratio.strip().rstrip("×")) == pytest.approx(float(now) / float(before), rel=0.05, abs=0.01)


@pytest.mark.timeout(60)
def test_sandbox_start_bench_prints_both_starts_and_their_ratio(tmp_path: Path) -> None:
    """`python -m bench.sandbox_start --quick`: an agent's start unconfined and confined,
    and the ratio of the two; structure only, never timing."""
    out = tmp_path / "sandbox.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.sandbox_start", "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("agent-bridge bench.sandbox_start: 5 rounds"), proc.stdout
    res = json.loads(out.read_text())
    none, ll = res["none"]["median_ms"], res["landlock"]["median_ms"]
    assert none > 0 and ll > 0 and res["rule_count"] > 10
    assert res["ratio_median"] == pytest.approx(ll / none, rel=1e-6)
    assert f"{res['ratio_median']:.3f}x" in proc.stdout
