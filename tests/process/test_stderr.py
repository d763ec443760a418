"""stderr relaying, pure: lines cut to a bound, and a rate limit that says when it drops."""

from __future__ import annotations

from bridge.process.agent_process import STDERR_LINE_BYTES, StderrLines, StderrRate


def test_lines_are_split_cut_and_the_rest_of_an_overlong_line_is_discarded() -> None:
    lines = StderrLines()
    assert lines.feed(b"one\ntw") == [b"one"]
    long = b"x" * (STDERR_LINE_BYTES + 10)
    assert lines.feed(b"o\n" + long) == [b"two", long]  # the head of the long line, once
    assert lines.feed(b"more of it\nthree\n") == [b"three"]
    assert lines.feed(b"tail") == []
    assert lines.feed(b"") == [b"tail"]


def test_the_rate_limit_says_when_dropping_starts_and_how_many_were_dropped() -> None:
    rate = StderrRate(2)
    assert rate.admit(b"a", 0.0) == ["a"]
    assert rate.admit(b"b", 0.1) == ["b"]
    assert rate.admit(b"c", 0.2) == ["[stderr rate limit of 2 lines/s reached: dropping lines]"]
    assert rate.admit(b"d", 0.3) == []
    assert rate.admit(b"e", 1.5) == ["[2 stderr lines dropped: rate limit]", "e"]
    assert rate.finish() is None
    for t in (1.6, 1.7, 1.8):
        rate.admit(b"f", t)
    assert rate.finish() == "[2 stderr lines dropped: rate limit]"


def test_a_cut_line_says_so() -> None:
    rate = StderrRate(10)
    [text] = rate.admit(b"y" * (STDERR_LINE_BYTES + 1), 0.0)
    assert text.endswith(" …[cut]") and len(text) == STDERR_LINE_BYTES + len(" …[cut]")
