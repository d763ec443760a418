"""LineFramer: bytes → ``\\n``-terminated lines with a hard length cap (docs/api.md §6.7,
AWP contract "an unbroken stdout buffer over 4 MiB terminates the runtime")."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.protocols.framing import MAX_LINE_BYTES, LineFramer, LineTooLong


def feed_all(framer: LineFramer, chunks: list[bytes]) -> list[bytes]:
    lines: list[bytes] = []
    for chunk in chunks:
        lines.extend(framer.feed(chunk))
    return lines


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = [0, *sorted(set(cuts)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(points)]


# ---------------------------------------------------------------- chunk boundaries

line_bytes = st.binary(max_size=64).map(lambda b: b.replace(b"\n", b""))


@settings(max_examples=200, deadline=None, database=None)
@given(
    lines=st.lists(line_bytes, max_size=12),
    tail=line_bytes,
    data=st.data(),
)
def test_lines_are_the_same_whatever_the_chunk_boundaries(lines, tail, data):
    stream = b"".join(line + b"\n" for line in lines) + tail
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=20), label="cuts")
    framer = LineFramer()

    out = feed_all(framer, split_at(stream, cuts))

    assert out == lines
    assert framer.close() == (tail or None)


@settings(max_examples=100, deadline=None, database=None)
@given(stream=st.binary(max_size=300), data=st.data())
def test_arbitrary_bytes_split_anywhere_match_a_single_feed(stream, data):
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=30), label="cuts")
    whole = LineFramer()
    pieces = LineFramer()

    expected = whole.feed(stream)
    got = feed_all(pieces, split_at(stream, cuts))

    assert got == expected == stream.split(b"\n")[:-1]
    assert pieces.close() == whole.close() == (stream.split(b"\n")[-1] or None)


def byte_by_byte(chunks: list[bytes], cap: int) -> tuple[list[bytes], bool]:
    """The framer's contract, one byte at a time: the lines up to the first one over
    ``cap`` (a complete line, or the unterminated tail at the end of a chunk), and whether
    the cap was crossed."""
    out: list[bytes] = []
    cur = bytearray()
    for chunk in chunks:
        for byte in chunk:
            if byte != 10:
                cur.append(byte)
                continue
            if len(cur) > cap:
                return out, True
            out.append(bytes(cur))
            cur.clear()
        if len(cur) > cap:
            return out, True
    return out, False


@settings(max_examples=300, deadline=None, database=None)
@given(stream=st.text("ab\n\r", max_size=60).map(str.encode), cap=st.integers(0, 8), data=st.data())
def test_lines_and_the_cap_match_a_byte_by_byte_framer(stream, cap, data):
    # The split-based feed (issue #22) against the definition: the same lines, the same
    # chunk at which the cap is crossed, and the complete lines before it kept.
    chunks = split_at(stream, data.draw(st.lists(st.integers(0, len(stream)), max_size=12), label="cuts"))
    framer = LineFramer(cap)
    got: list[bytes] = []
    crossed = False
    for chunk in chunks:
        try:
            got += framer.feed(chunk)
        except LineTooLong as exc:
            got += exc.lines
            crossed = True
            break

    assert (got, crossed) == byte_by_byte(chunks, cap)


def test_byte_at_a_time_feeding_yields_each_line_once_at_its_newline():
    framer = LineFramer()
    produced = [framer.feed(bytes([b])) for b in b'{"a":1}\n{"b":2}\n']
    assert produced[6] == []  # the closing brace alone completes nothing
    assert produced[7] == [b'{"a":1}']
    assert produced[15] == [b'{"b":2}']
    assert [line for batch in produced for line in batch] == [b'{"a":1}', b'{"b":2}']


def test_several_lines_in_one_chunk_come_out_in_order():
    assert LineFramer().feed(b"one\ntwo\nthree\n") == [b"one", b"two", b"three"]


def test_empty_lines_are_returned_as_empty_bytes():
    assert LineFramer().feed(b"\n\nx\n\n") == [b"", b"", b"x", b""]


def test_feeding_nothing_returns_nothing():
    framer = LineFramer()
    assert framer.feed(b"") == []
    assert framer.feed(b"partial") == []
    assert framer.feed(b"") == []
    assert framer.close() == b"partial"


# ---------------------------------------------------------------- CRLF


def test_crlf_lines_keep_the_carriage_return_and_lose_only_the_newline():
    framer = LineFramer()
    assert framer.feed(b'{"a":1}\r\n{"b":2}\r\n') == [b'{"a":1}\r', b'{"b":2}\r']


def test_crlf_split_between_cr_and_lf():
    framer = LineFramer()
    assert framer.feed(b'{"a":1}\r') == []
    assert framer.feed(b"\n") == [b'{"a":1}\r']
    assert framer.close() is None


def test_lone_carriage_return_is_not_a_line_terminator():
    framer = LineFramer()
    assert framer.feed(b"a\rb\r") == []
    assert framer.close() == b"a\rb\r"


# ---------------------------------------------------------------- the cap

CAP = 64


def test_default_cap_is_four_mebibytes():
    assert MAX_LINE_BYTES == 4 * 1024 * 1024
    assert LineFramer().max_line == MAX_LINE_BYTES


def test_line_exactly_at_the_cap_passes():
    framer = LineFramer(max_line=CAP)
    assert framer.feed(b"x" * CAP + b"\n") == [b"x" * CAP]


def test_unterminated_buffer_exactly_at_the_cap_is_still_accepted():
    framer = LineFramer(max_line=CAP)
    assert framer.feed(b"x" * CAP) == []
    assert framer.feed(b"\n") == [b"x" * CAP]


def test_cap_plus_one_without_newline_raises():
    framer = LineFramer(max_line=CAP)
    with pytest.raises(LineTooLong) as info:
        framer.feed(b"x" * (CAP + 1))
    assert info.value.limit == CAP
    assert str(CAP) in str(info.value)


def test_cap_plus_one_with_its_newline_in_the_same_chunk_still_raises():
    framer = LineFramer(max_line=CAP)
    with pytest.raises(LineTooLong):
        framer.feed(b"x" * (CAP + 1) + b"\n")


def test_too_long_line_after_good_lines_in_one_chunk_raises():
    framer = LineFramer(max_line=CAP)
    with pytest.raises(LineTooLong):
        framer.feed(b"ok\n" + b"x" * (CAP + 1) + b"\nafter\n")


def test_long_line_fed_in_small_pieces_raises_as_soon_as_the_buffer_exceeds_the_cap():
    framer = LineFramer(max_line=CAP)
    for i in range(CAP):
        assert framer.feed(b"y") == [], f"raised early at byte {i + 1}"
    with pytest.raises(LineTooLong):
        framer.feed(b"y")


@pytest.mark.parametrize("piece", [1, 3, 7, 16, 63])
def test_long_line_raises_on_the_first_feed_that_crosses_the_cap(piece):
    framer = LineFramer(max_line=CAP)
    fed = 0
    while fed + piece <= CAP:
        assert framer.feed(b"z" * piece) == []
        fed += piece
    with pytest.raises(LineTooLong):
        framer.feed(b"z" * piece)


def test_completed_lines_do_not_count_towards_the_cap():
    framer = LineFramer(max_line=CAP)
    for _ in range(50):
        assert framer.feed(b"a" * CAP + b"\n") == [b"a" * CAP]
    # A full line followed by a partial line at the cap in the same chunk is fine too.
    assert framer.feed(b"b" * CAP + b"\n" + b"c" * CAP) == [b"b" * CAP]
    assert framer.close() == b"c" * CAP


def test_default_cap_long_line_in_64k_chunks():
    framer = LineFramer()
    chunk = b"q" * (64 * 1024)
    for _ in range(MAX_LINE_BYTES // len(chunk)):
        assert framer.feed(chunk) == []
    assert framer.feed(b"\n") == [b"q" * MAX_LINE_BYTES]
    for _ in range(MAX_LINE_BYTES // len(chunk)):
        framer.feed(chunk)
    with pytest.raises(LineTooLong):
        framer.feed(b"q")


# ---------------------------------------------------------------- close()


def test_close_returns_the_unterminated_tail():
    framer = LineFramer()
    assert framer.feed(b'{"a":1}\n{"b"') == [b'{"a":1}']
    assert framer.feed(b":2}") == []
    assert framer.close() == b'{"b":2}'


def test_close_with_nothing_buffered_returns_none():
    framer = LineFramer()
    assert framer.close() is None
    framer.feed(b"done\n")
    assert framer.close() is None


def test_close_empties_the_buffer():
    framer = LineFramer()
    framer.feed(b"tail")
    assert framer.close() == b"tail"
    assert framer.close() is None
    assert framer.feed(b"next\n") == [b"next"]
