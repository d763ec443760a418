"""The table of agent CLI versions tests/real runs, and reading a profile's CLI version
from its npm package without running it (issue #17 item 3)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from test_config_cli import agents_json, run_cli, write

from bridge.tested_agents import TESTED, cli_version

ROOT = Path(__file__).resolve().parent.parent


def package(root: Path, name: str, version: str, file: str, body: str = "#!/bin/sh\nexit 0\n") -> Path:
    """node_modules/NAME with a package.json and an executable FILE in it."""
    d = root / "node_modules" / name
    write(d / "package.json", json.dumps({"name": name, "version": version, "bin": {"x": file}}))
    exe = write(d / file, body)
    exe.chmod(0o755)
    return exe


def test_the_table_is_the_pinned_versions_of_tests_real() -> None:
    pins: dict[str, set[str]] = {}
    for line in (ROOT / "tests" / "real" / "npm-pins.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.strip().rsplit("@", 1)
            pins.setdefault(name, set()).add(version)
    assert {k: set(v) for k, v in TESTED.items()} == pins


def test_a_script_run_by_node_is_read_from_its_package(tmp_path: Path) -> None:
    script = package(tmp_path, "@qwen-code/qwen-code", "0.24.4", "cli-entry.js")
    node = "/usr/bin/node"
    v = cli_version(node, [str(script), "--acp"])
    assert v is not None and (v.package, v.version, v.tested) == ("@qwen-code/qwen-code", "0.24.4", True)
    # the executable itself, as PATH discovery resolves npm's bin symlink
    assert cli_version(str(script)) == v
    newer = package(tmp_path / "b", "@qwen-code/qwen-code", "0.25.0", "cli-entry.js")
    v2 = cli_version(node, [str(newer)])
    assert v2 is not None and v2.tested is False and v2.version == "0.25.0"


def test_native_binaries_of_platform_packages_count_for_their_cli(tmp_path: Path) -> None:
    codex = package(tmp_path, "@zed-industries/codex-acp-linux-x64", "0.16.0", "bin/codex-acp")
    v = cli_version(str(codex))
    assert v is not None and (v.package, v.tested) == ("@zed-industries/codex-acp", True)
    opencode = package(tmp_path, "opencode-linux-x64", "1.18.30", "bin/opencode")
    v = cli_version(str(opencode))
    assert v is not None and (v.package, v.version, v.tested) == ("opencode-ai", "1.18.30", False)
    claude = package(tmp_path, "@anthropic-ai/claude-code-linux-arm64", "2.1.332", "claude")
    v = cli_version(str(claude))
    assert v is not None and (v.package, v.tested) == ("@anthropic-ai/claude-code", True)


def test_a_dist_package_json_without_a_name_is_passed_over(tmp_path: Path) -> None:
    exe = package(tmp_path, "@agentclientprotocol/claude-agent-acp", "0.101.0", "dist/index.js")
    write(exe.parent / "package.json", '{"type": "module"}')
    v = cli_version("/usr/bin/node", [str(exe)])
    assert v is not None and v.package == "@agentclientprotocol/claude-agent-acp" and v.tested


@pytest.mark.parametrize(
    "setup",
    ["unknown package", "no package.json", "not json", "too big", "outside node_modules"],
)
def test_no_version_when_it_cannot_be_read_cheaply(tmp_path: Path, setup: str) -> None:
    if setup == "unknown package":
        exe = package(tmp_path, "left-pad", "1.0.0", "index.js")
    elif setup == "outside node_modules":
        exe = write(tmp_path / "opt" / "qwen" / "cli.js", "")
        write(tmp_path / "opt" / "package.json", json.dumps({"name": "@qwen-code/qwen-code", "version": "0.24.4"}))
        write(tmp_path / "package.json", json.dumps({"name": "@qwen-code/qwen-code", "version": "0.24.4"}))
        # found: a package.json within reach names a known CLI, wherever it lies
        assert cli_version(str(exe)) is not None
        exe = write(tmp_path / "a" / "b" / "c" / "d" / "e" / "f" / "g" / "cli.js", "")
    else:
        exe = package(tmp_path, "@google/gemini-cli", "0.61.0", "bundle/gemini.js")
        meta = exe.parent.parent / "package.json"
        if setup == "no package.json":
            meta.unlink()
        elif setup == "not json":
            meta.write_text("{not json")
        else:
            meta.write_text(json.dumps({"name": "@google/gemini-cli", "version": "0.61.0", "x": "y" * 300_000}))
    assert cli_version(str(exe)) is None


def test_agents_flags_a_cli_version_that_was_never_tested(tmp_path: Path) -> None:
    node = shutil.which("node") or "/usr/bin/node"
    good = package(tmp_path / "a", "@google/gemini-cli", "0.61.0", "bundle/gemini.js")
    new = package(tmp_path / "b", "@google/gemini-cli", "0.99.1", "bundle/gemini.js")
    cfg = write(
        tmp_path / "c.toml",
        f'[agents.tested]\nprotocol = "acp"\nexecutable = "{good}"\n\n'
        f'[agents.newer]\nprotocol = "acp"\nexecutable = "{os.path.realpath(node)}"\nargs = ["{new}", "--acp"]\n',
    )
    rows = {r["name"]: r for r in agents_json(tmp_path, "--config", str(cfg))}
    assert rows["tested"]["cli"] == {"package": "@google/gemini-cli", "version": "0.61.0", "tested": True}
    assert rows["newer"]["cli"] == {"package": "@google/gemini-cli", "version": "0.99.1", "tested": False}
    assert rows["demo"]["cli"] is None
    r = run_cli(tmp_path, "agents", "--config", str(cfg), "--data-dir", str(tmp_path / "d"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith(("ok newer", "-- newer")))
    assert lines[i + 1] == "     untested version: @google/gemini-cli 0.99.1 (tested: 0.61.0; docs/agents.md)"
    assert "untested" not in "".join(line for line in lines if not line.startswith("     untested"))
    assert r.stdout.count("untested version") == 1
