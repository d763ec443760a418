"""Admission by a memory budget, the arithmetic (issue #36; docs/api.md "Capacity").

Pure: what the agents take comes in as numbers (sessions/memory_guard.py reads them), and
what comes out is a decision — admit, admit after stopping these idle agents, or refuse.

* An agent starts only when the budget has room for its profile's estimate, counting what
  the agents running here take now (their sampled RSS; their estimate while they start).
* Without room, the idle agents (no turn, nothing queued, no permission waiting) are
  stopped, least recently active first, until there is; if stopping every idle one would
  not make room, nothing is stopped and the start is refused.
* An agent alone is always admitted: a budget smaller than one agent would otherwise
  refuse every start, and refusing frees nothing.
* Per user (users mode): with ``[auth] max_conversations_per_user`` set, one user's agents
  may take the same share of the budget as of the agents' count
  (``budget × per_user / max_conversations``); a start past the share stops that user's
  own idle agents first, never another user's for it.
* A profile's estimate: the median peak RSS of its last few runs; before any, its
  ``memory_estimate_mb``; else :data:`DEFAULT_ESTIMATE_MB`.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

# Before a profile's first run was measured and with no memory_estimate_mb: above the
# median idle Claude Code process tree (~660 MB), so the first agents of an unknown
# profile are not under-counted; the first measured run replaces it.
DEFAULT_ESTIMATE_MB = 768
RUNS_KEPT = 5  # runs per profile the median is taken over


@dataclass(frozen=True, slots=True)
class Running:
    """An agent running (or starting) here, as admission sees it."""

    key: str  # its thread id
    user: str | None  # its thread's owner (users mode)
    mb: float  # what it takes now: its sampled RSS, or its estimate while it starts
    idle: bool  # may be stopped to make room
    last_active: float  # monotonic seconds; the oldest is stopped first


class Estimates:
    """Each profile's recent runs' peak RSS (MiB), in memory only: a restarted daemon
    starts again from the profiles' ``memory_estimate_mb``."""

    def __init__(self, default_mb: int = DEFAULT_ESTIMATE_MB, keep: int = RUNS_KEPT) -> None:
        self.default_mb = default_mb
        self._keep = keep
        self._peaks: dict[str, deque[float]] = {}

    def record(self, profile: str, peak_mb: float) -> None:
        if peak_mb > 0:
            self._peaks.setdefault(profile, deque(maxlen=self._keep)).append(peak_mb)

    def of(self, profile: str, configured_mb: int | None) -> float:
        peaks = self._peaks.get(profile)
        if peaks:
            return float(statistics.median(peaks))
        return float(configured_mb if configured_mb is not None else self.default_mb)


def user_share_mb(budget_mb: float, per_user: int | None, max_conversations: int) -> float | None:
    """A user's share of the budget (None: no share of its own)."""
    if per_user is None or per_user >= max_conversations:
        return None
    return budget_mb * per_user / max_conversations


def _fit(budget_mb: float, need_mb: float, agents: Sequence[Running]) -> list[str] | None:
    """The idle agents to stop, in order, so that ``need_mb`` fits; None if it cannot."""
    used = sum(a.mb for a in agents)
    out: list[str] = []
    for agent in sorted((a for a in agents if a.idle), key=lambda a: a.last_active):
        if used + need_mb <= budget_mb:
            break
        out.append(agent.key)
        used -= agent.mb
    # Alone (nothing left running once these are stopped), it starts whatever its estimate.
    return out if used + need_mb <= budget_mb or len(out) == len(agents) else None


def plan(
    budget_mb: float,
    need_mb: float,
    agents: Sequence[Running],
    *,
    user: str | None = None,
    share_mb: float | None = None,
) -> list[str] | None:
    """Which idle agents to stop (in order) so that an agent needing ``need_mb`` starts:
    [] when it fits now, None when it cannot fit (refuse; stop nothing). ``user`` and
    ``share_mb``: the starting agent's user and that user's share."""
    evict: list[str] = []
    if user is not None and share_mb is not None:
        mine = _fit(share_mb, need_mb, [a for a in agents if a.user == user])
        if mine is None:
            return None
        evict += mine
    rest = _fit(budget_mb, need_mb, [a for a in agents if a.key not in evict])
    return None if rest is None else evict + rest
