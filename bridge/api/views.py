"""How a thread row is shown to clients (docs/api.md §4.3): the public fields only."""

from __future__ import annotations

from typing import Any

from bridge.store.base import PUBLIC_THREAD_FIELDS, ThreadRow


def thread_view(row: ThreadRow) -> dict[str, Any]:
    out = {k: row.get(k) for k in PUBLIC_THREAD_FIELDS}
    out["options"] = row.get("options") or {}
    out["pending_permissions"] = row.get("pending_permissions") or 0
    return out
