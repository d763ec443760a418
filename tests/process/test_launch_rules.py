"""Launch rules hardened in issue #15: the remote-URL rule (ws, wss, ftp, scheme-relative
``//host``; prose in a system prompt is not an endpoint; checked by
``check_launch_rules`` at profile load and thread creation), the locale allowlist, and
executable paths that pass through a symlinked directory or ``..``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON

from bridge.config import THREAD_OPTION_KEYS, AgentProfile, load_settings
from bridge.errors import LaunchRefused
from bridge.launching import check_profile, spawn_options
from bridge.process.launch import (
    build_launch,
    child_env,
    endpoint_values,
    executable_problem,
    url_problem,
)


@pytest.mark.parametrize(
    ("values", "opt_in", "refused"),
    [
        (["ws://evil.example/socket"], False, "remote_api_opt_in"),
        (["wss://evil.example/socket"], False, "remote_api_opt_in"),
        (["wss://evil.example/socket"], True, None),
        (["ws://evil.example/socket"], True, "plain ws"),
        (["WS:evil.example"], True, "plain ws"),
        (["ftp://evil.example/f"], False, "remote_api_opt_in"),
        (["ftp://evil.example/f"], True, "plain ftp"),
        (["ws://127.0.0.1:9", "wss://localhost:9", "ftp://[::1]/x"], False, None),
        (["//evil.example/v1"], False, "//evil.example"),
        (["--api=//evil.example/v1"], False, "//evil.example"),
        (["--api=//evil.example/v1"], True, "scheme-relative"),
        (["see //evil.example"], False, "//evil.example"),
        (["\\\\evil.example\\v1"], False, "//evil.example"),
        (["--api=//127.0.0.1:9/v1", "//localhost:9"], True, None),
        (["// a comment", "/usr//lib/x", "a//b", "news:x", "jws:y"], False, None),
    ],
)
def test_url_problem_covers_every_scheme_and_scheme_relative(
    values: list[str], opt_in: bool, refused: str | None
) -> None:
    problem = url_problem(values, opt_in=opt_in)
    if refused is None:
        assert problem is None, problem
    else:
        assert problem is not None and refused in problem, problem


def test_a_system_prompt_is_prose_not_an_endpoint() -> None:
    argv = ["--system-prompt", "see https://evil.example", "--system-prompt=and http://evil.example", "--x", "y"]
    assert endpoint_values(argv, {"E": "v"}) == ["--x", "y", "v"]
    assert url_problem(endpoint_values(argv, {}), opt_in=False) is None


def test_build_launch_skips_the_system_prompt_but_not_other_arguments(tmp_path: Path) -> None:
    common: dict[str, Any] = {
        "executable": PYTHON,
        "args": ["-I", "agent.py"],
        "protocol_flags": [],
        "profile_env": {},
        "cwd": str(tmp_path),
        "model": None,
        "resume_id": None,
        "daemon_env": {},
    }
    spec = build_launch(**common, extra_args=["--system-prompt", "Docs: https://example.com/docs"])
    assert "Docs: https://example.com/docs" in spec.argv
    with pytest.raises(LaunchRefused) as exc:
        build_launch(**common, extra_args=["--allowedTools", "x", "--api", "wss://evil.example"])
    assert exc.value.code == "remote_url_refused"


def profile(**kw: Any) -> AgentProfile:
    return AgentProfile(**{"name": "p", "executable": PYTHON, **kw})


def check_launch_rules(
    prof: AgentProfile,
    options: dict[str, Any] | None = None,
    *,
    model: str | None = None,
    check_executable: bool = True,
) -> None:
    """What thread creation checks: the profile with the thread's options (bridge/launching.py)."""
    check_profile(
        prof, spawn_options(prof, options, THREAD_OPTION_KEYS), model=model, check_executable=check_executable
    )


def test_check_launch_rules_for_thread_creation(tmp_path: Path) -> None:
    check_launch_rules(profile(system_prompt="read https://example.com first"))
    check_launch_rules(profile(), {"system_prompt": "or ws://evil.example, in prose"})
    check_launch_rules(profile(env={"U": "wss://api.example.com"}, remote_api_opt_in=True))
    for prof, options, code in [
        (profile(env={"BASE": "ws://evil.example"}), {}, "remote_url_refused"),
        (profile(args=["--api=//evil.example"]), {}, "remote_url_refused"),
        (profile(), {"mcp_config": "relative.json"}, "bad_mcp_config"),
        (profile(), {"allowed_tools": ["ftp://evil.example"]}, "remote_url_refused"),
        (profile(executable="/no/such/agent"), {}, "executable_unusable"),
    ]:
        with pytest.raises(LaunchRefused) as exc:
            check_launch_rules(prof, options)
        assert exc.value.code == code, (prof, options, exc.value.message)
    with pytest.raises(LaunchRefused) as exc:
        check_launch_rules(profile(), model="wss://evil.example")
    assert exc.value.code == "remote_url_refused"
    check_launch_rules(profile(executable="/no/such/agent"), check_executable=False)


