"""How each dialect's agent forks a conversation (docs/api.md §4.26, docs/agents.md). Pure.

A fork is a new thread whose agent knows the source's conversation up to a turn boundary
and nothing later. The bridge copies the transcript; what the agent knows it learns through
its own mechanism, at the fork's first start:

- stream-json (Claude Code, and a CLI the bridge does not know, which mirrors Claude Code's
  command line): ``--resume=SRC --fork-session`` copies the session under a new id; with
  ``--resume-session-at=UUID`` the copy ends at that chain entry (a ``uuid`` of the kept
  turn's last ``assistant``/``user`` line), so any turn boundary can be forked at.
- ACP: ``session/fork`` (unstable) where the agent advertises
  ``agentCapabilities.sessionCapabilities.fork``; it copies the whole session, so only the
  end can be forked at.
- awp-jsonl (the contract's argv is ``--model``, ``--resume``, ``--mcp-config`` only), Qwen
  Code and CodeBuddy (neither documents the flags): no mechanism.

A fork at seq 0, or of a thread whose agent never reported a session, needs none: there is
nothing to know, and the fork starts a fresh session.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bridge.protocols.jsonline import loads_strict
from bridge.protocols.stream_json import stream_json_cli

# A Claude Code chain entry's uuid: what --resume-session-at is given (on one argument with
# "=", and only in this form, so it can never be read as a flag or carry anything else).
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# The stream-json lines that are entries of the session's chain (a result or system line
# carries a uuid too, but is not in the session file).
_CHAIN_TYPES = frozenset({"assistant", "user"})
# stream-json CLIs whose fork flags are known: Claude Code, and an unknown CLI (None),
# which the bridge launches with Claude Code's flags (protocols/stream_json.py).
_ARGV_FORK_CLIS = frozenset({"claude", None})


@dataclass(frozen=True, slots=True)
class ForkWay:
    """What a thread's agent offers: ``how`` it forks (on its command line, in its
    handshake, or not at all) and whether it can fork before the end (``earlier``)."""

    how: Literal["argv", "handshake", "none"]
    earlier: bool

    @property
    def able(self) -> bool:
        return self.how != "none"


NONE = ForkWay("none", earlier=False)


def fork_way(protocol: str, executable: str, args: Sequence[str], agent_info: Mapping[str, Any] | None) -> ForkWay:
    """How an agent of this profile forks. ``agent_info``: the source thread's (docs/api.md
    §4.2), where an ACP agent's ``initialize`` capabilities are kept."""
    if protocol == "stream-json":
        return ForkWay("argv", earlier=True) if stream_json_cli(executable, args) in _ARGV_FORK_CLIS else NONE
    if protocol == "acp":
        caps = (agent_info or {}).get("capabilities")
        session = caps.get("sessionCapabilities") if isinstance(caps, Mapping) else None
        fork = session.get("fork") if isinstance(session, Mapping) else None
        return ForkWay("handshake", earlier=False) if isinstance(fork, Mapping) else NONE
    return NONE


def chain_entry(protocol: str, raw: str | None) -> str | None:
    """The uuid of the session chain entry an agent's output line is, if it is one (only
    stream-json's lines are; a malformed line or uuid is none)."""
    if protocol != "stream-json" or not raw or '"uuid"' not in raw:
        return None
    try:
        line = loads_strict(raw)
    except ValueError:
        return None
    if not isinstance(line, dict) or line.get("type") not in _CHAIN_TYPES:
        return None
    uuid = line.get("uuid")
    return uuid if isinstance(uuid, str) and _UUID.fullmatch(uuid) else None


@dataclass(frozen=True, slots=True)
class NativeFork:
    """What a fork's first process is to copy: its source's agent ``session`` up to the
    chain entry ``at`` (None: to its end). Kept in the fork's ``forked_from`` column beside
    the public ``thread`` and ``seq`` until the agent reports the fork's own session."""

    session: str
    at: str | None = None

    def __post_init__(self) -> None:
        # Never a fork that would quietly become a plain resume of its source's session.
        if self.at is not None and not _UUID.fullmatch(self.at):
            raise ValueError("a fork point must be a chain entry's uuid")

    def stored(self) -> dict[str, Any]:
        return {"session": self.session, "at": self.at}


def pending_fork(forked_from: Any, resume: str | None) -> NativeFork | None:
    """The native fork a start resuming ``resume`` is to make: while the thread's session
    is still its source's (the agent has not yet reported the fork's own), else None.
    ``forked_from`` is the stored column, read as untrusted."""
    if resume is None or not isinstance(forked_from, Mapping) or forked_from.get("session") != resume:
        return None
    at = forked_from.get("at")
    if at is not None and not (isinstance(at, str) and _UUID.fullmatch(at)):
        return None
    return NativeFork(resume, at)


def fork_argv(protocol: str, at: str | None) -> list[str]:
    """The arguments that make a resumed agent fork (beside its resume arguments): for
    stream-json ``--fork-session`` and, to stop at a chain entry, ``--resume-session-at``;
    none for a dialect that forks in its handshake. ``at`` must be a chain entry's uuid."""
    if protocol != "stream-json":
        return []
    if at is None:
        return ["--fork-session"]
    if not _UUID.fullmatch(at):
        raise ValueError("a fork point must be a chain entry's uuid")
    return ["--fork-session", f"--resume-session-at={at}"]


__all__ = ["NONE", "ForkWay", "NativeFork", "chain_entry", "fork_argv", "fork_way", "pending_fork"]
