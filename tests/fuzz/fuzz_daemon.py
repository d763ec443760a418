"""A real daemon for the fuzz tests, started once per module and shared by every example.

Synchronous on purpose: hypothesis drives plain functions, and ``websockets.sync`` /
``httpx.Client`` talk to the daemon without an event loop. The daemon is the same
``python -m bridge serve --port 0 --log-format json`` subprocess as ``conftest.Daemon``,
with the fake agent profiles of ``conftest.base_config``.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from conftest import TOKEN, base_config, processes_mentioning, processes_with_environ

START_TIMEOUT = 15.0


class SyncDaemon:
    def __init__(self, tmp: Path, *, server: str = "") -> None:
        self.tmp = tmp
        state = tmp / "agent-state"
        state.mkdir(exist_ok=True)
        self.agent_log = tmp / "agent.log"
        self.agent_env = {"FAKE_AGENT_LOG": str(self.agent_log), "FAKE_AGENT_STATE": str(state)}
        self.config_path = tmp / "config.toml"
        self.config_path.write_text(base_config(tmp, self.agent_env, server=server))
        self.data_dir = tmp / "data"
        self.stderr_path = tmp / "daemon.stderr"
        self.token = TOKEN
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self._stderr_offset = 0

    def start(self) -> None:
        argv = [
            sys.executable,
            "-m",
            "bridge",
            "serve",
            "--port",
            "0",
            "--config",
            str(self.config_path),
            "--data-dir",
            str(self.data_dir),
            "--log-format",
            "json",
            "--token",
            self.token,
        ]
        env = dict(os.environ)
        env.pop("AGENT_BRIDGE_TOKEN", None)
        with self.stderr_path.open("ab") as err:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, env=env, cwd=str(self.tmp))
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT)
        if not ready:
            self.proc.kill()
            raise AssertionError(f"daemon did not start: {self.stderr_path.read_text()}")
        line = self.proc.stdout.readline().decode().rstrip("\n")
        assert line.startswith("agent-bridge listening on http://"), (line, self.stderr())
        self.url = line.removeprefix("agent-bridge listening on ")

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://", 1)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=15.0)

    def stderr(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""

    def new_log_problems(self) -> list[str]:
        """Log lines written since the last call that are a traceback, not JSON, or at
        error level or above (the daemon logs JSON lines only, with --log-format json)."""
        text = self.stderr()
        fresh, self._stderr_offset = text[self._stderr_offset :], len(text)
        return log_problems(fresh)

    def healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            return False
        try:
            r = httpx.get(f"{self.url}/healthz", timeout=5.0)
        except httpx.HTTPError:
            return False
        return r.status_code == 200 and r.json() == {"status": "ok"}

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError("the daemon did not stop within 30 s of SIGTERM") from None
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        deadline = time.monotonic() + 15
        while self.leftover_agents() and time.monotonic() < deadline:
            time.sleep(0.05)
        return rc

    def leftover_agents(self) -> list[tuple[int, str]]:
        marker = str(self.agent_log)
        return processes_mentioning(marker) + processes_with_environ(marker.encode(), "fake_agent.py")


@contextlib.contextmanager
def running_daemon(tmp: Path, server: str) -> Iterator[SyncDaemon]:
    """A started daemon; on the way out it must stop cleanly (exit 0), with nothing at error
    level in its log and no agent process left behind."""
    d = SyncDaemon(tmp, server=server)
    d.start()
    try:
        yield d
    finally:
        rc = d.stop()
        problems = d.new_log_problems()
        leftovers = d.leftover_agents()
        assert rc == 0, f"daemon exited {rc}"
        assert not problems, "daemon logged problems:\n" + "\n".join(problems[:60])
        assert not leftovers, f"agent processes outlived the daemon: {leftovers}"


def log_problems(text: str) -> list[str]:
    problems = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            entry: Any = json.loads(line)
        except ValueError:
            problems.append(line)
            continue
        if not isinstance(entry, dict):
            problems.append(line)
        elif str(entry.get("level", "")).lower() in ("error", "critical", "exception", "fatal"):
            problems.append(line)
        elif "exception" in entry or "exc_info" in entry or "Traceback" in line:
            problems.append(line)
    return problems
