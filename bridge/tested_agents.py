"""Which agent CLI versions the real-agent suite runs (tests/real, docs/agents.md), and the
version a profile's CLI is at.

``agent-bridge agents`` marks a profile whose CLI is a known package at a version not in
:data:`TESTED`. The version is read, never run for: from the ``package.json`` of the npm
package the executable lies in — or, when the executable is an interpreter (``node``), the
script given as its first argument. Running ``--version`` would execute an arbitrary
program at listing time (and some CLIs start slowly or touch the network), so a CLI
installed some other way (a release binary, a copy outside ``node_modules``) simply shows
no version. Reading is bounded: a few directory levels, one small file each.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

# npm package → the versions tests/real runs (kept equal to tests/real/npm-pins.txt by a test).
TESTED: dict[str, frozenset[str]] = {
    "@anthropic-ai/claude-code": frozenset({"2.1.332"}),
    "@agentclientprotocol/claude-agent-acp": frozenset({"0.101.0"}),
    "@qwen-code/qwen-code": frozenset({"0.24.4"}),
    "@google/gemini-cli": frozenset({"0.61.0"}),
    "opencode-ai": frozenset({"1.18.33"}),
    "@zed-industries/codex-acp": frozenset({"0.16.0"}),
}
# A native binary lives in a platform package of the CLI (``opencode-linux-x64``,
# ``@anthropic-ai/claude-code-linux-x64``), released with the same version.
_PLATFORM = re.compile(r"-(linux|darwin|win32)-(x64|arm64|ia32|arm)(-[a-z0-9]+)*$")
_PLATFORM_OF = {"opencode": "opencode-ai"}  # platform packages not named after the CLI's own
_INTERPRETER = re.compile(r"(node|nodejs|bun|deno)(\d+(\.\d+)*)?(\.exe)?")
_MAX_LEVELS = 6
_MAX_BYTES = 256 * 1024


@dataclass(frozen=True)
class CliVersion:
    package: str  # the CLI's npm package (its main one, for a platform package)
    version: str
    tested: bool


def _main_package(name: str) -> str:
    base = _PLATFORM.sub("", name)
    if base == name:
        return name
    return _PLATFORM_OF.get(base, base)


def _read_package(path: str) -> tuple[str, str] | None:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_MAX_BYTES + 1)
    except OSError:
        return None
    if len(raw) > _MAX_BYTES:
        return None
    try:
        meta = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(meta, dict):
        return None
    name, version = meta.get("name"), meta.get("version")
    return (name, version) if isinstance(name, str) and isinstance(version, str) else None


def cli_version(executable: str, args: Sequence[str] = ()) -> CliVersion | None:
    """The known CLI a profile runs and its version, from the nearest ``package.json``
    above the executable (or the interpreter's script) inside ``node_modules``; None when
    there is none or it is not a package of :data:`TESTED`."""
    target = executable
    if _INTERPRETER.fullmatch(os.path.basename(executable)) and args and os.path.isabs(args[0]):
        target = args[0]
    directory = os.path.dirname(os.path.realpath(target))
    for _ in range(_MAX_LEVELS):
        if os.path.basename(directory) == "node_modules" or directory == os.path.dirname(directory):
            return None
        found = _read_package(os.path.join(directory, "package.json"))
        if found is not None:
            package = _main_package(found[0])
            if package not in TESTED:
                return None
            return CliVersion(package, found[1], found[1] in TESTED[package])
        directory = os.path.dirname(directory)
    return None
