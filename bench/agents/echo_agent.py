#!/usr/bin/env python3
"""Benchmark echo agent: one reply line per prompt, stream-json, standard library only.

On its first prompt it announces its session (``system/init``, which agent-bridge needs);
then every ``user`` line on stdin is answered by exactly one ``result`` line carrying the
prompt's text. The same script runs under agent-bridge, under websocketd and on a bare pipe.
"""

from __future__ import annotations

import json
import sys
import uuid
from typing import Any


def user_text(msg: dict[str, Any]) -> str:
    content = (msg.get("message") or {}).get("content")
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return str(content or "")


def main() -> None:
    sid = f"bench-{uuid.uuid4()}"
    out = sys.stdout
    started = False
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if not isinstance(msg, dict) or msg.get("type") != "user":
            continue
        if not started:
            started = True
            out.write(
                json.dumps(
                    {"type": "system", "subtype": "init", "session_id": sid, "model": "bench", "tools": []},
                    separators=(",", ":"),
                )
                + "\n"
            )
        out.write(
            json.dumps(
                {
                    "type": "result",
                    "subtype": "success",
                    "is_error": False,
                    "result": f"echo: {user_text(msg)}",
                    "session_id": sid,
                },
                separators=(",", ":"),
            )
            + "\n"
        )
        out.flush()


if __name__ == "__main__":
    main()
