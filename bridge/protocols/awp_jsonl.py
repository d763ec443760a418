"""The AWP Agent CLI ``awp-jsonl`` dialect (protocols.md Part 2).

A subset of stream-json: the same ``system/init``, ``assistant`` and ``result`` lines,
plus top-level ``content_block_*`` and ``message_stop`` events, ``result.subtype ==
"error"``, no control protocol and no permission prompts. Input is one ``user`` line per
turn; ``{"type":"shutdown"}`` asks for a graceful exit.
"""

from __future__ import annotations

from typing import Any

from bridge.protocols.events import dumps
from bridge.protocols.stream_json import StreamJsonCodec

PROTOCOL = "awp-jsonl"


class AwpJsonlCodec(StreamJsonCodec):
    protocol = PROTOCOL
    launch_flags: tuple[str, ...] = ()
    # The contract has no interrupt message: the bridge interrupts by stopping the process.
    supports_interrupt = False

    def __init__(self) -> None:
        super().__init__(awp=True)

    def encode_prompt(self, content: list[dict[str, Any]]) -> str:
        return dumps({"type": "user", "message": {"role": "user", "content": content}})

    def encode_interrupt(self) -> str | None:
        return None

    def encode_shutdown(self) -> str | None:
        return dumps({"type": "shutdown"})
