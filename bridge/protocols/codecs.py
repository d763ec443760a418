"""Dialect name → codec factory."""

from __future__ import annotations

from bridge.protocols.awp_jsonl import AwpJsonlCodec
from bridge.protocols.stream_json import StreamJsonCodec

PROTOCOLS = ("stream-json", "awp-jsonl")


def make_codec(protocol: str) -> StreamJsonCodec:
    if protocol == "stream-json":
        return StreamJsonCodec()
    if protocol == "awp-jsonl":
        return AwpJsonlCodec()
    raise ValueError(f"unknown protocol {protocol!r}")
