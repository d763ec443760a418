"""ws_coalesce.coalesce (``?coalesce=1``, docs/api.md §5.1): frame payloads joined into
NDJSON frames, in order, each within the byte bound unless it is one payload on its own."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from bridge.api.ws_coalesce import COALESCE_BYTES, coalesce

# Lines as frames hold them: any text without a newline (non-ASCII too: the bound is bytes).
lines = st.text(st.characters(exclude_characters="\n", exclude_categories=["Cs"]), min_size=1, max_size=40)


@given(texts=st.lists(lines, max_size=60), limit=st.integers(1, 200), as_bytes=st.booleans())
def test_coalesced_frames_split_back_exactly_and_stay_within_the_bound(texts, limit, as_bytes):
    payloads = [t.encode() for t in texts] if as_bytes else texts
    frames = coalesce(payloads, limit)
    sep = b"\n" if as_bytes else "\n"
    assert [line for frame in frames for line in frame.split(sep)] == (payloads or [])
    for frame in frames:
        size = len(frame) if as_bytes else len(frame.encode())
        assert size <= limit or sep not in frame
    # Greedy: no two neighbouring frames would have fitted in one.
    sizes = [len(f) if as_bytes else len(f.encode()) for f in frames]
    assert all(a + 1 + b > limit for a, b in itertools.pairwise(sizes))


def test_the_default_bound_is_64_kib_and_a_longer_line_is_alone():
    line = "x" * 1000
    frames = coalesce([line] * 200)
    assert [len(f) for f in frames] == [65 * 1001 - 1, 65 * 1001 - 1, 65 * 1001 - 1, 5 * 1001 - 1]
    assert COALESCE_BYTES == 65536
    big = "y" * 70_000
    assert coalesce(["a", big, "b", "c"]) == ["a", big, "b\nc"]
    assert coalesce(["é" * 40_000, "é" * 40_000]) == ["é" * 40_000, "é" * 40_000]  # 80 KB in UTF-8
    assert coalesce([]) == [] and coalesce(["one"]) == ["one"]
