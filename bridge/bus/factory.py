"""The bus a daemon runs with: Redis when ``[cluster] bus_url`` is set, else the
single-daemon :class:`~bridge.bus.base.LocalBus`. redis-py is imported only when a bus URL
is configured (the default install has none of it: ``pip install 'agent-bridge[cluster]'``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bridge.bus.base import Bus, LocalBus


def make_bus(url: str | None, replica_id: str, info: Mapping[str, Any] | None = None) -> Bus:
    if url is None:
        return LocalBus(replica_id)
    try:
        from bridge.bus.redis import RedisBus
    except ImportError as exc:  # pragma: no cover - the test extra installs redis
        raise RuntimeError("[cluster] bus_url needs redis-py: pip install 'agent-bridge[cluster]'") from exc
    return RedisBus(url, replica_id, info=info)
