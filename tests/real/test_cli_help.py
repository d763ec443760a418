"""Every flag a tested preset in docs/agents.md passes, and every flag the bridge adds for
its CLI, is one the pinned CLI's own ``--help`` lists (issue #17 item 1): a flag the CLI
does not know makes it exit at start (Qwen Code 0.24: ``Unknown argument: verbose``)."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from realagents import claude_executable, doc_preset, native_binary, node_script

from bridge.config import AgentProfile
from bridge.protocols.codec import Codec
from bridge.protocols.codecs import make_codec


def codec_of(p: AgentProfile) -> Codec:
    return make_codec(p.protocol, executable=p.executable, args=p.args, protocol_flags=p.protocol_flags)


pytestmark = pytest.mark.timeout(120)

QWEN = lambda: node_script("@qwen-code/qwen-code", "cli-entry.js")  # noqa: E731
# preset → how to run its pinned CLI's help (the command, then the arguments before --help)
HELP: dict[str, Callable[[], tuple[str, list[str]]]] = {
    "claude": lambda: (claude_executable(), []),
    "qwen": QWEN,
    "qwen-acp": QWEN,
    "gemini": lambda: node_script("@google/gemini-cli", "bundle/gemini.js"),
    "opencode": lambda: (native_binary("opencode-ai", "bin/opencode.exe", platform_package=False), ["acp"]),
    "codex": lambda: (native_binary("@zed-industries/codex-acp", "bin/codex-acp"), []),
}
# Flags a CLI accepts but leaves out of its --help (checked by the tests that run it).
HIDDEN = {"claude": {"--permission-prompt-tool"}}


def flags(args: list[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if re.fullmatch(r"--?[A-Za-z][\w-]*(=.*)?", a, flags=re.S)}


@pytest.mark.parametrize("name", sorted(HELP))
def test_every_flag_of_the_preset_is_in_the_clis_help(name: str, tmp_path: Path) -> None:
    exe, pre = HELP[name]()
    preset = doc_preset(name)
    script_args = preset["args"][1:] if pre and pre[0].endswith(".js") else preset.get("args", [])
    wanted = flags(script_args)
    if preset["protocol"] == "stream-json":  # what the bridge adds for this CLI
        prof = AgentProfile.model_validate({**preset, "name": name})
        wanted |= flags(
            [*codec_of(prof).launch_flags({"permission_prompts": True}), "--model", "--resume", "--mcp-config"]
        )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    r = subprocess.run([exe, *pre, "--help"], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    text = r.stdout + r.stderr
    missing = {
        f for f in wanted - HIDDEN.get(name, set()) if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text)
    }
    assert not missing, f"{name}: {sorted(missing)} not in `{' '.join([os.path.basename(exe), *pre])} --help`"


def test_the_preset_for_qwen_passes_no_verbose() -> None:
    prof = AgentProfile.model_validate({**doc_preset("qwen"), "name": "qwen"})
    assert "--verbose" not in codec_of(prof).launch_flags({})
    assert "--permission-prompt-tool" not in codec_of(prof).launch_flags({"permission_prompts": True})
    claude = AgentProfile.model_validate({**doc_preset("claude"), "name": "claude"})
    assert "--verbose" in codec_of(claude).launch_flags({})
