"""The agents' memory on this host: admission by the budget, eviction of idle agents, the
per-profile limit, and the figures /metrics shows (issue #36; docs/api.md "Capacity").

The arithmetic is sessions/admission.py's; what an agent takes is the agent tracker's
sample of its whole process tree (process/subreaper.py, process/memory.py), read here
once a second (:meth:`MemoryGuard.run`). Each replica budgets its own host: only the
agents this daemon runs are counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from bridge.clock import now_iso
from bridge.config import Settings
from bridge.errors import BridgeError, Capacity
from bridge.process.cgroup import AGENT_CGROUPS, MODES
from bridge.process.memory import MIB, budget_mb
from bridge.process.subreaper import TRACKER
from bridge.protocols.envelope import ephemeral
from bridge.sessions.admission import Estimates, Running, plan, user_share_mb
from bridge.sessions.conversation import Conversation

log = structlog.get_logger("bridge.memory")

WATCH_INTERVAL_S = 1.0  # the tracker samples once a second; reading it more often gains nothing
RETRY_AFTER_S = 5  # a refused prompt: about the time a turn or an idle stop frees an agent
# An agent just started has not grown yet (a CLI loads for seconds): for this long after
# its admission it counts at least its estimate, whatever its first samples show.
START_WINDOW_S = 10.0


@dataclass(slots=True)
class _Seen:
    pid: int
    profile: str
    peak: int = 0  # bytes
    killed: bool = False  # stopped over its limit: counted once, however long its exit takes


class MemoryGuard:
    def __init__(self, settings: Settings, agents: Callable[[], Sequence[Conversation]]) -> None:
        self.settings = settings
        self.budget_mb = budget_mb(settings.capacity.memory_budget_mb)
        self.estimates = Estimates()
        self._agents = agents  # the conversations loaded here
        self._lock = asyncio.Lock()  # one admission at a time: two starts never share one room
        self._seen: dict[str, _Seen] = {}  # thread → its agent's pid, profile and peak so far
        self._admitted: dict[str, float] = {}  # thread → when its agent was last admitted
        self.refused = 0
        self.evicted = 0
        self.limit_stops = 0

    # ------------------------------------------------------------------ admission

    def estimate_mb(self, conv: Conversation) -> float:
        prof = conv.profile
        name = conv.thread["agent"]
        return self.estimates.of(name, None if prof is None else prof.memory_estimate_mb)

    def taking_mb(self, conv: Conversation) -> float:
        """What ``conv``'s agent takes now: its last sample; while it starts (no sample
        yet, or admitted less than START_WINDOW_S ago), at least its estimate."""
        pid = conv.agent_pid
        rss = None if pid is None else TRACKER.memory(pid)[0]
        at = self._admitted.get(conv.id)
        young = at is not None and time.monotonic() - at < START_WINDOW_S
        if rss is None or young:
            return max(self.estimate_mb(conv), 0 if rss is None else rss / MIB)
        return rss / MIB

    def _running(self, conv: Conversation) -> list[Running]:
        return [
            Running(
                c.id,
                c.thread.get("owner"),
                self.taking_mb(c),
                c.running and not c.starting and not c.busy and not c.pending_permissions(),
                c.last_activity,
            )
            for c in self._agents()
            if (c.running or c.starting) and c is not conv
        ]

    async def admit(self, conv: Conversation) -> None:
        """Return once ``conv``'s agent may start, idle agents stopped for it if need be;
        raise 503 ``memory_budget`` (Retry-After) when there is no room."""
        if self.budget_mb is None:
            return
        async with self._lock:
            need = self.estimate_mb(conv)
            owner = conv.thread.get("owner")
            auth, srv = self.settings.auth, self.settings.server
            share = user_share_mb(self.budget_mb, auth.max_conversations_per_user, srv.max_conversations)
            running = self._running(conv)
            evict = plan(self.budget_mb, need, running, user=owner, share_mb=None if owner is None else share)
            if evict is None:
                self.refused += 1
                used = sum(r.mb for r in running)
                log.info("agent.memory_refused", thread_id=conv.id, need_mb=round(need), used_mb=round(used))
                raise Capacity(
                    f"no room in the memory budget: this agent needs about {need:.0f} MiB, the agents running "
                    f"take {used:.0f} of {self.budget_mb} MiB and none is idle; retry later",
                    code="memory_budget",
                    retry_after_s=RETRY_AFTER_S,
                )
            victims = [c for c in self._agents() if c.id in evict]
            await asyncio.gather(*(self._evict(c, conv.id) for c in victims))
            self._admitted[conv.id] = time.monotonic()

    async def _evict(self, conv: Conversation, for_thread: str) -> None:
        if conv.busy or conv.pending_permissions():
            return  # a prompt reached it since the plan: its turn is never cut for another's start
        self.evicted += 1
        log.info("agent.memory_evicted", thread_id=conv.id, for_thread=for_thread)
        text = (
            "this thread's idle agent was stopped to make room in the host's memory budget; "
            "the thread is kept and its next prompt resumes it"
        )
        conv.fanout.broadcast_side(ephemeral("notice", now_iso(), code="memory_evicted", text=text))
        with contextlib.suppress(BridgeError):
            await conv.stop("memory_budget")

    # ------------------------------------------------------------------ sampling

    async def run(self) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            self.tick()

    def tick(self) -> None:
        """Read each agent's last sample: stop one over its profile's limit, keep each
        run's peak, and learn the peaks of the runs that ended."""
        live = {conv.id for conv in self._agents() if self._check(conv)}
        for key in [k for k in self._seen if k not in live]:
            self._learn(key)
        now = time.monotonic()
        for key in [k for k, at in self._admitted.items() if now - at >= START_WINDOW_S]:
            del self._admitted[key]

    def _check(self, conv: Conversation) -> bool:
        """One agent's sample (False: no agent runs for ``conv``)."""
        pid = conv.agent_pid
        if pid is None:
            return False
        rss, peak = TRACKER.memory(pid)
        seen = self._seen.get(conv.id)
        if seen is None or seen.pid != pid:  # a new life: the last one's peak is learnt
            self._learn(conv.id)
            seen = self._seen[conv.id] = _Seen(pid, conv.thread["agent"])
        seen.peak = max(seen.peak, peak)
        limit = None if conv.profile is None else conv.profile.memory_limit_mb
        if not seen.killed and (by := _over(pid, rss, limit)) is not None and conv.kill_now("memory_limit"):
            seen.killed = True
            self.limit_stops += 1
            if (cgroup := AGENT_CGROUPS.of(pid)) is not None:
                cgroup.stopped = True  # its exit is counted here, not again as the kernel's
            log.warning(
                "agent.memory_limit", thread_id=conv.id, pid=pid, rss_mb=(rss or 0) // MIB, limit_mb=limit, by=by
            )
        return True

    def _learn(self, key: str) -> None:
        seen = self._seen.pop(key, None)
        if seen is not None:
            self.estimates.record(seen.profile, seen.peak / MIB)

    # ------------------------------------------------------------------ /metrics

    def exposition(self) -> str:
        per_profile: dict[str, int] = {}
        for conv in self._agents():
            pid = conv.agent_pid
            rss = None if pid is None else TRACKER.memory(pid)[0]
            if rss is not None:
                name = conv.thread["agent"]
                per_profile[name] = per_profile.get(name, 0) + rss
        rows = [
            ("agents_rss_bytes", "gauge", "Resident memory of every agent's process tree, at the last sample"),
            ("memory_budget_bytes", "gauge", "The agents' memory budget on this host (0: off)"),
            ("memory_refused_total", "counter", "Agent starts refused for want of memory (503 memory_budget)"),
            ("memory_evictions_total", "counter", "Idle agents stopped to make room in the budget"),
            ("memory_limit_stops_total", "counter", "Agents stopped over their profile's memory_limit_mb"),
            (
                "memory_oom_kills_total",
                "counter",
                "Agents in whose cgroup the kernel's OOM killer struck (memory_limit_mb)",
            ),
        ]
        values = [
            sum(per_profile.values()),
            0 if self.budget_mb is None else self.budget_mb * MIB,
            self.refused,
            self.evicted,
            self.limit_stops + AGENT_CGROUPS.kernel_stops,  # stopped by the daemon, or ended by the kernel
            AGENT_CGROUPS.oom_lives,
        ]
        out = [
            f"# HELP agent_bridge_{name} {text}.\n# TYPE agent_bridge_{name} {kind}\nagent_bridge_{name} {value}\n"
            for (name, kind, text), value in zip(rows, values, strict=True)
        ]
        name = "agent_bridge_profile_rss_bytes"
        out.append(f"# HELP {name} Resident memory of the agents of each profile.\n# TYPE {name} gauge\n")
        out += [f'{name}{{profile="{prof}"}} {rss}\n' for prof, rss in sorted(per_profile.items())]
        name = "agent_bridge_memory_limit_mode"
        out.append(
            f"# HELP {name} How memory_limit_mb is enforced: 1 for the way in use (a cgroup per agent, "
            f"v2 or v1, with the sample as a second line; or the sample alone).\n# TYPE {name} gauge\n"
        )
        out += [f'{name}{{mode="{mode}"}} {int(mode == AGENT_CGROUPS.mode)}\n' for mode in MODES]
        return "".join(out)


def _over(pid: int, rss: int | None, limit_mb: int | None) -> str | None:
    """Why the agent ``pid`` is over its limit ("sample": its tree's last sample; "kernel":
    the OOM killer struck in its cgroup), or None. In a cgroup the kernel enforces the
    limit: past it one of the agent's processes is killed, which the agent may survive; it
    is stopped then too, as one the sample finds over it (the second line, either way)."""
    cgroup = AGENT_CGROUPS.of(pid)
    if cgroup is not None and AGENT_CGROUPS.oom_killed(cgroup):
        return "kernel"
    if rss is not None and limit_mb is not None and rss > limit_mb * MIB:
        return "sample"
    return None
