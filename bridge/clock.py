"""Wall-clock time as the transcript writes it."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

_SECOND: list[Any] = [None, ""]  # the last whole second formatted, and its text


def now_iso() -> str:
    """UTC now as ``2026-11-30T01:02:03.456Z`` (milliseconds, truncated). The date and time
    are formatted once per second; one is needed per transcript append (issue #8)."""
    t = time.time()
    sec = int(t)
    if sec != _SECOND[0]:
        _SECOND[0], _SECOND[1] = sec, datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{_SECOND[1]}.{min(int((t - sec) * 1000), 999):03d}Z"
