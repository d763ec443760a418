"""The model id on the command line (docs/api.md §2.2, issue #32 B6): validated wherever a
model is set (no leading ``-``, so it can never read as a flag), and passed in each
dialect's form: stream-json ``--model=M`` (one argument), awp-jsonl ``--model M`` (the AWP
contract's two arguments), ACP not at all."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, new_thread
from pydantic import ValidationError
from test_launch import assert_nothing_spawned, assert_refused, chat, config, fake_profile, starts

from bridge.config import AgentProfile, load_settings
from bridge.errors import ConfigError, LaunchRefused
from bridge.launching import check_profile
from bridge.process.launch import build_launch, model_argv, model_problem
from bridge.protocols.codecs import make_codec

GOOD = [
    "claude-sonnet-4-6",
    "qwen3-coder-plus",
    "llama3.1:8b",
    "openrouter/anthropic/claude-3.5-sonnet",
    "gpt-5.4-mini@2026-01",
    "x_y",
    "a" * 200,
]
# Each one was, or could be, a flag or a second argument to the agent.
BAD = [
    "--resume=abc",
    "--approval-mode=yolo",
    "-x",
    "-",
    "--model",
    "",
    "a" * 201,
    "a b",
    "a\x00b",
    "a\nb",
    "m=--yolo",
    "$(id)",
    "modèle",
]


@pytest.mark.parametrize("model", GOOD)
def test_a_model_id_of_the_pattern_is_accepted(model: str) -> None:
    assert model_problem(model) is None
    assert model_argv(model) == [f"--model={model}"]


@pytest.mark.parametrize("model", BAD)
def test_a_model_id_outside_the_pattern_or_with_a_leading_dash_is_refused(model: str) -> None:
    assert model_problem(model) is not None
    with pytest.raises(LaunchRefused) as caught:
        model_argv(model)
    assert caught.value.code == "invalid_model"


def test_a_leading_dash_is_named_as_the_reason() -> None:
    assert "begin with '-'" in (model_problem("--resume=abc") or "")
    assert model_problem(None) is not None and model_problem(3) is not None


def spawn_argv(tmp_path: Path, protocol: str, model: str | None) -> list[str]:
    """The argv a thread of ``protocol`` would be spawned with, exactly as the
    conversation builds it (its codec's flags, resume and model forms)."""
    codec = make_codec(protocol, cwd=str(tmp_path))
    spec = build_launch(
        executable=PYTHON,
        args=["-I", "agent.py"],
        protocol_flags=[],
        profile_env={},
        cwd=str(tmp_path),
        model=model,
        resume_id=None,
        resume_form=codec.resume_args,
        model_form=codec.model_args,
        daemon_env={},
    )
    return list(spec.argv[3:])


def test_each_dialect_passes_the_model_in_its_own_form(tmp_path: Path) -> None:
    assert spawn_argv(tmp_path, "stream-json", "vendor/m-1:latest") == ["--model=vendor/m-1:latest"]
    assert spawn_argv(tmp_path, "awp-jsonl", "vendor/m-1:latest") == ["--model", "vendor/m-1:latest"]
    assert spawn_argv(tmp_path, "acp", "vendor/m-1:latest") == []
    for protocol in ("stream-json", "awp-jsonl", "acp"):
        assert spawn_argv(tmp_path, protocol, None) == []


@pytest.mark.parametrize("protocol", ["stream-json", "awp-jsonl", "acp"])
@pytest.mark.parametrize("model", ["--resume=abc", "--approval-mode=yolo", "-m"])
def test_every_dialect_refuses_a_model_that_would_be_a_flag_before_spawning(
    tmp_path: Path, protocol: str, model: str
) -> None:
    with pytest.raises(LaunchRefused) as caught:
        spawn_argv(tmp_path, protocol, model)
    assert caught.value.code == "invalid_model" and caught.value.status == 422


def profile(**kw: Any) -> AgentProfile:
    return AgentProfile(**{"name": "p", "executable": PYTHON, **kw})


@pytest.mark.parametrize("protocol", ["stream-json", "awp-jsonl", "acp"])
def test_thread_creation_rules_refuse_a_hostile_thread_model(protocol: str) -> None:
    prof = profile(protocol=protocol, model="fine")
    check_profile(prof, {}, model="also-fine", for_thread=True)
    with pytest.raises(LaunchRefused) as caught:
        check_profile(prof, {}, model="--resume=abc", for_thread=True)
    assert caught.value.code == "invalid_model"


@pytest.mark.parametrize("model", ["--resume=abc", "-x", "a b", ""])
def test_a_profile_model_outside_the_pattern_is_a_validation_error(model: str) -> None:
    with pytest.raises(ValidationError, match="model"):
        profile(model=model)


def test_a_profile_model_with_a_leading_dash_is_a_config_error_at_load(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[agents.p]\nexecutable = "{PYTHON}"\nmodel = "--approval-mode=yolo"\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(config=str(cfg), data_dir=str(tmp_path / "d"), env={}, discover_path=False)
    assert "[agents.p]" in caught.value.message and "begin with '-'" in caught.value.message


def test_awp_agent_default_model_with_a_leading_dash_is_a_config_error(tmp_path: Path) -> None:
    env = {"AWP_AGENT_CLI_EXECUTABLE": PYTHON, "AWP_AGENT_DEFAULT_MODEL": "--resume=abc"}
    with pytest.raises(ConfigError) as caught:
        load_settings(data_dir=str(tmp_path / "d"), env=env, discover_path=False)
    assert caught.value.message.startswith("AWP_AGENT_DEFAULT_MODEL: ")
    env["AWP_AGENT_DEFAULT_MODEL"] = "qwen2.5-coder:7b"
    settings = load_settings(data_dir=str(tmp_path / "d"), env=env, discover_path=False)
    assert settings.agents["awp"].model == "qwen2.5-coder:7b"


# --------------------------------------------------------------------------- end to end


async def test_a_model_that_would_be_a_flag_is_refused_at_thread_creation(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(fake_profile("sj", agent_env), fake_profile("awp", agent_env, dialect="awp-jsonl")))
    async with d.http() as http:
        for agent in ("sj", "awp"):
            for model in ("--resume=abc", "--approval-mode=yolo", "-m", "a b", "a" * 201):
                r = await http.post("/v1/threads", json={"agent": agent, "model": model})
                err = assert_refused(r, "invalid_model", 400)
                assert "model" in err["message"]
            r = await http.post("/v1/threads", json={"agent": agent, "options": {"model": "--resume=abc"}})
            assert_refused(r, "unknown_option", 400)  # a thread's options never carry a model
        assert (await http.get("/v1/threads")).json()["threads"] == []
    assert_nothing_spawned(d, tmp_path)


async def test_a_valid_model_reaches_a_stream_json_agent_as_one_argument(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    d = await daemon_factory(config(fake_profile("sj", agent_env, model="profile-model")))
    thread = await new_thread(d, "sj", model="vendor/m-1:latest")
    assert thread["model"] == "vendor/m-1:latest"
    events = await chat(d, thread["id"], "hi")
    (start,) = starts(tmp_path)
    assert "--model=vendor/m-1:latest" in start["argv"]
    assert not any(a == "--model" or a.startswith("--model=profile") for a in start["argv"]), start["argv"]
    # The agent read it: the model it reports is the thread's.
    (started,) = [e for e in events if e["kind"] == "session.started"]
    assert started["data"]["model"] == "vendor/m-1:latest"


async def test_awp_jsonl_keeps_the_contracts_two_arguments(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    # The strict fake, like the AWP reference adapter, refuses "--model=M" at start.
    d = await daemon_factory(config(fake_profile("awp", agent_env, dialect="awp-jsonl")))
    thread = await new_thread(d, "awp", model="vendor/m-1:latest")
    await chat(d, thread["id"], "hi")
    (start,) = starts(tmp_path)
    i = start["argv"].index("--model")
    assert start["argv"][i + 1] == "vendor/m-1:latest"
    assert not any(a.startswith("--model=") for a in start["argv"])


async def test_a_stored_model_that_would_be_a_flag_is_refused_at_spawn(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    """A model written before the rule (or into the store by hand) never reaches argv."""
    cfg = config(fake_profile("sj", agent_env))
    d1 = await daemon_factory(cfg)
    thread = await new_thread(d1, "sj", model="fine")
    assert await d1.stop() == 0
    with sqlite3.connect(tmp_path / "data" / "bridge.db") as db:
        n = db.execute("UPDATE threads SET model = ? WHERE id = ?", ("--resume=abc", thread["id"])).rowcount
    db.close()
    assert n == 1
    d2 = await daemon_factory(cfg)
    async with d2.http() as http:
        r = await http.post(f"/v1/threads/{thread['id']}/messages", json={"text": "hi"})
        assert_refused(r, "invalid_model")
        assert_refused(await http.post(f"/v1/threads/{thread['id']}/resume"), "invalid_model")
    assert_nothing_spawned(d2, tmp_path)


async def test_an_acp_agent_gets_no_model_on_its_command_line(
    daemon_factory: Any, tmp_path: Path, agent_env: dict[str, str]
) -> None:
    from test_acp_e2e import acp_profile

    d = await daemon_factory(config(acp_profile("acp", agent_env, model="profile-model")))
    thread = await new_thread(d, "acp", model="vendor/m-1:latest")
    await chat(d, thread["id"], "hi")
    (start,) = starts(tmp_path)
    assert not any("model" in a for a in start["argv"]), start["argv"]
