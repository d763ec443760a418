#!/usr/bin/env python3
"""Benchmark flood agent: speaks enough stream-json for agent-bridge, and nothing else.

For every ``user`` line on stdin whose text is ``flood N S`` it writes a ``system/init``
line, then N ``stream_event`` text deltas of exactly S bytes each (newline excluded), then
one ``result`` line. ``flood N S assistant`` writes N ``assistant`` messages of exactly S
bytes instead, each with one text block (the shape Claude Code writes a whole message in)
and a message id of its own. Output is built in memory and written in large chunks, so
the agent itself is never the bottleneck (it produces several million lines per second).
Standard library only; the same script runs under agent-bridge, under websocketd and on a
bare pipe.
"""

from __future__ import annotations

import json
import sys
import uuid
from typing import Any, BinaryIO

CHUNK = 256 * 1024


def user_text(msg: dict[str, Any]) -> str:
    content = (msg.get("message") or {}).get("content")
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return str(content or "")


STREAM_EVENT_HEAD = (
    '{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"'
)
# The message id ("msg_" and 8 digits) is the same number as the text's first 8 characters.
# Claude Code's fields but the usage and the optional ones, so that a 200-byte line fits.
ASSISTANT_HEAD = '{"type":"assistant","message":{"id":"msg_%08d","role":"assistant","model":"bench",'
ASSISTANT_HEAD += '"content":[{"type":"text","text":"'


def flood(out: BinaryIO, sid: str, count: int, size: int, shape: str = "stream_event") -> None:
    if shape == "assistant":
        head = ASSISTANT_HEAD
        tail = f'"}}]}},"session_id":"{sid}"}}\n'
        fixed = len(head % 0)
    else:
        head = STREAM_EVENT_HEAD
        tail = f'"}}}},"session_id":"{sid}"}}\n'
        fixed = len(head)
    pad = max(0, size - fixed - (len(tail) - 1) - 9)  # 9 = "%08d " index
    filler = "x" * pad
    buf: list[str] = []
    used = 0
    numbered = "%" in head
    for i in range(count):
        line = f"{head % i if numbered else head}{i:08d} {filler}{tail}"
        buf.append(line)
        used += len(line)
        if used >= CHUNK:
            out.write("".join(buf).encode())
            buf, used = [], 0
    if buf:
        out.write("".join(buf).encode())


def main() -> None:
    sid = f"bench-{uuid.uuid4()}"
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if not isinstance(msg, dict) or msg.get("type") != "user":
            continue
        words = user_text(msg).split()
        count = int(words[1]) if len(words) > 1 and words[1].isdigit() else 1
        size = int(words[2]) if len(words) > 2 and words[2].isdigit() else 200
        shape = "assistant" if len(words) > 3 and words[3] == "assistant" else "stream_event"
        out.write(
            (
                json.dumps(
                    {"type": "system", "subtype": "init", "session_id": sid, "model": "bench", "tools": []},
                    separators=(",", ":"),
                )
                + "\n"
            ).encode()
        )
        flood(out, sid, count, size, shape)
        out.write(
            (
                json.dumps(
                    {
                        "type": "result",
                        "subtype": "success",
                        "is_error": False,
                        "result": f"flooded {count}",
                        "session_id": sid,
                    },
                    separators=(",", ":"),
                )
                + "\n"
            ).encode()
        )
        out.flush()


if __name__ == "__main__":
    main()
