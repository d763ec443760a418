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
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from conftest import Client, Daemon, base_config

SETUP_CONCURRENCY = 25  # thread creations / WebSocket handshakes in flight at once
SAMPLE_EVERY_S = 0.25

T = TypeVar("T")


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
    return [p for p in pids if not _store_writer(p)]  # the daemon's own helper, not an agent


def _store_writer(pid: int) -> bool:
    try:
        return b"bridge.store.writer" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class Sampler:
    """Samples the daemon while the turns run: the peak number of agent children alive, the
    peak of their summed VmHWM, and the peak number of open file descriptors."""

    def __init__(self, daemon_pid: int) -> None:
        self.pid = daemon_pid
        self.peak_agents = 0
        self.peak_agents_hwm_kib = 0
        self.peak_daemon_fds = 0
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        kids = child_pids(self.pid)
        self.peak_agents = max(self.peak_agents, len(kids))
        self.peak_agents_hwm_kib = max(self.peak_agents_hwm_kib, sum(vm_kib(p, "VmHWM") for p in kids))
        try:
            self.peak_daemon_fds = max(self.peak_daemon_fds, len(os.listdir(f"/proc/{self.pid}/fd")))
        except FileNotFoundError:
            pass

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


async def bounded(limit: int, coros: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Await ``coros`` with at most ``limit`` in flight (each starts only when admitted)."""
    sem = asyncio.Semaphore(limit)

    async def one(coro: Coroutine[Any, Any, T]) -> T:
        async with sem:
            return await coro

    return list(await asyncio.gather(*(one(c) for c in coros)))


def transcript(c: Client) -> list[tuple[str, dict[str, Any]]]:
    """The frames with a seq, as (exact text, parsed frame). Seq-null frames are replies to
    this client alone (client.accepted/rejected) and are not part of the transcript."""
    return [(t, f) for t, f in zip(c.texts, c.frames, strict=True) if f.get("seq") is not None]


async def run_thread_turns(
    thread_id: str, clients: tuple[Client, Client], turns: int, step_timeout: float, progress: dict[str, str]
) -> list[str]:
    """``turns`` prompts on one thread, sent alternately by its two clients; both clients
    read through every turn until its turn.ended. Returns the accepted turn ids."""
    turn_ids: list[str] = []
    for k in range(turns):
        sender, other = clients[k % 2], clients[1 - k % 2]
        text = f"load {thread_id} turn {k}"
        progress[thread_id] = f"turn {k}: awaiting client.accepted"
        await sender.send(op="prompt", text=text)
        acc = await sender.next(
            lambda f: f.get("kind") in ("client.accepted", "client.rejected") and f["data"].get("op") == "prompt",
            step_timeout,
        )
        assert acc["kind"] == "client.accepted", (thread_id, k, acc)
        assert acc["seq"] is None, acc
        tid = acc["data"]["turn_id"]
        turn_ids.append(tid)
        progress[thread_id] = f"turn {k}: awaiting turn.ended {tid}"
        ends = await asyncio.gather(
            sender.kind("turn.ended", step_timeout, turn_id=tid), other.kind("turn.ended", step_timeout, turn_id=tid)
        )
        for end in ends:
            assert end["data"]["status"] == "success", (thread_id, k, end)
    progress[thread_id] = "done"
    return turn_ids


async def stuck_report(
    http: Any,
    d: Daemon,
    ids: list[str],
    clients: list[tuple[Client, Client]],
    progress: dict[str, str],
    errors: list[BaseException | None],
) -> str:
    """What every unfinished thread was waiting for, what the bridge says about it, and the
    last frames each client saw: the evidence for a hang or a lost event."""
    lines = []
    for tid, pair, err in zip(ids, clients, errors, strict=True):
        if progress.get(tid) == "done" and err is None:
            continue
        try:
            view = (await http.get(f"/v1/threads/{tid}")).json()
            view = {k: view.get(k) for k in ("state", "turn_active", "last_seq", "last_exit")}
        except Exception as exc:  # the report must not hide the original failure
            view = {"error": repr(exc)}
        tails = [[(f.get("seq"), f.get("kind")) for f in c.frames[-6:]] for c in pair]
        lines.append(
            f"{tid}: {progress.get(tid)}; bridge {view}; A tail {tails[0]}; B tail {tails[1]}; error {err!r:.300}"
        )
    return f"{len(lines)} thread(s) did not finish; daemon stderr at {d.stderr_path}\n" + "\n".join(lines[:40])


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


def check_thread(
    thread_id: str, clients: tuple[Client, Client], last_seq: int, turn_ids: list[str], stored: list[dict[str, Any]]
) -> int:
    """Every invariant for one thread; returns its number of transcript events."""
    a, b = (transcript(c) for c in clients)
    for name, tr in (("A", a), ("B", b)):
        seqs = [f["seq"] for _, f in tr]
        assert seqs == list(range(1, last_seq + 1)), (
            f"thread {thread_id} client {name}: seqs not 1..{last_seq} exactly once in order: {seqs}"
        )
    # Byte-identical transcript frames on both clients.
    for (ta, fa), (tb, _) in zip(a, b, strict=True):
        assert ta == tb, f"thread {thread_id} seq {fa['seq']}: clients differ\n{ta}\n{tb}"
    # The store holds the same sequence, with the same content.
    assert [e["seq"] for e in stored] == list(range(1, last_seq + 1)), (
        f"thread {thread_id}: store seqs {[e['seq'] for e in stored]}, last_seq {last_seq}"
    )
    for e, (_, f) in zip(stored, a, strict=True):
        assert (e["seq"], e["kind"], e["data"]) == (f["seq"], f["kind"], f["data"]), (thread_id, e, f)
        assert e == f, (thread_id, e, f)
    # Every accepted prompt: exactly one turn.ended, with status success; no other turn.ended.
    ended = [f for _, f in a if f["kind"] == "turn.ended"]
    assert sorted(f["data"].get("turn_id") for f in ended) == sorted(turn_ids), (thread_id, ended, turn_ids)
    assert all(f["data"]["status"] == "success" for f in ended), (thread_id, ended)
    # The agent answered each prompt (the echo reply is in the transcript once per turn).
    replies = [
        f["data"]["text"]
        for _, f in a
        if f["kind"] == "message" and f["source"] == "agent" and f["data"].get("role") == "assistant"
    ]
    assert replies == [f"echo: load {thread_id} turn {k}" for k in range(len(turn_ids))], (thread_id, replies)
    return last_seq


def daemon_log_problems(stderr: str) -> list[str]:
    """Daemon log lines at error level or above, and anything that is not a JSON log line
    (a traceback, say): under load there should be none."""
    bad = []
    for line in stderr.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            bad.append(line)
            continue
        if not isinstance(entry, dict) or entry.get("level") in ("error", "critical", "exception"):
            bad.append(line)
    return bad


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


async def run_load(
    daemon_factory: Callable[..., Any],
    tmp_path: Path,
    agent_env: dict[str, str],
    *,
    label: str,
    threads: int,
    turns: int,
    budget_s: float,
    step_timeout: float,
    awp_every: int = 4,
) -> dict[str, Any]:
    """The shared body of both load tests. ``budget_s`` bounds all the turns together and
    ``step_timeout`` any single wait; both stay below the test's pytest timeout, so a hang
    fails with a report of the stuck threads rather than a bare timeout."""
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

        ids: list[str] = await bounded(SETUP_CONCURRENCY, [create(i) for i in range(threads)])
        assert len(set(ids)) == threads

        async def connect(tid: str) -> tuple[Client, Client]:
            return await d.ws(tid), await d.ws(tid)

        clients: list[tuple[Client, Client]] = await bounded(SETUP_CONCURRENCY, [connect(t) for t in ids])
        setup_s = time.monotonic() - t_setup

        sampler = Sampler(d.proc.pid)
        sampler.start()
        t0 = time.monotonic()
        progress: dict[str, str] = {}

        async def one_thread(tid: str, pair: tuple[Client, Client]) -> tuple[list[str], int]:
            turn_ids = await run_thread_turns(tid, pair, turns, step_timeout, progress)
            # Wait until both clients have everything the thread says it has: no sleeps.
            progress[tid] = "draining"
            r = await http.get(f"/v1/threads/{tid}")
            assert r.status_code == 200, r.text
            last = int(r.json()["last_seq"])
            await asyncio.gather(*(c.upto(last, step_timeout) for c in pair))
            progress[tid] = "done"
            return turn_ids, last

        try:
            tasks = [asyncio.create_task(one_thread(t, c)) for t, c in zip(ids, clients, strict=True)]
            await asyncio.wait(tasks, timeout=budget_s)
            run_s = time.monotonic() - t0
            for t in tasks:
                t.cancel()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            errors = [o if isinstance(o, BaseException) else None for o in outcomes]
            if any(errors):
                raise AssertionError(await stuck_report(http, d, ids, clients, progress, errors))
            turn_ids = [o[0] for o in outcomes if not isinstance(o, BaseException)]
            last_seqs = [o[1] for o in outcomes if not isinstance(o, BaseException)]
        finally:
            await sampler.stop()
        daemon_hwm_kib = vm_kib(d.proc.pid, "VmHWM")

        stored = await bounded(SETUP_CONCURRENCY, [store_events(http, t) for t in ids])
        total_events = 0
        for tid, pair, last, tids, st in zip(ids, clients, last_seqs, turn_ids, stored, strict=True):
            total_events += check_thread(tid, pair, last, tids, st)

        agent_pids = [
            f["data"]["pid"] for pair in clients for f in pair[0].frames if f.get("kind") == "process.started"
        ]
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
        "daemon_peak_fds": sampler.peak_daemon_fds,
        "rlimit_nofile": list(nofile),
        "cpus": os.cpu_count(),
    }
    report(figures)
    assert total_events == transcript_frames // 2
    problems = daemon_log_problems(d.stderr())
    assert not problems, f"daemon logged problems under load ({d.stderr_path}):\n" + "\n".join(problems[:20])
    # Each thread ran its own agent process, and all of them were alive at once.
    assert len(set(agent_pids)) == threads, agent_pids
    assert sampler.peak_agents == threads, figures
    return figures


# 100 threads × 2 clients × 10 turns takes ~25 s here, so it runs in every CI run
# (issue #3: "part of CI if it fits in a few minutes").
@pytest.mark.timeout(300)
async def test_load_many_threads_two_clients_each(
    daemon_factory: Callable[..., Any], tmp_path: Path, agent_env: dict[str, str]
) -> None:
    await run_load(
        daemon_factory, tmp_path, agent_env, label="many", threads=100, turns=10, budget_s=240, step_timeout=120
    )
