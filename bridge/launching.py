"""How a thread's agent is launched, in one pass.

A profile and a thread's options, cwd and model give the dialect's codec, and the codec
gives what the launch rules judge: the flags those options become, the model's and the
resume id's forms on the command line. The rules themselves live once, in
process/launch.py (``agent_args``); this module walks them with the codec:

- at profile load (config): :func:`check_profile`, a profile alone;
- at thread creation (registry): :meth:`ThreadLaunch.checked`, which makes the one codec
  of the creation and keeps it for the thread's first process;
- at each spawn (conversation): :meth:`ThreadLaunch.start`, the codec and the argv of one
  process, the rules run again on what is actually spawned.

process/ may not import the codecs (tests/test_layering.py), which is why this walk sits
above both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from bridge import __version__
from bridge.errors import InvalidRequest, LaunchRefused
from bridge.process.launch import (
    LaunchSpec,
    ProfileLike,
    build_launch,
    check_executable_usable,
    check_launch_rules,
    model_problem,
    resume_argv,
    url_problem,
    valid_session_id,
)
from bridge.protocols import mcp_servers
from bridge.protocols.codec import Codec
from bridge.protocols.codecs import make_codec, mcp_config_takes_many, mcp_servers_in_session
from bridge.protocols.forking import NativeFork, fork_argv


class Profile(ProfileLike, Protocol):
    @property
    def protocol(self) -> str: ...
    @property
    def auth_method(self) -> str | None: ...
    @property
    def protocol_flags(self) -> Sequence[str] | None: ...

    def model_dump(self, *, include: set[str] | None = None) -> dict[str, Any]: ...


def spawn_options(profile: Profile, overrides: Mapping[str, Any] | None, keys: frozenset[str]) -> dict[str, Any]:
    """The profile's spawn options, overridden by a thread's own."""
    return {**profile.model_dump(include=set(keys)), **(overrides or {})}


def codec_for(
    profile: Profile,
    *,
    cwd: str = "/",
    resume: str | None = None,
    options: Mapping[str, Any] | None = None,
    fork: bool = False,
) -> Codec:
    """A fresh codec of ``profile``'s dialect, for one process run in ``cwd``; ``options``:
    the thread's spawn options, whose MCP servers a dialect may carry in its session;
    ``fork``: ``resume`` is copied into a new session, not reopened (protocols/forking.py)."""
    return make_codec(
        profile.protocol,
        cwd=cwd,
        resume_id=resume,
        auth_method=profile.auth_method,
        client_version=__version__,
        executable=profile.executable,
        args=profile.args,
        protocol_flags=profile.protocol_flags,
        mcp_servers=servers_of(options or {}),
        fork=fork,
    )


def servers_of(options: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The thread's MCP servers (``mcp_servers``), read again into their checked form
    (a stored list is not trusted more than a given one), as a profile's ``mcp_config`` is:
    LaunchRefused ``bad_mcp_config`` when malformed."""
    given = options.get("mcp_servers")
    if not given:
        return []
    try:
        return mcp_servers.parse(given, "mcp_servers")
    except mcp_servers.McpServersInvalid as exc:
        raise LaunchRefused(str(exc), code="bad_mcp_config") from None


def check_servers(profile: Profile, options: Mapping[str, Any]) -> None:
    """The remote-URL rule (process/launch.py) on what the MCP servers would make the agent
    reach: the same opt-in as the agent's own endpoints (``remote_api_opt_in``)."""
    servers = servers_of(options)
    problem = url_problem(mcp_servers.endpoints(servers), opt_in=profile.remote_api_opt_in)
    if problem:
        raise LaunchRefused(f"mcp_servers: {problem}", code="remote_url_refused")
    one_file = not mcp_servers_in_session(profile.protocol) and not mcp_config_takes_many(profile.protocol)
    if servers and one_file and options.get("mcp_config"):
        raise LaunchRefused(
            "this agent takes one --mcp-config file: give mcp_config or mcp_servers", code="bad_mcp_config"
        )


