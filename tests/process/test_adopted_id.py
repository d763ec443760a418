"""An adopted session id is checked at thread creation (bridge/launching.py,
``ThreadLaunch.checked``) by the dialect's own resume form:
awp-jsonl passes it as an argument of its own (``--resume ID``), so an id beginning with
"-" is refused there (it would read as a flag), while stream-json's ``--resume=ID`` and
ACP's session/load take it."""

from __future__ import annotations

import pytest

from bridge.config import AgentProfile
from bridge.errors import InvalidRequest
from bridge.launching import ThreadLaunch


def profile(protocol: str) -> AgentProfile:
    return AgentProfile(name="p", protocol=protocol, executable="/usr/bin/true")  # type: ignore[arg-type]


def check_adopted_id(native_session_id: str | None, prof: AgentProfile) -> None:
    """What creating a thread that adopts ``native_session_id`` checks (with a model, which
    awp-jsonl needs anyway)."""
    ThreadLaunch.checked(prof, {}, cwd="/", model="m", native_session_id=native_session_id)


@pytest.mark.parametrize("protocol", ["stream-json", "awp-jsonl", "acp"])
def test_a_plain_id_is_taken_by_every_dialect(protocol: str) -> None:
    check_adopted_id("0f4c6a1e-2b7d-4c1a-9e55-1d2f3a4b5c6d", profile(protocol))
    check_adopted_id(None, profile(protocol))


def test_an_id_beginning_with_a_dash_is_refused_where_it_would_be_an_argument_of_its_own() -> None:
    with pytest.raises(InvalidRequest, match="begins with '-'") as err:
        check_adopted_id("-rf", profile("awp-jsonl"))
    assert err.value.code == "invalid_session_id"
    check_adopted_id("-rf", profile("stream-json"))  # --resume=-rf: one argument
    check_adopted_id("-rf", profile("acp"))  # never on the command line


@pytest.mark.parametrize("bad", ["../../etc", "a b", "", "x" * 300])
def test_ids_outside_the_pattern_are_refused_for_every_dialect(bad: str) -> None:
    for protocol in ("stream-json", "awp-jsonl", "acp"):
        with pytest.raises(InvalidRequest) as err:
            check_adopted_id(bad, profile(protocol))
        assert err.value.code == "invalid_session_id"
