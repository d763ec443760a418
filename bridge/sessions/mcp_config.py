"""A thread's MCP servers (``mcp_servers``, docs/api.md §1.5) as a generated
``--mcp-config`` file, for the dialects that take no servers in a session (stream-json:
Claude Code and the CLIs that share its flags; awp-jsonl: the AWP contract's flag).

Where the file goes: the agent must read it, and it may hold secrets (env and header
values). The data dir is closed to a confined agent (docs/security.md), and the command
line is readable by every process of the user (``/proc/PID/cmdline``), so it is written
in the agent's own ``HOME`` — the owner's private home in users mode, whose agents get
the owner's secrets anyway — as ``$HOME/.agent-bridge-mcp/<thread id>.json``, directory
0700, file 0600, written at each start and removed when the agent exits. Its path
is on the command line, never its content; nothing here logs either.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from bridge.errors import LaunchRefused
from bridge.launching import servers_of
from bridge.process.launch import LaunchSpec
from bridge.protocols.codecs import mcp_config_takes_many, mcp_servers_in_session
from bridge.protocols.events import Event
from bridge.protocols.mcp_servers import claude_config, secret_values
from bridge.sessions.scrub import Scrubber

DIR_NAME = ".agent-bridge-mcp"
FLAG = "--mcp-config"


def config_path(home: str, thread_id: str) -> Path:
    return Path(home) / DIR_NAME / f"{thread_id}.json"


def with_servers(
    spec: LaunchSpec, thread_id: str, options: Mapping[str, Any], protocol: str
) -> tuple[LaunchSpec, Path | None]:
    """``spec`` with ``--mcp-config FILE`` for the thread's servers, and the file written
    (removed with :func:`discard` when the agent exits: the secrets it may hold are on disk
    only while an agent that reads them runs); ``spec`` as it was, and None, when the
    thread has none or its dialect carries them in its session. With the
    profile's own ``mcp_config`` as well, Claude Code takes both files after the one flag
    (``--mcp-config A B``); awp-jsonl takes one file, so there the thread's servers are
    refused (``bad_mcp_config``). Raises LaunchRefused."""
    servers = servers_of(options)
    if not servers or mcp_servers_in_session(protocol):
        return spec, None
    home = spec.env.get("HOME")
    if not home or not os.path.isabs(home):
        raise LaunchRefused("mcp_servers need the agent to have a HOME to hold their file", code="bad_mcp_config")
    path = config_path(home, thread_id)  # HOME is the agent's to read, confined or not (docs/security.md)
    argv = list(spec.argv)
    if FLAG in argv:
        if not mcp_config_takes_many(protocol) or argv.index(FLAG) != len(argv) - 2:
            raise LaunchRefused(
                "this agent takes one --mcp-config file: give mcp_config or mcp_servers, not both",
                code="bad_mcp_config",
            )
        argv.append(str(path))  # the flag takes a list; it is the last argument (process/launch.py)
    else:
        argv += [FLAG, str(path)]
    write_private(path, json.dumps(claude_config(servers), ensure_ascii=False))
    return replace(spec, argv=tuple(argv)), path


def secrets(options: Mapping[str, Any]) -> list[str]:
    """The thread's servers' env and header values (protocols/mcp_servers.py)."""
    return secret_values(servers_of(options))


def scrubber(options: Mapping[str, Any]) -> Scrubber | None:
    """What keeps the servers' env and header values out of the transcript: the lines the
    bridge writes to the agent (an ACP ``session/new`` carries them) are stored as written,
    so they are scrubbed as the agent's own lines are (sessions/scrub.py). None when the
    thread has none."""
    values = secrets(options)
    return Scrubber({}, extra=values) if values else None


def scrubbed(events: list[Event], scrub: Scrubber | None) -> list[Event]:
    """``events`` with the raw line of each the bridge wrote (``client`` ones) scrubbed;
    the agent's own were scrubbed when they were read."""
    if scrub is None:
        return events
    return [replace(e, raw=scrub.text(e.raw)) if e.source == "client" and e.raw else e for e in events]


def write_private(path: Path, text: str) -> None:
    """``text`` in ``path`` (0600, its directory 0700), replacing any old file at once: an
    agent starting meanwhile reads the old one or the new one, never a part."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)  # made earlier by someone else with a looser mode
    fd, tmp = tempfile.mkstemp(prefix=".mcp-", dir=path.parent)  # 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def discard(path: Path | None) -> None:
    """The file :func:`with_servers` wrote, gone (its agent exited)."""
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()


__all__ = ["DIR_NAME", "config_path", "discard", "scrubbed", "scrubber", "secrets", "with_servers", "write_private"]
