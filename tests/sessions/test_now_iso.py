"""The transcript timestamp (docs/api.md §6.1: ``ts`` like 2026-11-30T01:02:03.456Z), formatted with
a per-second cache (issue #8)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge import clock

TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=4_000_000_000, allow_nan=False), min_size=1, max_size=5))
def test_now_iso_is_the_utc_time_to_the_millisecond(times: list[float]) -> None:
    with pytest.MonkeyPatch.context() as mp:
        for t in times:
            mp.setattr(clock.time, "time", lambda t=t: t)
            text = clock.now_iso()
            assert TS.fullmatch(text), text
            parsed = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
            assert abs(parsed.timestamp() - t) < 0.0015, (t, text)
            assert parsed.timestamp() <= t + 1e-6  # truncated, never ahead
