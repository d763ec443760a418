"""A profile and a thread's options, checked against the launch rules before anything is
spawned: at profile load (config) and at thread creation (registry). The dialect's flags
come from its codec, so the rules see exactly the argv a spawn would build."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from bridge.errors import LaunchRefused
from bridge.process.launch import ProfileLike, check_launch_rules
from bridge.protocols.codecs import make_codec


class Profile(ProfileLike, Protocol):
    @property
    def protocol(self) -> str: ...

    def model_dump(self, *, include: set[str] | None = None) -> dict[str, Any]: ...


def spawn_options(profile: Profile, overrides: Mapping[str, Any] | None, keys: frozenset[str]) -> dict[str, Any]:
    """The profile's spawn options, overridden by a thread's own."""
    return {**profile.model_dump(include=set(keys)), **(overrides or {})}


def check_profile(
    profile: Profile,
    options: Mapping[str, Any],
    *,
    model: str | None = None,
    check_executable: bool = True,
    for_thread: bool = False,
) -> None:
    """Raise LaunchRefused when a thread with ``options`` could never be spawned.
    ``for_thread``: a thread's own check at creation (``model`` is its model), where a
    dialect whose command line needs a model and has none from the thread or the profile is
    refused; a profile alone (at load) may leave the model to its threads."""
    codec = make_codec(profile.protocol, executable=profile.executable)
    if for_thread and codec.requires_model and not (model or profile.model):
        raise LaunchRefused(
            f"{profile.protocol} agents are started with --model: give the thread a model, or set the profile's model",
            code="model_required",
        )
    mcp = options.get("mcp_config")
    check_launch_rules(
        profile,
        codec.launch_flags(options),
        model=model,
        model_form=codec.model_args,
        mcp_config=mcp if isinstance(mcp, str) else None,
        check_executable=check_executable,
    )
