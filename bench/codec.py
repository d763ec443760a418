"""Decoding cost per stdout line, by line shape: ``StreamJsonCodec.decode`` (with its
shortcuts, issue #8 and #22) against the generic path ``_decode_slow`` and a bare ``orjson.loads`` of the
same line, interleaved in one run (docs/benchmarks.md).

    python -m bench.codec            # a few seconds
    python -m bench.codec --quick    # a smoke run; numbers are not meaningful

Each figure is the minimum over ``--rounds`` rounds of ``--number`` decodes (the least
disturbed round of a shared machine); compare the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import os
import time
import timeit
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import orjson

from bridge.protocols.awp_jsonl import AwpJsonlCodec
from bridge.protocols.stream_json import StreamJsonCodec

SESSION = "4f0b6a8e-1c2d-4e5f-9a0b-1c2d3e4f5a6b"
UUID = "9a0b1c2d-3e4f-5a6b-7c8d-9e0f1a2b3c4d"


def flood_line(size: int) -> bytes:
    """A text delta of ``size`` bytes as bench/agents/flood_agent.py writes it."""
    head = (
        '{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"'
    )
    tail = f'"}}}},"session_id":"bench-{SESSION}"}}'
    return f"{head}{12345:08d} {'x' * max(0, size - len(head) - len(tail) - 9)}{tail}".encode()


def flood_assistant_line(size: int) -> bytes:
    """An assistant message of ``size`` bytes as ``flood N S assistant`` writes it."""
    from bench.agents.flood_agent import ASSISTANT_HEAD

    head = ASSISTANT_HEAD % 12345
    tail = f'"}}]}},"session_id":"bench-{SESSION}"}}'
    return f"{head}{12345:08d} {'x' * max(0, size - len(head) - len(tail) - 9)}{tail}".encode()


def assistant(content: list[dict[str, Any]]) -> bytes:
    """An assistant message as Claude Code writes it (docs/api.md §7.1)."""
    return orjson.dumps(
        {
            "type": "assistant",
            "message": {
                "id": "msg_01",
                "type": "message",
                "role": "assistant",
                "model": "claude-opus-4-8",
                "content": content,
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": 50,
                    "output_tokens": 12,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0,
                },
                "context_management": None,
            },
            "parent_tool_use_id": None,
            "session_id": SESSION,
            "uuid": UUID,
        }
    )


def stream_event(event: dict[str, Any]) -> bytes:
    """A stream_event line as Claude Code writes it (docs/api.md §7.1)."""
    return orjson.dumps(
        {"type": "stream_event", "event": event, "session_id": SESSION, "parent_tool_use_id": None, "uuid": UUID}
    )


def delta(kind: str, key: str, text: str) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": 0, "delta": {"type": kind, key: text}}


SHAPES: list[tuple[str, type[StreamJsonCodec], bytes]] = [
    ("flood_agent text delta, 200 B", StreamJsonCodec, flood_line(200)),
    ("text_delta", StreamJsonCodec, stream_event(delta("text_delta", "text", "Hello, here is the plan: "))),
    ("thinking_delta", StreamJsonCodec, stream_event(delta("thinking_delta", "thinking", "The user wants a "))),
    ("input_json_delta", StreamJsonCodec, stream_event(delta("input_json_delta", "partial_json", '{"command": "l'))),
    (
        "content_block_start",
        StreamJsonCodec,
        stream_event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    ),
    ("content_block_stop", StreamJsonCodec, stream_event({"type": "content_block_stop", "index": 0})),
    (
        "message_start",
        StreamJsonCodec,
        stream_event(
            {
                "type": "message_start",
                "message": {
                    "id": "msg_01",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-opus-4-8",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": 50,
                        "output_tokens": 1,
                        "cache_creation_input_tokens": 0,
                        "cache_read_input_tokens": 0,
                    },
                },
            }
        ),
    ),
    (
        "message_delta",
        StreamJsonCodec,
        stream_event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 12},
            }
        ),
    ),
    ("flood_agent assistant, 200 B", StreamJsonCodec, flood_assistant_line(200)),
    ("assistant (text block)", StreamJsonCodec, assistant([{"type": "text", "text": "Hello, here is the plan."}])),
    ("assistant, 4 KiB text", StreamJsonCodec, assistant([{"type": "text", "text": "All good. " * 410}])),
    (
        "assistant (thinking + text)",
        StreamJsonCodec,
        assistant(
            [{"type": "thinking", "thinking": "The user wants", "signature": "c2ln"}, {"type": "text", "text": "Ok."}]
        ),
    ),
    (
        "assistant (tool_use)",
        StreamJsonCodec,
        assistant([{"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "ls -la"}}]),
    ),
    (
        "user (tool_result)",
        StreamJsonCodec,
        orjson.dumps(
            {
                "type": "user",
                "message": {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_01", "content": "a\nb\n", "is_error": False}
                    ],
                },
                "parent_tool_use_id": None,
                "session_id": SESSION,
                "uuid": UUID,
            }
        ),
    ),
    (
        "result",
        StreamJsonCodec,
        orjson.dumps(
            {
                "type": "result",
                "subtype": "success",
                "is_error": False,
                "duration_ms": 1234,
                "num_turns": 1,
                "result": "Done.",
                "session_id": SESSION,
                "total_cost_usd": 0.0123,
                "usage": {"input_tokens": 50, "output_tokens": 12},
                "uuid": UUID,
            }
        ),
    ),
    ("awp-jsonl content_block_delta", AwpJsonlCodec, orjson.dumps(delta("text_delta", "text", "Partial text"))),
]


def measure(fns: dict[str, Callable[[], object]], rounds: int, number: int) -> dict[str, float]:
    """Nanoseconds of this process's CPU time per call (less disturbed by other processes
    than wall time), the minimum over rounds; the functions take turns round by round."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            best[name] = min(best[name], timeit.timeit(fn, number=number, timer=time.process_time) / number * 1e9)
    return best


def run(rounds: int, number: int, print_: Callable[[str], None] = print) -> list[dict[str, Any]]:
    print_(
        f"agent-bridge codec bench: min of {rounds} rounds x {number} decodes, load average {os.getloadavg()[0]:.2f}"
    )
    print_(f"| {'line shape':32s} | bytes | decode ns | generic ns | orjson.loads ns | decode / generic |")
    print_(f"|{'-' * 34}|------:|----------:|-----------:|----------------:|-----------------:|")
    rows = []
    for name, codec_cls, line in SHAPES:
        codec = codec_cls()
        fast, slow = codec.decode, codec._decode_slow
        # The same events, or the bench is void (each path on a fresh codec: a result line's
        # cost is its share of the process's running total, so a second decode differs).
        assert repr(codec_cls().decode(line)) == repr(codec_cls()._decode_slow(line)), name
        ns = measure(
            {"decode": partial(fast, line), "generic": partial(slow, line), "orjson": partial(orjson.loads, line)},
            rounds,
            number,
        )
        rows.append({"shape": name, "bytes": len(line), **ns, "ratio": ns["decode"] / ns["generic"]})
        print_(
            f"| {name:32s} | {len(line):5d} | {ns['decode']:9.0f} | {ns['generic']:10.0f} "
            f"| {ns['orjson']:15.0f} | {ns['decode'] / ns['generic']:15.2f}x |"
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.codec", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 rounds of 50")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.number = 2, 50
    run(args.rounds, args.number)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
