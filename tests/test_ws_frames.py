"""The batching transport's frame writer (issue #8): byte for byte the RFC 6455 frames of
the payloads, whether given as text (ASCII or not) or as UTF-8 bytes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bridge.api.ws_transport import frames


def reference(payloads: list[bytes]) -> bytes:
    out = b""
    for data in payloads:
        n = len(data)
        if n < 126:
            out += bytes((0x81, n))
        elif n < 65536:
            out += bytes((0x81, 126)) + n.to_bytes(2, "big")
        else:
            out += bytes((0x81, 127)) + n.to_bytes(8, "big")
        out += data
    return out


TEXT = st.one_of(
    st.text(max_size=300),
    st.text(alphabet="ax\x7f", min_size=120, max_size=140),
    st.integers(65530, 65540).map(lambda n: "é" * (n // 2)),
    st.integers(65530, 65540).map(lambda n: "a" * n),
)


@given(st.lists(TEXT, max_size=6))
def test_frames_are_the_rfc6455_frames_of_their_payloads(texts: list[str]) -> None:
    payloads = [t.encode("utf-8", "surrogatepass") for t in texts]
    assert frames(payloads) == reference(payloads)
    if all(t.encode("utf-8", "surrogatepass") == t.encode("utf-8", "ignore") for t in texts):
        assert frames(texts) == reference(payloads)
