"""W3C trace context as the bridge reads it (protocols/trace.py): strict, bounded, and a
bad value dropped rather than carried or logged."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import structlog

from bridge.errors import InvalidRequest
from bridge.logs import bound_trace, configure_logging, traced_turn
from bridge.protocols import trace
from bridge.protocols.acp import AcpCodec
from bridge.sessions.commands import Prompt, from_wire

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    "value",
    [
        TP.upper(),  # upper-case hex
        "01" + TP[2:],  # an unknown version
        "ff" + TP[2:],
        TP + "-00",  # trailing data on version 00
        "00-" + "0" * 32 + "-00f067aa0ba902b7-01",  # trace id all zeros
        "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",
        TP.replace("-", "_"),
        TP[:-1],
        " " + TP[1:],
        TP[:10] + "\n" + TP[11:],
        42,
        None,
        "x" * 100_000,
    ],
)
def test_a_malformed_traceparent_is_dropped_with_its_tracestate(value: Any) -> None:
    assert trace.traceparent(value) is None
    assert trace.context(value, "a=b") is None
    assert trace.from_meta({"traceparent": value, "tracestate": "a=b"}) is None


def test_a_valid_traceparent_is_kept_exactly() -> None:
    assert trace.context(TP) == {"traceparent": TP}
    assert trace.from_meta({"traceparent": TP, "tracestate": "congo=t61rcWkgMzE, rojo=00f067aa0ba902b7"}) == {
        "traceparent": TP,
        "tracestate": "congo=t61rcWkgMzE, rojo=00f067aa0ba902b7",
    }
    assert trace.context(TP, "tenant@vendor=x") == {"traceparent": TP, "tracestate": "tenant@vendor=x"}


@pytest.mark.parametrize(
    "state",
    [
        "a=b,a=c",  # a key twice
        "A=b",  # upper-case key
        "a=b=c",
        "a= b",  # a value may not start with a space... it may, but not end with one: see below
        "a=b ,c",
        ",".join(f"k{i}=v" for i in range(33)),  # 33 members
        "k=" + "v" * 600,  # longer than 512
        "a=b\nc=d",
        "",
        7,
    ],
)
def test_a_malformed_tracestate_is_dropped_alone(state: Any) -> None:
    got = trace.context(TP, state)
    if state == "a= b":
        assert got == {"traceparent": TP, "tracestate": "a= b"}  # leading space is part of the value's grammar
        return
    assert got == {"traceparent": TP}


def test_headers_need_exactly_one_traceparent_and_join_tracestates() -> None:
    assert trace.from_headers([TP, TP], []) is None
    assert trace.from_headers([], ["a=b"]) is None
    assert trace.from_headers([TP], ["a=b", "c=d"]) == {"traceparent": TP, "tracestate": "a=b,c=d"}


def test_checked_takes_only_what_context_makes() -> None:
    assert trace.checked({"traceparent": TP}) == {"traceparent": TP}
    assert trace.checked({"traceparent": TP, "baggage": "x=1"}) is None
    assert trace.checked({"traceparent": TP, "tracestate": "A=1"}) is None  # would have been dropped
    assert trace.checked("nope") is None


def test_the_acp_prompt_carries_it_at_the_root_of_meta_and_only_a_valid_one() -> None:
    codec = AcpCodec(cwd="/")
    codec.session_id = "s1"
    line = json.loads(codec.encode_prompt([{"type": "text", "text": "hi"}], {"traceparent": TP, "tracestate": "a=b"}))
    assert line["params"]["_meta"] == {"traceparent": TP, "tracestate": "a=b"}
    plain = json.loads(codec.encode_prompt([{"type": "text", "text": "hi"}], {"traceparent": "junk"}))
    assert "_meta" not in plain["params"]
    assert "_meta" not in json.loads(codec.encode_prompt([{"type": "text", "text": "hi"}]))["params"]


def test_the_prompt_command_holds_the_shape_and_crosses_replicas() -> None:
    p = Prompt(content=[{"type": "text", "text": "x"}], trace={"traceparent": TP})
    kind, body = p.to_wire()
    assert body["trace"] == {"traceparent": TP}
    assert from_wire(kind, body) == p
    _, plain = Prompt(content=[{"type": "text", "text": "x"}]).to_wire()
    assert "trace" not in plain  # an older replica refuses unknown fields
    for bad in ({"baggage": "x"}, {"traceparent": 5}, {"traceparent": "x" * 513}, {}, "tp"):
        with pytest.raises(InvalidRequest):
            Prompt(content=[{"type": "text", "text": "x"}], trace=bad)  # type: ignore[arg-type]


def test_log_lines_carry_the_ids_and_never_the_raw_values(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    configure_logging("json", logging.INFO)
    try:
        with bound_trace({"traceparent": TP, "tracestate": "secret=1"}):
            structlog.get_logger("t").info("inside")
        structlog.get_logger("t").info("outside")
        traced_turn("thr_1", "turn_1", {"traceparent": TP})
        traced_turn("thr_1", "turn_2", {"traceparent": "00-evil\n"})  # never valid: nothing logged
    finally:
        structlog.reset_defaults()
        root.handlers[:] = handlers  # the handler made here writes to this test's captured stderr
        root.setLevel(level)
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    inside, outside, turn = lines
    assert inside["trace_id"] == TP[3:35] and inside["parent_span_id"] == TP[36:52]
    assert "trace_id" not in outside
    assert turn["event"] == "turn.traced" and turn["turn_id"] == "turn_1" and turn["trace_id"] == TP[3:35]
    assert "secret" not in json.dumps(lines)
