"""process/sandbox.py: the rules an agent gets, checked by running real processes under them
(the layout of a default install: the data dir inside HOME), and the daemon's own
hardening (command line and environment scrubbed, not dumpable)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.config import load_settings, sandbox_refusal
from bridge.errors import LaunchRefused
from bridge.process import bwrap
from bridge.process import sandbox as sb
from bridge.process.launch import LaunchSpec

pytestmark = pytest.mark.skipif(sb.landlock_abi() < sb.MIN_ABI, reason="this kernel has no Landlock")

PROBE = r"""
import json, os, sys
out = {}
def attempt(name, fn):
    try:
        out[name] = fn()
    except PermissionError:
        out[name] = "denied"
    except OSError as exc:
        out[name] = f"error:{exc.errno}"
def write(p):
    with open(p, "w") as f:
        f.write("x")
    return "ok"
for name, path in json.loads(sys.argv[1]).items():
    kind = name.split(":")[0]
    if kind == "read":
        attempt(name, lambda p=path: open(p).read())
    elif kind == "write":
        attempt(name, lambda p=path: write(p))
    elif kind == "list":
        attempt(name, lambda p=path: sorted(os.listdir(p)))
    elif kind == "caps":
        attempt(name, lambda: [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0])
out["tmpdir"] = os.environ.get("TMPDIR")
print(json.dumps(out))
"""


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """HOME with the data dir inside it, an existing settings dir, and a symlink to the data dir."""
    h = tmp_path / "home"
    data = h / ".local" / "share" / "agent-bridge"
    (data / "workspaces" / "thr_1").mkdir(parents=True)
    (data / "workspaces" / "thr_2").mkdir(parents=True)
    (data / "token").write_text("operator-token")
    (data / "workspaces" / "thr_2" / "theirs.txt").write_text("another thread's")
    (h / ".local" / "share" / "other-app").mkdir()
    (h / ".claude").mkdir()
    (h / ".claude.json").write_text("{}")
    (h / "shortcut").symlink_to(data)
    return h


def box(home: Path, **kw: object) -> sb.Sandbox:
    data = home / ".local" / "share" / "agent-bridge"
    return sb.resolve(sb.SandboxConfig(), deny=[str(data)], agent_areas=[str(data / "workspaces")], **kw)  # type: ignore[arg-type]


def run(plan: sb.Plan | None, cwd: Path, home: Path, targets: dict[str, str]) -> dict[str, object]:
    """The probe under ``plan`` (Landlock's rules, or bubblewrap's command line)."""
    assert plan is not None
    confined = sb.Confined(plan)
    program = [sys.executable, "-I", "-c", PROBE, json.dumps(targets)]
    executable, argv = confined.command(program, str(cwd)) or (program[0], program)
    try:
        p = subprocess.run(
            argv,
            executable=executable,
            cwd=cwd,
            env={**confined.env, "HOME": str(home), "PATH": "/usr/bin:/bin"},
            preexec_fn=confined.preexec(None),
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        confined.close()
    assert p.returncode == 0, p.stderr
    report: dict[str, object] = json.loads(p.stdout)
    assert report["tmpdir"] == confined.env["TMPDIR"] and Path(confined.tmpdir).is_dir()
    confined.cleanup()
    assert not Path(confined.tmpdir).exists()  # the private temp dir goes with the agent
    return report


def test_an_agent_owns_its_cwd_home_and_tmp_and_nothing_of_the_data_dir(home: Path) -> None:
    data = home / ".local" / "share" / "agent-bridge"
    cwd = data / "workspaces" / "thr_1"
    plan = box(home).plan(cwd=str(cwd), env={"HOME": str(home)}, executable=sys.executable)
    got = run(
        plan,
        cwd,
        home,
        {
            "write:cwd": str(cwd / "a.txt"),
            "write:home-existing-dir": str(home / ".claude" / "s.json"),
            "write:home-existing-file": str(home / ".claude.json"),
            "write:sibling-of-data": str(home / ".local" / "share" / "other-app" / "x"),
            "read:token": str(data / "token"),
            "read:through-symlink": str(home / "shortcut" / "token"),
            "read:other-thread": str(data / "workspaces" / "thr_2" / "theirs.txt"),
            "write:other-thread": str(data / "workspaces" / "thr_2" / "planted"),
            "write:data": str(data / "planted"),
            "list:data": str(data),
            "write:tmp": "/tmp/agent-bridge-test-planted",
            # The limit of a granted dir that holds the data dir: nothing new directly in it.
            "write:home-new-entry": str(home / "new.txt"),
            "caps:": "",
        },
    )
    for key in ("write:cwd", "write:home-existing-dir", "write:home-existing-file", "write:sibling-of-data"):
        assert got[key] == "ok", (key, got)
    for key in (
        "read:token",
        "read:through-symlink",
        "read:other-thread",
        "write:other-thread",
        "write:data",
        "list:data",
        "write:tmp",
        "write:home-new-entry",
    ):
        assert got[key] == "denied", (key, got)
    if os.geteuid() == 0:
        assert got["caps:"] == "0000000000000000", got  # root's agents hold no capability


def test_a_cwd_in_the_data_dir_outside_the_agent_areas_is_refused(home: Path) -> None:
    data = home / ".local" / "share" / "agent-bridge"
    for cwd in (data, data / "workspaces", home / "shortcut"):
        with pytest.raises(LaunchRefused) as caught:
            box(home).plan(cwd=str(cwd), env={"HOME": str(home)}, executable=sys.executable)
        assert caught.value.code == "cwd_not_allowed"
    # extra_write inside the data dir is dropped, unless the daemon allows that very path.
    allowed = data / "demo-agent"
    plan = box(home, allow=[str(allowed)]).plan(
        cwd=str(data / "workspaces" / "thr_1"),
        env={"HOME": str(home)},
        executable=sys.executable,
        extra_write=[str(data), str(allowed)],
    )
    assert plan is not None and str(data) not in plan.write and str(allowed) in plan.write
    assert allowed.is_dir()


def test_none_means_no_plan_and_the_spec_keeps_none(home: Path) -> None:
    unconfined = sb.resolve(sb.SandboxConfig(mode="none"))
    assert not unconfined.confined and unconfined.describe() == {"mechanism": "none", "requested": "none"}
    spec = LaunchSpec((sys.executable,), {"HOME": str(home)}, str(home))
    assert sb.confine(spec, unconfined).sandbox is None
    assert sb.confine(spec, box(home)).sandbox is not None


def test_install_dirs() -> None:
    assert sb.install_dirs("/opt/x/node_modules/@a/b/cli.js") == ["/opt/x/node_modules"]
    assert sb.install_dirs("/usr/local/bin/claude") == ["/usr/local/bin"]


def test_users_mode_refuses_to_run_agents_unconfined(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[auth]\nmode = "users"\n')
    settings = load_settings(config=str(cfg), data_dir=str(tmp_path / "d"), token="t" * 32)
    assert sandbox_refusal(settings) is None  # Landlock is here
    settings._confinement = sb.Sandbox(mechanism="none", requested="auto", abi=0, problem="no Landlock")
    assert "users mode refuses" in str(sandbox_refusal(settings))
    cfg.write_text('[auth]\nmode = "users"\n[sandbox]\nmode = "none"\n')
    written = load_settings(config=str(cfg), data_dir=str(tmp_path / "d"), token="t" * 32)
    assert sandbox_refusal(written) is None  # said in so many words
    cfg.write_text('[sandbox]\nmode = "landlock"\n')
    named = load_settings(config=str(cfg), data_dir=str(tmp_path / "d"), token="t" * 32)
    named._confinement = sb.Sandbox(mechanism="none", requested="landlock", abi=0, problem="no Landlock")
    assert "landlock" in str(sandbox_refusal(named))


HARDEN = r"""
import ctypes, sys
sys.path.insert(0, sys.argv[1])
from bridge.process.sandbox import harden_daemon, scrub_process
print(scrub_process([sys.argv[2]]))
print(harden_daemon())
print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))  # PR_GET_DUMPABLE
print(sys.argv[2] in open("/proc/self/cmdline").read(), sys.argv[2] in open("/proc/self/environ").read())
"""


def test_the_daemon_blanks_its_secrets_in_proc_and_is_not_dumpable() -> None:
    secret = "s3cret-" + "x" * 40
    root = str(Path(__file__).resolve().parents[2])
    p = subprocess.run(
        [sys.executable, "-c", HARDEN, root, secret],
        env={**os.environ, "AGENT_BRIDGE_TOKEN": secret},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 0, p.stderr
    changed, hardened, dumpable, leaks = p.stdout.splitlines()
    assert int(changed) == 2 * len(secret) and hardened == "True" and dumpable == "0"
    assert leaks == "False False"


def test_denied_paths_stay_out_of_reach_inside_a_granted_tree(tmp_path: Path) -> None:
    """A readable tree (``extra_read``, like /etc) that holds a denied file (like
    /etc/agent-bridge/agent-bridge.env with the token) is granted around it."""
    conf = tmp_path / "etc"
    (conf / "agent-bridge").mkdir(parents=True)
    (conf / "agent-bridge" / "agent-bridge.env").write_text("AGENT_BRIDGE_TOKEN=secret")
    (conf / "hosts").write_text("127.0.0.1 localhost")
    work = tmp_path / "work"
    work.mkdir()
    sandbox = sb.resolve(sb.SandboxConfig(extra_read=(str(conf),)), deny=[str(conf / "agent-bridge")])
    plan = sandbox.plan(cwd=str(work), env={"HOME": str(work)}, executable=sys.executable)
    got = run(
        plan,
        work,
        work,
        {"read:hosts": str(conf / "hosts"), "read:env": str(conf / "agent-bridge" / "agent-bridge.env")},
    )
    assert got["read:hosts"] == "127.0.0.1 localhost" and got["read:env"] == "denied", got


def test_the_daemon_denies_its_data_dir_config_and_etc_dir(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[sandbox]\ndeny = ["{tmp_path / "secrets"}"]\n')
    settings = load_settings(config=str(cfg), data_dir=str(tmp_path / "d"), token="t" * 32)
    deny = settings.confinement().deny
    for path in (tmp_path / "d", cfg, Path("/etc/agent-bridge"), tmp_path / "secrets"):
        assert os.path.realpath(path) in deny, (path, deny)


def test_the_store_writer_process_makes_itself_not_dumpable() -> None:
    code = (
        "import ctypes, sys; sys.path.insert(0, sys.argv[1]); from bridge.store import writer; "
        "writer._not_dumpable(); print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).resolve().parents[2])],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 0 and p.stdout.strip() == "0", (p.stdout, p.stderr)


def test_bubblewrap_mounts_in_the_order_that_keeps_the_rules(tmp_path: Path) -> None:
    """/tmp first (mounts under it stay visible), then what is granted, then a mask over each
    denied path that shows through (a file: /dev/null), then what the agent owns inside
    a mask, then the masks made read-only; missing paths are left out."""
    home = tmp_path / "home"
    data = home / "data"
    ws = data / "workspaces" / "thr_1"
    ws.mkdir(parents=True)
    cfg = tmp_path / "config.toml"
    cfg.write_text("")
    argv = bwrap.argv(
        "/usr/bin/bwrap",
        read=["/nonexistent/sdk"],
        write=[str(home), str(ws), str(tmp_path)],
        deny=[str(data), str(cfg)],
        tmpdir="/tmp/private",
        cwd=str(ws),
        program=["/proc/self/fd/7", "--flag"],
    )
    text = " ".join(argv)
    assert argv[-3:] == ["--", "/proc/self/fd/7", "--flag"]
    assert "--unshare-pid" in argv and "--die-with-parent" in argv and "/nonexistent/sdk" not in text
    order = [
        "--bind /tmp/private /tmp",
        f"--bind {home} {home}",
        f"--tmpfs {data}",
        f"--ro-bind /dev/null {cfg}",
        f"--bind {ws} {ws}",
        f"--remount-ro {data}",
        f"--chdir {ws}",
    ]
    at = [text.index(part) for part in order]
    assert at == sorted(at), list(zip(order, at, strict=True))


@pytest.mark.skipif(bwrap.find() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")
def test_under_bubblewrap_the_agent_may_make_new_entries_in_a_home_that_holds_the_data_dir(home: Path) -> None:
    data = home / ".local" / "share" / "agent-bridge"
    cwd = data / "workspaces" / "thr_1"
    sandbox = sb.resolve(sb.SandboxConfig(mode="bubblewrap"), deny=[str(data)], agent_areas=[str(data / "workspaces")])
    assert sandbox.mechanism == "bubblewrap", sandbox.problem
    plan = sandbox.plan(cwd=str(cwd), env={"HOME": str(home)}, executable=sys.executable)
    got = run(
        plan,
        cwd,
        home,
        {
            "write:cwd": str(cwd / "a.txt"),
            "write:home-new-entry": str(home / "new.txt"),
            "read:token": str(data / "token"),
            "read:other-thread": str(data / "workspaces" / "thr_2" / "theirs.txt"),
            "write:data": str(data / "planted"),
        },
    )
    assert got["write:cwd"] == "ok" and got["write:home-new-entry"] == "ok", got
    assert got["read:token"] == "error:2" and got["read:other-thread"] == "error:2", got  # not there at all
    assert got["write:data"] in ("denied", "error:30"), got  # EROFS: the mask is read-only
    assert got["tmpdir"] == "/tmp"
    assert (home / "new.txt").exists() and not (data / "planted").exists()


def test_no_agent_writes_the_system(home: Path) -> None:
    """A cwd of /, /usr or /etc is refused; a HOME or extra_write there is not granted."""
    for cwd in ("/", "/usr", "/etc"):
        with pytest.raises(LaunchRefused) as caught:
            box(home).plan(cwd=cwd, env={"HOME": str(home)}, executable=sys.executable)
        assert caught.value.code == "cwd_not_allowed"
    data = home / ".local" / "share" / "agent-bridge"
    plan = box(home).plan(
        cwd=str(data / "workspaces" / "thr_1"), env={"HOME": "/"}, executable=sys.executable, extra_write=["/etc"]
    )
    assert plan is not None and plan.write == (str(data / "workspaces" / "thr_1"),)
