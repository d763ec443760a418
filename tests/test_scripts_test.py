"""scripts/test (README command 2) without root on a machine that lacks Debian packages the
suite needs: one line naming them, a non-zero exit, and nothing run or made (issue #34)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOBODY = 65534


def test_without_root_it_names_what_to_install_in_one_line_and_runs_nothing() -> None:
    # Directly under the system temp dir: pytest's own are 0700 root, closed to ``nobody``.
    with tempfile.TemporaryDirectory(prefix="bridge-scripts-test-") as tmp:
        check_without_root(Path(tmp))


def check_without_root(tmp_path: Path) -> None:
    setpriv = shutil.which("setpriv")
    if os.geteuid() == 0 and setpriv is None:
        pytest.skip("setpriv is not installed (Debian package util-linux): root needs it to run as another user")
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "test", tree / "scripts" / "test")
    tmp_path.chmod(0o755)
    tree.chmod(0o777)  # were the script to go on, it could make .venv here: the test would see it
    # A PATH with the shell's few helpers and none of the tools: whatever is installed on
    # this machine, those packages count as missing.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("bash", "dirname", "id"):
        found = shutil.which(name)
        assert found is not None, name
        (bin_dir / name).symlink_to(found)
    argv = [str(bin_dir / "bash"), str(tree / "scripts" / "test"), "-k", "nothing"]
    if os.geteuid() == 0:
        argv = [str(setpriv), f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *argv]
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path / "home")}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30, check=False)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, lines
    prefix = "scripts/test: run as root, or first: sudo apt-get install -y "
    assert lines[0].startswith(prefix), lines
    missing = lines[0][len(prefix) :].split()
    assert {"python3", "python3-venv", "redis-server", "websocketd", "podman", "bubblewrap"} <= set(missing), missing
    assert len(missing) == len(set(missing)), missing
    assert sorted(p.name for p in tree.iterdir()) == ["scripts"]  # no .venv, nothing installed
    assert not (tmp_path / "home").exists()  # no cache made
