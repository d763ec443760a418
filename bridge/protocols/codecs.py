"""Dialect name → codec."""

from __future__ import annotations

from bridge.protocols.acp import AcpCodec
from bridge.protocols.awp_jsonl import AwpJsonlCodec
from bridge.protocols.stream_json import INITIALIZE_FIRST, StreamJsonCodec

PROTOCOLS = ("stream-json", "awp-jsonl", "acp")

Codec = StreamJsonCodec | AcpCodec


def make_codec(
    protocol: str,
    *,
    cwd: str = "/",
    resume_id: str | None = None,
    auth_method: str | None = None,
    client_version: str = "0",
    cli: str | None = None,
) -> Codec:
    """``cli``: the known stream-json CLI the profile runs (stream_json_cli), if any."""
    if protocol == "stream-json":
        return StreamJsonCodec(initialize=cli in INITIALIZE_FIRST)
    if protocol == "awp-jsonl":
        return AwpJsonlCodec()
    if protocol == "acp":
        return AcpCodec(cwd=cwd, resume_id=resume_id, auth_method=auth_method, client_version=client_version)
    raise ValueError(f"unknown protocol {protocol!r}")
