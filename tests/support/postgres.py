"""A real PostgreSQL server for tests: ``initdb`` in a fresh temporary directory, a free
port on loopback, its unix socket in that directory, ``pg_ctl start``; stopped and removed
at the end. Never a system service.

``initdb`` and ``postgres`` refuse to run as root, so under root (CI) they run as the
unprivileged ``nobody`` user through ``setpriv`` (util-linux), on a directory owned by it.

Authentication: a superuser ``bridge`` with a password over TCP (scram-sha-256), so the
tests exercise a URL with a password in it (and that it is never shown).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

USER = "bridge"
PASSWORD = "pg-secret-0f1e2d3c"
NOBODY = 65534


def pg_bin() -> Path | None:
    """The newest installed PostgreSQL's bin directory (Debian's layout), or one on PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Postgres:
    bin: Path
    root: Path
    port: int

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, db: str = "postgres", *, password: str = PASSWORD) -> str:
        return f"postgresql://{USER}:{password}@127.0.0.1:{self.port}/{db}"

    def _as_owner(self, argv: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return argv
        return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *argv]

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C", "TZ": "UTC"}
        return subprocess.run(
            self._as_owner([str(self.bin / argv[0]), *argv[1:]]),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=self.root,
            check=False,
        )

    def start(self) -> None:
        if os.geteuid() == 0:
            os.chown(self.root, NOBODY, NOBODY)
        pwfile = self.root / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if os.geteuid() == 0:
            os.chown(pwfile, NOBODY, NOBODY)
        r = self.run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            USER,
            f"--pwfile={pwfile}",
            "--auth-host=scram-sha-256",
            "--auth-local=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed: {r.stderr or r.stdout}")
        self.start_server()

    def start_server(self) -> None:
        """(Re)start the server on its data dir and port (after :meth:`stop`, too)."""
        opts = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=on -c full_page_writes=off -c max_connections=200"
        )
        r = self.run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-o", opts, "-w", "-t", "60", "start"
        )
        if r.returncode != 0:
            log = (self.root / "log").read_text() if (self.root / "log").exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {r.stderr or r.stdout}\n{log}")

    def stop(self) -> None:
        self.run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def psql(self, sql: str, db: str = "postgres") -> str:
        r = self.run("psql", "-h", str(self.root), "-p", str(self.port), "-U", USER, "-d", db, "-Atc", sql)
        if r.returncode != 0:
            raise RuntimeError(f"psql failed: {r.stderr}")
        return r.stdout

    def create_database(self, name: str) -> str:
        self.psql(f'CREATE DATABASE "{name}"')
        return self.url(name)


def missing_reason() -> str | None:
    if pg_bin() is None:
        return (
            "PostgreSQL is not installed (Debian package postgresql; scripts/test installs it): "
            "no initdb in /usr/lib/postgresql/*/bin or on PATH"
        )
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "running as root and setpriv (Debian package util-linux) is missing: initdb refuses root"
    return None


@contextlib.contextmanager
def running() -> Iterator[Postgres]:
    """A started server, stopped and removed afterwards. Its directory is made directly
    under the system temp dir: pytest's own tmp dirs are 0700 root, which ``nobody``
    cannot enter."""
    binary = pg_bin()
    assert binary is not None
    root = Path(tempfile.mkdtemp(prefix="bridge-pg-"))
    pg = Postgres(binary, root, free_port())
    try:
        pg.start()
        yield pg
    finally:
        with contextlib.suppress(Exception):
            pg.stop()
        shutil.rmtree(root, ignore_errors=True)
