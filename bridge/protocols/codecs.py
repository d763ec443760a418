"""Dialect name → codec, and what a dialect says about a thread when no agent runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bridge.protocols.acp import AcpCodec, content_refusal
from bridge.protocols.awp_jsonl import AwpJsonlCodec
from bridge.protocols.codec import Codec
from bridge.protocols.stream_json import StreamJsonCodec


def make_codec(
    protocol: str,
    *,
    cwd: str = "/",
    resume_id: str | None = None,
    auth_method: str | None = None,
    client_version: str = "0",
    executable: str = "",
    args: Sequence[str] = (),
    protocol_flags: Sequence[str] | None = None,
    mcp_servers: Sequence[Mapping[str, Any]] = (),
    fork: bool = False,
) -> Codec:
    """``executable`` and ``args``: the profile's, from which a stream-json codec knows
    which CLI it speaks to (its flags, its handshake); ``protocol_flags``: a profile's own.
    ``fork``: ``resume_id`` is to be copied into a new session where the dialect does that
    in its handshake (ACP session/fork; the others fork on argv: protocols/forking.py)."""
    if protocol == "stream-json":
        return StreamJsonCodec(executable=executable, args=args, protocol_flags=protocol_flags)
    if protocol == "awp-jsonl":
        return AwpJsonlCodec(protocol_flags=protocol_flags)
    if protocol == "acp":
        return AcpCodec(
            cwd=cwd,
            resume_id=resume_id,
            auth_method=auth_method,
            client_version=client_version,
            protocol_flags=protocol_flags,
            mcp_servers=mcp_servers,
            fork=fork,
        )
    raise ValueError(f"unknown protocol {protocol!r}")


def mcp_servers_in_session(protocol: str) -> bool:
    """Whether the dialect gives a thread's MCP servers to its agent in the session it opens
    (ACP's ``mcpServers``); the others are given a generated ``--mcp-config`` file."""
    return protocol == "acp"


def mcp_config_takes_many(protocol: str) -> bool:
    """Whether the dialect's CLIs take several files after one ``--mcp-config`` (Claude
    Code's flag takes a list; the AWP contract's takes one file)."""
    return protocol == "stream-json"


def stored_content_refusal(protocol: str, agent_info: Any, content: list[dict[str, Any]]) -> str | None:
    """Why a thread's agent cannot take ``content``, from what the agent declared when it
    last started (the thread's ``agent_info``), before a new process has said it again."""
    if protocol == "acp" and isinstance(agent_info, dict):
        return content_refusal(content, agent_info.get("capabilities"))
    return None


def prompt_capabilities(protocol: str) -> dict[str, bool]:
    """What a dialect's agents take in a prompt, as ACP ``promptCapabilities`` say it (the
    ACP gateway, docs/api.md §11): stream-json and awp-jsonl take the Anthropic image and
    document blocks; an ACP agent says so only once it runs, so nothing beyond text is
    promised for it."""
    if protocol == "acp":
        return {"image": False, "audio": False, "embeddedContext": False}
    return {"image": True, "audio": False, "embeddedContext": True}


def may_have_modes(protocol: str) -> bool:
    """Whether a dialect's agents can have session modes (ACP ``session/set_mode``): only
    ACP's, and only those that report them (docs/api.md §4.19)."""
    return protocol == "acp"
