"""A latency histogram for /metrics (Prometheus buckets, cumulative): store commit
latency as the conversations see it (from an append's call to its durable return,
group-commit wait included)."""

from __future__ import annotations

import bisect

BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Latency:
    def __init__(self, buckets: tuple[float, ...] = BUCKETS_S) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last: above every bucket (+Inf only)
        self.total_s = 0.0
        self.count = 0
        self.last_s = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.total_s += seconds
        self.count += 1
        self.last_s = seconds

    def exposition(self, name: str, help_text: str) -> str:
        """The histogram in Prometheus' text format."""
        out = [f"# HELP {name} {help_text}\n", f"# TYPE {name} histogram\n"]
        running = 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            running += n
            out.append(f'{name}_bucket{{le="{bound:g}"}} {running}\n')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}\n')
        out.append(f"{name}_sum {self.total_s:.6f}\n{name}_count {self.count}\n")
        return "".join(out)
