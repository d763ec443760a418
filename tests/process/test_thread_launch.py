"""Creating and starting a thread in one pass (bridge/launching.py): the codec made for the
creation's checks starts the thread's first process; later processes get fresh ones, and
each start checks the launch rules again on the argv it spawns."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.config import AgentProfile
from bridge.errors import LaunchRefused
from bridge.launching import ThreadLaunch


def profile(protocol: str = "acp", **kw: object) -> AgentProfile:
    return AgentProfile(name="p", protocol=protocol, executable="/usr/bin/true", **kw)  # type: ignore[arg-type]


def test_the_creation_codec_starts_the_first_process_and_only_that_one(tmp_path: Path) -> None:
    launch = ThreadLaunch.checked(profile(), {}, cwd=str(tmp_path), model=None, native_session_id="s-1")
    first, spec = launch.start("s-1", {})
    again, _ = launch.start("s-1", {})
    assert first is not again  # a process's codec holds that process's state
    assert spec.argv[0] == "/usr/bin/true" and spec.cwd == str(tmp_path)


def test_a_first_start_resuming_another_session_gets_a_codec_of_its_own(tmp_path: Path) -> None:
    launch = ThreadLaunch.checked(profile("stream-json"), {}, cwd=str(tmp_path), model=None)
    _, spec = launch.start("s-2", {})
    assert "--resume=s-2" in spec.argv


def test_the_model_is_the_threads_else_the_profiles(tmp_path: Path) -> None:
    prof = profile("stream-json", model="profile-model")
    _, spec = ThreadLaunch.checked(prof, {}, cwd=str(tmp_path), model=None).start(None, {})
    assert "--model=profile-model" in spec.argv
    _, spec = ThreadLaunch.checked(prof, {}, cwd=str(tmp_path), model="own").start(None, {})
    assert "--model=own" in spec.argv and "--model=profile-model" not in spec.argv


def test_each_start_checks_the_rules_again_on_what_it_spawns(tmp_path: Path) -> None:
    launch = ThreadLaunch.checked(profile("stream-json"), {}, cwd=str(tmp_path), model=None)
    with pytest.raises(LaunchRefused) as err:
        launch.start(None, {"BASE": "wss://evil.example"})  # e.g. an owner's secret
    assert err.value.code == "remote_url_refused"
    with pytest.raises(LaunchRefused) as err:
        launch.start("../../etc", {})
    assert err.value.code == "invalid_session_id"
