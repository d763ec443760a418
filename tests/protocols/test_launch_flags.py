"""Per-CLI stream-json compatibility flags (issue #17 item 1; docs/api.md §2.2): Claude Code and
CodeBuddy need ``--verbose``, Qwen Code refuses it; a profile may state them exactly."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from bridge.config import AgentProfile
from bridge.protocols.codec import Codec
from bridge.protocols.codecs import make_codec
from bridge.protocols.stream_json import LAUNCH_FLAGS, launch_flags_for, stream_json_cli

BASE = ("--output-format", "stream-json", "--input-format", "stream-json")
NM = "/root/.cache/agent-bridge/npm/node_modules"


@pytest.mark.parametrize(
    ("executable", "args", "cli"),
    [
        ("/usr/local/bin/claude", (), "claude"),
        (f"{NM}/@anthropic-ai/claude-code/bin/claude.exe", (), "claude"),
        (f"{NM}/@anthropic-ai/claude-code-linux-x64/claude", (), "claude"),
        ("/opt/codebuddy", (), "codebuddy"),
        ("/usr/bin/cbc", (), "codebuddy"),
        ("/usr/bin/qwen", (), "qwen"),
        # the real path of npm's bin symlink `qwen`, as PATH discovery resolves it
        (f"{NM}/@qwen-code/qwen-code/cli-entry.js", (), "qwen"),
        ("/usr/bin/node", (f"{NM}/@qwen-code/qwen-code/cli-entry.js", "--auth-type", "openai"), "qwen"),
        ("/usr/local/bin/node22", (f"{NM}/@qwen-code/qwen-code/cli.js",), "qwen"),
        ("/usr/bin/node", (), None),  # node alone names no CLI
        ("/usr/bin/node", ("/srv/my-agent.js",), None),
        ("/opt/tools/qwen-wrapper", (), None),
        (f"{NM}/@qwen-code/qwen-code-helper/x.js", (), None),  # another package, not a prefix match
        ("", (), None),
    ],
)
def test_the_cli_is_named_by_its_command_or_its_npm_package(executable: str, args: tuple[str, ...], cli: str) -> None:
    assert stream_json_cli(executable, args) == cli


def test_claude_and_codebuddy_get_verbose_qwen_does_not() -> None:
    assert launch_flags_for("/usr/bin/claude") == (*BASE, "--verbose") == LAUNCH_FLAGS
    assert launch_flags_for("/usr/bin/codebuddy") == (*BASE, "--verbose")
    assert launch_flags_for("/usr/bin/qwen") == BASE
    assert launch_flags_for("/usr/bin/node", [f"{NM}/@qwen-code/qwen-code/cli-entry.js"]) == BASE


def test_an_unknown_cli_gets_the_claude_code_flags_as_before() -> None:
    assert launch_flags_for("/opt/some/agent") == LAUNCH_FLAGS
    assert launch_flags_for("/usr/bin/python3", ["-I", "/srv/agent.py"]) == LAUNCH_FLAGS


def profile(**fields: object) -> AgentProfile:
    return AgentProfile.model_validate({"name": "p", "executable": "/usr/bin/qwen", **fields})


def codec_of(p: AgentProfile) -> Codec:
    """The codec a conversation makes for this profile."""
    return make_codec(p.protocol, executable=p.executable, args=p.args, protocol_flags=p.protocol_flags)


def flags_of(p: AgentProfile) -> tuple[str, ...]:
    """The protocol's flags for the profile, before any thread option."""
    return tuple(codec_of(p).launch_flags({}))


def prompt_flags_of(p: AgentProfile) -> list[str]:
    """What the codec adds when a thread's permission prompts go to clients."""
    codec = codec_of(p)
    base = codec.launch_flags({})
    return codec.launch_flags({"permission_prompts": True})[len(base) :]


def test_a_profile_with_protocol_flags_gets_exactly_those() -> None:
    p = profile(protocol_flags=["--output-format", "stream-json", "--input-format", "stream-json", "--quiet"])
    assert flags_of(p) == (*BASE, "--quiet")
    assert flags_of(profile(protocol_flags=[])) == ()
    # ACP and awp-jsonl too: the stated flags replace the codec's
    assert flags_of(profile(protocol="acp", protocol_flags=["--acp"])) == ("--acp",)


def test_without_protocol_flags_the_codec_decides() -> None:
    assert flags_of(profile()) == BASE  # qwen
    assert flags_of(profile(executable="/usr/bin/claude")) == LAUNCH_FLAGS
    assert flags_of(profile(protocol="acp")) == ()
    assert flags_of(profile(protocol="awp-jsonl", executable="/usr/bin/claude")) == ()


@pytest.mark.parametrize(
    ("flags", "word"),
    [
        (["--output-format", "stream\x00json"], "nul"),
        (["--verbose", ""], "empty"),
        (["--a\nb"], "newline"),
        (["stream-json"], "start with a flag"),
        ("--verbose", "valid list"),
        ([1], "valid string"),
    ],
)
def test_bad_protocol_flags_are_refused(flags: object, word: str) -> None:
    with pytest.raises(ValidationError) as exc:
        profile(protocol_flags=flags)
    assert word in str(exc.value).lower()


def test_permission_prompts_need_the_stdio_tool_flag_except_for_qwen() -> None:
    assert prompt_flags_of(profile(executable="/usr/bin/claude")) == ["--permission-prompt-tool", "stdio"]
    assert prompt_flags_of(profile(executable="/opt/agent")) == ["--permission-prompt-tool", "stdio"]
    assert prompt_flags_of(profile()) == []  # qwen asks whenever its input is stream-json


def test_qwen_gets_an_initialize_request_first_and_others_nothing() -> None:
    import json

    [line] = codec_of(profile()).start()
    msg = json.loads(line)
    assert msg["type"] == "control_request" and msg["request"] == {"subtype": "initialize"} and msg["request_id"]
    assert codec_of(profile(executable="/usr/bin/claude")).start() == []
    assert make_codec("stream-json").start() == []
    assert json.loads(codec_of(profile(protocol="acp")).start()[0])["method"] == "initialize"  # ACP's own
