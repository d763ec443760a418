"""Load test (issue #3 item 6): many concurrent threads, each with its own agent process and
two WebSocket clients, through a real daemon on loopback. Bounded in count and time.

Every thread runs a few turns sent alternately by its two clients, concurrently across
threads. Afterwards, for every thread: both clients got every transcript event exactly once
and in order, byte-identical to each other; the store holds the same sequence; and every
accepted prompt has exactly one successful ``turn.ended``.

Figures (threads, events, duration, events/s, peak RSS, peak agent count) are printed (run
pytest with ``-s``) and, when ``LOAD_REPORT`` names a file, merged into it as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Client, Daemon, base_config

LOAD_STEP_TIMEOUT = 120.0  # one wait under load (a turn, a catch-up); a hang still fails
SETUP_CONCURRENCY = 25  # thread creations / WebSocket handshakes in flight at once
SAMPLE_EVERY_S = 0.25


def raise_nofile(want: int) -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE towards ``want`` (capped by the hard limit). The daemon
    subprocess inherits it, so call this before starting the daemon."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def vm_kib(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` memory field (``VmHWM``, ``VmRSS``) in KiB; 0 if gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def child_pids(pid: int) -> list[int]:
    pids: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return pids
    for task in tasks:
        try:
            pids += [int(x) for x in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return pids


class Sampler:
    """Samples the daemon's agent children while the turns run: the peak number alive and
    the peak of the summed VmHWM over them."""

    def __init__(self, daemon_pid: int) -> None:
        self.pid = daemon_pid
        self.peak_agents = 0
        self.peak_agents_hwm_kib = 0
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        kids = child_pids(self.pid)
        self.peak_agents = max(self.peak_agents, len(kids))
        self.peak_agents_hwm_kib = max(self.peak_agents_hwm_kib, sum(vm_kib(p, "VmHWM") for p in kids))

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(SAMPLE_EVERY_S)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        self.sample()


async def bounded(limit: int, factories: list[Callable[[], Any]]) -> list[Any]:
    sem = asyncio.Semaphore(limit)

    async def one(factory: Callable[[], Any]) -> Any:
        async with sem:
            return await factory()

    return list(await asyncio.gather(*(one(f) for f in factories)))


def transcript(c: Client) -> list[tuple[str, dict[str, Any]]]:
    """The frames with a seq, as (exact text, parsed frame). Seq-null frames are replies to
    this client alone (client.accepted/rejected) and are not part of the transcript."""
    return [(t, f) for t, f in zip(c.texts, c.frames, strict=True) if f.get("seq") is not None]


async def run_thread_turns(thread_id: str, clients: tuple[Client, Client], turns: int) -> list[str]:
    """``turns`` prompts on one thread, sent alternately by its two clients; both clients
    read through every turn until its turn.ended. Returns the accepted turn ids."""
    turn_ids: list[str] = []
    for k in range(turns):
        sender, other = clients[k % 2], clients[1 - k % 2]
        text = f"load {thread_id} turn {k}"
        await sender.send(op="prompt", text=text)
        acc = await sender.next(lambda f: f.get("kind") in ("client.accepted", "client.rejected")
                                and f["data"].get("op") == "prompt", LOAD_STEP_TIMEOUT)
        assert acc["kind"] == "client.accepted", (thread_id, k, acc)
        assert acc["seq"] is None, acc
        tid = acc["data"]["turn_id"]
        turn_ids.append(tid)
        ends = await asyncio.gather(sender.kind("turn.ended", LOAD_STEP_TIMEOUT, turn_id=tid),
                                    other.kind("turn.ended", LOAD_STEP_TIMEOUT, turn_id=tid))
        for end in ends:
            assert end["data"]["status"] == "success", (thread_id, k, end)
    return turn_ids


async def store_events(http: Any, thread_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    after = 0
    while True:
        r = await http.get(f"/v1/threads/{thread_id}/events", params={"after": after, "limit": 1000})
        assert r.status_code == 200, r.text
        page = r.json()["events"]
        if not page:
            return events
        events += page
        after = page[-1]["seq"]


def check_thread(thread_id: str, clients: tuple[Client, Client], last_seq: int,
                 turn_ids: list[str], stored: list[dict[str, Any]]) -> int:
    """Every invariant for one thread; returns its number of transcript events."""
    a, b = (transcript(c) for c in clients)
    for name, tr in (("A", a), ("B", b)):
        seqs = [f["seq"] for _, f in tr]
        assert seqs == list(range(1, last_seq + 1)), (
            f"thread {thread_id} client {name}: seqs not 1..{last_seq} exactly once in order: {seqs}")
    # Byte-identical transcript frames on both clients.
    for (ta, fa), (tb, _) in zip(a, b, strict=True):
        assert ta == tb, f"thread {thread_id} seq {fa['seq']}: clients differ\n{ta}\n{tb}"
    # The store holds the same sequence, with the same content.
    assert [e["seq"] for e in stored] == list(range(1, last_seq + 1)), (
        f"thread {thread_id}: store seqs {[e['seq'] for e in stored]}, last_seq {last_seq}")
    for e, (_, f) in zip(stored, a, strict=True):
        assert (e["seq"], e["kind"], e["data"]) == (f["seq"], f["kind"], f["data"]), (thread_id, e, f)
        assert e == f, (thread_id, e, f)
    # Every accepted prompt: exactly one turn.ended, with status success; no other turn.ended.
    ended = [f for _, f in a if f["kind"] == "turn.ended"]
    assert sorted(f["data"].get("turn_id") for f in ended) == sorted(turn_ids), (thread_id, ended, turn_ids)
    assert all(f["data"]["status"] == "success" for f in ended), (thread_id, ended)
    # The agent answered each prompt (the echo reply is in the transcript once per turn).
    replies = [f["data"]["text"] for _, f in a if f["kind"] == "message" and f["source"] == "agent"
               and f["data"].get("role") == "assistant"]
    assert replies == [f"echo: load {thread_id} turn {k}" for k in range(len(turn_ids))], (thread_id, replies)
    return last_seq


def report(figures: dict[str, Any]) -> None:
    print("\nload figures: " + json.dumps(figures, indent=2))
    path = os.environ.get("LOAD_REPORT")
    if path:
        p = Path(path)
        try:
            existing = json.loads(p.read_text()) if p.exists() else {}
        except ValueError:
            existing = {}
        if not isinstance(existing, dict):
            existing = {}
        existing[figures["label"]] = figures
        p.write_text(json.dumps(existing, indent=2) + "\n")


async def run_load(daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str], *,
                   label: str, threads: int, turns: int, awp_every: int = 4) -> dict[str, Any]:
    # Per agent: 3 pipes in the daemon; per thread: 2 sockets on each side of loopback.
    nofile = raise_nofile(max(4096, threads * 16 + 256))
    cfg = base_config(tmp_path, agent_env, server=f"max_conversations = {max(200, threads)}\n")
    d: Daemon = await daemon_factory(cfg)
    assert d.proc is not None
    t_setup = time.monotonic()

    async with d.http() as http:
        async def create(i: int) -> str:
            agent = "awp-jsonl" if i % awp_every == awp_every - 1 else "stream-json"
            r = await http.post("/v1/threads", json={"agent": agent, "title": f"load {i}"})
            assert r.status_code == 201, r.text
            return str(r.json()["id"])

        ids: list[str] = await bounded(SETUP_CONCURRENCY, [lambda i=i: create(i) for i in range(threads)])
        assert len(set(ids)) == threads

        async def connect(tid: str) -> tuple[Client, Client]:
            return await d.ws(tid), await d.ws(tid)

        clients: list[tuple[Client, Client]] = await bounded(
            SETUP_CONCURRENCY, [lambda t=t: connect(t) for t in ids])
        setup_s = time.monotonic() - t_setup

        sampler = Sampler(d.proc.pid)
        sampler.start()
        t0 = time.monotonic()
        try:
            turn_ids = await asyncio.gather(*(run_thread_turns(t, c, turns) for t, c in zip(ids, clients)))

            # Wait until both clients have everything the thread says it has: no sleeps.
            async def drain(tid: str, pair: tuple[Client, Client]) -> int:
                r = await http.get(f"/v1/threads/{tid}")
                assert r.status_code == 200, r.text
                last = int(r.json()["last_seq"])
                await asyncio.gather(*(c.upto(last, LOAD_STEP_TIMEOUT) for c in pair))
                return last

            last_seqs = await asyncio.gather(*(drain(t, c) for t, c in zip(ids, clients)))
            run_s = time.monotonic() - t0
        finally:
            await sampler.stop()
        daemon_hwm_kib = vm_kib(d.proc.pid, "VmHWM")

        stored = await bounded(SETUP_CONCURRENCY, [lambda t=t: store_events(http, t) for t in ids])
        total_events = 0
        for tid, pair, last, tids, st in zip(ids, clients, last_seqs, turn_ids, stored, strict=True):
            total_events += check_thread(tid, pair, last, tids, st)

        # Nothing went wrong that the transcript would not show: no bridge-level error logs.
        frames = sum(len(c.frames) for pair in clients for c in pair)
        transcript_frames = sum(len(transcript(c)) for pair in clients for c in pair)
        await asyncio.gather(*(c.close() for pair in clients for c in pair))

    figures: dict[str, Any] = {
        "label": label,
        "threads": threads,
        "awp_jsonl_threads": sum(1 for i in range(threads) if i % awp_every == awp_every - 1),
        "clients": 2 * threads,
        "turns_per_thread": turns,
        "turns": threads * turns,
        "total_events": total_events,
        "transcript_frames_delivered": transcript_frames,
        "total_frames_delivered": frames,
        "setup_s": round(setup_s, 3),
        "duration_s": round(run_s, 3),
        "events_per_s": round(total_events / run_s, 1),
        "frames_per_s": round(frames / run_s, 1),
        "turns_per_s": round(threads * turns / run_s, 1),
        "daemon_peak_rss_mib": round(daemon_hwm_kib / 1024, 1),
        "agents_alive_at_peak": sampler.peak_agents,
        "agents_peak_summed_hwm_mib": round(sampler.peak_agents_hwm_kib / 1024, 1),
        "rlimit_nofile": list(nofile),
        "cpus": os.cpu_count(),
    }
    assert total_events == transcript_frames // 2
    assert sampler.peak_agents <= threads
    report(figures)
    return figures


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_load_many_threads_two_clients_each(daemon_factory: Callable[..., Any], tmp_path: Path,
                                                  agent_env: dict[str, str]) -> None:
    fig = await run_load(daemon_factory, tmp_path, agent_env, label="many", threads=100, turns=5)
    assert fig["agents_alive_at_peak"] >= 1


async def test_load_small_ci_variant(daemon_factory: Callable[..., Any], tmp_path: Path,
                                     agent_env: dict[str, str]) -> None:
    fig = await run_load(daemon_factory, tmp_path, agent_env, label="small", threads=20, turns=3)
    assert fig["agents_alive_at_peak"] >= 1
