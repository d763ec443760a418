"""The resume arguments of the launch rules (docs/api.md §2.2, §2.5): each dialect's form,
from its codec, and the checks on the id (issue #17 item 6)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bridge.errors import LaunchRefused
from bridge.process.launch import build_launch, joined_resume, resume_argv
from bridge.protocols.codecs import make_codec

PYTHON = str(Path(sys.executable).resolve())


def spawn_argv(tmp_path: Path, protocol: str, resume_id: str | None, **kw: object) -> list[str]:
    codec = make_codec(protocol)
    spec = build_launch(
        executable=PYTHON,
        args=["-I", "agent.py"],
        protocol_flags=codec.launch_flags({}),
        profile_env={},
        cwd=str(tmp_path),
        model="m1",
        resume_id=resume_id if codec.resume_on_argv else None,
        resume_form=codec.resume_args,
        model_form=codec.model_args,
        daemon_env={},
        **kw,  # type: ignore[arg-type]
    )
    return list(spec.argv)


def test_awp_jsonl_argv_is_exactly_the_contract_form(tmp_path: Path) -> None:
    mcp = str(tmp_path / "mcp.json")
    argv = spawn_argv(tmp_path, "awp-jsonl", "opaque.id:1", mcp_config=mcp)
    assert argv == [PYTHON, "-I", "agent.py", "--model", "m1", "--resume", "opaque.id:1", "--mcp-config", mcp]
    assert spawn_argv(tmp_path, "awp-jsonl", None) == [PYTHON, "-I", "agent.py", "--model", "m1"]


def test_stream_json_keeps_the_one_argument_form(tmp_path: Path) -> None:
    argv = spawn_argv(tmp_path, "stream-json", "-starts-with-dash")
    # With "=" the id can never be read as a flag, so an id that begins with "-" is fine here.
    assert argv[-1] == "--resume=-starts-with-dash" and "--resume" not in argv


@pytest.mark.parametrize("bad", ["-x", "--model", "-"])
def test_awp_jsonl_refuses_an_id_that_begins_with_a_dash(tmp_path: Path, bad: str) -> None:
    with pytest.raises(LaunchRefused) as caught:
        spawn_argv(tmp_path, "awp-jsonl", bad)
    assert caught.value.code == "invalid_session_id"
    assert str(caught.value).startswith("native session id begins with '-', and this agent takes it as an argument")


@pytest.mark.parametrize("bad", ["", "a b", "../x", "a" * 257, "é"])
def test_every_form_refuses_an_id_outside_the_pattern(bad: str) -> None:
    for form in (joined_resume, make_codec("awp-jsonl").resume_args):
        with pytest.raises(LaunchRefused) as caught:
            resume_argv(bad, form)
        assert caught.value.code == "invalid_session_id"


def test_acp_puts_nothing_on_the_command_line(tmp_path: Path) -> None:
    assert not any(a.startswith("--resume") for a in spawn_argv(tmp_path, "acp", "s1"))
    assert resume_argv("s1", make_codec("acp").resume_args) == []
