"""A real Redis server for the tests: ``redis-server`` on a free loopback port, its data in
a temporary directory, never a system service. :meth:`RedisServer.stop` and
:meth:`RedisServer.start` again on the same port stand for "Redis went down and came back"."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

REDIS_SERVER = shutil.which("redis-server")
MISSING = "redis-server is not installed (Debian package redis-server; scripts/test installs it)"
START_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, workdir: Path, port: int | None = None):
        if REDIS_SERVER is None:
            raise RuntimeError(MISSING)
        self.workdir = workdir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS_SERVER is not None and self.proc is None
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        argv += ["--dir", str(self.workdir), "--protected-mode", "yes", "--daemonize", "no"]
        log = open(self.workdir / "redis.log", "ab")  # the child keeps its own copy
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        end = time.monotonic() + START_TIMEOUT_S
        while not _answers_ping(self.port):
            if self.proc.poll() is not None or time.monotonic() > end:
                out = (self.workdir / "redis.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"redis-server did not start on port {self.port}: {out}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc = None
