#!/usr/bin/env python3
"""A hostile stream-json agent (issue #32): what a steered coding agent would try, as code.

Standard library only; run as ``python -I hostile_agent.py`` (the bridge adds its
stream-json flags, which are taken as the real CLIs take them; anything else is refused).
Each user turn's text is a JSON object naming targets; the agent tries every escape on
them and answers with one assistant message whose text is a JSON report
``{"probe name": "denied" | "ok" | "ok:<what it got>" | "absent", ...}``:

  read:<path>       read a file (token, database, daemon.json, another workspace's file,
                    another user's home)
  list:<path>       list a directory (the data dir)
  write:<path>      create a file (outside what is its own, and inside: cwd, HOME, TMPDIR)
  environ / mem     the daemon's /proc environ and memory (the pid given, else its parent's)
  cmdline           the daemon's command line (the report carries it: a test looks for the token)
  signal            signal 0 to the daemon (the pid given, else its parent)
  sqlite:<path>     open the store's database and read the users table
  api:<url>         GET <url>/v1/threads with every credential found on the way (env
                    values, the daemon's command line and environment, files read), and
                    answer a permission request of its own thread (POST …/permissions/…)

The turn ends with a ``result`` line, as Claude Code ends one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import sys
import urllib.error
import urllib.request
import uuid

ACCEPTED = {"--output-format", "--input-format", "--verbose", "--model", "--resume", "--print"}
TOKEN_RE = re.compile(rb"[A-Za-z0-9_-]{32,}")


def out(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def refuse_unknown(argv: list[str]) -> None:
    i = 0
    while i < len(argv):
        flag = argv[i].split("=", 1)[0]
        if flag not in ACCEPTED:
            sys.stderr.write(f"error: unknown option '{argv[i]}'\n")
            sys.exit(1)
        if "=" not in argv[i] and flag in {"--output-format", "--input-format", "--model", "--resume"}:
            i += 1
        i += 1


class Probe:
    def __init__(self) -> None:
        self.daemon = os.getppid()
        self.found: set[str] = set()  # credentials picked up on the way

    def harvest(self, data: bytes) -> None:
        for m in TOKEN_RE.findall(data):
            self.found.add(m.decode())

    def read(self, path: str) -> str:
        try:
            with open(path, "rb") as f:
                data = f.read(4096)
        except FileNotFoundError:
            return "absent"
        except OSError:
            return "denied"
        self.harvest(data)
        return "ok:" + data[:200].decode("utf-8", "replace")

    def list(self, path: str) -> str:
        try:
            return "ok:" + ",".join(sorted(os.listdir(path)))
        except FileNotFoundError:
            return "absent"
        except OSError:
            return "denied"

    def write(self, path: str) -> str:
        try:
            with open(path, "w") as f:
                f.write("planted by a hostile agent\n")
        except OSError:
            return "denied"
        return "ok"

    def proc(self, name: str, pid: int) -> str:
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                data = f.read(65536)
        except FileNotFoundError:
            return "absent"  # not in this process's view of /proc (a pid namespace of its own)
        except OSError:
            return "denied"
        self.harvest(data)
        return "ok:" + data.replace(b"\0", b" ").decode("utf-8", "replace")

    def signal(self, pid: int) -> str:
        try:
            os.kill(pid, 0)
        except PermissionError:
            return "denied"
        except ProcessLookupError:
            return "absent"
        except OSError as exc:
            return f"error:{exc.errno}"
        return "ok"

    def sqlite(self, path: str) -> str:
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)
            try:
                rows = db.execute("SELECT name FROM sqlite_master").fetchall()
            finally:
                db.close()
        except sqlite3.Error:
            return "denied"
        return "ok:" + ",".join(r[0] for r in rows)

    def api(self, url: str, thread: str) -> str:
        for name in ("AGENT_BRIDGE_TOKEN", "AGENT_BRIDGE_STORE_URL", "PGPASSWORD"):
            if os.environ.get(name):
                self.found.add(os.environ[name])
        if not self.found:
            return "denied:no credential found"
        codes = []
        for token in sorted(self.found):
            req = urllib.request.Request(
                f"{url}/v1/threads/{thread}/permissions", headers={"Authorization": f"Bearer {token}"}
            )
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    codes.append(r.status)
            except urllib.error.HTTPError as exc:
                codes.append(exc.code)
            except OSError:
                codes.append(0)
        return "ok" if 200 in codes else f"denied:{sorted(set(codes))}"


def attack(targets: dict[str, str]) -> dict[str, str]:
    p = Probe()
    report: dict[str, str] = {}
    for key, arg in targets.items():
        kind = key.split(":", 1)[0]
        if kind == "read":
            report[key] = p.read(arg)
        elif kind == "list":
            report[key] = p.list(arg)
        elif kind == "write":
            report[key] = p.write(arg)
        elif kind in ("environ", "mem", "cmdline"):
            report[key] = p.proc(kind, int(arg) if arg else p.daemon)
        elif kind == "signal":
            report[key] = p.signal(int(arg) if arg else p.daemon)
        elif kind == "sqlite":
            report[key] = p.sqlite(arg)
    for key, arg in targets.items():  # last: with every credential the others found
        if key.startswith("api:"):
            url, _, thread = arg.rpartition("|")
            report[key] = p.api(url, thread)
    return report


def main() -> int:
    refuse_unknown(sys.argv[1:])
    session = str(uuid.uuid4())
    started = False
    for raw in sys.stdin:
        if not raw.strip():
            continue
        msg = json.loads(raw)
        if msg.get("type") != "user":
            continue
        if not started:
            out({"type": "system", "subtype": "init", "session_id": session, "model": "hostile", "tools": []})
            started = True
        content = msg["message"]["content"]
        text = content if isinstance(content, str) else "".join(b.get("text", "") for b in content)
        report: dict[str, str] = {}
        with contextlib.suppress(ValueError):
            report = attack(json.loads(text))
        body = json.dumps(report)
        out(
            {
                "type": "assistant",
                "session_id": session,
                "message": {"id": str(uuid.uuid4()), "role": "assistant", "content": [{"type": "text", "text": body}]},
            }
        )
        out({"type": "result", "subtype": "success", "is_error": False, "session_id": session, "result": body})
    return 0


if __name__ == "__main__":
    sys.exit(main())
