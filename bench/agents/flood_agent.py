#!/usr/bin/env python3
"""Benchmark flood agent: speaks enough stream-json for agent-bridge, and nothing else.

For every ``user`` line on stdin whose text is ``flood N S`` it writes a ``system/init``
line, then N ``stream_event`` text deltas of exactly S bytes each (newline excluded), then
one ``result`` line. Output is built in memory and written in large chunks, so the agent
itself is never the bottleneck (it produces several million lines per second). Standard
library only; the same script runs under agent-bridge, under websocketd and on a bare pipe.
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


def flood(out: BinaryIO, sid: str, count: int, size: int) -> None:
    head = (
        '{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"'
    )
    tail = f'"}}}},"session_id":"{sid}"}}\n'
    pad = max(0, size - len(head) - (len(tail) - 1) - 9)  # 9 = "%08d " index
    filler = "x" * pad
    buf: list[str] = []
    used = 0
    for i in range(count):
        line = f"{head}{i:08d} {filler}{tail}"
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
        out.write(
            (
                json.dumps(
                    {"type": "system", "subtype": "init", "session_id": sid, "model": "bench", "tools": []},
                    separators=(",", ":"),
                )
                + "\n"
            ).encode()
        )
        flood(out, sid, count, size)
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
