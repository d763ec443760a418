"""What confinement costs an agent's start (issue #32): the same spawn, through the daemon's
own ``AgentProcess.spawn``, unconfined and under the Landlock sandbox, alternated in one run.

    python -m bench.sandbox_start               # a few seconds
    python -m bench.sandbox_start --quick       # a smoke run; numbers are not meaningful

Each agent is ``python -I -c pass`` (an interpreter's start, about what a small CLI costs
before its first line), spawned in a fresh workspace with a HOME that holds the data dir,
as in the default layout; a sample is the time from the spawn call to the process's exit.
Printed: the median and p90 of each, and the ratio confined/unconfined; the same under
bubblewrap where it is installed (``[sandbox] mode = "bubblewrap"``); and the cost of
making the rules alone (``Confined``: the private temp dir and the ruleset).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bridge.process.agent_process import AgentProcess
from bridge.process.launch import LaunchSpec
from bridge.process.sandbox import MIN_ABI, Confined, SandboxConfig, confine, landlock_abi, resolve


def _layout(root: Path) -> tuple[Path, Path, Path]:
    home = root / "home"
    data = home / ".local" / "share" / "agent-bridge"
    work = data / "workspaces" / "thr_bench"
    work.mkdir(parents=True)
    for name in (".claude", ".config", ".cache", ".npm"):
        (home / name).mkdir()
    return home, data, work


async def _one(spec: LaunchSpec) -> float:
    t0 = time.perf_counter()
    proc = await AgentProcess.spawn(spec)
    await proc.close_stdin()
    await proc.wait()
    took = time.perf_counter() - t0
    proc.release()
    return took


async def run(rounds: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        home, data, work = _layout(Path(tmp))
        box = resolve(SandboxConfig(), deny=[str(data)], agent_areas=[str(data / "workspaces")])
        bw = resolve(SandboxConfig(mode="bubblewrap"), deny=[str(data)], agent_areas=[str(data / "workspaces")])
        plain = LaunchSpec(
            (os.path.realpath(sys.executable), "-I", "-c", "pass"),
            {"HOME": str(home), "PATH": "/usr/bin:/bin"},
            str(work),
        )
        confined = confine(plain, box)
        assert confined.sandbox is not None
        wrapped = confine(plain, bw) if bw.confined else None
        samples: dict[str, list[float]] = {"none": [], "landlock": []}
        if wrapped is not None:
            samples["bubblewrap"] = []
        await _one(plain)  # warm the page cache
        for _ in range(rounds):
            samples["none"].append(await _one(plain))
            samples["landlock"].append(await _one(confined))
            if wrapped is not None:
                samples["bubblewrap"].append(await _one(wrapped))
        rules: list[float] = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            made = Confined(confined.sandbox)
            rules.append(time.perf_counter() - t0)
            made.cleanup()
    out: dict[str, object] = {"rounds": rounds, "landlock_abi": landlock_abi(), "rule_count": confined.sandbox.rules}
    for name, xs in samples.items():
        xs.sort()
        out[name] = {"median_ms": statistics.median(xs) * 1e3, "p90_ms": xs[int(len(xs) * 0.9) - 1] * 1e3}
    none, ll = out["none"], out["landlock"]
    assert isinstance(none, dict) and isinstance(ll, dict)
    out["ratio_median"] = ll["median_ms"] / none["median_ms"]
    bwr = out.get("bubblewrap")
    if isinstance(bwr, dict):
        out["bubblewrap_ratio_median"] = bwr["median_ms"] / none["median_ms"]
    out["rules_median_ms"] = statistics.median(rules) * 1e3
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sandbox_start", description=__doc__)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--quick", action="store_true", help="5 rounds: a smoke run")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    if landlock_abi() < MIN_ABI:
        print("agent-bridge bench.sandbox_start: this kernel has no usable Landlock", file=sys.stderr)
        return 2
    res = asyncio.run(run(5 if args.quick else args.rounds))
    none, ll = res["none"], res["landlock"]
    assert isinstance(none, dict) and isinstance(ll, dict)
    print(f"agent-bridge bench.sandbox_start: {res['rounds']} rounds, Landlock ABI {res['landlock_abi']}")
    print(f"  unconfined   median {none['median_ms']:.2f} ms   p90 {none['p90_ms']:.2f} ms")
    print(f"  landlock     median {ll['median_ms']:.2f} ms   p90 {ll['p90_ms']:.2f} ms")
    print(f"  ratio confined/unconfined (median): {res['ratio_median']:.3f}x")
    bwr = res.get("bubblewrap")
    if isinstance(bwr, dict):
        print(f"  bubblewrap   median {bwr['median_ms']:.2f} ms   p90 {bwr['p90_ms']:.2f} ms")
        print(f"  ratio bubblewrap/unconfined (median): {res['bubblewrap_ratio_median']:.3f}x")
    else:
        print("  bubblewrap   not measured (not installed, or no namespaces here)")
    print(f"  making the rules ({res['rule_count']} rules, temp dir): median {res['rules_median_ms']:.3f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
