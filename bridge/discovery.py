"""The discovery file ``<data-dir>/daemon.json``: how a desktop shell finds the daemon that
serves a data dir (docs/desktop.md, docs/api.md §1.6).

* The daemon writes it once it accepts connections, just before the first stdout line
  (:func:`publish`): atomically (a private temporary file, fsynced, renamed over the old
  one) and mode 0600, like everything in the data dir. It names the daemon's address,
  pid, version, start time and token file, never the token.
* It removes it when it stops cleanly (:func:`withdraw`), and only if the file still names
  its own pid. A daemon that is SIGKILLed leaves it behind: readers recognise that as
  stale (:func:`look`) because its pid is dead; they never delete it themselves (the next
  daemon replaces it), so a reader can never remove a fresh daemon's file.
* Its contents are read as untrusted input: a field of the wrong type makes the whole file
  ``malformed``, never a crash.

:func:`probe` asks the daemon itself (``GET /v1/daemon`` with the token), over TCP or the
Unix socket, with the standard library only: a pid that is alive is not yet proof, since
pids are reused.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from bridge.network import is_loopback_host
from bridge.process.parent import alive as pid_alive

FILE_NAME = "daemon.json"
MAX_BYTES = 64 * 1024  # far more than a record needs; a bigger file is malformed
PROBE_TIMEOUT_S = 3.0

State = Literal["running", "not_running", "stale", "unresponsive", "malformed"]

# field → the types it may have (read back from an untrusted file)
_FIELDS: dict[str, tuple[type, ...]] = {
    "url": (str, type(None)),
    "uds": (str, type(None)),
    "pid": (int,),
    "version": (str,),
    "started_at": (str,),
    "token_file": (str, type(None)),
    "data_dir": (str,),
    "auth": (bool,),
}


@dataclass(frozen=True)
class Record:
    """What ``daemon.json`` says: ``url`` is the TCP address a local client uses (null
    with ``--uds``), ``uds`` the Unix socket's path (else null), ``token_file`` where the
    token is (null when it was given by flag or environment, or with ``--no-auth``)."""

    url: str | None
    uds: str | None
    pid: int
    version: str
    started_at: str
    token_file: str | None
    data_dir: str
    auth: bool

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FIELDS}


@dataclass(frozen=True)
class Found:
    """What a reader concluded: ``record`` is None when the file is absent or malformed."""

    state: State
    record: Record | None
    detail: str = ""
    info: dict[str, Any] | None = None  # GET /v1/daemon's answer, when running
    # Running, but it answered 429: the token read is wrong and too many wrong credentials
    # came from this address (docs/security.md §1); seconds until it answers 401 again.
    retry_after_s: int | None = None


def path_of(data_dir: Path) -> Path:
    return data_dir / FILE_NAME


def publish(data_dir: Path, record: Record) -> None:
    """Write ``daemon.json`` atomically, mode 0600 (whatever the umask)."""
    final = path_of(data_dir)
    tmp = data_dir / f".{FILE_NAME}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a leftover of a daemon that died with this pid
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (json.dumps(record.as_dict(), indent=2) + "\n").encode())
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, final)
    _fsync_dir(data_dir)


def withdraw(data_dir: Path, pid: int) -> None:
    """Remove ``daemon.json`` if it still names ``pid`` (a clean stop)."""
    found = read(data_dir)
    if isinstance(found, Record) and found.pid == pid:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path_of(data_dir))
        _fsync_dir(data_dir)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def read(data_dir: Path) -> Record | str | None:
    """The record; None when there is no file; a string saying what is wrong with it."""
    try:
        fd = os.open(path_of(data_dir), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot read {path_of(data_dir)}: {exc.strerror}"
    with os.fdopen(fd, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    return parse(raw)


def parse(raw: bytes) -> Record | str:
    if len(raw) > MAX_BYTES:
        return "the file is too large"
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        return "not JSON"
    if not isinstance(obj, dict):
        return "not a JSON object"
    for name, types in _FIELDS.items():
        # type(), not isinstance: a pid of true is refused, an auth of 1 too
        if name not in obj or type(obj[name]) not in types:
            return f"field {name!r} is missing or has the wrong type"
    if obj["pid"] <= 0 or (obj["url"] is None) == (obj["uds"] is None):
        return "bad pid, or not exactly one of url and uds"
    return Record(**{name: obj[name] for name in _FIELDS})


def look(data_dir: Path, token: str | None = None, timeout: float = PROBE_TIMEOUT_S) -> Found:
    """Whether a daemon serves ``data_dir``: the file, its pid, then the daemon itself."""
    got = read(data_dir)
    if got is None:
        return Found("not_running", None, f"no {FILE_NAME} in {data_dir}")
    if isinstance(got, str):
        return Found("malformed", None, f"{path_of(data_dir)}: {got}")
    if not pid_alive(got.pid):
        return Found("stale", got, f"pid {got.pid} is not running (the daemon died without cleaning up)")
    try:
        status, body = probe(got, "GET", "/healthz", timeout=timeout)
        if status == 200 and got.auth and token is None:
            token = token_for(got)
        wait = None
        if status == 200:
            status, body, wait = exchange(got, "GET", "/v1/daemon", token=token, timeout=timeout)
    except (OSError, http.client.HTTPException) as exc:
        return Found("unresponsive", got, f"pid {got.pid} is alive but does not answer: {exc}")
    return _judge(got, status, body, wait)


def _judge(got: Record, status: int, body: Any, wait: int | None = None) -> Found:
    if status == 429:
        # It answers, and throttles this address: the token we sent is wrong (a valid one
        # always passes) and too many wrong ones came from here.
        where = got.token_file or "AGENT_BRIDGE_TOKEN"
        return Found("running", got, throttled_detail(where, wait), retry_after_s=wait)
    if status == 401:
        # It answers at its address, but the token we have is not its own: running, and
        # that is all we can tell.
        where = got.token_file or "AGENT_BRIDGE_TOKEN"
        return Found("running", got, f"the daemon refused the token from {where}: no more detail")
    if status != 200 or not isinstance(body, dict):
        return Found("unresponsive", got, f"pid {got.pid} is alive; its address answered {status}")
    if body.get("pid") != got.pid:
        # pids are reused and so are ports: someone else answers at that address
        return Found("stale", got, f"the daemon at that address is pid {body.get('pid')}, not {got.pid}")
    return Found("running", got, info=body)


def token_for(record: Record) -> str | None:
    """The token a local client uses: the token file named in the record, else
    ``AGENT_BRIDGE_TOKEN`` (a daemon given its token by flag or environment)."""
    if record.token_file:
        with contextlib.suppress(OSError):
            token = Path(record.token_file).read_text(encoding="utf-8").strip()
            if token:
                return token
    return os.environ.get("AGENT_BRIDGE_TOKEN") or None


def throttled_detail(where: str, wait: int | None) -> str:
    after = "" if wait is None else f" for {wait} s more"
    return (
        f"throttled: it refused the token from {where} as wrong, and answers wrong credentials "
        f"from this address with 429{after}"
    )


def probe(
    record: Record,
    method: str,
    path: str,
    *,
    token: str | None = None,
    body: dict[str, Any] | None = None,
    timeout: float = PROBE_TIMEOUT_S,
) -> tuple[int, Any]:
    """One request to the daemon the record names: (status, decoded JSON or None)."""
    status, decoded, _ = exchange(record, method, path, token=token, body=body, timeout=timeout)
    return status, decoded


def exchange(
    record: Record,
    method: str,
    path: str,
    *,
    token: str | None = None,
    body: dict[str, Any] | None = None,
    timeout: float = PROBE_TIMEOUT_S,
) -> tuple[int, Any, int | None]:
    """:func:`probe`, and the answer's ``Retry-After`` in seconds (None: absent or not a
    number of seconds)."""
    conn = _connection(record, timeout)
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read(MAX_BYTES + 1)
    finally:
        conn.close()
    retry = (resp.getheader("Retry-After") or "").strip()
    wait = int(retry) if retry.isdigit() and len(retry) < 10 else None
    try:
        return resp.status, json.loads(raw) if raw else None, wait
    except ValueError:
        return resp.status, None, wait


def _connection(record: Record, timeout: float) -> http.client.HTTPConnection:
    if record.uds is not None:
        return UnixHTTPConnection(record.uds, timeout)
    assert record.url is not None
    parts = urlsplit(record.url)
    host, port = parts.hostname or "127.0.0.1", parts.port
    if parts.scheme == "https":
        ctx = ssl.create_default_context()
        if is_loopback_host(host):
            # A loopback daemon usually has a certificate of its own making; its pid is
            # alive and holds the port, and the record is private to this user.
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return http.client.HTTPSConnection(host, port, timeout=timeout, context=ctx)
    return http.client.HTTPConnection(host, port, timeout=timeout)


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket; the Host header says ``localhost`` (docs/api.md §3.3)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock
