"""``[capacity]``: what bounds a host besides a count of agents (docs/configuration.md,
docs/api.md "Capacity"). The agents, not the daemon, decide how many conversations a host
can hold, so the bound is a memory budget for all agents together; threads and what one
thread may store are capped too.

Only the settings live here; what enforces them is in the sessions layer (admission,
caps) and the process layer (limits, sampling)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class CapacitySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # All agents' memory together, in MiB: "auto" is 80% of the host's memory, or of the
    # daemon's cgroup limit when it has one; 0 turns the budget off (a count alone bounds).
    memory_budget_mb: int | Literal["auto"] = "auto"
    # Threads in the store, daemon-wide; and per user in users mode (None: no cap of its own).
    max_threads: int = Field(100_000, ge=1)
    max_threads_per_user: int | None = Field(None, ge=1)
    # What one thread's transcript may hold, in MiB; past it the agent is stopped
    # (reason transcript_full) and the thread stays readable.
    max_transcript_mb: int = Field(1024, ge=1)
    # A profile's memory_limit_mb as the kernel's limit: each such agent in a cgroup of its
    # own where the daemon may make one (process/cgroup.py), else sampling alone. "auto"
    # looks under /sys/fs/cgroup, "off" never tries; an absolute path names where the cgroup
    # file system is mounted instead.
    agent_cgroups: str = "auto"

    @field_validator("memory_budget_mb", mode="before")
    @classmethod
    def _budget(cls, value: object) -> object:
        # One plain refusal for every wrong value, not one per member of the union.
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            return value
        raise ValueError("must be 'auto', 0 (off) or a whole number of MiB")

    @field_validator("agent_cgroups")
    @classmethod
    def _cgroups(cls, value: str) -> str:
        if value in ("auto", "off") or value.startswith("/"):
            return value
        raise ValueError("must be 'auto', 'off' or the absolute path where the cgroup file system is mounted")