def check_profile(
    profile: Profile,
    options: Mapping[str, Any],
    *,
    model: str | None = None,
    check_executable: bool = True,
    for_thread: bool = False,
    codec: Codec | None = None,
) -> None:
    """Raise LaunchRefused when a thread with ``options`` could never be spawned.
    ``for_thread``: a thread's own check at creation (``model`` is its model), where a
    dialect whose command line needs a model and has none from the thread or the profile is
    refused; a profile alone (at load) may leave the model to its threads. ``codec``: the
    dialect's, when the caller has one already."""
    if check_executable:
        check_executable_usable(profile.executable)
    codec = codec or codec_for(profile)
    if for_thread and codec.requires_model and not (model or profile.model):
        raise LaunchRefused(
            f"{profile.protocol} agents are started with --model: give the thread a model, or set the profile's model",
            code="model_required",
        )
    mcp = options.get("mcp_config")
    check_servers(profile, options)
    check_launch_rules(
        profile,
        codec.launch_flags(options),
        model=model,
        model_form=codec.model_args,
        mcp_config=mcp if isinstance(mcp, str) else None,
        check_executable=False,
    )


class ThreadLaunch:
    """How one thread's agent is started: its profile, its spawn options (the profile's
    overridden by the thread's), its cwd and its model (the thread's, else the profile's).
    The registry makes it at creation (:meth:`checked`) and hands it to the conversation,
    which asks it for each process (:meth:`start`); a thread loaded from the store gets one
    at its first start."""

    def __init__(self, profile: Profile, options: Mapping[str, Any], *, cwd: str, model: str | None) -> None:
        self.profile = profile
        self.options = dict(options)
        self.cwd = cwd
        self.model = model
        # The codec made at creation, and the resume id it was made for: the first
        # process's, so creating and starting a thread make one codec, not two.
        self._ready: tuple[str | None, Codec] | None = None

    @classmethod
    def checked(
        cls,
        profile: Profile,
        options: Mapping[str, Any],
        *,
        cwd: str,
        model: str | None,
        native_session_id: str | None = None,
    ) -> ThreadLaunch:
        """A new thread's launch, refused now if it could never be spawned: an adopted
        session id this dialect cannot be given (docs/api.md §2.5) or a malformed model
        (InvalidRequest: the request is wrong), an unusable executable, a missing model the
        dialect needs, or any launch rule its profile and options break (LaunchRefused).
        ``model``: the thread's own, or None for the profile's."""
        launch = cls(profile, options, cwd=cwd, model=model or profile.model)
        codec = codec_for(profile, cwd=cwd, resume=native_session_id, options=options)
        if native_session_id is not None:
            try:
                resume_argv(native_session_id, codec.resume_args)
            except LaunchRefused as exc:
                raise InvalidRequest(f"native_session_id: {exc}", code="invalid_session_id") from exc
        if model and (problem := model_problem(model)):
            # Before the rules below read it: it goes on the agent's command line.
            raise InvalidRequest(f"model: {problem}", code="invalid_model")
        check_profile(profile, options, model=model, for_thread=True, codec=codec)
        launch._ready = (native_session_id, codec)
        return launch

    def start(
        self, resume: str | None, env: Mapping[str, str], fork: NativeFork | None = None
    ) -> tuple[Codec, LaunchSpec]:
        """The codec and the launch of one process, resuming the agent's session ``resume``
        (if any), with ``env`` on top of the allowed part of the daemon's (its profile's and
        its owner's secrets). ``fork``: a fork's first process copies ``resume`` (up to
        ``fork.at``) into a new session instead (protocols/forking.py). Every rule is
        checked again on this argv. Raises LaunchRefused."""
        if resume is not None and not valid_session_id(resume):
            raise LaunchRefused("native session id is not valid; refusing to pass it on", code="invalid_session_id")
        ready, self._ready = self._ready, None
        codec = (
            ready[1]
            if ready is not None and ready[0] == resume and fork is None
            else codec_for(self.profile, cwd=self.cwd, resume=resume, options=self.options, fork=fork is not None)
        )
        extra = fork_argv(self.profile.protocol, fork.at) if fork is not None else []
        profile = self.profile
        check_servers(profile, self.options)
        spec = build_launch(
            executable=profile.executable,
            args=profile.args,
            protocol_flags=codec.launch_flags(self.options),
            extra_args=extra,
            profile_env=env,
            cwd=self.cwd,
            model=self.model,
            resume_id=resume if codec.resume_on_argv else None,
            resume_form=codec.resume_args,
            model_form=codec.model_args,
            mcp_config=self.options.get("mcp_config"),
            remote_api_opt_in=profile.remote_api_opt_in,
        )
        return codec, spec
