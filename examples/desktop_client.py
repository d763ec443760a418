#!/usr/bin/env python3
"""A desktop shell's start-up sequence, for reference (docs/desktop.md): find the daemon
that serves a data dir, or start one that follows this process, then open a thread and
talk to it over the WebSocket.

    python examples/desktop_client.py [--data-dir DIR] [--agent NAME] [--prompt TEXT]
                                      [--config FILE] [--daemon-log FILE] [--hold]

1. Read ``<data-dir>/daemon.json``. If it names a live pid, ``GET /healthz`` answers and
   ``GET /v1/daemon`` (with the token from ``token_file``) reports that same pid, use it.
   A file whose pid is dead is stale: a daemon that was killed; go on to step 2.
2. Otherwise spawn ``agent-bridge serve --data-dir DIR --port 0 --parent-pid <our pid>``
   and read the first line of its stdout (``agent-bridge listening on …``): the daemon is
   ready, and ``daemon.json`` is written. If it exits instead, another shell won the race
   for the data dir: poll ``daemon.json`` (step 1) until its daemon answers.
3. ``POST /v1/threads``, then the WebSocket ``/v1/threads/{id}/ws`` with
   ``Authorization: Bearer``; send one prompt and read events until its ``turn.ended``.

It prints one JSON line on stdout: ``{"pid", "spawned", "stale_found", "url", "uds",
"thread", "reply", "status"}``. With ``--hold`` it then waits for its stdin to close
before it exits (a daemon it spawned exits with it). Standard library plus ``websockets``
(installed with agent-bridge); it imports nothing of agent-bridge itself, as a shell
written in another language would not.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from websockets.sync.client import connect, unix_connect

START_TIMEOUT_S = 20.0


def main() -> int:
    args = parse_args()
    data_dir = Path(args.data_dir).expanduser().absolute()
    found, spawned, stale = find_or_start(data_dir, args)
    token = read_token(found)
    thread = request(found, "POST", "/v1/threads", token, {"agent": args.agent} if args.agent else {})
    reply, status = converse(found, token, thread["id"], args.prompt)
    result = {
        "pid": found["pid"],
        "spawned": spawned,
        "stale_found": stale,
        "url": found["url"],
        "uds": found["uds"],
        "thread": thread["id"],
        "reply": reply,
        "status": status,
    }
    print(json.dumps(result), flush=True)
    if args.hold:
        sys.stdin.read()  # until the caller closes our stdin
    return 0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_dir = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "agent-bridge"
    p.add_argument("--data-dir", default=os.environ.get("AGENT_BRIDGE_DATA_DIR") or str(default_dir))
    p.add_argument("--agent", help="agent profile for the new thread (default: the daemon's default)")
    p.add_argument("--prompt", default="hello")
    p.add_argument("--config", help="config file for a daemon this client starts")
    p.add_argument("--daemon-log", help="append a daemon this client starts's stderr here")
    p.add_argument("--command", default=f"{shlex.quote(sys.executable)} -m bridge", help="how to run agent-bridge")
    p.add_argument("--hold", action="store_true", help="stay until stdin closes")
    return p.parse_args()


# --------------------------------------------------------------------------- finding it


def find_or_start(data_dir: Path, args: argparse.Namespace) -> tuple[dict[str, Any], bool, bool]:
    """(daemon.json's record, whether we started it, whether we found a stale file)."""
    stale = False
    tried = False
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        record, state = discover(data_dir)
        if record is not None:
            return record, False, stale
        stale = stale or state == "stale"
        if not tried:
            tried = True
            if spawn(data_dir, args):
                record, state = discover(data_dir)
                if record is not None:
                    return record, True, stale
        if time.monotonic() > deadline:
            raise SystemExit(f"desktop_client: no daemon for {data_dir} ({state})")
        time.sleep(0.1)  # another shell's daemon is starting: its daemon.json comes next


def discover(data_dir: Path) -> tuple[dict[str, Any] | None, str]:
    """Step 1: the record of a daemon that answers, else (None, why not)."""
    try:
        record = json.loads((data_dir / "daemon.json").read_text())
    except FileNotFoundError:
        return None, "absent"
    except (OSError, ValueError):
        return None, "malformed"
    pid = record.get("pid")
    if not isinstance(pid, int) or not pid_alive(pid):
        return None, "stale"
    try:
        health = request(record, "GET", "/healthz", None)
        me = request(record, "GET", "/v1/daemon", read_token(record))
    except (OSError, http.client.HTTPException, RuntimeError):
        return None, "unresponsive"
    if health.get("status") != "ok" or me.get("pid") != pid:
        return None, "stale"  # pids and ports are reused: someone else answers there
    return record, "running"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead too (Linux)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def spawn(data_dir: Path, args: argparse.Namespace) -> bool:
    """Step 2: start a daemon that follows us; True once it said it listens."""
    argv = [*shlex.split(args.command), "serve", "--data-dir", str(data_dir), "--port", "0"]
    argv += ["--parent-pid", str(os.getpid())]
    if args.config:
        argv += ["--config", args.config]
    err = open(args.daemon_log, "ab") if args.daemon_log else None
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL)
    if err is not None:
        err.close()
    assert proc.stdout is not None
    first = proc.stdout.readline().decode()
    if not first.startswith("agent-bridge listening on "):
        proc.wait()  # it exited: most likely another shell's daemon holds the data dir
        return False
    # Keep reading its stdout (the second line, the sign-in link), so the daemon never
    # writes into a full or closed pipe.
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    return True


def read_token(record: dict[str, Any]) -> str | None:
    if not record.get("auth"):
        return None
    if record.get("token_file"):
        return Path(record["token_file"]).read_text().strip()
    return os.environ.get("AGENT_BRIDGE_TOKEN")


# --------------------------------------------------------------------------- talking to it


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=10)  # the Host header: localhost
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def request(record: dict[str, Any], method: str, path: str, token: str | None, body: Any = None) -> Any:
    if record.get("uds"):
        conn: http.client.HTTPConnection = UnixHTTPConnection(record["uds"])
    else:
        u = urlsplit(record["url"])
        conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=10)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    if resp.status >= 300:
        raise RuntimeError(f"{method} {path}: {resp.status} {data[:200]!r}")
    return json.loads(data)


def converse(record: dict[str, Any], token: str | None, thread_id: str, prompt: str) -> tuple[str, str]:
    """Step 3: one prompt over the WebSocket; (the agent's reply, the turn's status)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    path = f"/v1/threads/{thread_id}/ws"
    if record.get("uds"):
        ws = unix_connect(record["uds"], f"ws://localhost{path}", additional_headers=headers, open_timeout=10)
    else:
        ws = connect(record["url"].replace("http", "ws", 1) + path, additional_headers=headers, open_timeout=10)
    with ws:
        ws.send(json.dumps({"op": "prompt", "text": prompt}))
        turn_id, reply = None, []
        while True:
            frame = json.loads(ws.recv(timeout=30))
            kind, data = frame.get("kind"), frame.get("data") or {}
            if kind == "client.rejected":
                raise SystemExit(f"desktop_client: prompt rejected: {data}")
            if kind == "client.accepted" and data.get("op") == "prompt":
                turn_id = data.get("turn_id")
            elif kind == "message.delta" and frame.get("source") == "agent":
                reply.append(data.get("text", ""))
            elif kind == "turn.ended" and turn_id is not None and data.get("turn_id") == turn_id:
                return "".join(reply), str(data.get("status"))


if __name__ == "__main__":
    sys.exit(main())