def test_a_profile_breaking_the_url_rule_is_found_at_load_and_cannot_run(tmp_path: Path) -> None:
    """Found once, at load, with the fix; the profile is unusable, not the daemon (issue
    #34 item 4): listed, never the default, refused with the rule's code."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[agents.bad]\nexecutable = "{PYTHON}"\nenv = {{ BASE = "wss://evil.example" }}\n')
    s = load_settings(config=str(cfg), data_dir=str(tmp_path / "d"), env={}, discover_path=False)
    assert s.profile_problem("bad") == (
        "remote URL wss://evil.example needs remote_api_opt_in; to let this agent reach that host, "
        "set remote_api_opt_in = true in [agents.bad]"
    )
    assert s.default_profile() == "demo" and s.profile_problem("demo") is None
    with pytest.raises(LaunchRefused) as refused:
        s.check_runnable("bad")
    assert refused.value.code == "remote_url_refused" and refused.value.message.startswith("agent profile 'bad'")
    env = {"AWP_AGENT_CLI_EXECUTABLE": PYTHON, "AWP_AGENT_CLI_ARGS_JSON": '["--api=//evil.example"]'}
    s = load_settings(data_dir=str(tmp_path / "d"), env=env, discover_path=False)
    assert "AWP_AGENT_CLI_* variables" in (s.profile_problem("awp") or "")
    env["AWP_AGENT_CLI_ARGS_JSON"] = '["--api=https://evil.example"]'
    s = load_settings(data_dir=str(tmp_path / "d"), env=env, discover_path=False)
    assert (s.profile_problem("awp") or "").endswith("set AWP_AGENT_REMOTE_API_OPT_IN=1")
    # A system prompt that only mentions a URL is fine.
    cfg.write_text(f'[agents.ok]\nexecutable = "{PYTHON}"\nsystem_prompt = "see https://example.com"\n')
    load_settings(config=str(cfg), data_dir=str(tmp_path / "d"), env={}, discover_path=False)


def test_only_posix_locale_variables_reach_the_agent() -> None:
    daemon_env = {
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "LC_CTYPE": "C",
        "LC_COLLATE": "C",
        "LC_MESSAGES": "C",
        "LC_MONETARY": "C",
        "LC_NUMERIC": "C",
        "LC_TIME": "C",
        "LC_SECRET_TOKEN": "s3cret",
        "LC_TERMINAL": "iTerm2",
        "LC_": "x",
    }
    env = child_env(daemon_env, {})
    assert set(env) == {
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "LC_COLLATE",
        "LC_MESSAGES",
        "LC_MONETARY",
        "LC_NUMERIC",
        "LC_TIME",
    }


def test_executable_paths_through_a_symlinked_directory_or_dotdot_are_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    agent = real / "agent"
    agent.write_text("#!/bin/sh\n")
    agent.chmod(0o755)
    (tmp_path / "linked").symlink_to(real)
    assert executable_problem(str(agent)) is None
    via_link = executable_problem(str(tmp_path / "linked" / "agent")) or ""
    assert "symlink" in via_link and str(agent) in via_link
    for odd in (f"{real}/../real/agent", f"{real}/./agent", f"{real}//agent", f"/{real}/agent"):
        assert "normalized" in (executable_problem(odd) or ""), odd


def test_the_token_flag_warns_that_it_is_visible_in_ps(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_BRIDGE_")}
    r = subprocess.run(
        [sys.executable, "-m", "bridge", "serve", "--token", "t0ken-value-123", "--port", "0", "--host", "::bad"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**env, "AGENT_BRIDGE_DATA_DIR": str(tmp_path / "d")},
    )
    assert "--token" in r.stderr and "AGENT_BRIDGE_TOKEN" in r.stderr and "ps" in r.stderr, r.stderr
    assert "t0ken-value-123" not in r.stderr


def test_an_awp_jsonl_thread_without_a_model_is_refused_at_creation_not_its_profile_at_load() -> None:
    awp = profile(protocol="awp-jsonl")
    check_profile(awp, {})  # a profile may leave the model to its threads
    with pytest.raises(LaunchRefused, match="--model") as err:
        check_profile(awp, {}, for_thread=True)
    assert err.value.code == "model_required"
    check_profile(awp, {}, model="m", for_thread=True)  # the thread's model
    check_profile(profile(protocol="awp-jsonl", model="m"), {}, for_thread=True)  # the profile's
    check_profile(profile(), {}, for_thread=True)  # stream-json takes no --model unless given one
