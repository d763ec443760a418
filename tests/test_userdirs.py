"""bridge/userdirs.py in-process: the cwd rules on real paths (the data dir, workspaces,
roots, symlinks at creation and swapped in before a spawn), homes, and the paths a
non-admin is shown and may give back. The same rules through a real daemon:
tests/test_userdirs_e2e.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from bridge.config import Settings, load_settings
from bridge.errors import BridgeError, ConfigError, LaunchRefused
from bridge.process.launch import LaunchSpec
from bridge.userdirs import (
    DATA_DIR_MARK,
    ThreadOwner,
    check_cwd,
    given,
    home_env,
    launch_for_thread,
    picker_roots,
    shown,
    shown_text,
    spawn_problem,
)

pytestmark = pytest.mark.timeout(30)
TID = "thr_0123456789abcdef"
OTHER = "thr_fedcba9876543210"


def settings(tmp_path: Path, auth: str = 'mode = "users"\n') -> Settings:
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"[auth]\n{auth}")
    s = load_settings(config=str(cfg), data_dir=str(tmp_path / "data"), token="t" * 32, discover_path=False)
    s.data_dir.mkdir(parents=True, exist_ok=True)
    return s


def owners(table: dict[str, str | None]) -> ThreadOwner:
    async def owner_of(tid: str) -> tuple[bool, str | None]:
        return (tid in table, table.get(tid))

    return owner_of


async def refused(s: Settings, cwd: Path | str, owner: str | None, admin: bool, table: dict[str, str | None]) -> str:
    with pytest.raises(BridgeError) as info:
        await check_cwd(s, str(cwd), owner=owner, admin=admin, thread_owner=owners(table))
    return info.value.code


async def test_the_data_dir_is_refused_to_everyone_but_a_workspaces_owner(tmp_path: Path) -> None:
    s = settings(tmp_path)
    data = s.data_dir
    for sub in (f"workspaces/{TID}/src", f"workspaces/{OTHER}", "workspaces/users/alice/app", "homes/alice"):
        (data / sub).mkdir(parents=True)
    (tmp_path / "link").symlink_to(data)
    table = {TID: "alice", OTHER: "bob"}
    for who, admin in (("alice", False), ("root", True), (None, True)):
        for cwd in (
            data,
            data / "workspaces",
            data / "homes" / "alice",
            tmp_path / "link",
            tmp_path / "link" / "homes",
        ):
            assert await refused(s, cwd, who, admin, table) == "cwd_not_allowed", (who, cwd)
        assert await refused(s, data / "workspaces" / OTHER, who, admin, table) == "cwd_not_allowed"
    # Alice's own: her thread's workspace (below it too), her root; through a symlink as well.
    (tmp_path / "mine").symlink_to(data / "workspaces" / TID / "src")
    for cwd in (data / "workspaces" / TID, tmp_path / "mine", data / "workspaces" / "users" / "alice" / "app"):
        real = await check_cwd(s, str(cwd), owner="alice", admin=False, thread_owner=owners(table))
        assert real == os.path.realpath(cwd)
    # An admin is not given Alice's root, nor a deleted thread's workspace to anyone.
    assert await refused(s, data / "workspaces" / "users" / "alice", "root", True, table) == "cwd_not_allowed"
    assert await refused(s, data / "workspaces" / TID, "alice", False, {}) == "cwd_not_allowed"
    assert await refused(s, tmp_path / "nowhere", "alice", False, table) == "bad_cwd"
    assert await refused(s, "relative", "alice", False, table) == "bad_cwd"


async def test_token_mode_the_operator_may_use_any_directory_but_the_data_dir(tmp_path: Path) -> None:
    s = settings(tmp_path, "")
    (s.data_dir / "workspaces" / TID).mkdir(parents=True)
    assert await refused(s, s.data_dir, None, True, {TID: None}) == "cwd_not_allowed"
    for cwd in ("/", str(tmp_path), str(s.data_dir / "workspaces" / TID)):
        assert await check_cwd(s, cwd, owner=None, admin=True, thread_owner=owners({TID: None})) == cwd


async def test_a_non_admin_stays_under_their_roots(tmp_path: Path) -> None:
    roots = tmp_path / "work"
    s = settings(tmp_path, f'mode = "users"\nuser_workspace_roots = ["{roots}/{{user}}"]\n')
    (roots / "alice" / "app").mkdir(parents=True)
    (roots / "bob").mkdir(parents=True)
    (roots / "alice" / "out").symlink_to(tmp_path)
    ok = await check_cwd(s, str(roots / "alice" / "app"), owner="alice", admin=False, thread_owner=owners({}))
    assert ok == str(roots / "alice" / "app")
    for cwd in (roots / "bob", roots / "alice" / "out", tmp_path, "/"):
        assert await refused(s, cwd, "alice", False, {}) == "cwd_not_allowed", cwd
    assert await check_cwd(s, str(tmp_path), owner="root", admin=True, thread_owner=owners({})) == str(tmp_path)
    assert picker_roots(s, "alice", False) == [str(roots / "alice")]


def thread(cwd: Path | str, owner: str | None = "alice", tid: str = TID) -> dict[str, object]:
    return {"id": tid, "cwd": str(cwd), "owner": owner}


def test_a_symlink_swapped_in_after_creation_is_refused_before_the_spawn(tmp_path: Path) -> None:
    s = settings(tmp_path)
    data = s.data_dir
    for sub in (f"workspaces/{TID}", f"workspaces/{OTHER}", "workspaces/users/alice/app", "homes/bob"):
        (data / sub).mkdir(parents=True)
    proj = data / "workspaces" / "users" / "alice" / "proj"
    proj.mkdir()
    assert spawn_problem(s, thread(proj)) is None
    assert spawn_problem(s, thread(data / "workspaces" / OTHER)) is None  # checked at creation, no symlink
    for target in (data, data / "homes" / "bob", data / "workspaces" / OTHER, tmp_path):
        proj.rmdir() if proj.is_dir() and not proj.is_symlink() else proj.unlink()
        proj.symlink_to(target)
        assert spawn_problem(s, thread(proj)) is not None, target
        with pytest.raises(LaunchRefused) as info:
            launch_for_thread(LaunchSpec(("x",), {}, str(proj)), s, thread(proj))
        assert info.value.code == "cwd_not_allowed"
    for target in (data / "workspaces" / TID, data / "workspaces" / "users" / "alice" / "app"):
        proj.unlink()
        proj.symlink_to(target)  # still the thread's own places
        assert spawn_problem(s, thread(proj)) is None, target
    # A thread made before the rule, in the data dir itself: never started there again.
    assert spawn_problem(s, thread(data, owner=None)) is not None


def test_homes_are_made_0700_and_given_to_the_users_agents_only(tmp_path: Path) -> None:
    s = settings(tmp_path)
    spec = LaunchSpec(("x",), {"HOME": "/daemon/home", "PATH": "/bin"}, str(tmp_path))
    out = launch_for_thread(spec, s, thread(tmp_path, owner="alice"))
    home = s.data_dir / "homes" / "alice"
    assert out.env == {"HOME": str(home), "PATH": "/bin"}
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert launch_for_thread(spec, s, thread(tmp_path, owner=None)).env == spec.env  # the operator's
    assert home_env(settings(tmp_path / "t", ""), "alice") == {}  # token mode
    custom = settings(tmp_path / "c", f'mode = "users"\nuser_home = "{tmp_path}/h/{{user}}-home"\n')
    assert home_env(custom, "bob") == {"HOME": f"{tmp_path}/h/bob-home"}


def test_user_dirs_config_is_checked(tmp_path: Path) -> None:
    for auth in (
        'user_home = "/srv/homes/shared"\n',
        'user_home = "relative/{user}"\n',
        'user_workspace_roots = ["x"]\n',
    ):
        with pytest.raises(ConfigError):
            settings(tmp_path, 'mode = "users"\n' + auth)


def test_a_non_admin_is_shown_data_dir_paths_as_a_mark_and_may_give_them_back(tmp_path: Path) -> None:
    s = settings(tmp_path)
    data = os.path.realpath(s.data_dir)
    inside = os.path.join(data, "workspaces", TID)
    assert shown(s, inside, admin=False) == f"{DATA_DIR_MARK}/workspaces/{TID}"
    assert shown(s, data, admin=False) == DATA_DIR_MARK
    assert shown(s, data + "x/y", admin=False) == data + "x/y"  # a sibling, not inside
    assert shown(s, inside, admin=True) == inside
    assert shown(settings(tmp_path / "t", ""), inside, admin=False) == inside  # token mode
    assert (
        shown_text(s, f"no such directory: {inside}", admin=False)
        == f"no such directory: {DATA_DIR_MARK}/workspaces/{TID}"
    )
    assert given(s, f"{DATA_DIR_MARK}/workspaces/{TID}") == inside
    assert given(s, DATA_DIR_MARK) == data
    assert given(s, f"{DATA_DIR_MARK}x") == f"{DATA_DIR_MARK}x" and given(s, "/abs") == "/abs"
